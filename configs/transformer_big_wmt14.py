"""The paper's Transformer-big on WMT'14 English-German (Vaswani et al. 2017: 28.4 BLEU on newstest2014).

    tfds build wmt14_translate/de-en --file_format=array_record --data_dir=$DATA
    python -m vitjax.main --config=configs/transformer_big_wmt14.py --workdir=workdirs/wmt14_big \
        --config.data.data_dir=$DATA

Recipe: d_model 1024, 16 heads, d_ff 4096, 6+6 layers, dropout 0.3, post-norm, shared 32k vocabulary, tied
output; Adam (0.9, 0.98, 1e-9) with lr = d_model^-0.5 * min(step^-0.5, step * 4000^-1.5) (peak 4.9e-4 at step
4000), label smoothing 0.1, about 25,000 source + 25,000 target tokens per batch, 300k steps; beam 4, alpha 0.6.
Here tokens_per_batch is per side (source and target rows are each about that many padded positions),
so 25,000 matches the paper's batches.
Expected: about 28 BLEU on newstest2014 (the paper's number; not reproduced here: it needs 8 accelerators
for about 3.5 days, and the data).
"""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "transformer_base_wmt14", os.path.join(os.path.dirname(os.path.abspath(__file__)), "transformer_base_wmt14.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config():
  c = _base.get_config()  # the base recipe, with the big model and its schedule
  c.model.name = "transformer_big"
  c.optim.lr = 1024**-0.5 * 4000**-0.5
  c.total_steps = 300_000
  return c
