"""vitjax: transformers for vision and translation in JAX/Flax.

import vitjax
trained = vitjax.load("workdirs/vit_digits")    # a trained run: .model, .variables, .config, .step,
probs = trained.predict(images)                 # .predict(images) or .translate(lines)
"""

__version__ = "0.1.0"


def load(workdir: str, checkpoint: str | int = "best", weights: str = "params"):
  """A trained model from a vitjax workdir (see vitjax.trained.load).

  Imported on first use, so `import vitjax` stays light.
  """
  from vitjax.trained import load as _load

  return _load(workdir, checkpoint, weights)
