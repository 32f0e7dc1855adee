"""vitjax's Dense layers: flax's, except that a bfloat16 / float16 layer on a CPU runs its matmul and bias as one op.

A flax Dense layer with dtype=bfloat16 calls lax.dot_general on bfloat16 operands with a bfloat16 result and adds a
bfloat16 bias. XLA's CPU backend runs such dots in float32 (160 GFLOP/s against 337 for bfloat16 inputs with a
float32 result on this project's AVX-512 EPYC with avx512_bf16), JAX differentiates them into dots with a float32
operand, slower still, and the bias gradient (a bfloat16 sum with float32 accumulation) becomes a tree of
reduce-windows (experiments/README.md, issue 28). `Dense` and `DenseGeneral` here are flax's layers (same fields,
same parameters, same initialisation: flax creates them) whose low-precision CPU path is `affine`: one custom-VJP op
whose forward and both backward matmuls take the layer's bf16 operands and accumulate in float32, with the bias added
in float32 and the result rounded once; the kernel and bias gradients come out in float32, unrounded. Elsewhere
(float32 layers, GPUs and TPUs, whose bfloat16 dots accumulate in float32 already) they are flax's layers unchanged.
`tied_logits` does the same for a Transformer's output logits through its tied embedding (a float32 result there).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

LOW_PRECISION = (jnp.bfloat16, jnp.float16)


def low_precision_on_cpu(dtype) -> bool:
  """Whether a layer computing in `dtype` takes vitjax's own path (see the module docstring)."""
  return dtype is not None and jnp.dtype(dtype) in LOW_PRECISION and jax.default_backend() == "cpu"


class Dense(nn.Dense):
  """flax.linen.Dense; x [..., K] -> [..., features]."""

  @nn.compact
  def __call__(self, inputs):
    if not _own_path(self):
      return _flax_call(nn.Dense, self, inputs)
    return _apply(self, inputs, (inputs.shape[-1],), (self.features,))


class DenseGeneral(nn.DenseGeneral):
  """flax.linen.DenseGeneral; x [..., K...] -> [..., features...] when `axis` names x's last dims (the case vitjax's
  layers use; others, and batch_dims, go to flax's)."""

  @nn.compact
  def __call__(self, inputs):
    axis = tuple(sorted(a % inputs.ndim for a in np.atleast_1d(self.axis)))
    trailing = axis == tuple(range(inputs.ndim - len(axis), inputs.ndim))
    if not _own_path(self) or self.batch_dims or not trailing:
      return _flax_call(nn.DenseGeneral, self, inputs)
    features = tuple(np.atleast_1d(self.features).tolist())
    return _apply(self, inputs, inputs.shape[inputs.ndim - len(axis) :], features)


def _own_path(layer) -> bool:
  """vitjax's path: a low-precision layer on a CPU, applied to parameters that exist (at init, and wherever a caller
  sets flax's dot_general, dot_general_cls or precision, flax's layer runs)."""
  custom = layer.dot_general is not None or layer.dot_general_cls is not None or layer.precision is not None
  exists = layer.has_variable("params", "kernel")
  return low_precision_on_cpu(layer.dtype) and exists and not custom and not layer.is_initializing()


def _flax_call(cls, layer, inputs):  # the parent's __call__ unwrapped: flax's method hooks run once, not twice
  return cls.__call__.__wrapped__(layer, inputs)


def _apply(layer, inputs, contracted: tuple, features: tuple):
  # layer.param returns the existing parameters (unboxed), checking their shapes as flax's layer does
  kernel = layer.param("kernel", layer.kernel_init, tuple(contracted) + features, layer.param_dtype)
  bias = layer.param("bias", layer.bias_init, features, layer.param_dtype) if layer.use_bias else None
  return affine(inputs.astype(layer.dtype), kernel, bias, len(contracted))


def _dot(a, b, contract):  # 2-D, float32 result
  return jax.lax.dot_general(a, b, ((contract[:1], contract[1:]), ((), ())), preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def affine(x, w, b, n):
  """x [..., K...] @ w [K..., N...] + b [N...] -> [..., N...] in x's dtype, contracting x's last n dims with w's
  first n; the matmul in x's dtype with float32 accumulation, the bias added in float32, one rounding. b may be
  None. Gradients: x's in x's dtype, w's and b's in their own (float32 parameters get float32 sums)."""
  return _affine_fwd(x, w, b, n)[0]


def _affine_fwd(x, w, b, n):
  k = int(np.prod(w.shape[:n]))
  x2, w2 = x.reshape(-1, k), w.reshape(k, -1).astype(x.dtype)
  y = _dot(x2, w2, (1, 0))
  if b is not None:
    y = y + b.reshape(1, -1).astype(jnp.float32)
  y = y.astype(x.dtype).reshape(x.shape[: x.ndim - n] + w.shape[n:])
  return y, (x, w, w2, b)  # w and b: the parameters themselves (kept alive anyway), for their shapes and dtypes


def _affine_bwd(n, saved, g):
  x, w, w2, b = saved
  x2 = x.reshape(-1, w2.shape[0])
  g2 = g.reshape(x2.shape[0], w2.shape[1]).astype(x.dtype)
  dx = _dot(g2, w2, (1, 1)).astype(x.dtype).reshape(x.shape)  # [M, N] x [K, N] -> [M, K]
  dw = _weight_gradient(x2, g2).astype(w.dtype).reshape(w.shape)
  db = None if b is None else jnp.sum(g2, axis=0, dtype=jnp.float32).astype(b.dtype).reshape(b.shape)
  return dx, dw, db


def _weight_gradient(x2, g2):
  """x2 [M, K]^T @ g2 [M, N] -> float32 [K, N]. Written with M split in two contracted dimensions when M is even:
  XLA then transposes x2 into [K, M] (in bf16) and runs a bf16 dot; the same dot written [M, K] x [M, N] it computes
  in float32, 2.0-2.5x slower (ViT-S / Swin-T shapes, experiments/README.md, issue 28)."""
  m = x2.shape[0]
  rows = (2, m // 2) if m % 2 == 0 else (m,)
  contract = tuple(range(len(rows)))
  x3, g3 = x2.reshape(rows + x2.shape[1:]), g2.reshape(rows + g2.shape[1:])
  return jax.lax.dot_general(x3, g3, ((contract, contract), ((), ())), preferred_element_type=jnp.float32)


affine.defvjp(_affine_fwd, _affine_bwd)


def tied_logits(embed: nn.Embed, x):
  """Output logits through a tied embedding: x [..., D] @ embed.embedding [V, D]^T -> float32 [..., V].

  flax's `attend` on float32 x (as flax's wmt example computes them), except for a low-precision x on a CPU: then
  `logits` below, one matmul with x's dtype as operands and float32 accumulation and result (XLA:CPU runs the float32
  matmul at about half the rate, the transformer's largest dots: experiments/README.md, issue 28)."""
  if not low_precision_on_cpu(x.dtype):
    return embed.attend(x.astype(jnp.float32))
  return logits(x, embed.embedding)


@jax.custom_vjp
def logits(x, table):
  """x [..., D] @ table [V, D]^T -> float32 [..., V]; the matmul in x's dtype with float32 accumulation. Gradients:
  x's in x's dtype, the table's in its own dtype (float32 sums of x's-dtype products)."""
  return _logits_fwd(x, table)[0]


def _logits_fwd(x, table):
  t2 = table.astype(x.dtype)
  y = _dot(x.reshape(-1, table.shape[1]), t2, (1, 1)).reshape(x.shape[:-1] + table.shape[:1])
  return y, (x, table, t2)


def _logits_bwd(saved, g):
  x, table, t2 = saved
  x2, g2 = x.reshape(-1, table.shape[1]), g.reshape(-1, table.shape[0]).astype(x.dtype)
  dx = _dot(g2, t2, (1, 0)).astype(x.dtype).reshape(x.shape)  # [M, V] x [V, D] -> [M, D]
  return dx, _weight_gradient(g2, x2).astype(table.dtype)  # [M, V]^T [M, D] -> [V, D]


logits.defvjp(_logits_fwd, _logits_bwd)
