"""Swin-T on ImageNet-1k, the Swin paper's 300-epoch recipe (81.3% top-1 in Liu et al. 2021).

    tfds build imagenet2012 --file_format=array_record --data_dir=$DATA --manual_dir=$IMAGENET_TARS
    python -m vitjax.main --config=configs/swin_t_imagenet.py --workdir=workdirs/swin_t_i1k \
        --config.data.data_dir=$DATA

Recipe: AdamW, lr 1e-3 at batch 1024, weight decay 0.05, 20 warm-up epochs then cosine, gradient clipping
at 5.0, label smoothing 0.1, stochastic depth 0.2, RandAugment (2, 9), Mixup 0.8 / CutMix 1.0, 224 px,
window 7. Expected: 81.3% top-1 on validation (the paper's number; not reproduced here).
"""

import ml_collections as mlc

from vitjax.config import default_config


def get_config():
  c = default_config()
  c.model = mlc.ConfigDict(dict(name="swin_t", num_classes=1000, drop_path_rate=0.2))
  c.data.name = "imagenet2012"
  c.data.valid_fraction = 0.01  # 12,812 training images held out (big_vision's minival); report "validation"
  c.data.image_size = 224
  c.data.augment = mlc.ConfigDict(
    {
      "flip": True,
      "random_resized_crop": {"scale": (0.08, 1.0), "ratio": (0.75, 1.333)},
      "randaugment": {"num_layers": 2, "magnitude": 9},
      "mixup_alpha": 0.8,
      "cutmix_alpha": 1.0,
    }
  )
  c.data.eval_batch_size = 1024
  c.data.worker_count = 8
  c.batch_size = 1024
  c.num_epochs = 300
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.05
  c.optim.grad_clip_norm = 5.0
  c.schedule.warmup_epochs = 20
  c.schedule.end_lr_factor = 0.01
  c.label_smoothing = 0.1
  c.compute_dtype = "bfloat16"
  c.log_every = 100
  c.eval_every = 5000
  c.checkpoint_every = 2000
  return c
