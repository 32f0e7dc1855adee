"""Transformer DE->EN on the German-English pairs of Debian's trans-de-en package (the Ding dictionary,
/usr/share/trans/de-en: 391,697 pairs after splitting alternatives; most are words and short phrases).

Run (from the repository root):

    apt-get install trans-de-en
    python -m vitjax.main --config=configs/transformer_ding_de_en.py --workdir=workdirs/ding_de_en
    python -m vitjax.main --mode=eval --workdir=workdirs/ding_de_en --split=test

Expected: 4.4 BLEU (chrF 12.5) on the 2,000 test pairs after 55 minutes on one CPU core (1,368 and 1,498 steps in
two runs; copying the source: 0.15 BLEU, chrF 16.5). Scored as a dictionary: 0.85% exact matches, 4.73 BLEU
against all of an entry's synonyms (copying: 0.50%, 0.16; looking the source up in the training pairs: 0.65%,
1.74). Short of the 15 BLEU aimed for: 69% of held-out sources are one word, most of them rare compounds seen
once, with a single reference each (experiments/README.md has the analysis).
Same model and recipe as configs/transformer_bible_en_es.py; shorter buckets (sources are 1.9 words on average).
"""

from vitjax.config import translation_config


def get_config():
  c = translation_config("ding", "de", "en")
  c.data.max_len = 64
  c.data.num_valid, c.data.num_test = 1000, 2000
  c.evals.eval.examples = 1000
  c.data.eval_batch_size = 128
  # Sized for 2 CPU cores and at most an hour: smaller batches (more updates), a short warm-up, a time budget.
  c.data.tokens_per_batch = 2048
  c.schedule.warmup_steps = 400
  c.total_steps = 20000  # the schedule's horizon; max_train_minutes ends the run first on a CPU
  c.max_train_minutes = 55
  c.eval_every = 400
  c.checkpoint_every = 400
  return c
