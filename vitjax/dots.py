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
A layer whose parameters hold a low-rank adapter (lora_a, lora_b, lora_scale: vitjax.models.lora) adds its term.
`Conv` is flax's convolution whose backward on a CPU, for strided and 1x1 ones (patch embeddings, stems), is matmuls.
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
    """Applies the layer: float [..., K] -> [..., features] in the layer's dtype.

    A bfloat16 / float16 layer on a CPU, with its parameters initialised, runs `affine`; every other call is flax's
    Dense.
    """
    if not _own_path(self):
      return adapted(self, inputs, _flax_call(nn.Dense, self, inputs), 1)
    return adapted(self, inputs, _apply(self, inputs, (inputs.shape[-1],), (self.features,)), 1)


class DenseGeneral(nn.DenseGeneral):
  """flax.linen.DenseGeneral; x [..., K...] -> [..., features...] when `axis` names x's last dims.

  The case vitjax's layers use; others, and batch_dims, go to flax's.
  """

  @nn.compact
  def __call__(self, inputs):
    """Applies the layer: float [..., K...] -> [..., features...] in the layer's dtype.

    A bfloat16 / float16 layer on a CPU, with its parameters initialised, whose `axis` names the input's trailing
    dimensions and that has no batch_dims runs `affine`; every other call is flax's DenseGeneral.
    """
    axis = tuple(sorted(a % inputs.ndim for a in np.atleast_1d(self.axis)))
    trailing = axis == tuple(range(inputs.ndim - len(axis), inputs.ndim))
    if not _own_path(self) or self.batch_dims or not trailing:
      y = _flax_call(nn.DenseGeneral, self, inputs)
    else:
      features = tuple(np.atleast_1d(self.features).tolist())
      y = _apply(self, inputs, inputs.shape[inputs.ndim - len(axis) :], features)
    return adapted(self, inputs, y, len(axis))


ADAPTER = ("lora_a", "lora_b", "lora_scale")  # a low-rank adapter's parameters beside its layer's kernel


def adapted(layer, inputs, y, contracted: int):
  """The layer's output y plus's low-rank adapter's term where its parameters hold one (vitjax.models.lora adds them).

  y + scale * (x @ lora_a) @ lora_b, in y's dtype: x [..., K...] (`contracted` trailing dims), lora_a [K..., r],
  lora_b [r, N...], lora_scale [] (alpha / r). A layer without them (every layer unless config.lora) is unchanged.
  With lora_dropout [] (config.lora.dropout > 0) and a "dropout" RNG (training), x is dropped out on the adapter's
  path only (PEFT's lora_dropout); evaluation has no such RNG.
  """
  if not layer.has_variable("params", "lora_a"):
    return y
  a, b, scale = (layer.get_variable("params", name) for name in ADAPTER)
  x = inputs.astype(y.dtype)
  if layer.has_variable("params", "lora_dropout") and layer.has_rng("dropout"):  # training (config.lora.dropout)
    keep = 1.0 - layer.get_variable("params", "lora_dropout").astype(y.dtype)
    x = jnp.where(jax.random.bernoulli(layer.make_rng("dropout"), keep, x.shape), x / keep, 0.0).astype(y.dtype)
  h = jnp.tensordot(x, a.astype(y.dtype), axes=contracted)  # [..., r]
  return y + scale.astype(y.dtype) * jnp.tensordot(h, b.astype(y.dtype), axes=1)


class Conv(nn.Conv):
  """flax.linen.Conv; x [B, H, W, C] -> [B, H', W', features].

  On a CPU, a 2-D convolution with strides >= 2 or equal to its kernel (patch embeddings, a convolutional stem's
  stride-2 3x3 and 1x1 projection) is `strided_conv`: its float32 forward is flax's (XLA's convolution), its backward,
  and a bfloat16 forward, are matmuls over the input's patches. XLA:CPU runs these convolutions' backward at a third of
  its matmuls' rate, and every convolution in float32 (experiments/README.md, issue 28). Other convolutions, and every
  one off a CPU, are flax's.
  """

  @nn.compact
  def __call__(self, inputs):
    """Applies the convolution: float [B, H, W, C] -> [B, H', W', features].

    On a CPU, a 2-D convolution with strides >= 2 or strides equal to its kernel runs `strided_conv` (a bfloat16 /
    float16 one with the float32 parameters, its bias added in float32); every other call is flax's Conv.
    """
    plan = _conv_plan(self, inputs)
    if plan is None:
      return _flax_call(nn.Conv, self, inputs)
    kh, kw = self.kernel_size
    kernel = self.param("kernel", self.kernel_init, (kh, kw, inputs.shape[-1], self.features), self.param_dtype)
    bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
    x, k, b = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)  # flax's dtype rule
    if x.dtype in LOW_PRECISION:  # the float32 parameters themselves: strided_conv adds the bias in float32
      k, b = kernel, bias
    return strided_conv(x, k, b, *plan)


def _conv_plan(layer, inputs):
  """(strides, ((top, bottom), (left, right)) padding) for `strided_conv`, or None where flax's layer runs."""
  if isinstance(layer.kernel_size, int):  # flax's 1-D convolution
    return None
  ks, st = tuple(layer.kernel_size), layer.strides
  st = (st,) * len(ks) if isinstance(st, int) else tuple(st or (1,) * len(ks))
  ones = lambda d: d is None or tuple(np.atleast_1d(d).tolist()) in ((1,), (1,) * len(ks))
  plain = (
    jax.default_backend() == "cpu"
    and inputs.ndim == 4
    and len(ks) == 2
    and (min(st) >= 2 or ks == st)  # strided, or patchify / 1x1
    and jnp.dtype(layer.dtype or jnp.result_type(inputs, layer.param_dtype)) in (jnp.float32, *LOW_PRECISION)
    and layer.feature_group_count == 1
    and ones(layer.input_dilation)
    and ones(layer.kernel_dilation)
    and layer.mask is None
    and layer.precision is None
    and layer.conv_general_dilated is None
    and layer.conv_general_dilated_cls is None
    and layer.has_variable("params", "kernel")
    and not layer.is_initializing()
  )
  p = layer.padding
  if not plain or (isinstance(p, str) and p not in ("VALID", "SAME")):
    return None
  if isinstance(p, str):
    pads = jax.lax.padtype_to_pads(inputs.shape[1:3], ks, st, p)
  elif isinstance(p, int):
    pads = ((p, p), (p, p))
  elif len(p) == 2 and all(isinstance(q, int) for q in p):
    pads = tuple((q, q) for q in p)
  elif len(p) == 2 and all(not isinstance(q, int) and len(q) == 2 for q in p):
    pads = tuple(tuple(q) for q in p)
  else:
    return None
  pads = tuple(tuple(int(v) for v in q) for q in pads)
  out = [(n + lo + hi - k) // s + 1 for n, (lo, hi), k, s in zip(inputs.shape[1:3], pads, ks, st)]
  if min(min(q) for q in pads) < 0 or min(out) < 1:  # cropping, or an empty output: flax's
    return None
  return st, pads


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def strided_conv(x, w, b, strides, pads):
  """Strided convolution: x [B, H, W, C] (*) w [kh, kw, C, O] + b [O] -> [B, H', W', O] in x's dtype.

  In float32 XLA's convolution, in bfloat16 / float16 the patches' matmul (`_patches`; float32 accumulation, the bias
  added in float32, one rounding). Backward: the patches' matmuls; gradients of x in x's dtype, of w and b in theirs. b
  may be None.
  """
  return _strided_conv_fwd(x, w, b, strides, pads)[0]


def _strided_conv_fwd(x, w, b, strides, pads):
  if x.dtype in LOW_PRECISION:  # XLA:CPU convolves in float32 whatever the operands: the patches' bf16 matmul instead
    p = _patches(x, w.shape[:2], strides, pads)  # [B, H', W', kh * kw * C], kept for the backward
    y = _dot(p.reshape(-1, p.shape[-1]), w.reshape(-1, w.shape[-1]).astype(x.dtype), (1, 0))
    y = y.reshape(p.shape[:3] + w.shape[-1:])
  else:  # float32 (w and b promoted to it): flax's convolution itself
    p, dn = None, ("NHWC", "HWIO", "NHWC")
    y = jax.lax.conv_general_dilated(x, w, strides, pads, dimension_numbers=dn)
  if b is not None:
    y = y + b.astype(y.dtype)
  return y.astype(x.dtype), (x, w, b, p)


def _strided_conv_bwd(strides, pads, saved, g):
  x, w, b, p = saved
  kh, kw, c, o = w.shape
  p = _patches(x, (kh, kw), strides, pads) if p is None else p  # [B, H', W', kh * kw * C]
  p2, g2, w2 = p.reshape(-1, kh * kw * c), g.reshape(-1, o).astype(x.dtype), w.reshape(-1, o).astype(x.dtype)
  dp = _dot(g2, w2, (1, 1)).reshape(p.shape)  # float32, scattered back onto x's positions in float32
  to_x = jax.linear_transpose(lambda z: _patches(z, (kh, kw), strides, pads), jax.ShapeDtypeStruct(x.shape, dp.dtype))
  return (to_x(dp)[0].astype(x.dtype), *_parameter_gradients(p2, g2, w, b))


def _patches(x, kernel, strides, pads):
  """A convolution's input patches: x [B, H, W, C] -> [B, H', W', kh * kw * C], in the kernel's (kh, kw, C) order."""
  (kh, kw), (sh, sw) = kernel, strides
  x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
  n, c, ho, wo = x.shape[0], x.shape[3], (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
  if (kh, kw) == (sh, sw):  # patchify: the patches are x itself, reordered
    x = x[:, : ho * kh, : wo * kw].reshape(n, ho, kh, wo, kw, c)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(n, ho, wo, kh * kw * c)
  cols = [x[:, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw] for i in range(kh) for j in range(kw)]
  return jnp.concatenate(cols, axis=-1)


strided_conv.defvjp(_strided_conv_fwd, _strided_conv_bwd)


def _own_path(layer) -> bool:
  """Whether vitjax's path runs: a low-precision layer on a CPU, applied to parameters that exist.

  At init, and wherever a caller sets flax's dot_general, dot_general_cls or precision, flax's layer runs.
  """
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
  """Affine map: x [..., K...] @ w [K..., N...] + b [N...] -> [..., N...] in x's dtype.

  Contracts x's last n dims with w's first n; the matmul in x's dtype with float32 accumulation, the bias added in
  float32, one rounding. b may be None. Gradients: x's in x's dtype, w's and b's in their own (float32 parameters get
  float32 sums).
  """
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
  return (dx, *_parameter_gradients(x2, g2, w, b))


def _parameter_gradients(x2, g2, w, b):
  """The gradients of w and b in y2 = x2 [M, K] @ w (reshaped [K, N]) + b [N], given g2 [M, N].

  Float32 sums in the parameters' own dtypes and shapes (b may be None).
  """
  dw = _weight_gradient(x2, g2).astype(w.dtype).reshape(w.shape)
  db = None if b is None else jnp.sum(g2, axis=0, dtype=jnp.float32).astype(b.dtype).reshape(b.shape)
  return dw, db


def _weight_gradient(x2, g2):
  """Weight gradient: x2 [M, K]^T @ g2 [M, N] -> float32 [K, N].

  For low-precision operands, written with M split in two contracted dimensions when M is even: XLA then transposes x2
  into [K, M] (in bf16) and runs a bf16 dot; the same dot written [M, K] x [M, N] it computes in float32, 2.0-2.5x
  slower (ViT-S / Swin-T shapes, experiments/README.md, issue 28). Float32 operands take the plain dot (the split gains
  nothing there).
  """
  m = x2.shape[0]
  rows = (2, m // 2) if m % 2 == 0 and x2.dtype in LOW_PRECISION else (m,)
  contract = tuple(range(len(rows)))
  x3, g3 = x2.reshape(rows + x2.shape[1:]), g2.reshape(rows + g2.shape[1:])
  return jax.lax.dot_general(x3, g3, ((contract, contract), ((), ())), preferred_element_type=jnp.float32)


affine.defvjp(_affine_fwd, _affine_bwd)


def tied_logits(embed: nn.Embed, x):
  """Output logits through a tied embedding: x [..., D] @ embed.embedding [V, D]^T -> float32 [..., V].

  flax's `attend` on float32 x (as flax's wmt example computes them), except for a low-precision x on a CPU: then
  `logits` below, one matmul with x's dtype as operands and float32 accumulation and result (XLA:CPU runs the float32
  matmul at about half the rate, the transformer's largest dots: experiments/README.md, issue 28).
  """
  if not low_precision_on_cpu(x.dtype) or (embed.dtype is not None and not low_precision_on_cpu(embed.dtype)):
    return embed.attend(x.astype(jnp.float32))
  return logits(x, embed.embedding)


@jax.custom_vjp
def logits(x, table):
  """Logits: x [..., D] @ table [V, D]^T -> float32 [..., V]; the matmul in x's dtype with float32 accumulation.

  Gradients: x's in x's dtype, the table's in its own dtype (float32 sums of x's-dtype products).
  """
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
