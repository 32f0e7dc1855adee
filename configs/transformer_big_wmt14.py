"""The paper's Transformer-big on WMT'14 English-German (Vaswani et al. 2017: 28.4 BLEU on newstest2014).

    tfds build wmt14_translate/de-en --file_format=array_record --data_dir=$DATA
    python -m vitjax.main --config=configs/transformer_big_wmt14.py --workdir=workdirs/wmt14_big \
        --config.data.data_dir=$DATA

Recipe: configs/transformer_base_wmt14.py (its optimiser, batch, data, decoding) with the big model: d_model
1024, 16 heads, d_ff 4096, dropout 0.3; peak lr 1024^-0.5 * 4000^-0.5 = 4.9e-4 at step 4000; 300k steps.
Expected: about 28 BLEU on newstest2014 (the paper's number; not reproduced here: it needs 8 accelerators
for about 3.5 days, and the data).
"""

import os

from vitjax.config import load_module

_base = load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "transformer_base_wmt14.py"))


def get_config():
  c = _base.get_config()  # the base recipe, with the big model and its schedule
  c.model.name = "transformer_big"
  c.optim.lr = 1024**-0.5 * 4000**-0.5
  c.total_steps = 300_000
  return c
