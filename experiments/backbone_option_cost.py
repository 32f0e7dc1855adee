"""What DINOv2's options cost on the training step: vitjax's own step (value_and_grad + AdamW, jitted, donated) of
ViT-S/14 at 224 px, batch 8, plain and with each option, timed interleaved (median of --repeats).

    taskset -c 0,1 python experiments/backbone_option_cost.py --repeats=3
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vitjax import models

CASES = {
  "S/14 plain (257 tokens)": ("S/14", {}),
  "S/14 + LayerScale": ("S/14", dict(init_values=1e-5)),
  "S/14 + 4 registers, patches-only table": ("S/14", dict(num_registers=4, class_posemb=False)),
  "dinov2_s14_reg4": ("dinov2_s14_reg4", {}),
  "eva02_s14": ("eva02_s14", {}),
}


def compiled(name: str, fields: dict, x, y):
  model = models.create(name, num_classes=1000, **fields)
  params = model.init(jax.random.key(0), x[:1])["params"]
  tx = optax.adamw(1e-3, weight_decay=0.05)

  def step(p, o, x, y):
    loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, x)[0], y).mean()
    value, grads = jax.value_and_grad(loss)(p)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), o, value

  return jax.jit(step, donate_argnums=(0, 1)), [params, tx.init(params)]


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args()
  x = jnp.asarray(np.random.RandomState(0).randn(8, 224, 224, 3).astype(np.float32))
  y = jnp.zeros((8,), jnp.int32)
  steps = {case: compiled(*spec, x, y) for case, spec in CASES.items()}
  for f, state in steps.values():  # the first call of each, after compilation
    state[0], state[1], loss = f(*state, x, y)
    jax.block_until_ready(loss)
  times = {case: [] for case in CASES}
  for _ in range(args.repeats):
    for case, (f, state) in steps.items():
      t = time.perf_counter()
      state[0], state[1], loss = f(*state, x, y)
      jax.block_until_ready(loss)
      times[case].append(time.perf_counter() - t)
  for case, ts in times.items():
    print(f"{np.median(ts) * 1000:8.0f} ms  {case}  {[round(t * 1000) for t in ts]}")


if __name__ == "__main__":
  main()
