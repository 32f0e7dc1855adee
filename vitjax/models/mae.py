"""Masked autoencoder (He et al. 2021, "Masked Autoencoders Are Scalable Vision Learners") around a vitjax ViT.

A random 75% of the patches is dropped; the ViT encoder sees only the rest (with their own position embeddings);
a light decoder puts mask tokens at the dropped positions, adds fixed 2-D sin-cos positions, and predicts every
patch's pixels. The loss (vitjax.tasks.mae) is the mean squared error on the dropped patches only, against each
patch's pixels normalised by its own mean and variance.

The encoder's parameters have exactly the names of the ViT they come from (embedding, cls, posembed,
encoder/block_i/...), at the top level of the tree: a classification run takes an MAE run's checkpoint as
``config.init_from`` and keeps them, while the decoder's (decoder_embed, mask_token, decoder/..., decoder_pred)
are dropped and the head starts new (vitjax.models.adapt).

Masking is explicit: the model takes uniform noise [B, N] (N patches) and keeps the K = N (1 - mask_ratio)
patches of lowest noise (`random_mask`), so the task draws it from the step's key, and evaluation can fix it.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vitjax import dots
from vitjax.layers import EncoderBlock, Stack
from vitjax.models import registry, vit
from vitjax.posenc import sincos_2d

Array = jax.Array


def random_mask(noise: Array, mask_ratio: float) -> tuple[Array, Array]:
  """Random masking: noise float [B, N] -> (keep int32 [B, K], mask float32 [B, N]).

  keep: the K = int(N (1 - mask_ratio)) positions of lowest noise in ascending order of position; mask: 1 where a patch
  is dropped.
  """
  n = noise.shape[1]
  k = max(int(n * (1 - mask_ratio)), 1)
  keep = jnp.sort(jnp.argsort(noise, axis=1)[:, :k], axis=1).astype(jnp.int32)
  mask = jnp.ones(noise.shape, jnp.float32).at[jnp.arange(noise.shape[0])[:, None], keep].set(0.0)
  return keep, mask


def patchify(images: Array, patch: tuple[int, int]) -> Array:
  """[B, H, W, C] -> [B, (H/p) (W/p), p p C], patches in row-major order, pixels (row, column, channel) within."""
  b, h, w, c = images.shape
  p, q = patch
  x = images.reshape(b, h // p, p, w // q, q, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, (h // p) * (w // q), p * q * c)


def unpatchify(patches: Array, grid: tuple[int, int], patch: tuple[int, int], channels: int) -> Array:
  """The inverse of patchify: [B, gh gw, p q C] -> [B, gh p, gw q, C]."""
  b = patches.shape[0]
  (gh, gw), (p, q) = grid, patch
  x = patches.reshape(b, gh, gw, p, q, channels).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(b, gh * p, gw * q, channels)


def _frozen(value):
  """Hashable, as a jit static argument must be: dicts -> sorted (key, value) tuples, lists -> tuples, recursively."""
  if isinstance(value, dict):
    return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
  if isinstance(value, (list, tuple)):
    return tuple(_frozen(v) for v in value)
  return value


def _overrides(kw: dict) -> dict:
  if isinstance(kw.get("encoder"), dict):
    kw["encoder"] = _frozen(kw["encoder"])
  return kw


@registry.register(
  lambda name: {} if name == "mae" else None,
  examples=("mae",),
  no_decay=vit.NO_DECAY,  # the encoder is a ViT, named as one; the decoder's blocks are the shared ones
  tp_rules=registry.family_of(vit.ViT).tp_rules,
  adapters=vit.ADAPTERS,
  overrides=_overrides,
)
class MAE(nn.Module):
  """Masked autoencoder: images and noise -> (pixel predictions and mask, the encoder's tokens).

  __call__(images [B, H, W, C], noise [B, N], train) -> ({"pred": [B, N, p p C] float32, "mask": [B, N] (1 = dropped)},
  {"encoded": [B, P + K, D], the encoder's tokens (P prefix tokens, K kept patches)}).

  Attributes:
    encoder: the ViT's options as (key, value) pairs (a dict in the config): "name" (a vitjax model name such as
      "Ti/4" or "vit_s16") and any ViT attribute (width, depth, stem, posemb, pool_type, ...). Its head and
      pooling are not used; give it the options of the classifier that will be fine-tuned from it. A
      convolutional stem (stem="conv") sees the whole image before masking, so it leaks a little of the masked
      patches' borders: MAE's own recipe is the patch stem.
    decoder_width, decoder_depth, decoder_heads, decoder_mlp_dim: the decoder (pre-norm Transformer blocks).
    mask_ratio: the share of patches dropped (0.75).
    channels: the images' channels (the task sets it from the data): the decoder predicts p p channels values.
  """

  encoder: tuple = ()
  decoder_width: int = 128
  decoder_depth: int = 2
  decoder_heads: int = 4
  decoder_mlp_dim: int | None = None
  mask_ratio: float = 0.75
  channels: int = 3
  dtype: Any = None

  def setup(self):
    """Builds the ViT encoder and the decoder.

    The encoder comes from `encoder`, its parameters shared into this module's top level; the decoder is its
    embedding, mask token, blocks and pixel prediction.

    Raises:
      ValueError: `encoder` has no "name", or names a model that is not a ViT.
    """
    options = dict(self.encoder)
    if "name" not in options:
      raise ValueError("MAE needs encoder={'name': a ViT such as 'Ti/4', ...}")
    name = options.pop("name")
    encoder = registry.create(name, **{**options, "num_classes": None})
    if not isinstance(encoder, vit.ViT):
      raise ValueError(f"MAE's encoder must be a ViT, got {type(encoder).__name__} ({name!r})")
    self.vit = encoder.clone(dtype=self.dtype)
    nn.share_scope(self, self.vit)  # the encoder's parameters at the top level, named as the ViT's
    self.decoder_embed = dots.Dense(self.decoder_width, dtype=self.dtype)
    self.mask_token = self.param("mask_token", nn.initializers.normal(0.02), (1, 1, self.decoder_width))
    block_kwargs = dict(
      num_heads=self.decoder_heads,
      mlp_dim=self.decoder_mlp_dim or 4 * self.decoder_width,
      norm="pre",
      deterministic=True,
      dtype=self.dtype,
    )
    self.decoder = Stack(EncoderBlock, self.decoder_depth, tuple(block_kwargs.items()), dtype=self.dtype)
    self.patch = self.vit.patch_hw
    self.decoder_pred = dots.Dense(self.patch[0] * self.patch[1] * self.channels, dtype=self.dtype)

  def __call__(self, images: Array, noise: Array, train: bool = False) -> tuple[dict, dict]:
    """Masks, encodes the kept patches, decodes every patch.

    Args:
      images: float [B, H, W, C], C = `channels`, H and W multiples of the encoder's patch.
      noise: float [B, N], N the patches; the N (1 - mask_ratio) patches of lowest noise are kept (`random_mask`).
      train: dropout and stochastic depth on in the encoder.

    Returns:
      tuple: ({"pred": float32 [B, N, p q C] every patch's predicted pixels, "mask": float32 [B, N], 1 where a patch was
      dropped}, {"encoded": [B, P + K, D] the encoder's output tokens}).

    Raises:
      ValueError: the images' channels or the noise's shape do not match.
    """
    b, h, w, c = images.shape
    if c != self.channels:
      raise ValueError(f"MAE(channels={self.channels}) got images with {c} channels")
    p, q = self.patch
    grid = (h // p, w // q)
    n = grid[0] * grid[1]
    if noise.shape != (b, n):
      raise ValueError(f"noise must be [B, N] = {(b, n)} for {h}x{w} images in {p}x{q} patches, got {noise.shape}")
    keep, mask = random_mask(noise, self.mask_ratio)
    _, out = self.vit(images, train=train, keep=keep)
    tokens = out["encoded"]  # [B, P + K, D]
    x = self.decoder_embed(tokens)
    k = keep.shape[1]
    prefix, visible = x[:, : x.shape[1] - k], x[:, x.shape[1] - k :]
    full = jnp.broadcast_to(self.mask_token.astype(x.dtype), (b, n, x.shape[-1]))
    full = full.at[jnp.arange(b)[:, None], keep].set(visible)  # the kept patches back at their places
    full = full + jnp.asarray(sincos_2d(*grid, self.decoder_width), x.dtype)[None]
    x = self.decoder(jnp.concatenate([prefix, full], axis=1))
    pred = self.decoder_pred(x[:, prefix.shape[1] :])
    return {"pred": pred.astype(jnp.float32), "mask": mask}, {"encoded": tokens}
