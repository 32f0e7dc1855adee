"""The paper's Transformer-base on WMT'14 English-German (Vaswani et al. 2017: 27.3 BLEU on newstest2014).

    tfds build wmt14_translate/de-en --file_format=array_record --data_dir=$DATA
    python -m vitjax.main --config=configs/transformer_base_wmt14.py --workdir=workdirs/wmt14_base \
        --config.data.data_dir=$DATA

Recipe: d_model 512, 8 heads, d_ff 2048, 6+6 layers, dropout 0.1, post-norm, shared 32k vocabulary, tied
output; Adam (0.9, 0.98, 1e-9) with lr = d_model^-0.5 * min(step^-0.5, step * 4000^-1.5) (peak 7e-4 at step
4000), label smoothing 0.1, about 25,000 source + 25,000 target tokens per batch, 100k steps; beam 4, alpha 0.6.
Here tokens_per_batch is per side (source and target rows are each about that many padded positions),
so 25,000 matches the paper's batches.
Expected: about 27 BLEU on newstest2014 (the paper's number; not reproduced here: it needs 8 accelerators
for about 12 hours, and the data).
"""

from vitjax.config import translation_config


def get_config():
  c = translation_config("tfds:wmt14_translate/de-en", "en", "de", size="base")
  c.data.vocab_size = 32000
  c.data.tokenizer_sentences = 2_000_000
  c.data.max_len = 256
  c.data.tokens_per_batch = 25_000
  c.data.num_valid, c.data.num_test = 3000, 0
  c.data.test_source = "tfds:wmt14_translate/de-en:test"  # newstest2014: evaluate with --split=test
  c.optim.lr = 512**-0.5 * 4000**-0.5
  c.schedule.warmup_steps = 4000
  c.total_steps = 100_000
  c.compute_dtype = "bfloat16"
  c.eval_every = 5000
  c.checkpoint_every = 2000
  return c
