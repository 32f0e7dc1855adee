"""The config and task description of a classifier on the Hugging Face hub, as a vitjax run's would be.

    config, described, module, variables = hub_run("hf:timm/vit_small_patch16_224.augreg_in21k")

What vitjax.load("hf:...") and a distillation teacher from the hub (vitjax.tasks.distill) build their model from:
config.model (vitjax.convert.model_config's fields), the input size, the preprocessing (mean, std, crop,
interpolation) and the class names, read from the repository's config as a workdir's config.json and task.json
give them.
"""

from __future__ import annotations

import ml_collections as mlc

from vitjax import convert
from vitjax.config.schema import default_config
from vitjax.data import augment
from vitjax.models import convert_util


def hub_run(spec: str) -> tuple[mlc.ConfigDict, dict, object, dict]:
  """(config, described, module, variables) of a hub repository 'hf:ORG/NAME[@REVISION]' (convert.from_hub).

  described: what a run's task.json holds (task, dataset, num_classes, class_names, channels, image_size and the
  preprocessing's fields). ConfigError (one line) for a repository that cannot be read.
  """
  module, variables, repo = convert.from_hub(spec)
  flat = convert_util.flat_params(variables["params"])
  channels = next(v.shape[2] for k, v in flat.items() if k in ("embedding/kernel", "patch_embed/kernel"))
  num_classes = int(module.num_classes or 0)
  h, w = repo.image_size()
  pre = augment.Preprocess(**{k: v for k, v in repo.preprocess().items() if v is not None})
  described = {
    "task": "classification",
    "dataset": spec,
    "num_classes": num_classes,
    "class_names": repo.class_names(num_classes),
    "channels": channels,
    "image_size": [h, w],
    **pre.describe(),
  }
  config = default_config()
  config.model = mlc.ConfigDict(convert.model_config(module))
  config.data.name = spec
  if h == w:
    config.data.image_size = h
  else:  # the field is an int: a config of its own with (height, width), as a config file may give it
    config.data = mlc.ConfigDict({**config.data.to_dict(), "image_size": (h, w)})
  for k in ("mean", "std", "crop_fraction", "interpolation"):
    config.data.preprocess[k] = getattr(pre, k)
  config.init_from = spec
  return config, described, module, variables
