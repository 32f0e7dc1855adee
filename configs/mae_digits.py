"""MAE pre-training (vitjax.tasks.mae) of configs/vit_digits.py's ViT on digits, labels unused: a minute-scale
example of the masked autoencoder, and what tests/test_mae.py trains.

Run (from the repository root):

    python -m vitjax.data.prepare --dataset=digits
    python -m vitjax.main --config=configs/mae_digits.py --workdir=workdirs/mae_digits
    python -m vitjax.main --config=configs/vit_digits.py --workdir=workdirs/vit_digits_from_mae \\
      --config.init_from=workdirs/mae_digits

Expected: the masked patches' loss (per-patch normalised pixels; 1.0 is predicting each patch's mean) on the
validation split falls below 0.75: 0.584 at step 210 and 0.490 at step 840 (the last) measured in 70 s on 2 CPU
cores shared with another run; reconstructions in workdirs/mae_digits/reconstructions/step_N.png. 12 of the 16 2x2 patches are dropped; the encoder is the ViT of
configs/vit_digits.py (its 4 blocks see 4 patches and the class token), the decoder 2 blocks of width 32.
"""

import ml_collections as mlc

from vitjax.config import default_config, evaluator


def get_config():
  c = default_config()
  c.task = "mae"
  c.model = mlc.ConfigDict(
    dict(
      name="mae",
      encoder=dict(name="Ti/2", width=64, depth=4, num_heads=4, mlp_dim=128),
      decoder_width=32,
      decoder_depth=2,
      decoder_heads=4,
      mask_ratio=0.75,
    )
  )
  c.data.name = "digits"
  c.data.image_size = 8
  c.data.eval_batch_size = 320
  c.batch_size = 64
  c.num_epochs = 40
  c.optim.lr = 1e-3
  c.optim.kwargs = dict(b2=0.95)
  c.optim.weight_decay = 0.05
  c.schedule.warmup_epochs = 2
  c.evals = {"eval": evaluator("mae")}  # the reconstruction loss under fixed masks (lower is better)
  c.best = "eval/loss"
  c.log_every = 100
  c.eval_every = 210
  c.checkpoint_every = 210
  return c
