"""The encoder-decoder Transformer of "Attention is all you need" (Vaswani et al. 2017), for translation.

Token embeddings scaled by sqrt(d_model) plus sinusoidal (or learned) positions; post-norm encoder and decoder
stacks (`norm`: pre-norm, res-post-norm) from vitjax.layers; the decoder's self-attention is causal and its
cross-attention masks the source padding. Embeddings may be shared between source and target and tied to the
output projection. Token ids are attributes (pad_id, eos_id, bos_id; default pad 0, eos 1, bos 2, vitjax's
SentencePiece ids): pad_id masks the source, the decoder input is bos_id + target shifted right, and
vitjax.decode starts from bos_id and stops at eos_id. flax's examples/wmt and T5 start from the pad id (bos_id=0).

Shapes: src [B, S] int, tgt [B, T] int (ending with EOS, padded with pad_id); logits [B, T, V].
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vitjax import dots
from vitjax.layers import TP_RULES, DecoderBlock, EncoderBlock, Stack, check_norm
from vitjax.models import adapt, registry
from vitjax.posenc import sinusoidal_1d

Array = jax.Array
PAD, EOS, BOS = 0, 1, 2  # the defaults of Transformer.pad_id, eos_id, bos_id

# name: (d_model, num_heads, d_ff, layers, dropout)
SIZES = {
  "base": (512, 8, 2048, 6, 0.1),
  "big": (1024, 16, 4096, 6, 0.3),
  "small": (256, 4, 1024, 3, 0.1),
  "tiny": (64, 2, 128, 2, 0.0),
}


def shift_right(tgt: Array, bos: int = BOS) -> Array:
  """Decoder input: BOS, then the target without its last token. [B, T] -> [B, T]."""
  return jnp.concatenate([jnp.full_like(tgt[:, :1], bos), tgt[:, :-1]], axis=1)


class _Side(nn.Module):
  """Embedding (scaled by sqrt(d_model)) + positions + dropout + a stack of blocks: one side of the model."""

  embed: nn.Module
  kind: str  # "encoder" | "decoder"
  d_model: int
  num_layers: int
  block_kwargs: tuple
  dropout_rate: float
  posemb: str
  max_len: int
  scan: bool = False
  remat: bool = False
  decode: bool = False
  dtype: Any = None

  @nn.compact
  def __call__(self, tokens: Array, *args, train: bool = False, positions: Array | None = None) -> Array:
    x = self.embed(tokens) * jnp.sqrt(jnp.float32(self.d_model))
    if positions is None:
      if tokens.shape[1] > self.max_len:
        raise ValueError(
          f"sequence of {tokens.shape[1]} tokens exceeds max_len={self.max_len}; truncate it "
          "or use a model with a larger max_len"
        )
      positions = jnp.arange(tokens.shape[1])[None]
    if self.posemb == "learned":
      table = self.param("pos_embedding", nn.initializers.normal(0.02), (self.max_len, self.d_model))
    else:
      table = jnp.asarray(sinusoidal_1d(self.max_len, self.d_model))
    x = (x + table[positions]).astype(self.dtype or jnp.float32)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    kw = dict(self.block_kwargs, deterministic=not train)
    cls = EncoderBlock
    if self.kind == "decoder":
      cls, kw["decode"] = DecoderBlock, self.decode
    return Stack(
      cls,
      self.num_layers,
      tuple(kw.items()),
      scan=self.scan,
      remat=self.remat,
      final_norm=True,  # Stack adds it for "pre" and "respost" blocks, not "post"
      layernorm_eps=1e-6,
      dtype=self.dtype,
      name="stack",
    )(x, *args)


def parse_name(name: str) -> dict | None:
  """The Transformer's keyword arguments (the paper's sizes) for a name such as "transformer_base"; else None."""
  size = name.removeprefix("transformer_") if name.startswith("transformer_") else None
  if size not in SIZES:
    return None
  d, h, ff, layers, drop = SIZES[size]
  return dict(d_model=d, num_heads=h, d_ff=ff, num_layers=layers, dropout_rate=drop)


@registry.register(
  parse_name,
  examples=tuple(f"transformer_{s}" for s in ("base", "big", "small", "tiny")),
  no_decay=("pos_embedding",),
  tp_rules=TP_RULES,
  adapters=(adapt.extend_positions,),
)
class Transformer(nn.Module):
  """Encoder-decoder Transformer. __call__(src, tgt, train) -> (logits [B, T, V], intermediates).

  Attributes:
    vocab_size: size of the (joint) vocabulary; tgt_vocab_size: a separate target vocabulary (then
      share_embeddings must be False).
    d_model, num_heads, d_ff, num_layers (encoder and decoder each), dropout_rate: the architecture.
    norm: where each block's LayerNorms sit: "post" LN(x + F(x)) (the paper's), "pre" x + F(LN(x)) or
      "respost" x + LN(F(x)); "pre" and "respost" stacks end in a final LayerNorm (see vitjax.layers.NORMS).
    posemb: "sinusoidal" (the paper) or "learned"; max_len bounds positions.
    share_embeddings: one embedding table for source and target.
    tie_output: the output projection is the transposed target embedding.
    decode: decoder with a KV cache, fed one position at a time (see vitjax.decode).
    pad_id, eos_id, bos_id: the special token ids (0, 1, 2); they must match the tokenizer's, and bos_id may
      equal pad_id (flax's examples/wmt, T5), eos_id may not.
  """

  vocab_size: int
  tgt_vocab_size: int | None = None
  d_model: int = 512
  num_heads: int = 8
  d_ff: int = 2048
  num_layers: int = 6
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  norm: str = "post"
  posemb: str = "sinusoidal"
  max_len: int = 256
  share_embeddings: bool = True
  tie_output: bool = True
  act: str = "relu"
  scan: bool = False
  remat: bool = False
  decode: bool = False
  implementation: str = "fast"
  dtype: Any = None
  pad_id: int = PAD
  eos_id: int = EOS
  bos_id: int = BOS

  def setup(self):
    """Builds the embeddings, the encoder and decoder stacks and the output projection.

    Source and target share one embedding table with share_embeddings; with tie_output the output projection is the
    target embedding's transpose, else a Dense layer.

    Raises:
      ValueError: eos_id equal to pad_id, an unknown posemb, or share_embeddings with two vocabularies.
    """
    if self.eos_id == self.pad_id:
      raise ValueError(f"eos_id and pad_id are both {self.pad_id}; EOS must be a token of its own")
    if self.posemb not in ("sinusoidal", "learned"):
      raise ValueError(f"unknown posemb {self.posemb!r}; use 'sinusoidal' or 'learned'")
    tgt_vocab = self.tgt_vocab_size or self.vocab_size
    if self.share_embeddings and tgt_vocab != self.vocab_size:
      raise ValueError("share_embeddings needs one vocabulary; set share_embeddings=False for two")
    init = nn.initializers.normal(stddev=self.d_model**-0.5)
    src_embed = nn.Embed(self.vocab_size, self.d_model, embedding_init=init, name="src_embed")
    self.tgt_embed = (
      src_embed if self.share_embeddings else nn.Embed(tgt_vocab, self.d_model, embedding_init=init, name="tgt_embed")
    )
    blocks = dict(
      num_heads=self.num_heads,
      mlp_dim=self.d_ff,
      norm=check_norm(self.norm),
      act=self.act,
      dropout_rate=self.dropout_rate,
      attention_dropout_rate=self.attention_dropout_rate,
      layernorm_eps=1e-6,
      implementation=self.implementation,
      dtype=self.dtype,
    )
    side = dict(
      d_model=self.d_model,
      num_layers=self.num_layers,
      block_kwargs=tuple(blocks.items()),
      dropout_rate=self.dropout_rate,
      posemb=self.posemb,
      max_len=self.max_len,
      scan=self.scan,
      remat=self.remat,
      dtype=self.dtype,
    )
    self.encoder = _Side(src_embed, "encoder", **side)
    self.decoder = _Side(self.tgt_embed, "decoder", decode=self.decode, **side)
    if not self.tie_output:
      self.out_proj = dots.Dense(tgt_vocab, dtype=self.dtype)

  @staticmethod
  def check_ids(what: str, ids, vocab: int) -> None:
    """check_ids (below), for code that has the model but not this module (vitjax.decode)."""
    check_ids(what, ids, vocab)

  def encode(self, src: Array, train: bool = False) -> Array:
    """Encodes src [B, S] -> encoded [B, S, D] (padding positions are masked out of every attention)."""
    check_ids("src", src, self.vocab_size)
    return self.encoder(src, (src != self.pad_id)[:, None, None, :], train=train)

  def decode_logits(
    self, tgt_in: Array, encoded: Array, src: Array, train: bool = False, positions: Array | None = None
  ) -> Array:
    """Decoder input tokens [B, T] (BOS-shifted), encoded [B, S, D], src [B, S] -> logits [B, T, V].

    positions: [1, T] absolute positions of tgt_in (needed in decode mode, where T is 1 per call).
    """
    check_ids("tgt", tgt_in, self.tgt_vocab_size or self.vocab_size)
    cross_mask = (src != self.pad_id)[:, None, None, :]
    x = self.decoder(tgt_in, encoded, None, cross_mask, train=train, positions=positions)
    logits = dots.tied_logits(self.tgt_embed, x) if self.tie_output else self.out_proj(x)
    return logits.astype(jnp.float32)

  def __call__(self, src: Array, tgt: Array, train: bool = False) -> tuple[Array, dict]:
    """Teacher-forced logits of the target.

    Args:
      src: int [B, S] source token ids, pad_id after the end.
      tgt: int [B, T] target token ids; the decoder reads them shifted right by one, bos_id first.
      train: dropout on.

    Returns:
      tuple: (logits float32 [B, T, V], {"encoded": [B, S, D] the encoder's output}).
    """
    encoded = self.encode(src, train)
    return self.decode_logits(shift_right(tgt, self.bos_id), encoded, src, train), {"encoded": encoded}


def check_ids(what: str, ids, vocab: int) -> None:
  """ValueError for token ids that are not integers [B, L], or (outside jit, where they are known) not in 0..vocab - 1.

  An id out of range would embed as NaN (jnp.take's fill) and spread through the whole batch's logits.
  """
  if jnp.ndim(ids) != 2 or not jnp.issubdtype(jnp.result_type(ids), jnp.integer):
    raise ValueError(f"{what} must be integer token ids [B, L]; got {jnp.result_type(ids)} of shape {jnp.shape(ids)}")
  if isinstance(ids, jax.core.Tracer) or not jnp.size(ids) or not getattr(ids, "is_fully_addressable", True):
    return  # (unknown here: traced, or held partly by other processes)
  ids = np.asarray(ids)  # (numpy: under a jit trace jnp would stage even a constant's min)
  low, high = int(ids.min()), int(ids.max())
  if low < 0 or high >= vocab:
    raise ValueError(f"{what} holds token ids {low}..{high}, outside the vocabulary's 0..{vocab - 1}")


def create(size: str = "base", **overrides) -> Transformer:
  """A Transformer of a named size ("base" and "big" from the paper; "small", "tiny" for CPUs)."""
  if size not in SIZES:
    raise ValueError(f"unknown Transformer size {size!r}; use one of {list(SIZES)}")
  return Transformer(**{**parse_name(f"transformer_{size}"), **overrides})
