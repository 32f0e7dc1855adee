"""Square-matmul GFLOP/s of JAX on this backend in float32, bfloat16, and bfloat16 inputs with float32
accumulation, under whatever XLA_FLAGS are set: is bf16 compute faster here?

    taskset -c 0,1 python experiments/matmul_dtypes.py
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=dot taskset -c 0,1 python experiments/matmul_dtypes.py
"""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np


def median_s(f, *args, n=5):
  f(*args).block_until_ready()
  times = []
  for _ in range(n):
    t = time.perf_counter()
    f(*args).block_until_ready()
    times.append(time.perf_counter() - t)
  return sorted(times)[n // 2]


def main(n=2048):
  r = np.random.RandomState(0)
  a, b = (jnp.asarray(r.randn(n, n).astype(np.float32)) for _ in range(2))
  a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  mm = jax.jit(lambda x, y: x @ y)
  acc = jax.jit(lambda x, y: jax.lax.dot(x, y, preferred_element_type=jnp.float32))
  gflop = 2 * n**3 / 1e9
  rates = {
    "f32": gflop / median_s(mm, a, b),
    "bf16": gflop / median_s(mm, a16, b16),
    "bf16->f32": gflop / median_s(acc, a16, b16),
  }
  print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} n={n}: " + ", ".join(f"{k} {v:.0f}" for k, v in rates.items()))


if __name__ == "__main__":
  main()
