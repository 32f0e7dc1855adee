"""Transformer building blocks: FFN, stochastic depth, encoder and decoder blocks, and their stacks.

Every block takes `deterministic` as an attribute (not a call argument), so blocks can be wrapped by
`nn.remat` and `nn.scan` without static-argument bookkeeping. Shapes: B batch, T target/query length,
S source length, D width.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vitjax import dots
from vitjax.attention import MultiHeadAttention, causal_mask
from vitjax.posenc import RelativePositionBias

Array = jax.Array
_SQRT_HALF = float(np.sqrt(0.5))


def gelu(x: Array) -> Array:
  """Exact GELU, x * Phi(x), written as PyTorch writes it: x * (1 + erf(x / sqrt(2))) / 2. Same shape and dtype.

  flax's nn.gelu(approximate=False) writes it with erfc, which XLA:CPU evaluates piecewise (an exp and two selects
  per element): this form's forward is 3x faster there and its backward 1.6x (Swin-T's MLP shapes), and the
  training step of Swin-T 3% faster (experiments/README.md, issue 28). The two agree to 1e-6 in float32.
  """
  return x * (0.5 + 0.5 * jax.lax.erf(x * _SQRT_HALF))


ACTIVATIONS = {
  "relu": nn.relu,
  "silu": nn.silu,
  "gelu": gelu,
  "gelu_tanh": functools.partial(nn.gelu, approximate=True),
}


# Where a block's LayerNorm sits around each sublayer F (attention or FFN):
#   "pre":     x + F(LN(x))   (ViT, GPT-2; the stack ends in a final norm)
#   "post":    LN(x + F(x))   (the 2017 Transformer; its output is already normalised: no final norm)
#   "respost": x + LN(F(x))   ("res-post-norm" of Swin V2; the residual stream is never normalised: final norm)
NORMS = ("pre", "post", "respost")


# Megatron-style tensor parallelism over this module's blocks (attention "attn" / "cross_attn", FeedForward "mlp"):
# (regex on parameter paths, mesh axis per dimension, aligned right); model families add their own (registry).
TP_RULES = (
  (r"(query|key|value)/kernel$", (None, "tensor", None)),  # [d, heads, head_dim]: column-parallel
  (r"(query|key|value)/bias$", ("tensor", None)),  # [heads, head_dim]
  (r"attn/out/kernel$", ("tensor", None, None)),  # [heads, head_dim, d]: row-parallel
  (r"mlp/fc1(_g|_x)?/kernel$", (None, "tensor")),  # [d, hidden]: column-parallel (SwiGLU's two halves too)
  (r"mlp/fc1(_g|_x)?/bias$", ("tensor",)),  # [hidden]
  (r"mlp/fc2/kernel$", ("tensor", None)),  # [hidden, d]: row-parallel
)
BIAS_TABLE_TP_RULE = (r"relative_position_bias_table$", (None, "tensor"))  # [positions, heads]


def check_norm(norm: str) -> str:
  """Returns `norm` if it is one of NORMS ("pre", "post", "respost").

  Raises:
    ValueError: naming the known placements.
  """
  if norm not in NORMS:
    raise ValueError(f"unknown norm placement {norm!r}; use one of {', '.join(repr(n) for n in NORMS)}")
  return norm


def activation(name: str):
  """The activation function named `name` in ACTIVATIONS ("relu", "gelu", "gelu_tanh").

  Raises:
    ValueError: an unknown name.
  """
  if name not in ACTIVATIONS:
    raise ValueError(f"unknown activation {name!r}; use one of {sorted(ACTIVATIONS)}")
  return ACTIVATIONS[name]


class FeedForward(nn.Module):
  """FFN(x) = W2 act(W1 x + b1) + b2, dropout after the activation. [..., D] -> [..., D_out or D].

  gated: W2 (act(Wg x + bg) * (Wx x + bx)) + b2 instead (Shazeer 2020; act "silu": SwiGLU), parameters "fc1_g" (the
  gate) and "fc1_x" in place of "fc1", as timm's SwiGLU names them (its packed GluMlp and transformers' DINOv2 hold the
  gate as fc1's first half: the converters split it).
  inner_norm: a LayerNorm ("norm", epsilon layernorm_eps) over the hidden features, after the dropout, before W2
  (EVA-02's sub-LayerNorm, timm's scale_mlp).
  """

  hidden: int
  out_features: int | None = None
  act: str = "gelu"
  dropout_rate: float = 0.0
  deterministic: bool = True
  dtype: Any = None
  kernel_init: Any = nn.initializers.xavier_uniform()
  bias_init: Any = nn.initializers.normal(stddev=1e-6)
  gated: bool = False
  inner_norm: bool = False
  layernorm_eps: float = 1e-6

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """Applies fc1 (or the gated pair) to `hidden`, the activation, dropout, fc2: x [..., D] -> [..., out_features or D]."""
    dense = functools.partial(dots.Dense, dtype=self.dtype, kernel_init=self.kernel_init, bias_init=self.bias_init)
    if self.gated:
      y = activation(self.act)(dense(self.hidden, name="fc1_g")(x)) * dense(self.hidden, name="fc1_x")(x)
    else:
      y = activation(self.act)(dense(self.hidden, name="fc1")(x))
    y = nn.Dropout(self.dropout_rate)(y, deterministic=self.deterministic)
    if self.inner_norm:
      y = nn.LayerNorm(epsilon=self.layernorm_eps, dtype=self.dtype, name="norm")(y)
    return dense(self.out_features or x.shape[-1], name="fc2")(y)


FFNS = ("mlp", "swiglu")  # a block's feed-forward (_BlockBase.ffn): FeedForward, gated for "swiglu"


class DropPath(nn.Module):
  """Stochastic depth: drops the whole residual branch per example with probability `rate`.

  `rate` may be a traced scalar (as under nn.scan, where each layer gets its own). [B, ...] -> [B, ...].
  """

  deterministic: bool = True

  @nn.compact
  def __call__(self, x: Array, rate: float | Array) -> Array:
    """Drops each example's branch x [B, ...] with probability `rate` and scales the kept ones by 1 / (1 - rate).

    Returns `x` unchanged when deterministic or when `rate` is a Python 0; draws from the "dropout" RNG otherwise.
    """
    if self.deterministic or (isinstance(rate, (int, float)) and rate == 0.0):
      return x
    keep = 1.0 - rate
    mask = jax.random.bernoulli(self.make_rng("dropout"), keep, (x.shape[0],) + (1,) * (x.ndim - 1))
    return jnp.where(mask, x / keep, 0.0).astype(x.dtype)


class LayerScale(nn.Module):
  """Per-channel scale of a residual branch (Touvron et al. 2021, CaiT; DeiT III, DINOv2). [..., D] -> [..., D].

  One learned parameter "scale" [D], initialised to `init_values`.
  """

  init_values: float
  dtype: Any = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """X * scale, in x's dtype."""
    scale = self.param("scale", nn.initializers.constant(self.init_values), (x.shape[-1],))
    return x * scale.astype(x.dtype)


class _BlockBase(nn.Module):
  """Options shared by encoder and decoder blocks. norm: "pre", "post" or "respost" (see NORMS).

  init_values: LayerScale on every residual branch ("ls1", "ls2", ...: one per norm "norm1", "norm2", ...),
  initialised to this value; None (the default): none, and no parameter.
  qk_norm: "layernorm" or "rmsnorm" on every attention's queries and keys (MultiHeadAttention.qk_norm); None: none.
  ffn: "mlp" (FeedForward, the default) or "swiglu" (FeedForward gated: mlp_dim is each half's width, act the gate's).
  ffn_norm: the feed-forward's sub-LayerNorm on its hidden features (FeedForward.inner_norm; EVA-02-B/L).
  attn_norm: every attention's sub-LayerNorm on its heads' outputs (MultiHeadAttention.inner_norm; EVA-02 CLIP).
  key_bias: False: no bias on the attention's keys, where qkv_bias gives queries and values one (EVA-02).
  rope_half: the rotary embedding given to the attention is in the half layout (DINOv3's; apply_rope).
  """

  num_heads: int
  mlp_dim: int
  norm: str = "pre"
  act: str = "gelu"
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  qkv_bias: bool = True
  layernorm_eps: float = 1e-6
  implementation: str = "fast"
  deterministic: bool = True
  dtype: Any = None
  init_values: float | None = None
  qk_norm: str | None = None
  ffn: str = "mlp"
  ffn_norm: bool = False
  attn_norm: bool = False
  key_bias: bool = True
  rope_half: bool = False

  def _attention(self, name: str, decode: bool = False) -> MultiHeadAttention:
    return MultiHeadAttention(
      num_heads=self.num_heads,
      qkv_bias=self.qkv_bias,
      decode=decode,
      dropout_rate=self.attention_dropout_rate,
      implementation=self.implementation,
      deterministic=self.deterministic,
      dtype=self.dtype,
      qk_norm=self.qk_norm,
      qk_norm_eps=self.layernorm_eps,
      inner_norm=self.attn_norm,
      key_bias=self.key_bias,
      rope_half=self.rope_half,
      name=name,
    )

  def _norm(self, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=self.layernorm_eps, dtype=self.dtype, name=name)

  def _residual(self, x: Array, branch, norm_name: str, drop_path: float | Array) -> Array:
    """pre: x + dp(do(F(LN(x)))); post: LN(x + dp(do(F(x)))); respost: x + dp(LN(do(F(x)))).

    do is dropout, dp stochastic depth (in respost the norm comes before the branch is dropped, as in Swin V2). With
    init_values, the branch is scaled (LayerScale) right before it is dropped, as timm's blocks do.
    """
    dropout = lambda y: nn.Dropout(self.dropout_rate)(y, deterministic=self.deterministic)
    drop_branch = lambda y: DropPath(self.deterministic)(y, drop_path)
    scale = lambda y: y
    if self.init_values is not None:
      scale = LayerScale(self.init_values, self.dtype, name=norm_name.replace("norm", "ls"))
    norm = check_norm(self.norm)
    if norm == "pre":
      return x + drop_branch(scale(dropout(branch(self._norm(norm_name)(x)))))
    if norm == "post":
      return self._norm(norm_name)(x + drop_branch(scale(dropout(branch(x)))))
    return x + drop_branch(scale(self._norm(norm_name)(dropout(branch(x)))))

  def _ffn(self, x: Array) -> Array:
    if self.ffn not in FFNS:
      raise ValueError(f"unknown ffn {self.ffn!r}; use one of {', '.join(map(repr, FFNS))}")
    return FeedForward(
      self.mlp_dim,
      act=self.act,
      dropout_rate=self.dropout_rate,
      deterministic=self.deterministic,
      dtype=self.dtype,
      gated=self.ffn == "swiglu",
      inner_norm=self.ffn_norm,
      layernorm_eps=self.layernorm_eps,
      name="mlp",
    )(x)


class EncoderBlock(_BlockBase):
  """Self-attention + FFN, pre-norm (ViT), post-norm (the 2017 Transformer) or res-post-norm. [B, T, D] -> [B, T, D].

  rel_pos_grid: (h, w) adds a learned 2-D relative position bias to the attention logits (param "rel_pos", see
  posenc.RelativePositionBias): T must be h*w tokens in row-major order, or 1 + h*w with rel_pos_cls_token (a
  class token first, with BEiT's three learned entries cls->patch, patch->cls, cls->cls).
  """

  rel_pos_grid: tuple[int, int] | None = None
  rel_pos_cls_token: bool = False

  @nn.compact
  def __call__(
    self,
    x: Array,
    mask: Array | None = None,
    bias: Array | None = None,
    rope: tuple[Array, Array] | None = None,
    drop_path: float | Array = 0.0,
  ) -> Array:
    """mask: boolean broadcastable to [B, H, T, T]; bias: additive, same shape; rope: (sin, cos) [T, K] (attention)."""
    if self.rel_pos_grid is not None:
      rel = RelativePositionBias(
        tuple(self.rel_pos_grid), self.num_heads, cls_token=self.rel_pos_cls_token, name="rel_pos"
      )()  # [H, T, T]
      if rel.shape[-1] != x.shape[1]:
        raise ValueError(
          f"relative position bias over a {tuple(self.rel_pos_grid)} grid"
          f"{' plus a class token' if self.rel_pos_cls_token else ''} covers {rel.shape[-1]} tokens, got {x.shape[1]}"
        )
      bias = rel if bias is None else bias + rel
    attend = lambda y: self._attention("attn")(y, mask=mask, bias=bias, rope=rope)
    x = self._residual(x, attend, "norm1", drop_path)
    return self._residual(x, self._ffn, "norm2", drop_path)


class DecoderBlock(_BlockBase):
  """Causal self-attention, cross-attention over the encoder output, FFN. [B, T, D] -> [B, T, D].

  With decode=True the self-attention keeps a KV cache (see MultiHeadAttention) and the causal mask comes
  from the cache; otherwise a causal mask is applied (and-ed with self_mask).
  """

  decode: bool = False

  @nn.compact
  def __call__(
    self,
    x: Array,
    encoded: Array,
    self_mask: Array | None = None,
    cross_mask: Array | None = None,
    drop_path: float | Array = 0.0,
  ) -> Array:
    """Applies the block to x, attending to encoded [B, S, D].

    self_mask is broadcastable to [B, H, T, T]; cross_mask to [B, H, T, S].
    """
    if not self.decode:
      causal = causal_mask(x.shape[1])
      self_mask = causal if self_mask is None else jnp.logical_and(self_mask, causal)
    x = self._residual(x, lambda y: self._attention("self_attn", self.decode)(y, mask=self_mask), "norm1", drop_path)
    x = self._residual(x, lambda y: self._attention("cross_attn")(y, encoded, mask=cross_mask), "norm2", drop_path)
    return self._residual(x, self._ffn, "norm3", drop_path)


def drop_path_rates(rate: float, num_layers: int) -> np.ndarray:
  """Stochastic depth rising linearly from 0 at the first layer to `rate` at the last."""
  return np.linspace(0.0, rate, num_layers, dtype=np.float32) if num_layers > 1 else np.zeros(num_layers, np.float32)


class _Carry(nn.Module):
  """Adapts a block to nn.scan's (carry, x) -> (carry, y) form."""

  block_cls: Any
  block_kwargs: Any

  @nn.compact
  def __call__(self, x, drop_path, *args):
    return self.block_cls(**dict(self.block_kwargs), name="block")(x, *args, drop_path=drop_path), None


class Stack(nn.Module):
  """L blocks of one kind, optionally scanned over layers (one compiled body) and rematerialised.

  block_cls: EncoderBlock or DecoderBlock; block_kwargs: their attributes (a tuple of pairs, hashable).
  drop_path_rate: stochastic depth of the last layer (linear from 0). Parameters are "block_{i}" or, when
  scanned, one "blocks" subtree stacked along a leading layer axis. With final_norm, stacks of "pre" and
  "respost" blocks end in a LayerNorm "final_norm" (their residual stream is never normalised); "post" blocks
  end normalised already and get none.
  """

  block_cls: Any
  num_layers: int
  block_kwargs: tuple = ()
  drop_path_rate: float = 0.0
  scan: bool = False
  remat: bool = False
  final_norm: bool = True
  layernorm_eps: float = 1e-6
  dtype: Any = None

  @nn.compact
  def __call__(self, x: Array, *args) -> Array:
    """Applies the stack of blocks to x [B, T, D]; args: the block's extra positional inputs (mask, encoded, ...)."""
    rates = drop_path_rates(self.drop_path_rate, self.num_layers)
    if self.scan:
      body = nn.remat(_Carry, prevent_cse=False) if self.remat else _Carry
      scanned = nn.scan(
        body,
        variable_axes={"params": 0, "cache": 0, "intermediates": 0},
        split_rngs={"params": True, "dropout": True},
        length=self.num_layers,
        in_axes=(0,) + (nn.broadcast,) * len(args),
      )
      x, _ = scanned(self.block_cls, self.block_kwargs, name="blocks")(x, jnp.asarray(rates), *args)
    else:
      block = nn.remat(self.block_cls) if self.remat else self.block_cls
      for i in range(self.num_layers):
        x = block(**dict(self.block_kwargs), name=f"block_{i}")(x, *args, drop_path=float(rates[i]))
    if self.final_norm and check_norm(dict(self.block_kwargs).get("norm", "pre")) != "post":
      x = nn.LayerNorm(epsilon=self.layernorm_eps, dtype=self.dtype, name="final_norm")(x)
    return x
