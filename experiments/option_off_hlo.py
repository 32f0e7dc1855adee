"""Options that are off cost nothing: the compiled program of each model, with every new option at its default, is
the same text as before the options existed.

    python experiments/option_off_hlo.py            # prints one sha256 per model: its training step's StableHLO
    PYTHONPATH=OLD_TREE python experiments/option_off_hlo.py   # the same for another checkout: compare the lines

The step is jax.value_and_grad of the logits' sum (forward and backward) under jit; the text is jax's StableHLO
without debug locations, so only the program counts.
"""

import hashlib

import jax
import jax.numpy as jnp

import vitjax
from vitjax import models

CASES = {  # name: (model name, fields, input shape)
  "vit_s16 at 224 (tok)": ("vit_s16", dict(num_classes=10), (2, 224, 224, 3)),
  "vit_ti16 gap, fc_norm, scan": ("vit_ti16", dict(pool_type="gap", fc_norm=True, scan=True), (2, 64, 64, 3)),
  "vit_ti16 sincos2d, map": ("vit_ti16", dict(posemb="sincos2d", pool_type="map"), (2, 64, 64, 3)),
  "vit_ti16 rel_pos_bias, post-norm": ("vit_ti16", dict(rel_pos_bias=True, norm="post"), (2, 64, 64, 3)),
  "swin_t": ("swin_t", dict(num_classes=10), (2, 224, 224, 3)),
}


def step_text(name: str, fields: dict, shape: tuple) -> str:
  model = models.create(name, **fields)
  x = jnp.zeros(shape)
  variables = jax.eval_shape(model.init, jax.random.key(0), x)

  def loss(v, x):
    return model.apply(v, x)[0].sum()

  return jax.jit(jax.value_and_grad(loss)).lower(variables, x).as_text()


if __name__ == "__main__":
  print(f"vitjax from {vitjax.__file__}, jax {jax.__version__}")
  for case, (name, fields, shape) in CASES.items():
    text = step_text(name, fields, shape)
    print(f"{hashlib.sha256(text.encode()).hexdigest()[:16]}  {len(text):>8} chars  {case}")
