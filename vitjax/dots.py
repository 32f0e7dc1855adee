"""The matmul of vitjax's Dense layers: float32 accumulation for bfloat16 / float16 layers on a CPU.

A flax Dense layer with dtype=bfloat16 calls lax.dot_general on bfloat16 operands and gets a bfloat16 result. XLA's
CPU backend runs such dots at float32's speed or below (160 GFLOP/s against float32's 173 on this project's AVX-512
EPYC with avx512_bf16), and JAX differentiates them into dots with a float32 operand, slower still; bfloat16 inputs
with a float32 result run at 337 (experiments/README.md, issue 28). `dense_dot_general(dtype)` gives the attention
and MLP projections (flax's `dot_general=` argument; the heads keep flax's) a dot whose forward and both backward
matmuls take the layer's low-precision operands and accumulate in float32, then round once to the layer's dtype: a
faster step there, and sums no less exact. Elsewhere (float32 layers, GPUs and TPUs, whose bfloat16 dots accumulate
in float32 already) it is lax.dot_general itself.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

LOW_PRECISION = (jnp.bfloat16, jnp.float16)


def dense_dot_general(dtype):
  """The dot_general for a Dense / DenseGeneral layer computing in `dtype` (see the module docstring)."""
  low = dtype is not None and jnp.dtype(dtype) in LOW_PRECISION
  return f32_accumulating_dot_general if low and jax.default_backend() == "cpu" else jax.lax.dot_general


def f32_accumulating_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kw):
  """lax.dot_general's signature. A Dense layer's contraction (lhs's last n dims with rhs's first n, no batch
  dimensions; bfloat16 / float16 operands of one dtype) goes through `_matmul`; anything else to lax.dot_general."""
  (lc, rc), (lb, rb) = dimension_numbers
  n = len(lc)
  dense = (
    not lb
    and not rb
    and tuple(lc) == tuple(range(lhs.ndim - n, lhs.ndim))
    and tuple(rc) == tuple(range(n))
    and lhs.dtype == rhs.dtype
    and lhs.dtype in LOW_PRECISION
    and preferred_element_type in (None, lhs.dtype)
  )
  if not dense:
    return jax.lax.dot_general(
      lhs, rhs, dimension_numbers, precision=precision, preferred_element_type=preferred_element_type, **kw
    )
  return _matmul(lhs, rhs, n)


def _flat(x, w, n):  # x [..., K...] -> [M, K], w [K..., N...] -> [K, N]
  k = int(np.prod(w.shape[:n]))
  return x.reshape(-1, k), w.reshape(k, -1)


def _dot(a, b, contract):  # 2-D, float32 result
  return jax.lax.dot_general(a, b, ((contract[:1], contract[1:]), ((), ())), preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(x, w, n):
  """x [..., K...] @ w [K..., N...] -> [..., N...] in x's dtype, contracting x's last n dims with w's first n."""
  return _matmul_fwd(x, w, n)[0]


def _matmul_fwd(x, w, n):
  x2, w2 = _flat(x, w, n)
  y = _dot(x2, w2, (1, 0)).astype(x.dtype)
  return y.reshape(x.shape[: x.ndim - n] + w.shape[n:]), (x, w)


def _matmul_bwd(n, saved, g):
  x, w = saved
  x2, w2 = _flat(x, w, n)
  g2 = g.reshape(x2.shape[0], w2.shape[1]).astype(x.dtype)
  dx = _dot(g2, w2, (1, 1)).astype(x.dtype)  # [M, N] x [K, N] -> [M, K]
  dw = _dot(x2, g2, (0, 0)).astype(w.dtype)  # [M, K] x [M, N] -> [K, N]
  return dx.reshape(x.shape), dw.reshape(w.shape)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)
