"""Any ViT variant on any prepared image dataset, chosen by config-string arguments.

Run:

    python -m vitjax.main --config=configs/vit.py:variant=S/16,dataset=fashion_mnist --workdir=workdirs/s16_fmnist
    python -m vitjax.main --config=configs/vit.py:variant=Ti/4,dataset=digits,image_size=8 ...

Arguments (comma-separated key=value): variant (SIZE/PATCH, default Ti/4), dataset (default fashion_mnist),
image_size (default: the dataset's size, 8 for digits, 28 for fashion_mnist, 32 otherwise, rounded up to a
multiple of the patch; images are resized to it), num_classes
(default 10), epochs (default 10). Every field the config sets is overridable with --config.KEY=VALUE; its model
sets name, num_classes and pool_type, and other ViT attributes (drop_path_rate, scan, ...) go in a copy of this file.
Expected: depends on the arguments (not measured here for every variant; see experiments/README.md for the
dedicated configs).
"""

import re

import ml_collections as mlc

from vitjax.config import default_config

ARGS = {"variant": "Ti/4", "dataset": "fashion_mnist", "image_size": None, "num_classes": 10, "epochs": 10}


def parse_args(arg: str | None) -> dict:
  out = dict(ARGS)
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    if key not in ARGS:
      raise ValueError(f"configs/vit.py: unknown argument {key!r}; use {', '.join(ARGS)}")
    out[key] = value
  if not re.fullmatch(r"[A-Za-z0-9]+/\d+", str(out["variant"])):
    raise ValueError(f"configs/vit.py: variant={out['variant']!r} must be SIZE/PATCH, e.g. variant=S/16")
  for key, kind in (("image_size", int), ("num_classes", int), ("epochs", float)):
    try:
      out[key] = None if out[key] is None else kind(out[key])
    except ValueError:
      raise ValueError(f"configs/vit.py: {key}={out[key]!r} must be a number, e.g. {key}={ARGS[key] or 32}") from None
  return out


def get_config(arg=None):
  a = parse_args(arg)
  c = default_config()
  c.model = mlc.ConfigDict(dict(name=a["variant"], num_classes=int(a["num_classes"]), pool_type="gap"))
  c.data.name = a["dataset"]
  patch = int(a["variant"].split("/")[1])
  size = int(a["image_size"] or {"digits": 8, "fashion_mnist": 28}.get(a["dataset"], 32))
  c.data.image_size = -(-size // patch) * patch  # a multiple of the patch
  c.num_epochs = float(a["epochs"])
  c.batch_size = 128
  c.optim.lr = 1e-3
  c.optim.weight_decay = 0.05
  c.schedule.warmup_epochs = 1
  c.label_smoothing = 0.1
  return c
