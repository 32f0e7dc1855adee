"""ViT-S/4 trained from scratch on CIFAR-10 (32x32), with RandAugment and Mixup/CutMix.

CIFAR-10 is not embedded: prepare it as array_record on a machine that can download it, then copy the folder.

    tfds build cifar10 --file_format=array_record --data_dir=$DATA
    python -m vitjax.main --config=configs/vit_cifar10.py --workdir=workdirs/vit_cifar10 --config.data.data_dir=$DATA

Expected: about 90% test accuracy after 200 epochs (the usual result for a from-scratch ViT-S/4 with strong
augmentation; not measured here: these machines have no accelerator and no CIFAR-10).
"""

import ml_collections as mlc

from vitjax.config import default_config


def get_config():
  c = default_config()
  c.model = mlc.ConfigDict(dict(name="S/4", num_classes=10, pool_type="gap", drop_path_rate=0.1))
  c.data.name = "cifar10"
  c.data.image_size = 32
  c.data.augment = mlc.ConfigDict(
    {
      "flip": True,
      "random_resized_crop": {"scale": (0.8, 1.0), "ratio": (0.75, 1.333)},
      "randaugment": {"num_layers": 2, "magnitude": 9},
      "mixup_alpha": 0.8,
      "cutmix_alpha": 1.0,
    }
  )
  c.data.eval_batch_size = 1000
  c.batch_size = 512
  c.num_epochs = 200
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.05
  c.schedule.warmup_epochs = 10
  c.label_smoothing = 0.1
  c.log_every = 100
  c.eval_every = 2000
  c.checkpoint_every = 2000
  return c
