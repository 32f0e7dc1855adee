"""ViT on Fashion-MNIST (28x28 grey, 60k train / 10k test), read from Debian's dataset-fashion-mnist package.

Run (from the repository root):

    apt-get install dataset-fashion-mnist
    python -m vitjax.data.prepare --dataset=fashion_mnist
    python -m vitjax.main --config=configs/vit_fashion_mnist.py --workdir=workdirs/vit_fashion_mnist
    python -m vitjax.main --mode=eval --workdir=workdirs/vit_fashion_mnist --split=test

Expected: at least 90% test accuracy: 90.65% measured for the best checkpoint by validation accuracy (the last, step 4,210;
90.42% on validation) in 45 min on one core; 54,000 training images, 6,000 held out for
validation (experiments/README.md).
A 4-layer, 96-wide ViT on a 7x7 grid (49 tokens) with global average pooling and the convolutional stem of
Xiao et al. 2021 (two 3x3 stride-2 convolutions, then 1x1) instead of 4x4 patchify: with patchify the same
model ended at 88.9% after 8 epochs. AdamW, cosine, 10 epochs.
"""

import ml_collections as mlc

from vitjax.config import default_config


def get_config():
  c = default_config()
  c.model = mlc.ConfigDict(
    dict(
      name="Ti/4",
      width=96,
      depth=4,
      num_heads=4,
      mlp_dim=192,
      num_classes=10,
      pool_type="gap",
      stem="conv",
      dropout_rate=0.0,
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
