"""The paper's Transformer-big on WMT'14 English-German (Vaswani et al. 2017: 28.4 BLEU on newstest2014).

    tfds build wmt14_translate/de-en --file_format=array_record --data_dir=$DATA
    python -m vitjax.main --config=configs/transformer_big_wmt14.py --workdir=workdirs/wmt14_big \
        --config.data.data_dir=$DATA

Recipe: d_model 1024, 16 heads, d_ff 4096, 6+6 layers, dropout 0.3, post-norm, shared 32k vocabulary, tied
output; Adam (0.9, 0.98, 1e-9) with lr = d_model^-0.5 * min(step^-0.5, step * 4000^-1.5) (peak 4.9e-4 at step
4000), label smoothing 0.1, about 25,000 source + 25,000 target tokens per batch, 300k steps; beam 4, alpha 0.6.
Here tokens_per_batch counts the padded rows of both sides, so 50,000 matches the paper's batches.
Expected: about 28 BLEU on newstest2014 (the paper's number; not reproduced here: it needs 8 accelerators
for about 3.5 days, and the data).
"""
from vitjax.config import translation_config


def get_config():
  c = translation_config("tfds:wmt14_translate/de-en", "en", "de", size="big")
  c.data.vocab_size = 32000
  c.data.tokenizer_sentences = 2_000_000
  c.data.max_len = 256
  c.data.tokens_per_batch = 50_000
  c.data.num_valid, c.data.num_test = 3000, 0
  c.data.test_source = "tfds:wmt14_translate/de-en:test"  # newstest2014: evaluate with --split=test
  c.optim.lr = 1024**-0.5 * 4000**-0.5
  c.schedule.warmup_steps = 4000
  c.total_steps = 300_000
  c.compute_dtype = "bfloat16"
  c.eval_every = 5000
  c.checkpoint_every = 2000
  return c
