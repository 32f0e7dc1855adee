"""MAE pre-training (vitjax.tasks.mae) on Fashion-MNIST's training images, labels unused, for the ViT of
configs/vit_fashion_mnist_from_mae.py (4x4 patches, 49 tokens, width 96, depth 4): the pre-train -> fine-tune
half of the comparison with training from scratch at the same compute (issue 14).

Run (from the repository root):

    python -m vitjax.data.prepare --dataset=fashion_mnist
    python -m vitjax.main --config=configs/mae_fashion_mnist.py --workdir=workdirs/mae_fashion_mnist
    python -m vitjax.main --config=configs/vit_fashion_mnist_from_mae.py --workdir=workdirs/vit_fashion_mnist_from_mae \\
      --config.init_from=workdirs/mae_fashion_mnist

Expected: the masked patches' validation loss (per-patch normalised pixels; 1.0 is predicting each patch's mean)
well below 1; the comparison's numbers are in experiments/README.md ("Pre-training"). 75% of the 49 patches are
dropped, the encoder sees 12; decoder: 2 blocks of width 64. AdamW (b2 0.95), lr 1e-3, cosine, 10 epochs.
"""

import ml_collections as mlc

from vitjax.config import default_config, evaluator

ENCODER = dict(name="Ti/4", width=96, depth=4, num_heads=4, mlp_dim=192, pool_type="gap")


def get_config():
  c = default_config()
  c.task = "mae"
  c.model = mlc.ConfigDict(
    dict(name="mae", encoder=dict(ENCODER), decoder_width=64, decoder_depth=2, decoder_heads=4, mask_ratio=0.75)
  )
  c.data.name = "fashion_mnist"
  c.data.image_size = 28
  c.data.augment.flip = True
  c.data.eval_batch_size = 512
  c.batch_size = 128
  c.num_epochs = 10
  c.optim.lr = 1e-3
  c.optim.kwargs = dict(b2=0.95)
  c.optim.weight_decay = 0.05
  c.schedule.warmup_epochs = 1
  c.evals = {"eval": evaluator("mae")}  # the reconstruction loss under fixed masks (lower is better)
  c.best = "eval/loss"
  c.log_every = 100
  c.eval_every = "2 epochs"
  c.checkpoint_every = "1 epoch"
  return c
