"""Training data held on the devices: a small split is put on them once and every batch is made inside jit.

`data.on_device` (None: auto, True, False). On a GPU or TPU by default (on a CPU with True), a split whose decoded
images fit the budget (`data.on_device_max_mb`; None: a quarter of a device's free memory) is decoded once on the
host, put on the devices with its rows split over the mesh's batch axes, and from then on each step's batch is cut
from it by a small jitted program: the epoch's
order (the host pipeline's, vitjax.data.images.epoch_order, sent once per epoch), the gather (XLA masks each
device's rows and sums them over the batch axes), the Inception crop and the flip. Mixup/CutMix follow in the
training step as for any batch (vitjax.data.device_ops). No host work per step but the program's dispatch.

The batches are those of the host pipeline in order; the crops and flips are drawn from (seed, batch, row) with
jax.random, so they are the same on any number of devices or processes, but not the host's draws. The position is
the host pipeline's, ``{"batches": n}``: a run resumes bitwise, and may resume in the other mode (same order, other
draws; a log line says so). Not on the devices (a line says why): RandAugment (PIL, host only), crops of images of
several shapes, a split over the budget.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vitjax import mesh as mesh_lib
from vitjax.data.augment import Augment, decode, parse_augment, resize
from vitjax.data.images import DatasetInfo, Split, epoch_order, image_pair, memory_estimate, mix_seed

BUDGET_SHARE = 4  # on_device_max_mb=None: a quarter of one device's free memory


def free_bytes() -> int:
  """Bytes one local device has free now: its limit less what it holds (a CPU device: its share of the RAM)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  return max(mesh_lib.device_memory() - int(stats.get("bytes_in_use", 0)), 0)


def why_not(aug: Augment) -> str | None:
  """Why these augmentations cannot run on the devices (None: they can)."""
  if aug.randaugment is not None:
    return "RandAugment runs on the host only (PIL)"
  return None


def _decoded(split: Split, size: tuple[int, int], crop: bool, limit_bytes: float):
  """(images uint8 [N, H, W, C], labels int32 [N]) of the split's training examples in row order, or a reason (str).

  Without crops each image is resized to `size` here, as the host pipeline resizes it; with crops the images are kept
  at their stored size, which must be one for all. Stops reading with a reason once past `limit_bytes`.
  """
  positions = np.arange(len(split.source)) if split.subset is None else split.subset
  images, labels, shape, held = [], np.zeros(len(positions), np.int32), None, 0
  for start in range(0, len(positions), 1024):
    chunk = [int(p) for p in positions[start : start + 1024]]
    for i, example in enumerate(split.source.__getitems__(chunk), start):
      image, _ = decode(bytes(example[split.image_key]), split.channels)
      image = image if crop else resize(image, size)
      if shape is None:
        shape = image.shape
      elif image.shape != shape:
        return f"its images have several shapes ({shape[:2]} and {image.shape[:2]}), and crops need one"
      images.append(image)
      labels[i] = int(example[split.label_key])
      held += image.nbytes
      if held > limit_bytes:
        return f"its decoded images pass {limit_bytes / 2**20:.3g} MiB after {i + 1:,} of {len(positions):,}"
  return np.stack(images), labels


def _put(host: np.ndarray, sharding: NamedSharding, rows: int) -> jax.Array:
  """A host array on the devices (every process holds it all), padded with zero rows to `rows`."""
  if rows > len(host):
    host = np.concatenate([host, np.zeros((rows - len(host), *host.shape[1:]), host.dtype)])
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def make_resident(
  name: str,
  split: str,
  *,
  global_batch_size: int,
  image_size,
  seed: int,
  mesh,
  data_dir: str | None = None,
  augment=None,
  subset: np.ndarray | None = None,
  on_device: bool | None = None,
  max_mb: float | None = None,
):
  """The training batches of a split made on the devices, or None where they are made on the host (a line says why).

  Long for its documented arguments; the body reads as the decision's order.

  Args:
    name: the dataset's config name, as vitjax.data.images.make_input takes it.
    split: the tfds split.
    data_dir: where it is prepared (None: the default).
    subset: the split's positions that train (None: all), in the order the host pipeline reads them.
    augment: Augment's fields (Mixup/CutMix are the training step's).
    seed: the run's seed: the order (the host's) and the crop and flip draws.
    global_batch_size: the batch size over all processes.
    image_size: the batches' (H, W), or one int.
    mesh: the run's Mesh; the split's rows and the batches are split over its batch axes.
    on_device: None (auto: on a GPU or TPU when it fits `max_mb`; on a CPU, whose devices are the host's own cores,
      the host pipeline), True (ValueError if it cannot be), False (None is returned).
    max_mb: MiB of one device the split may take; None: a quarter of a device's free memory.

  Returns:
    (iterator, DatasetInfo) or None. The iterator yields {"image": uint8 [B, H, W, C], "label": int32 [B]} as global
    arrays split over the batch axes and has get_state() / set_state() ({"batches": n}, as the host pipeline's).
  """
  if on_device is False or (on_device is None and jax.default_backend() == "cpu"):  # (auto on a CPU: the host's)
    return None
  size, aug = image_pair(image_size), parse_augment(augment)
  budget = max_mb * 2**20 if max_mb is not None else free_bytes() / BUDGET_SHARE
  src = Split(name, split, data_dir, subset)
  shards = mesh_lib.Layout(**{a: mesh.shape[a] for a in mesh_lib.AXES}).batch_shards
  why = why_not(aug)
  estimate = memory_estimate(src.builder, src.image_key, src.num_examples) / shards  # (the stored size where unknown)
  if why is None and on_device is None and estimate > budget:
    why = f"about {estimate / 2**20:.3g} MiB per device, over the {budget / 2**20:.3g} MiB of data.on_device_max_mb"
  if why is None:  # decode up to the budget (times the shards: each device holds its share of the rows)
    start = time.perf_counter()
    got = _decoded(src, size, aug.random_resized_crop is not None, budget * shards if on_device is None else np.inf)
    why = got if isinstance(got, str) else None
  if why is not None:
    if on_device:
      raise ValueError(f"data.on_device=True: {src.label} cannot be on the devices: {why}; use None (auto) or False")
    logging.info("data.on_device: %s trains from the host: %s", src.label, why)
    return None
  images, labels = got
  rows = -(-len(images) // shards) * shards
  per_device = images[:1].nbytes * rows // shards
  sharding = NamedSharding(mesh, P(mesh_lib.BATCH_AXES))
  batches = ResidentBatches(
    _put(images, sharding, rows), _put(labels, sharding, rows), len(images), global_batch_size, size, aug,
    mix_seed(seed), mesh,
  )  # fmt: skip
  logging.info(
    "data.on_device: %s examples of %s on the devices (%.1f MiB per device, decoded in %.1f s); batches, crops and "
    "flips made in jit",
    f"{len(images):,}",
    src.label,
    per_device / 2**20,
    time.perf_counter() - start,
  )
  info = DatasetInfo(
    name, split, src.num_classes, len(images), (*size, src.channels), global_batch_size // jax.process_count(),
    batches.steps_per_epoch,
  )  # fmt: skip
  return batches, info


class ResidentBatches:
  """The training iterator over a split on the devices: batch n is rows [n G, (n + 1) G) of its epoch's order."""

  def __init__(self, images, labels, num_examples: int, global_batch: int, size, aug: Augment, seed: int, mesh):
    self.images, self.labels, self.n, self.global_batch, self.seed = images, labels, num_examples, global_batch, seed
    self.steps_per_epoch = num_examples // global_batch
    if self.steps_per_epoch == 0:
      raise ValueError(f"{num_examples} examples are fewer than one batch of {global_batch}")
    self._order = (None, None)
    self._key = jax.random.key(seed)
    self._replicated = NamedSharding(mesh, P())
    crop = aug.random_resized_crop
    self._take = jax.jit(
      functools.partial(_take, batch=global_batch, size=size, crop=crop, flip=aug.flip),
      out_shardings=NamedSharding(mesh, P(mesh_lib.BATCH_AXES)),
    )
    self.batches = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    epoch, b = divmod(self.batches, self.steps_per_epoch)
    if self._order[0] != epoch:  # once an epoch: the host pipeline's order, sent to every device
      order = epoch_order(self.seed, epoch, self.n).astype(np.int32)
      self._order = (epoch, jax.make_array_from_callback(order.shape, self._replicated, lambda i: order[i]))
    batch = self._take(self.images, self.labels, self._order[1], b, self.batches, self._key)
    self.batches += 1
    return batch

  def get_state(self) -> dict:
    """The position: the batches made so far (the host pipeline's form, marked as made on the devices)."""
    return {"batches": self.batches, "on_device": True}

  def set_state(self, state: dict) -> None:
    """Goes to a position get_state() returned, or the host pipeline's (same order; a line says the draws differ)."""
    if "batches" not in state:
      raise ValueError("the checkpoint's data position has no batch count (an older vitjax's)")
    if not state.get("on_device"):
      logging.info("data.on_device: the checkpoint's batches were made on the host; same order, other crop draws")
    self.batches = int(state["batches"])


def _take(images, labels, order, b, number, key, *, batch: int, size, crop, flip: bool) -> dict:
  """Batch `number` (row b of its epoch's `order`): gathered, cropped and resized to `size`, flipped; uint8."""
  index = jax.lax.dynamic_slice(order, (b * batch,), (batch,))
  keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(key, number), r))(jnp.arange(batch))
  one = functools.partial(augment_one, size=size, crop=crop, flip=flip)
  return {"image": jax.vmap(one)(images[index], keys), "label": labels[index]}


def augment_one(image, key, *, size, crop, flip: bool):
  """One image's crop (Inception's, resized to `size`, antialiased bilinear as PIL's) and flip, uint8 [H, W, C].

  crop: (scale, ratio) ranges as Augment.random_resized_crop, or None (the image is already `size`).
  """
  k_crop, k_flip = jax.random.split(key)
  if crop is not None:
    image = crop_resize(image, crop_box(k_crop, *image.shape[:2], *crop), size)
  if flip:
    image = jnp.where(jax.random.uniform(k_flip) < 0.5, image[:, ::-1], image)
  return image


def crop_box(key, height: int, width: int, scale, ratio, attempts: int = 10):
  """An Inception crop (x0, y0, w, h), int32 scalars, drawn as augment.random_resized_crop_box draws one.

  The first of `attempts` (area fraction in `scale`, aspect w/h log-uniform in `ratio`) that fits, else the largest
  central crop with its aspect ratio clipped to `ratio`.
  """
  k_area, k_aspect, k_x, k_y = jax.random.split(key, 4)
  target = height * width * jax.random.uniform(k_area, (attempts,), minval=scale[0], maxval=scale[1])
  aspect = jnp.exp(jax.random.uniform(k_aspect, (attempts,), minval=np.log(ratio[0]), maxval=np.log(ratio[1])))
  w = jnp.round(jnp.sqrt(target * aspect)).astype(jnp.int32)
  h = jnp.round(jnp.sqrt(target / aspect)).astype(jnp.int32)
  fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
  first = jnp.argmax(fits)
  aspect0 = min(max(width / height, ratio[0]), ratio[1])  # the fallback, fixed by the shapes
  fw, fh = (width, round(width / aspect0)) if aspect0 > width / height else (round(height * aspect0), height)
  fw, fh = min(fw, width), min(fh, height)
  w, h = jnp.where(fits.any(), w[first], fw), jnp.where(fits.any(), h[first], fh)
  x0 = jnp.floor(jax.random.uniform(k_x) * (width - w + 1)).astype(jnp.int32)
  y0 = jnp.floor(jax.random.uniform(k_y) * (height - h + 1)).astype(jnp.int32)
  x0 = jnp.where(fits.any(), x0, (width - w) // 2)
  y0 = jnp.where(fits.any(), y0, (height - h) // 2)
  return x0, y0, w, h


def crop_resize(image, box, size):
  """uint8 [H, W, C] -> its box (x0, y0, w, h) resized to `size`, uint8: PIL's antialiased bilinear resize of a box."""
  x0, y0, w, h = (jnp.asarray(v, jnp.float32) for v in box)
  scale = jnp.stack([size[0] / h, size[1] / w])
  out = jax.image.scale_and_translate(
    image.astype(jnp.float32),
    (*size, image.shape[-1]),
    (0, 1),
    scale,
    -jnp.stack([y0, x0]) * scale,
    method="linear",
    antialias=True,
  )
  return jnp.clip(jnp.round(out), 0, 255).astype(jnp.uint8)
