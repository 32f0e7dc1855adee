"""Scaled dot-product attention and the multi-head attention module used by every vitjax model.

Shape letters: B batch, T query length, S key/value length, H heads, K key/query features per head,
V value features per head, D model width.

`dot_product_attention` computes softmax(Q K^T / sqrt(K) + bias) V with boolean masks (True = attend).
It has these implementations behind the `implementation` switch:

* "fast" (default; alias "auto"): on a GPU, `jax.nn.dot_product_attention`, which with bf16/fp16 inputs first
  tries cuDNN's fused kernel and falls back to XLA's when cuDNN's constraints do not hold (head size, bias
  shapes, ...); on other backends "explicit".
* "explicit": the reference's forward pass (bitwise its outputs in float32) with a hand-written backward pass
  that reuses the saved float32 probabilities (dS = P * (dP - rowsum(dO * O))) instead of differentiating the
  softmax; in [B, H, T, K] layout for float32 inputs, on the inputs' [B, T, H, K] layout for bfloat16 / float16
  (where XLA:CPU keeps every dot in bf16 with float32 accumulation, issue 28). On this project's 2-core CPU one
  ViT-S/16 layer's attention at 448 px (785 tokens, batch 2) takes 21 ms forward and 92 ms forward + backward,
  against 47 and 118 ms for XLA's path; at 224 px (batch 8) 24.5 against 26.4 ms forward + backward
  (experiments/README.md, "Training-step speed").
* "xla": `jax.nn.dot_product_attention(implementation="xla")`.
* "reference": the explicit einsum-softmax-einsum, differentiated by JAX. It is also what runs whenever
  attention dropout is active, since the other paths take no dropout, and when K != V.

Fully masked rows (a query that may attend to nothing) give finite outputs in every implementation: the
masked logits are set to a large negative number rather than -inf, so such a row averages the values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from vitjax import dots

Array = jax.Array
IMPLEMENTATIONS = ("fast", "auto", "explicit", "xla", "cudnn", "reference")


def _large_negative(dtype) -> float:
  # The same constant jax.nn.dot_product_attention uses, so both implementations agree exactly.
  return float(0.7 * jnp.finfo(dtype).min)


def _as_4d(x: Array | None) -> Array | None:
  if x is None:
    return None
  x = jnp.asarray(x)
  if x.ndim > 4:
    raise ValueError(f"mask/bias must broadcast to [B, H, T, S]; got rank {x.ndim} shape {x.shape}")
  return x.reshape((1,) * (4 - x.ndim) + x.shape)


def check_mask_bias(q_shape, k_shape, mask, bias) -> None:
  """ValueError of one line for a mask or bias that attention would misread or fail on deep inside.

  A mask is boolean (or integer 0/1), 4-d and broadcastable to [B, H, T, S]: a 2-d padding mask [B, S] would read
  as [T, S] (silently when B == T), and a float mask is most likely an additive one (0 / -inf), which as a boolean
  is inverted. A bias has 2 to 4 dimensions ([T, S], [H, T, S], [B, H, T, S]), right-aligned, that broadcast.
  """
  b, t, h, _ = q_shape
  full = (b, h, t, k_shape[1])
  for name, x in (("mask", mask), ("bias", bias)):
    if x is None:
      continue
    shape, dtype = tuple(np.shape(x)), jnp.result_type(x)
    if name == "mask" and not (jnp.issubdtype(dtype, jnp.bool_) or jnp.issubdtype(dtype, jnp.integer)):
      raise ValueError(
        f"mask is {dtype}: a mask is boolean (True = attend): pass `m == 0` for an additive one (0 where allowed, "
        "-inf where not), or pass that one as bias= (a row that is -inf everywhere then gives NaN, as in any softmax; "
        "a mask keeps such rows finite)"
      )
    if name == "mask" and len(shape) != 4:
      raise ValueError(
        f"mask has shape {shape}; give it 4 dimensions broadcastable to [B, H, T, S] = {list(full)}: a padding mask "
        "[B, S] is m[:, None, None, :] (attention.padding_mask), a [T, S] one m[None, None]"
      )
    if not 2 <= len(shape) <= 4 or any(n not in (1, f) for n, f in zip(shape[::-1], full[::-1])):
      raise ValueError(
        f"{name} has shape {shape}, which does not broadcast to [B, H, T, S] = {list(full)}"
        + (" (a bias of 2 or 3 dimensions is [T, S] or [H, T, S])" if name == "bias" else "")
      )


def causal_mask(length: int, key_length: int | None = None) -> Array:
  """[1, 1, T, S] boolean mask: query t may attend to keys s <= t (S defaults to T)."""
  key_length = length if key_length is None else key_length
  return jnp.tril(jnp.ones((length, key_length), bool))[None, None]


def padding_mask(query_valid: Array | None, key_valid: Array) -> Array:
  """[B, 1, T, S] mask from per-token validity flags: query_valid [B, T] (or None), key_valid [B, S]."""
  key_valid = key_valid.astype(bool)
  if query_valid is None:
    return key_valid[:, None, None, :]
  return query_valid.astype(bool)[:, None, :, None] & key_valid[:, None, None, :]


def attention_weights(
  q: Array, k: Array, *, bias: Array | None = None, mask: Array | None = None, scale: float | None = None
) -> Array:
  """softmax(q k^T scale + bias), masked: float32 [B, H, T, S] (rows sum to 1), as the reference computes it.

  q [B, T, H, K], k [B, S, H, K]; bias and mask as in reference_attention.
  """
  scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
  logits = jnp.einsum("bthk,bshk->bhts", q, k, preferred_element_type=jnp.float32) * scale
  if bias is not None:
    logits = logits + _as_4d(bias).astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(_as_4d(mask), logits, _large_negative(jnp.float32))
  return jax.nn.softmax(logits, axis=-1)


def reference_attention(
  q: Array,
  k: Array,
  v: Array,
  *,
  bias: Array | None = None,
  mask: Array | None = None,
  scale: float | None = None,
  dropout_rate: float = 0.0,
  dropout_rng: Array | None = None,
  deterministic: bool = True,
) -> Array:
  """Explicit attention. q [B, T, H, K], k [B, S, H, K], v [B, S, H, V] -> [B, T, H, V].

  bias: additive, broadcastable to [B, H, T, S]. mask: boolean, broadcastable to [B, H, T, S].
  Logits and softmax are computed in float32 whatever the input dtype.
  """
  weights = attention_weights(q, k, bias=bias, mask=mask, scale=scale)
  if not deterministic and dropout_rate > 0.0:
    if dropout_rng is None:
      raise ValueError("attention dropout needs dropout_rng (pass rngs={'dropout': key} to apply)")
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
    weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
  return jnp.einsum("bhts,bshv->bthv", weights.astype(v.dtype), v)


def _fast_attention(q, k, v, bias, mask, scale, implementation):
  bias, mask = _as_4d(bias), _as_4d(mask)
  if mask is not None:
    mask = mask.astype(bool)
  gpu = jax.default_backend() == "gpu"
  if implementation == "explicit" or (implementation in ("fast", "auto") and not gpu):
    return explicit_attention(q, k, v, bias, mask, scale)
  if bias is not None:
    bias = bias.astype(q.dtype)
  if implementation == "cudnn":
    return cudnn_attention(q, k, v, bias, mask, scale)
  if implementation in ("fast", "auto") and q.dtype in (jnp.bfloat16, jnp.float16):
    try:  # cuDNN refuses at trace time what it cannot run (e.g. head size, bias layouts).
      return cudnn_attention(q, k, v, bias, mask, scale)
    except Exception as e:  # pylint: disable=broad-except
      _fallback_once(f"{type(e).__name__}: {e}".splitlines()[0], q.shape, k.shape)
  return jax.nn.dot_product_attention(q, k, v, bias, mask, scale=scale, implementation="xla")


@functools.lru_cache(maxsize=64)
def _fallback_once(reason: str, q_shape, k_shape) -> None:
  """Logs, once per reason and shapes, that "fast" attention took XLA's path because cuDNN refused."""
  logging.warning("attention: cuDNN refused q %s, k %s (%s); using XLA's attention", q_shape, k_shape, reason)


def cudnn_attention(q, k, v, bias, mask, scale):
  """jax.nn.dot_product_attention's cuDNN kernel, for any sequence lengths (odd ones padded by one).

  jax refuses cuDNN's training kernels (the backward pass) for an odd query or key length (ViT's 197 tokens, Swin's
  49-token windows), so odd lengths are padded by one; the padded keys are masked out (by cuDNN's own padding mask where
  there is no other mask or bias) and the padded query's row is sliced off. Raises at trace time where cuDNN cannot run
  (head size, no cuDNN).
  """
  t, s = q.shape[1], k.shape[1]
  pt, ps = t % 2, s % 2
  call = functools.partial(jax.nn.dot_product_attention, scale=scale, implementation="cudnn")
  if not (pt or ps):
    return call(q, k, v, bias, mask)
  grow = lambda x, n: jnp.pad(x, ((0, 0), (0, n), (0, 0), (0, 0)))
  q, k, v = grow(q, pt), grow(k, ps), grow(v, ps)
  if bias is None and mask is None:  # cuDNN's PADDING mask: no bias tensor at all
    lengths = jnp.full((q.shape[0],), s, jnp.int32)
    return call(q, k, v, query_seq_lengths=jnp.full((q.shape[0],), t, jnp.int32), key_value_seq_lengths=lengths)[:, :t]

  def grow_ts(x, fill):  # [.., .., T or 1, S or 1] -> padded where the dimension is the sequence's
    return jnp.pad(
      x, ((0, 0), (0, 0), (0, pt if x.shape[2] == t else 0), (0, ps if x.shape[3] == s else 0)), constant_values=fill
    )

  key_valid = (jnp.arange(s + ps) < s)[None, None, None, :]
  mask = key_valid if mask is None else jnp.logical_and(grow_ts(mask, False), key_valid)
  bias = None if bias is None else grow_ts(bias, 0)
  return call(q, k, v, bias, mask)[:, :t]


def _heads_first(x):  # [B, T, H, K] <-> [B, H, T, K]
  return jnp.swapaxes(x, 1, 2)


def _explicit_forward(q, k, v, bias, mask, scale):
  # the forward pass is the reference's: the same einsums (bitwise its outputs in float32), except that in bf16 the
  # P V dot returns float32, rounded once (XLA:CPU would compute a bf16-result dot in float32: the same sums)
  logits = jnp.einsum("bthk,bshk->bhts", q, k, preferred_element_type=jnp.float32) * scale
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, _large_negative(jnp.float32))
  e = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
  probs = e / jnp.sum(e, axis=-1, keepdims=True)  # [B, H, T, S] float32
  # a float32 result here only: in the reference, JAX's autodiff of it would give float32 x bf16 backward dots
  out = jnp.einsum("bhts,bshv->bthv", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return out.astype(v.dtype), probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _explicit(q, k, v, bias, mask, scale):
  return _explicit_forward(q, k, v, bias, mask, scale)[0]


def _explicit_fwd(q, k, v, bias, mask, scale):
  out, probs = _explicit_forward(q, k, v, bias, mask, scale)
  # low precision: the backward keeps the rounded weights the P V dot took, half the bytes of float32 ones (and on a
  # CPU no separate conversion pass: 1-4% of the bf16 step, same curve; experiments/README.md, issue 28)
  return out, (q, k, v, probs.astype(v.dtype), out, bias, mask)


def _sum_to(x, shape):
  """Sums x [B, H, T, S] over the axes that a bias of `shape` (4-d) was broadcast along."""
  axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
  return jnp.sum(x, axis=axes, keepdims=True).reshape(shape)


def _explicit_bwd(scale, saved, d_out):
  """The four backward matmuls, in float32 accumulation.

  Float32 inputs: in [B, H, T, K] layout (the fastest on XLA:CPU, issue 13). bfloat16 / float16 inputs: on the inputs'
  [B, T, H, K] layout, which XLA turns into dots whose contracted dimension is the lhs's last; with the [B, H, T, K]
  forms two of the four would contract the lhs's third dimension, and XLA:CPU computes such low-precision dots in
  float32, at a third of the speed (experiments/README.md, issue 28).
  """
  q, k, v, probs, out, bias, mask = saved
  f32 = jnp.float32
  probs = probs.astype(f32)  # [B, H, T, S], saved in v's dtype
  heads_first = q.dtype == f32
  layout = _heads_first if heads_first else (lambda x: x)
  q, k, v, out, d_out = map(layout, (q, k, v, out, d_out.astype(q.dtype)))
  tq, sk, sv = ("bhtk", "bhsk", "bhsv") if heads_first else ("bthk", "bshk", "bshv")
  tv = tq.replace("k", "v")
  d_v = jnp.einsum(f"bhts,{tv}->{sv}", probs.astype(d_out.dtype), d_out, preferred_element_type=f32)
  d_probs = jnp.einsum(f"{tv},{sv}->bhts", d_out, v, preferred_element_type=f32)
  delta = jnp.sum(d_out.astype(f32) * out.astype(f32), axis=-1, keepdims=True)  # rowsum(dO * O)
  if not heads_first:
    delta = _heads_first(delta)  # [B, T, H, 1] -> [B, H, T, 1]
  d_logits = probs * (d_probs - delta)  # softmax's backward: rowsum(P * dP) = rowsum(dO * O)
  if mask is not None:  # masked logits are constants (a fully masked row's uniform weights pass no gradient)
    d_logits = jnp.where(mask, d_logits, 0.0)
  d_bias = None if bias is None else _sum_to(d_logits, bias.shape).astype(bias.dtype)
  d_scaled = (d_logits * scale).astype(q.dtype)
  d_q = jnp.einsum(f"bhts,{sk}->{tq}", d_scaled, k, preferred_element_type=f32)
  d_k = jnp.einsum(f"bhts,{tq}->{sk}", d_scaled, q, preferred_element_type=f32)
  d_mask = None if mask is None else np.zeros(mask.shape, jax.dtypes.float0)
  grads = (d_q.astype(q.dtype), d_k.astype(k.dtype), d_v.astype(v.dtype))
  return (*map(layout, grads), d_bias, d_mask)


_explicit.defvjp(_explicit_fwd, _explicit_bwd)


def explicit_attention(q, k, v, bias=None, mask=None, scale=None):
  """The "explicit" implementation (module docstring).

  q [B, T, H, K], k [B, S, H, K], v [B, S, H, V] -> [B, T, H, V]; bias (additive) and mask (boolean, True = attend) are
  4-d, broadcastable to [B, H, T, S].
  """
  scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else float(scale)
  return _explicit(q, k, v, bias, mask, scale)


def dot_product_attention(
  q: Array,
  k: Array,
  v: Array,
  *,
  bias: Array | None = None,
  mask: Array | None = None,
  scale: float | None = None,
  dropout_rate: float = 0.0,
  dropout_rng: Array | None = None,
  deterministic: bool = True,
  implementation: str = "fast",
) -> Array:
  """softmax(Q K^T * scale + bias) V, masked.

  Args:
    q: queries [B, T, H, K].
    k: keys [B, S, H, K].
    v: values [B, S, H, V].
    bias: additive attention bias broadcastable to [B, H, T, S] (relative positions, ALiBi, ...).
    mask: boolean, 4-d, broadcastable to [B, H, T, S]; True where a query may attend to a key (check_mask_bias).
    scale: defaults to 1/sqrt(K).
    dropout_rate: dropout on the attention weights: the rate.
    dropout_rng: that dropout's PRNG key.
    deterministic: True: no dropout.
    implementation: "fast"/"auto" (GPU: jax.nn.dot_product_attention, cuDNN where possible; elsewhere
      "explicit"), "explicit", "xla", "cudnn" (no fallback), or "reference" (module docstring).

  Returns:
    [B, T, H, V].
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"unknown attention implementation {implementation!r}; use one of {IMPLEMENTATIONS}")
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f"q, k, v must be [B, T, H, K]; got shapes {q.shape}, {k.shape}, {v.shape}")
  if q.shape[-1] != k.shape[-1] or k.shape[:-1] != v.shape[:-1] or (q.shape[0], q.shape[2]) != (k.shape[0], k.shape[2]):
    raise ValueError(
      f"incompatible q/k/v shapes {q.shape}, {k.shape}, {v.shape}: q [B, T, H, K], k [B, S, H, K] and v [B, S, H, V] "
      "share B and H"
    )
  check_mask_bias(q.shape, k.shape, mask, bias)
  dropout = not deterministic and dropout_rate > 0.0
  if implementation == "reference" or dropout or k.shape[-1] != v.shape[-1]:
    return reference_attention(
      q,
      k,
      v,
      bias=bias,
      mask=mask,
      scale=scale,
      dropout_rate=dropout_rate,
      dropout_rng=dropout_rng,
      deterministic=deterministic,
    )
  scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
  return _fast_attention(q, k, v, bias, mask, scale, implementation)


QK_NORMS = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}  # MultiHeadAttention.qk_norm


def apply_rope(x: Array, rope: tuple[Array, Array], half: bool = False) -> Array:
  """Turns each pair of channels (2i, 2i + 1) of x [B, T, H, K] by the angles of rope = (sin, cos).

  sin and cos are [T, K], or [B, T, K] (a subset of patches per example). x * cos + rot(x) * sin with rot(x) = (-x1,
  x0, -x3, x2, ...): rotary position embedding in the interleaved layout (vitjax.posenc.rope_2d); half: in the "half"
  layout instead, channel i with i + K/2, rot(x) = (-x[K/2:], x[:K/2]) (DINOv3's). Computed in float32, returned in
  x's dtype. A row with sin 0 and cos 1 leaves its token as it is, exactly.
  """
  sin, cos = (jnp.asarray(t, jnp.float32)[..., None, :] for t in rope)
  if sin.shape[-3] != x.shape[1] or sin.shape[-1] != x.shape[-1]:
    raise ValueError(f"rotary embedding of {sin.shape[-3]} tokens x {sin.shape[-1]} features for inputs {x.shape}")
  y = x.astype(jnp.float32)
  if half:
    first, second = jnp.split(y, 2, axis=-1)
    turned = jnp.concatenate([-second, first], axis=-1)
  else:
    pairs = y.reshape(*y.shape[:-1], -1, 2)
    turned = jnp.stack([-pairs[..., 1], pairs[..., 0]], -1).reshape(y.shape)
  return (y * cos + turned * sin).astype(x.dtype)


class MultiHeadAttention(nn.Module):
  """Multi-head attention: self-attention (inputs_kv=None) or cross-attention.

  Parameters: query/key/value kernels [D, H, K] (value [D, H, V]) with optional biases [H, K], and
  out kernel [H, V, D_out] with bias [D_out] (the layout of the original JAX ViT).

  With decode=True (self-attention only) the module keeps a KV cache in the "cache" collection. Initialise
  it with a full-length input [B, S_max, D] (flax's convention); then each call appends its tokens
  [B, T, D] at the cache index and attends causally to everything cached so far, so feeding a sequence a
  token at a time gives the outputs of one causal pass (but for a query whose every key a caller's mask hides: that
  row's output is a convention, the mean of the values attended over, here the whole cache's slots, empty ones
  included). A call past the cache's length returns NaN.

  Attributes:
    num_heads: H.
    qk_features, v_features: per-head K and V (default D // H).
    out_features: D_out (default D).
    qkv_bias: biases on the q/k/v projections. out_bias: bias on the output projection. key_bias: False leaves the key
      projection's out, where qkv_bias would give it one (EVA-02's; it matters only with rope: the softmax ignores a
      bias that shifts all of a query's logits alike).
    dropout_rate: dropout on the attention weights.
    implementation: see dot_product_attention.
    deterministic: no dropout when True.
    qk_norm: "layernorm" or "rmsnorm" normalises each head's queries and keys over their K features ("q_norm",
      "k_norm", shared by the heads; Dehghani et al. 2023, timm's qk_norm) before they meet; None: not.
    qk_norm_eps: its epsilon.
    inner_norm: a LayerNorm ("norm", epsilon qk_norm_eps) over the heads' outputs [H * V], before the output
      projection (EVA-02 CLIP's sub-LayerNorm, timm's scale_attn_inner).
  """

  num_heads: int
  qk_features: int | None = None
  v_features: int | None = None
  out_features: int | None = None
  qkv_bias: bool = True
  out_bias: bool = True
  key_bias: bool = True
  dropout_rate: float = 0.0
  decode: bool = False
  implementation: str = "fast"
  deterministic: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Callable = nn.initializers.xavier_uniform()
  bias_init: Callable = nn.initializers.zeros
  qk_norm: str | None = None
  qk_norm_eps: float = 1e-6
  inner_norm: bool = False
  rope_half: bool = False

  @nn.compact
  def __call__(
    self,
    inputs_q: Array,
    inputs_kv: Array | None = None,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    rope: tuple[Array, Array] | None = None,
  ) -> Array:
    """inputs_q [B, T, D], inputs_kv [B, S, D_kv] or None -> [B, T, D_out].

    Long: every option of the one attention function (masks, biases, the KV cache, cross-attention, the fused
    kernels) is read in one place; the projections (_project) and the output (_output) are apart.

    mask: boolean, broadcastable to [B, H, T, S] (True = attend). bias: broadcastable to [B, H, T, S].
    rope: (sin, cos) [T, K] turn the queries and keys (apply_rope; rope_half: its half layout) after qk_norm, before
      they meet (self-attention).
    """
    d = inputs_q.shape[-1]
    if d % self.num_heads and (self.qk_features is None or self.v_features is None):
      raise ValueError(
        f"model width {d} is not divisible by num_heads={self.num_heads}; choose a width "
        "that is, or set qk_features and v_features"
      )
    q, k, v = self._project(inputs_q, inputs_kv, rope)

    if self.decode:
      if inputs_kv is not None:
        raise ValueError("decode=True is for self-attention; cross-attention needs no cache")
      k, v, cache_mask, overflow = self._update_cache(k, v)
      if cache_mask is not None:  # None while the cache is being initialised.
        mask = cache_mask if mask is None else jnp.logical_and(_as_4d(mask), cache_mask)

    dropout_rng = None
    if not self.deterministic and self.dropout_rate > 0.0:
      dropout_rng = self.make_rng("dropout")
    if (
      self.implementation == "reference" and self.is_mutable_collection("intermediates") and not self.is_initializing()
    ):
      # what vitjax.attention_maps draws: the reference path's weights, before any attention dropout; only computed when
      # a caller of apply asks for intermediates (init, where every collection is mutable, must not add them)
      self.sow("intermediates", "attention_weights", attention_weights(q, k, bias=bias, mask=mask))
    x = dot_product_attention(
      q,
      k,
      v,
      bias=bias,
      mask=mask,
      dropout_rate=self.dropout_rate,
      dropout_rng=dropout_rng,
      deterministic=self.deterministic,
      implementation=self.implementation,
    )
    if self.decode and overflow is not None:  # past the cache's end: NaN, not a silently overwritten last slot
      x = jnp.where(overflow, jnp.nan, x)
    return self._output(x, d)

  # The phases of __call__ (their submodules are the attention's own, named as before).

  def _project(self, inputs_q: Array, inputs_kv: Array | None, rope) -> tuple[Array, Array, Array]:
    """Queries q [B, T, H, K], keys k [B, S, H, K], values v [B, S, H, V]: projected, qk_norm, the rotary embedding."""
    d = inputs_q.shape[-1]
    qk = self.qk_features or d // self.num_heads
    vf = self.v_features or d // self.num_heads
    dense = functools.partial(
      dots.DenseGeneral,
      axis=-1,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      kernel_init=self.kernel_init,
      bias_init=self.bias_init,
      use_bias=self.qkv_bias,
    )
    kv_in = inputs_q if inputs_kv is None else inputs_kv
    q = dense(features=(self.num_heads, qk), name="query")(inputs_q)
    k = dense(features=(self.num_heads, qk), use_bias=self.qkv_bias and self.key_bias, name="key")(kv_in)
    v = dense(features=(self.num_heads, vf), name="value")(kv_in)
    if self.qk_norm is not None:
      if self.qk_norm not in QK_NORMS:
        raise ValueError(f"unknown qk_norm {self.qk_norm!r}; use one of {', '.join(map(repr, QK_NORMS))} or None")
      norm = functools.partial(QK_NORMS[self.qk_norm], epsilon=self.qk_norm_eps, dtype=self.dtype)
      q, k = norm(name="q_norm")(q), norm(name="k_norm")(k)
    if rope is not None:
      if inputs_kv is not None or self.decode:
        raise ValueError("rotary position embedding (rope) is for self-attention without a KV cache")
      q, k = apply_rope(q, rope, self.rope_half), apply_rope(k, rope, self.rope_half)
    return q, k, v

  def _output(self, x: Array, d: int) -> Array:
    """The heads' outputs x [B, T, H, V] -> [B, T, D_out]: the optional sub-LayerNorm, then the output projection."""
    if self.inner_norm:
      norm = nn.LayerNorm(epsilon=self.qk_norm_eps, dtype=self.dtype, name="norm")
      x = norm(x.reshape(*x.shape[:-2], -1)).reshape(x.shape)
    return dots.DenseGeneral(
      features=self.out_features or d,
      axis=(-2, -1),
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      kernel_init=self.kernel_init,
      bias_init=self.bias_init,
      use_bias=self.out_bias,
      name="out",
    )(x)

  def _update_cache(self, k: Array, v: Array):
    """Writes k, v [B, T, H, *] at the cache index; returns the whole cache, its [1, 1, T, S] mask, and overflow.

    overflow: whether this call writes past the cache's length S_max (traced: the index is); the module then
    returns NaN, since jax would clamp the write onto the last slots. T > S_max is a ValueError.
    """
    initialised = self.has_variable("cache", "cached_key")
    cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialised:
      return k, v, None, None
    batch, steps = k.shape[0], k.shape[1]
    max_len = cached_k.value.shape[1]
    if cached_k.value.shape[0] != batch:
      raise ValueError(f"cache was initialised for batch {cached_k.value.shape[0]}, called with {batch}")
    if steps > max_len:
      raise ValueError(f"cache holds {max_len} tokens; called with {steps} at once")
    i = index.value
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k.astype(cached_k.value.dtype), (0, i, 0, 0))
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v.astype(cached_v.value.dtype), (0, i, 0, 0))
    index.value = i + steps
    query_pos = i + jnp.arange(steps)
    mask = jnp.arange(max_len)[None, :] <= query_pos[:, None]  # [T, S]
    return cached_k.value, cached_v.value, mask[None, None], i + steps > max_len
