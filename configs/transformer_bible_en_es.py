"""Transformer EN->ES on Bible verses: KJV (engKJV2006eb) and Reina-Valera 1909 (spaRV1909eb) from Debian's
sword-text-kjv and sword-text-sparv packages, paired verse by verse (30,895 pairs, 30,729 after removing
duplicates; 1,000 held out for test, 500 for validation, fixed by data.split_seed).

Run (from the repository root):

    apt-get install sword-text-kjv sword-text-sparv
    python -m vitjax.main --config=configs/transformer_bible_en_es.py --workdir=workdirs/bible_en_es
    python -m vitjax.main --mode=eval --workdir=workdirs/bible_en_es --split=test
    echo "In the beginning God created the heaven and the earth." | \
        python -m vitjax.translate --workdir=workdirs/bible_en_es

Expected: 16.7 BLEU (chrF 35.2) on the 1,000 test verses after 55 minutes of training on one CPU core
(1,343 steps; copying the source: 0.15 BLEU); more with more time, the curve was still rising
(experiments/README.md). A small post-norm Transformer (d_model 256, 3+3 layers,
shared 8k SentencePiece vocabulary, tied output), Adam (0.9, 0.98, 1e-9), inverse-sqrt schedule.
"""

from vitjax import sweep
from vitjax.config import translation_config


def get_config():
  c = translation_config("bible", "en", "es")
  # Sized for 2 CPU cores and at most an hour: smaller batches (more updates), a short warm-up, a time budget.
  c.data.tokens_per_batch = 2048
  c.data.eval_examples = 300
  c.schedule.warmup_steps = 400
  c.total_steps = 20000  # the schedule's horizon; max_train_minutes ends the run first on a CPU
  c.max_train_minutes = 55
  c.eval_every = 400
  c.checkpoint_every = 400
  return c


def get_sweep():
  """Learning rate x warm-up x dropout, 8 trials drawn by TPE, by validation BLEU; the median pruner stops a trial
  below the median of earlier ones at an evaluation. Short budgets: 10 minutes of training per trial, an
  evaluation every 200 steps.

      python -m vitjax.sweep --config=configs/transformer_bible_en_es.py --sweep_dir=sweeps/bible --workers=2 \
          --config.max_train_minutes=10 --config.eval_every=200 --config.checkpoint_every=200
  """
  return dict(
    space={
      "optim.lr": sweep.log_uniform(3e-4, 3e-3),
      "schedule.warmup_steps": sweep.integer(100, 800, step=100),
      "model.dropout_rate": sweep.uniform(0.0, 0.3),
    },
    trials=8,
    objective="eval/bleu",
    direction="maximize",
    pruner="median",
    seed=0,
  )
