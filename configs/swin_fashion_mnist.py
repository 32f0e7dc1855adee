"""Swin Transformer on Fashion-MNIST (28x28 grey, 60k train / 10k test), from Debian's dataset-fashion-mnist.

Run (from the repository root):

    apt-get install dataset-fashion-mnist
    python -m vitjax.data.prepare --dataset=fashion_mnist
    python -m vitjax.main --config=configs/swin_fashion_mnist.py --workdir=workdirs/swin_fashion_mnist
    python -m vitjax.main --mode=eval --workdir=workdirs/swin_fashion_mnist --split=test

Expected: at least 90% test accuracy: 90.85% measured for the best checkpoint by validation accuracy (step 3,752; 90.92%
on validation) in 30 min on one core; 54,000 training images, 6,000 held out for
validation (experiments/README.md).
A small Swin at the ViT config's resolution: the same conv stem (two 3x3 stride-2 convolutions with
BatchNorm, then 1x1) gives a 7x7 map of width 64; stage 1 has window 4, so the map is padded to 8x8 (four
windows; odd blocks shift by 2, with the shift mask), stage 2 works on the merged 4x4 map at width 128 (one
window). AdamW, cosine, 10 epochs. Measured on the way here (experiments/README.md): 2x2 patches with the
paper's patch embedding, window 7, widths 32/64, 6 epochs: 86.8%; the same with a one-convolution stem and
10 epochs: see the table.
"""

import ml_collections as mlc

from vitjax.config import default_config


def get_config():
  c = default_config()
  c.model = mlc.ConfigDict(
    dict(
      name="swin_t",
      patch_size=4,
      stem="conv",
      embed_dim=64,
      depths=(2, 2),
      num_heads=(2, 4),
      window_size=4,
      num_classes=10,
      drop_path_rate=0.1,
    )
  )
  c.data.name = "fashion_mnist"
  c.data.image_size = 28
  c.data.augment.flip = True
  c.data.eval_batch_size = 512
  c.batch_size = 128
  c.num_epochs = 10
  c.optim.lr = 2e-3
  c.optim.weight_decay = 0.05
  c.schedule.warmup_epochs = 0.5
  c.label_smoothing = 0.1
  c.log_every = 100
  c.eval_every = "2 epochs"
  c.checkpoint_every = "1 epoch"
  return c
