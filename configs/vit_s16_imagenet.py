"""ViT-S/16 on ImageNet-1k in 90 epochs: big_vision's "better plain ViT baselines" recipe (76.5% top-1 there).

    tfds build imagenet2012 --file_format=array_record --data_dir=$DATA --manual_dir=$IMAGENET_TARS
    python -m vitjax.main --config=configs/vit_s16_imagenet.py --workdir=workdirs/vit_s16_i1k \
        --config.data.data_dir=$DATA

Recipe (Beyer et al. 2022): global average pooling, fixed 2-D sin-cos position embeddings, batch 1024, AdamW
(b2 0.999) lr 1e-3, decoupled weight decay 1e-4 (scaled by the learning rate, as in big_vision and optax.adamw),
10k warm-up steps then cosine, gradient clipping at 1.0, random resized crop (scale 0.05-1), flip, RandAugment
(2, 10), Mixup 0.2, no dropout or stochastic depth, head initialised to zero.
Expected: 76.5% top-1 on the validation split after 90 epochs (big_vision's number; not reproduced here:
it needs 8+ accelerators and the ImageNet data).
"""

import ml_collections as mlc

from vitjax.config import default_config


def get_config():
  c = default_config()
  c.model = mlc.ConfigDict(dict(name="vit_s16", num_classes=1000, pool_type="gap", posemb="sincos2d"))
  c.data.name = "imagenet2012"
  c.data.valid_fraction = 0.01  # 12,812 training images held out (big_vision's minival); report "validation"
  c.data.image_size = 224
  c.data.augment = mlc.ConfigDict(
    {
      "flip": True,
      "random_resized_crop": {"scale": (0.05, 1.0), "ratio": (0.75, 1.333)},
      "randaugment": {"num_layers": 2, "magnitude": 10},
      "mixup_alpha": 0.2,
      "cutmix_alpha": 0.0,
    }
  )
  c.data.eval_batch_size = 1024
  c.data.worker_count = 8
  c.batch_size = 1024
  c.num_epochs = 90
  c.optim.lr = 1e-3
  c.optim.weight_decay = 1e-4
  c.optim.grad_clip_norm = 1.0
  c.schedule.warmup_steps = 10_000
  c.compute_dtype = "bfloat16"
  c.log_every = 100
  c.eval_every = 5000
  c.checkpoint_every = 2000
  return c
