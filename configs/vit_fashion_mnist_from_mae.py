"""The ViT that configs/mae_fashion_mnist.py pre-trains (4x4 patches, 49 tokens, width 96, depth 4, average
pooling), as a classifier of Fashion-MNIST: fine-tuned from an MAE workdir (config.init_from, with layer-wise
learning-rate decay 0.75), or trained from scratch with the same command and --config.init_from= (and no layer
decay): the two arms of the comparison at equal compute (issue 14).

Run (from the repository root):

    python -m vitjax.data.prepare --dataset=fashion_mnist
    python -m vitjax.main --config=configs/vit_fashion_mnist_from_mae.py --workdir=workdirs/vit_fashion_mnist_from_mae \\
      --config.init_from=workdirs/mae_fashion_mnist
    python -m vitjax.main --config=configs/vit_fashion_mnist_from_mae.py --workdir=workdirs/vit_fashion_mnist_scratch \\
      --config.init_from= --config.optim.layer_decay=1.0 --config.num_epochs=10
    python -m vitjax.main --mode=eval --workdir=W --split=test

Expected: see experiments/README.md ("Pre-training"), which gives both arms' test accuracy, their wall time on one
core and the number of fine-tuning epochs that makes the totals equal.
"""

import ml_collections as mlc

from vitjax.config import default_config


def get_config():
  c = default_config()
  c.model = mlc.ConfigDict(
    dict(name="Ti/4", width=96, depth=4, num_heads=4, mlp_dim=192, pool_type="gap", num_classes=10, drop_path_rate=0.1)
  )
  c.data.name = "fashion_mnist"
  c.data.image_size = 28
  c.data.augment.flip = True
  c.data.eval_batch_size = 512
  c.batch_size = 128
  c.num_epochs = 10
  c.optim.lr = 2e-3
  c.optim.weight_decay = 0.05
  c.optim.layer_decay = 0.75
  c.schedule.warmup_epochs = 0.5
  c.label_smoothing = 0.1
  c.log_every = 100
  c.eval_every = "2 epochs"
  c.checkpoint_every = "1 epoch"
  return c
