"""Swin Transformer on Fashion-MNIST (28x28 grey, 60k train / 10k test), from Debian's dataset-fashion-mnist.

Run (from the repository root):

    apt-get install dataset-fashion-mnist
    python -m vitjax.data.prepare --dataset=fashion_mnist
    python -m vitjax.main --config=configs/swin_fashion_mnist.py --workdir=workdirs/swin_fashion_mnist

Expected: at least 90% test accuracy (measured accuracy and wall time: experiments/README.md).
A small Swin: a conv stem (one 3x3 stride-2 convolution with BatchNorm, then 1x1: the 2x2 "patches"),
window 7, stages of 2 blocks at 14x14 (four windows, shifted on odd blocks) and 7x7 (one window, so no
shift), widths 32 and 64; AdamW, cosine, 10 epochs. With the paper's patch embedding (a 2x2 stride-2
convolution) and 6 epochs the same model reached 86.8%.
"""
import ml_collections as mlc

from vitjax.config import default_config


def get_config():
  c = default_config()
  c.model = mlc.ConfigDict(dict(name="swin_t", patch_size=2, stem="conv", embed_dim=32, depths=(2, 2), num_heads=(2, 4),
                                window_size=7, num_classes=10, drop_path_rate=0.1))
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
  c.eval_every = 938
  c.checkpoint_every = 469
  return c
