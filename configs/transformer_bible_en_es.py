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

# The recipe grid (`:recipe`): one factor at a time from this config, each trial 30 minutes on one core.
BASE = {
  "label_smoothing": 0.1,
  "model.dropout_rate": 0.1,
  "data.vocab_size": 8000,
  "data.tokens_per_batch": 2048,
  "optim.accum_steps": 1,
  "schedule.warmup_steps": 400,
  "model.d_model": 256,
  "model.num_heads": 4,
  "model.d_ff": 1024,
  "model.num_layers": 3,
  "compute_dtype": "float32",
}
RECIPE = [
  {},  # this config
  {"label_smoothing": 0.2},  # more smoothing (low-resource NMT practice)
  {"model.dropout_rate": 0.3},  # fairseq's IWSLT setting for small data
  {"data.vocab_size": 4000},  # a smaller shared vocabulary: more examples per subword, a cheaper softmax
  {"data.tokens_per_batch": 4096, "optim.accum_steps": 2},  # twice the tokens per update, in two micro-batches
  {"schedule.warmup_steps": 1000},  # a longer warm-up
  {"model.d_model": 384, "model.num_heads": 6, "model.d_ff": 1536},  # wider
  {"model.num_layers": 5},  # deeper
  {"compute_dtype": "bfloat16"},  # bfloat16 activations (AVX512-BF16 doubles the bf16-in, f32-out matmul peak)
]


def get_config(arg=None):
  c = translation_config("bible", "en", "es")
  # Sized for 2 CPU cores and at most an hour: smaller batches (more updates), a short warm-up, a time budget.
  c.data.tokens_per_batch = 2048
  c.evals.eval.examples = 300
  c.schedule.warmup_steps = 400
  c.total_steps = 20000  # the schedule's horizon; max_train_minutes ends the run first on a CPU
  c.max_train_minutes = 55
  c.eval_every = 400
  c.checkpoint_every = 400
  if arg == "recipe":  # each trial of the recipe grid: 30 minutes of training, evaluated every 300 steps
    c.max_train_minutes, c.eval_every, c.checkpoint_every = 30, 300, 300
    for field, value in BASE.items():  # the grid's fields, set so that get_sweep() can check them
      node, _, name = field.rpartition(".")
      (c[node] if node else c)[name] = value
  elif arg:
    raise ValueError(f"unknown argument {arg!r}: use :recipe or nothing")
  return c


def get_sweep(arg=None):
  """Without an argument: learning rate x warm-up x dropout, 8 trials drawn by TPE, by validation BLEU; the median
  pruner stops a trial below the median of earlier ones at an evaluation. Short budgets: 10 minutes of training per
  trial, an evaluation every 200 steps.

      python -m vitjax.sweep --config=configs/transformer_bible_en_es.py --sweep_dir=sweeps/bible --workers=2 \
          --config.max_train_minutes=10 --config.eval_every=200 --config.checkpoint_every=200

  With `:recipe`: what the anchors vary for small data, one factor at a time (RECIPE: label smoothing, dropout,
  the vocabulary's size, tokens per update with accumulation, warm-up, width, depth, bfloat16), 9 trials of 30 minutes on
  one core each, by validation BLEU; equal time, not equal steps, because time is what the long run has:

      python -m vitjax.sweep --config=configs/transformer_bible_en_es.py:recipe --sweep_dir=sweeps/bible_recipe \
          --workers=2

  Measured (experiments/README.md, "Choosing the recipe"; 2026-11-25/26): label smoothing 0.2, the 4k vocabulary,
  bfloat16 and warm-up 1,000 end at 7.6-9.6 validation BLEU, within the base recipe's own spread over two runs
  (5.9, 8.4); dropout 0.3, wider, deeper and 4,096 tokens per update end at 0.6-3.6.
  """
  if arg == "recipe":
    return dict(grid=[{**BASE, **change} for change in RECIPE], objective="eval/bleu", direction="maximize")
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
