"""Checkpoint checksums' cost on a real state: vitjax.models.checkpoints.checksums (one small jitted program per
array, shared by arrays of one shape, dtype and sharding) against one jitted program over the whole tree (what
vitjax did before 2026-11-27), on ViT-B/16 224's parameters and AdamW state (601 arrays, 86.6 M parameters).

  python experiments/bench_checksums.py [--repeats 3]

Prints each way's first call (trace, compile and run) and its fastest later call (what every save pays), and
checks that both give the same checksums.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import optax

from vitjax import models
from vitjax.models import checkpoints


@jax.jit
def _whole_tree(tree):
  return jax.tree.map(checkpoints._fingerprint.__wrapped__, tree)


def whole_tree(tree) -> dict:
  """The checksums from one program over the tree (the earlier way): the same values."""
  return checkpoints.named_checksums(jax.device_get(_whole_tree(tree)))


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args()
  model = models.ViT(num_classes=1000, patch_size=(16, 16), width=768, depth=12, mlp_dim=3072, num_heads=12)
  params = jax.jit(lambda: model.init(jax.random.key(0), jnp.zeros((1, 224, 224, 3)))["params"])()
  state = {"params": params, "opt_state": optax.adamw(1e-3).init(params)}
  leaves = jax.tree.leaves(state)
  print(f"ViT-B/16 + AdamW: {len(leaves)} arrays, {sum(x.size for x in jax.tree.leaves(params)):,} parameters")
  got = {}
  for name, fn in (
    ("one program over the tree", whole_tree),
    ("one program per array (vitjax)", checkpoints.checksums),
  ):
    t = time.perf_counter()
    got[name] = fn(state)
    first = time.perf_counter() - t
    later = []
    for _ in range(args.repeats):
      t = time.perf_counter()
      fn(state)
      later.append(time.perf_counter() - t)
    print(f"{name:32s} first call {first:6.2f} s, then {1e3 * min(later):6.0f} ms")
  a, b = got.values()
  print("same checksums:", a == b)


if __name__ == "__main__":
  main()
