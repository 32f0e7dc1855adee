"""ViT on scikit-learn's `digits` (1,797 8x8 scans; 1,497 train / 300 test), the embedded default dataset.

Run (from the repository root, after `pip install -e .`):

    python -m vitjax.data.prepare --dataset=digits
    python -m vitjax.main --config=configs/vit_digits.py --workdir=workdirs/vit_digits
    python -m vitjax.main --mode=eval --workdir=workdirs/vit_digits --split=test

Expected: 98.0-99.7% test accuracy for the best checkpoint by validation accuracy (96.7-100% on validation),
in 2-2.5 minutes of training on 2 CPU cores. Measured over seeds 0-2, one or two cores and three instruction sets
(AVX, AVX2, AVX-512): the seed, the core count and the CPU each move single scans (0.33 points each); see
the table in docs/getting_started.md and experiments/main_job_spread.py. Training uses 1,347 scans; 150 (10%, data.valid_seed 0) are the
validation split that evaluation during training and `best` use.
A 4-layer, 64-wide ViT with 2x2 patches (16 tokens) and a class token; small random crops and zooms (without
them it overfits and ends near 97%); AdamW, cosine, 80 epochs.
"""

import ml_collections as mlc

from vitjax import sweep
from vitjax.config import default_config


def get_config():
  c = default_config()
  c.model = mlc.ConfigDict(
    dict(name="Ti/2", width=64, depth=4, num_heads=4, mlp_dim=128, num_classes=10, dropout_rate=0.1)
  )
  c.data.name = "digits"
  c.data.image_size = 8
  c.data.augment = mlc.ConfigDict(
    {
      "flip": False,
      "random_resized_crop": {"scale": (0.8, 1.0), "ratio": (0.9, 1.1)},
      "randaugment": False,
      "mixup_alpha": 0.0,
      "cutmix_alpha": 0.0,
    }
  )
  c.data.eval_batch_size = 320  # divisible by 8 devices; the last batch is padded and masked
  c.batch_size = 64
  c.num_epochs = 80
  c.optim.lr = 2e-3
  c.optim.weight_decay = 0.05
  c.schedule.warmup_epochs = 3
  c.label_smoothing = 0.1
  c.log_every = 100
  c.eval_every = 200
  c.checkpoint_every = 200
  return c


def get_sweep():
  """Learning rate x weight decay x depth: 12 trials around the hand-set values (lr 2e-3, weight decay 0.05, depth
  4), by validation accuracy; the median pruner stops a trial below the median of earlier ones at an evaluation.

      python -m vitjax.sweep --config=configs/vit_digits.py --sweep_dir=sweeps/vit_digits --config.num_epochs=30
  """
  return dict(
    grid=sweep.product(
      sweep.values("optim.lr", [1e-3, 2e-3, 4e-3]),
      sweep.values("optim.weight_decay", [0.05, 0.3]),
      sweep.values("model.depth", [2, 4]),
    ),
    objective="eval/accuracy",
    direction="maximize",
    pruner="median",
  )
