"""Image classification: images -> class, from tfds datasets read with grain (vitjax.data).

Splits: `config.data.train_split` minus a held-out validation part is what trains; `"valid"` is that part
(`data.valid_fraction` of the training split, drawn by `data.valid_seed`; see vitjax.data.images.holdout_split),
unless the dataset has a `valid` split of its own (a `folder:PATH` with `PATH/valid/`): then that split is
`"valid"`, the whole training split trains and `data.valid_fraction` is not used; any other name is a tfds split
read as it is ("test", "train[:10%]", ...). Evaluators (vitjax.evaluators, config.evals) read 'valid' unless
told otherwise, so `best` is chosen without looking at the test split.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
from absl import logging

from vitjax import convert
from vitjax import data as data_lib
from vitjax import mesh as mesh_lib
from vitjax.config.schema import default_config
from vitjax.data import augment, device_ops, folder, image_files
from vitjax.data import resident as resident_lib
from vitjax.errors import ConfigError
from vitjax.logs import Progress
from vitjax.models.convert_util import flat_params
from vitjax.tasks.base import VALID, TrainInput, check_batch, check_stop, cross_entropy


def worker_count(configured: int | None) -> int:
  """data.worker_count, with None (auto) resolved for this machine.

  0 on a CPU backend, whose cores the step itself uses; on a GPU or TPU the cores this process may use (its CPU
  affinity: a SLURM task's share) less one for the training loop, at most 8, and a log line says so. The batches are
  the same for any count.
  """
  if configured is not None:
    return configured
  if jax.default_backend() == "cpu":
    return 0
  cores = image_files.default_workers()  # (taskset / SLURM's affinity; the CPU count off Linux)
  n = max(0, min(8, cores - 1))
  logging.info("data.worker_count=None: %d grain worker processes (%d cores for this process)", n, cores)
  return n


class ImageClassification:
  """See the module docstring; the interface is vitjax.tasks.base.Task."""

  batch_keys = ("image", "label")

  def __init__(self, config, workdir: str, described: dict | None = None, layout: mesh_lib.Layout | None = None):
    # described: a trained run's WORKDIR/task.json (vitjax.load): the task then needs no dataset.
    self.config, self.workdir, self._described = config, workdir, described
    self.layout = layout or mesh_lib.Layout.of(config)
    self._preprocess = None  # preprocess(), built on first use
    self._own_valid = None  # own_valid(), asked once
    self._training_positions = None  # (training_positions(),), drawn once
    self.teachers = {}  # distillation teachers on this task's mesh, loaded once (vitjax.tasks.distill.load)

  # -- splits
  def own_valid(self) -> bool:
    """Whether the dataset has a 'valid' split of its own (read as it is, instead of a held-out part)."""
    if self._own_valid is None:  # (folder:PATH and csv:FILE datasets; a stock tfds one keeps its held-out part)
      d = self.config.data
      self._own_valid = folder.is_source(d.name) and data_lib.has_split(d.name, VALID, d.data_dir)
    return self._own_valid

  def _holdout(self):
    d = self.config.data
    n = data_lib.split_info(d.name, d.train_split, d.data_dir)["num_examples"]
    return data_lib.holdout_split(n, d.valid_fraction, d.valid_seed)

  def training_positions(self) -> np.ndarray | None:
    """The positions of train_split that train (None: all).

    Without the held-out 'valid', and with data.labelled only a class-balanced subset of the rest (what the probe
    evaluator fits on too).
    """
    if self._training_positions is None:
      d = self.config.data
      kept = self._holdout()[0] if d.valid_fraction and not self.own_valid() else None
      if d.get("labelled") is not None:
        labels = data_lib.split_labels(d.name, d.train_split, d.data_dir)
        kept = np.arange(len(labels)) if kept is None else kept
        try:
          kept = kept[data_lib.labelled_subset(labels[kept], d.labelled, d.get("labelled_seed", 0))]
        except ValueError as e:
          raise ConfigError(f"config.{e}") from None
        counts = np.bincount(labels[kept])
        logging.info(
          "data.labelled=%s: %d training examples, %d-%d per class (labelled_seed %d)",
          d.labelled,
          len(kept),
          counts[counts > 0].min(),
          counts.max(),
          d.get("labelled_seed", 0),
        )
      self._training_positions = (kept,)
    return self._training_positions[0]

  def split_source(self, split: str) -> tuple[str, np.ndarray | None]:
    """(the dataset's split to read, the positions in it) for a split name of this task (None: all of it).

    'valid' without a split of its own is the part held out of train_split; train_split is the rest (and with
    data.labelled its subset). ConfigError for 'valid' where nothing is held out.
    """
    d = self.config.data
    if split == VALID and not self.own_valid():
      if not d.valid_fraction:
        raise ConfigError(
          f"no '{VALID}' split: data.valid_fraction is 0; give another split (--split=test), or train with "
          "--config.data.valid_fraction=0.1"
        )
      return d.train_split, self._holdout()[1]
    return split, self.training_positions() if split == d.train_split else None

  def _input(self, split: str, train: bool, **kw):
    """make_input for a split name of this task (see the module docstring)."""
    d = self.config.data
    split, subset = self.split_source(split)
    try:
      return data_lib.make_input(
        d.name,
        split,
        global_batch_size=kw.pop("batch", d.eval_batch_size),
        image_size=d.image_size,
        train=train,
        data_dir=d.data_dir,
        read_threads=d.read_threads,
        subset=subset,
        preprocess=None if train else self.preprocess(),
        **kw,
      )
    except ValueError as e:  # unknown split, augment keys, fewer examples than a batch, ...
      hint = f" (vitjax adds the split '{VALID}')" if "split" in str(e).lower() else ""
      raise ConfigError(f"config.data ({d.name}, split {split!r}): {str(e).splitlines()[0]}{hint}") from None

  def preprocess(self) -> augment.Preprocess:
    """How images meet the model.

    The config's data.preprocess, its None fields from timm's pretrained config of an init_from='timm:NAME:FILE' model
    (or a hub repository's), else the defaults (augment.Preprocess); a loaded run's from its task.json. An RGB model's
    mean and std on grey images: their averages over the channels.
    """
    if self._described is not None:
      return augment.Preprocess.from_described(self._described)
    if self._preprocess is None:
      given = self.config.data.get("preprocess") or {}
      fields = {k: given.get(k) for k in ("mean", "std", "crop_fraction", "interpolation")}
      source = convert.WeightSource.parse(self.config.init_from)
      if source.imported and any(v is None for v in fields.values()):
        known = convert.pretrained_preprocess(source) or {}
        if self._channels() == 1 and len(known.get("mean") or ()) == 3:  # an RGB model on grey images
          known.update({k: [float(np.mean(known[k]))] for k in ("mean", "std")})  # (and adapt.grey_input's kernel)
        fields = {k: known.get(k) if v is None else v for k, v in fields.items()}
        fields["crop_offset"] = known.get("crop_offset")  # (not a config field: a transformers repository's)
      try:
        self._preprocess = augment.Preprocess(**{k: v for k, v in fields.items() if v is not None})
      except ValueError as e:
        raise ConfigError(f"config.data.{e}") from None
    return self._preprocess

  def _channels(self) -> int | None:
    """The training split's channels (None where the dataset or split is not there: describe() says so)."""
    d = self.config.data
    try:
      return data_lib.split_info(d.name, d.train_split, d.data_dir)["channels"]
    except (ValueError, FileNotFoundError):  # (DatasetNotPreparedError is a FileNotFoundError)
      return None

  # -- interface
  def check(self):
    """Validates the config against the data and the devices, before anything is written.

    Checks that batch_size and data.eval_batch_size split over the layout, data.image_size is positive,
    data.valid_fraction is in [0, 1), data.labelled can be drawn, data.preprocess has one mean and std per channel,
    and model.num_classes is the dataset's.

    Raises:
      ConfigError: naming the setting and the value to give.
    """
    c = self.config
    check_batch(c.batch_size, "batch_size", self.layout, c.optim.accum_steps)
    check_batch(c.data.eval_batch_size, "data.eval_batch_size", self.layout)
    size = c.data.image_size
    sizes = (size, size) if isinstance(size, int) else tuple(size) if isinstance(size, (list, tuple)) else ()
    if len(sizes) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
      raise ConfigError(
        f"data.image_size={size!r} must be a size in pixels or (height, width), each at least 1, "
        "e.g. --config.data.image_size=32"
      )
    if not 0 <= c.data.valid_fraction < 1:
      raise ConfigError(f"data.valid_fraction={c.data.valid_fraction} must be in [0, 1)")
    for key in ("worker_count", "read_threads"):  # None: worker_count's auto, read_threads' grain default
      n = c.data[key]
      if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
        raise ConfigError(f"data.{key}={n!r} must be 0 (read in the training process) or more, or None")
    self._check_on_device()
    info = self.describe()
    self.training_positions()  # data.labelled: a bad amount, or too few examples of a class
    mean = self.preprocess().mean
    if mean is not None and len(mean) != info["channels"]:
      raise ConfigError(
        f"data.preprocess: mean/std have {len(mean)} values, {c.data.name} has {info['channels']} channels; set "
        f"--config.data.preprocess.mean and .std with {info['channels']} values each"
      )
    if c.model.get("num_classes") != info["num_classes"]:
      raise ConfigError(
        f"config.model.num_classes={c.model.get('num_classes')} but {c.data.name} has "
        f"{info['num_classes']} classes; set --config.model.num_classes={info['num_classes']}"
      )

  def _check_on_device(self) -> None:
    """data.on_device is None, True or False, and on_device_max_mb None or positive.

    True only where the batches can be made on the devices (not with RandAugment).
    """
    d = self.config.data
    mode, budget = d.get("on_device"), d.get("on_device_max_mb")
    if mode not in (None, True, False):
      raise ConfigError(f"data.on_device={mode!r}: use None (auto), True or False")
    if budget is not None and not budget > 0:
      raise ConfigError(
        f"data.on_device_max_mb={budget!r} must be positive (or None: a quarter of a device's free memory)"
      )
    why = resident_lib.why_not(augment.parse_augment(d.augment)) if mode else None
    if why:
      raise ConfigError(
        f"data.on_device=True: the training batches cannot be made on the devices: {why}; use None (auto) or False"
      )

  @property
  def data_name(self) -> str:
    """The dataset's name in messages: config.data.name."""
    return self.config.data.name

  def has_split(self, split: str) -> bool:
    """Whether the data has `split` ('valid': held out or its own)."""
    try:
      self.check_split(split, "split")
    except ConfigError:
      return False
    return True

  def check_split(self, split: str, what: str) -> None:
    """ConfigError (naming `what`, the setting) if `split` cannot be read.

    'valid' without a held-out part or a split of its own, or a split the dataset does not have.
    """
    d = self.config.data
    if split == VALID and not self.own_valid():
      if not d.valid_fraction:
        raise ConfigError(
          f"{what}='{VALID}' but data.valid_fraction is 0: set --config.data.valid_fraction=0.1 or --config.{what}=test"
        )
      return
    try:
      data_lib.split_info(d.name, split, d.data_dir)
    except ValueError as e:  # tfds: an unknown split name
      raise ConfigError(f"config.{what}={split!r}: {str(e).splitlines()[0]} (vitjax adds '{VALID}')") from None

  def describe(self) -> dict:
    """What prediction needs, read once from the training split's info (or given by a loaded run's task.json).

    Returns:
      dict: {"task": "classification", "dataset", "num_classes", "class_names", "channels", "image_size": [H, W]}
      and the preprocessing's fields (augment.Preprocess.describe).

    Raises:
      ConfigError: data.train_split is not a split of the dataset.
    """
    if self._described is None:
      d = self.config.data
      try:
        info = data_lib.split_info(d.name, d.train_split, d.data_dir)
      except ValueError as e:  # tfds: an unknown split name
        raise ConfigError(f"config.data.train_split={d.train_split!r}: {str(e).splitlines()[0]}") from None
      h, w = (d.image_size,) * 2 if isinstance(d.image_size, int) else tuple(d.image_size)
      self._described = {
        "task": "classification",
        "dataset": d.name,
        "num_classes": info["num_classes"],
        "class_names": info["class_names"],
        "channels": info["channels"],
        "image_size": [h, w],
        **self.preprocess().describe(),
      }
    return self._described

  def model_overrides(self) -> dict:
    """{}: the data decides no model attribute (check() compares config.model.num_classes with the data's instead)."""
    return {}

  def example_inputs(self):
    """(zeros float32 [1, H, W, C],) at the data's image size and channels."""
    h, w = self.describe()["image_size"]
    return (jnp.zeros((1, h, w, self.describe()["channels"]), jnp.float32),)

  def train_input(self) -> TrainInput:
    """This process's training batches of data.train_split: augmented, shuffled by config.seed, endless.

    An epoch is num_examples // batch_size steps (at least 1).
    """
    c, d = self.config, self.config.data
    resident = self._resident()
    if resident is not None:
      it, info = resident
      steps = max(info.num_examples // c.batch_size, 1)
      return TrainInput(it, info.num_examples, steps, c.batch_size, c.data.name, on_device=True)
    it, info = self._input(
      d.train_split,
      True,
      batch=c.batch_size,
      seed=c.seed,
      augment=d.augment,
      worker_count=worker_count(d.worker_count),
      cache=d.get("cache"),
      cache_max_mb=d.get("cache_max_mb", 1024),
    )
    return TrainInput(it, info.num_examples, max(info.num_examples // c.batch_size, 1), c.batch_size, c.data.name)

  def _resident(self):
    """(iterator, info) of the training batches made on the devices (vitjax.data.resident), or None: the host's."""
    d = self.config.data
    split, subset = self.split_source(d.train_split)
    try:
      return resident_lib.make_resident(
        d.name,
        split,
        global_batch_size=self.config.batch_size,
        image_size=d.image_size,
        seed=self.config.seed,
        mesh=self.layout.mesh(),
        data_dir=d.data_dir,
        augment=d.augment,
        subset=subset,
        on_device=d.get("on_device"),
        max_mb=d.get("on_device_max_mb"),
      )
    except ValueError as e:
      raise ConfigError(f"config.data ({d.name}, split {split!r}): {str(e).splitlines()[0]}") from None

  def device_batch(self, batch, key):
    """Normalises the uint8 images and applies Mixup/CutMix (labels become soft) on the device."""
    pre = self.preprocess()
    images = device_ops.to_float(batch["image"], pre.mean, pre.std)
    aug = augment.parse_augment(self.config.data.augment)
    if not aug.mixes:
      return {**batch, "image": images}
    images, labels = device_ops.mix_batch(images, batch["label"], self.config.model.num_classes, aug, key)
    return {**batch, "image": images, "label": labels}

  def model_inputs(self, batch):
    """(images,): the device batch's "image", float [B, H, W, C]."""
    return (batch["image"],)

  def loss(self, logits, batch):
    """The mean label-smoothed cross-entropy of a batch.

    Args:
      logits: float [B, K].
      batch: with "label", int [B], or soft float [B, K] after Mixup / CutMix.

    Returns:
      tuple: (scalar loss, {"accuracy": the share of argmax predictions equal to the label, or to the soft
      label's argmax}).
    """
    labels = batch["label"]
    loss = cross_entropy(logits, labels, logits.shape[-1], self.config.label_smoothing).mean()
    hard = labels if labels.ndim == 1 else labels.argmax(-1)
    return loss, {"accuracy": jnp.mean(logits.argmax(-1) == hard)}

  def eval_batches(self, split: str, limit: int | None = None):
    """The process-local evaluation batches of a split: what evaluators (vitjax.evaluators) read.

    Batches of (image uint8, label, mask: 0 for padding rows, index: the example's position in the split) of the
    split's first `limit` examples (None: all; the same on any number of processes), with a progress line.
    """
    it, info = self._input(split, False, limit=limit)
    progress = Progress(f"eval {split}", info.steps_per_epoch, unit="images")
    for batch in it:
      yield batch
      progress.update(len(batch["label"]) * jax.process_count())

  # -- representations (vitjax.probe)
  def features(self, model, variables, split, sharding, limit=None, stop=None) -> tuple[np.ndarray, np.ndarray]:
    """(features float32 [N, D], labels int [N]) of a split's images through the evaluation preprocessing.

    The model's pooled representation, the input of its head (its intermediates["pre_logits"]), computed under jit over
    the mesh; every process gets all of them. `limit` caps the examples; `stop()` as in evaluate().
    """
    it, info = self._input(split, False, limit=limit)
    pre = self.preprocess()
    progress = Progress(f"features {split}", info.steps_per_epoch, unit="images")
    feats, labels = [], []
    for batch in it:
      check_stop(stop)
      batch = mesh_lib.to_global(batch, sharding, ("image", "label", "mask"))
      out = _features_step(model, self.representation, variables, batch["image"], pre.mean, pre.std)
      keep = mesh_lib.gather(batch["mask"]).astype(bool)
      feats.append(mesh_lib.gather(out)[keep])
      labels.append(mesh_lib.gather(batch["label"])[keep])
      progress.update(len(keep))
    if not feats:
      raise ConfigError(f"config.data ({self.config.data.name}, split {split!r}): no examples to compute features of")
    return np.concatenate(feats), np.concatenate(labels)

  @staticmethod
  def representation(model, images):
    """Inside model.apply: the pooled features [B, D] of normalised images [B, H, W, C]."""
    intermediates = model(images, train=False)[1]
    if "pre_logits" not in intermediates:
      raise ConfigError(
        f"{type(model).__name__} returns no intermediates['pre_logits'] (the pooled features [B, D] the probe, k-NN "
        "and few-shot evaluators read): return them from its __call__ (CONTRIBUTING.md, 'A model family')"
      )
    return intermediates["pre_logits"]

  # -- prediction (vitjax.load)
  def predict(self, model, variables, images, sharding, batch_size: int = 256) -> np.ndarray:
    """uint8 [N, H, W, C] images as the dataset stores them -> class probabilities float32 [N, classes].

    The images go through the evaluation preprocessing (resize to the model's size, normalise); every process
    passes the same images and gets all the probabilities.
    """
    pre = self.preprocess()
    step = lambda x: _predict_step(model, variables, x, pre.mean, pre.std)
    out = [probs for (probs,) in self._over_images(images, sharding, batch_size, pre, step)]
    return np.concatenate(out) if out else np.zeros((0, self.describe()["num_classes"]), np.float32)

  def embed(self, model, variables, images, sharding, batch_size: int = 256) -> dict[str, np.ndarray]:
    """uint8 [N, H, W, C] images -> {"pooled": [N, D], "patches": [N, h, w, D]}, float32, as predict preprocesses.

    pooled: what the head takes (intermediates["pre_logits"]: the class token, the average, DINOv2's both);
    patches: the encoded patch tokens on their grid (intermediates["patches"]; a Swin's last normalised map).
    """
    pre = self.preprocess()
    step = lambda x: _embed_step(model, variables, x, pre.mean, pre.std)
    parts = list(self._over_images(images, sharding, batch_size, pre, step))
    if not parts:
      raise ValueError("embed takes at least one image")
    return {k: np.concatenate([p[i] for p in parts]) for i, k in enumerate(("pooled", "patches"))}

  def _over_images(self, images, sharding, batch_size: int, pre: augment.Preprocess, step):
    """The step's outputs, gathered, for each batch of the images after the evaluation preprocessing.

    Every process passes the same images and gets all the outputs: a batch is padded to the devices, split over the
    processes and trimmed back.
    """
    info = self.describe()
    images = check_images(images, info["channels"])
    size = tuple(info["image_size"])
    n_dev = jax.device_count()
    batch_size = -(-batch_size // n_dev) * n_dev
    for start in range(0, len(images), batch_size):
      chunk = np.stack([augment.preprocess_eval(im, size, pre) for im in images[start : start + batch_size]])
      rows = len(chunk)
      pad = -rows % n_dev
      if pad:
        chunk = np.concatenate([chunk, np.zeros((pad, *chunk.shape[1:]), chunk.dtype)])
      local = chunk.reshape(jax.process_count(), -1, *chunk.shape[1:])[jax.process_index()]
      local = mesh_lib.to_global({"image": local}, sharding, ("image",))["image"]
      outs = step(local)
      yield tuple(mesh_lib.gather(o)[:rows] for o in (outs if isinstance(outs, tuple) else (outs,)))


def check_images(images, channels: int) -> np.ndarray:
  """The images predict() takes, as uint8 [N, H, W, channels] (one channel may be left out: [N, H, W]).

  Anything else is a ValueError of one line that says what was given and what to do. Integer arrays with values in
  0..255 are taken as they are; floats are refused, since their range (0..1, -1..1, 0..16) cannot be told apart from a
  mistake.
  """
  images = np.asarray(images)
  want = f"predict takes uint8 images [N, H, W, {channels}] with values 0..255, as the dataset stores them"
  shape, last = list(images.shape), images.shape[-1] if images.ndim else None
  if images.ndim == 3 and channels == 1 and last in (3, 4):  # no image is 3 or 4 pixels wide: one colour image
    raise ValueError(
      f"{want}; got shape {shape}, one colour image? Make it grey, e.g. np.asarray(PIL.Image.open(f).convert('L')), "
      "and pass images[None]"
    )
  if images.ndim == 3 and channels == 1 and last != 1:  # [N, H, W]; a lone [H, W, 1] is refused
    images = images[..., None]
  if images.ndim == 3 and last == channels:
    raise ValueError(f"{want}; got shape {shape}, one image? Pass a batch of one: images[None]")
  if images.ndim == 4 and last != channels and last in (1, 3, 4):
    to = "'L'" if channels == 1 else "'RGB'"
    raise ValueError(
      f"{want}; got shape {shape}, images of {last} channel(s): convert them, e.g. PIL.Image.open(f).convert({to})"
    )
  if images.ndim != 4 or images.shape[-1] != channels:
    raise ValueError(f"{want}; got shape {shape}")
  if images.dtype == np.uint8:
    return images
  if np.issubdtype(images.dtype, np.integer) or images.dtype == bool:
    lo, hi = (int(images.min()), int(images.max())) if images.size else (0, 0)
    if 0 <= lo and hi <= 255:
      return images.astype(np.uint8)
    raise ValueError(f"{want}; got {images.dtype} with values {lo}..{hi}")
  lo, hi = (float(images.min()), float(images.max())) if images.size else (0.0, 0.0)
  hint = "np.round(x * 255).astype(np.uint8)" if 0 <= lo and hi <= 1 else "x.astype(np.uint8) after rescaling to 0..255"
  raise ValueError(f"{want}; got {images.dtype} with values {lo:g}..{hi:g}: convert them, e.g. {hint}")


@functools.partial(jax.jit, static_argnums=(0, 1, 4, 5))
def _features_step(model, representation, variables, images, mean=None, std=None):
  out = model.apply(variables, device_ops.to_float(images, mean, std), method=representation)
  return out.reshape(out.shape[0], -1).astype(jnp.float32)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _embed_step(model, variables, images, mean=None, std=None):
  _, inter = model.apply(variables, device_ops.to_float(images, mean, std), train=False)
  if "patches" not in inter or "pre_logits" not in inter:
    raise ConfigError(
      f"{type(model).__name__} returns no intermediates['pre_logits'] and ['patches'] (the pooled features and the "
      "patch grid's): return them from its __call__ (CONTRIBUTING.md, 'A model family')"
    )
  return inter["pre_logits"].astype(jnp.float32), inter["patches"].astype(jnp.float32)


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _predict_step(model, variables, images, mean=None, std=None):
  logits, _ = model.apply(variables, device_ops.to_float(images, mean, std), train=False)
  return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)


def hub_classifier(spec: str) -> tuple[mlc.ConfigDict, dict, object, dict]:
  """(config, described, module, variables) of a classifier on the hub, 'hf:ORG/NAME[@REVISION]' (convert.from_hub).

  What vitjax.load("hf:...") and a distillation teacher from the hub (vitjax.tasks.distill) build their model from:
  config.model (convert.model_config's fields), the input size, the preprocessing (mean, std, crop, interpolation)
  and the class names, read from the repository's config as a workdir's config.json and task.json give them.

  described: what a run's task.json holds (task, dataset, num_classes, class_names, channels, image_size and the
  preprocessing's fields). ConfigError (one line) for a repository that cannot be read.
  """
  module, variables, repo = convert.from_hub(spec)
  flat = flat_params(variables["params"])
  channels = next(v.shape[2] for k, v in flat.items() if k in ("embedding/kernel", "patch_embed/kernel"))
  num_classes = int(module.num_classes or 0)
  h, w = repo.image_size()
  pre = augment.Preprocess(**{k: v for k, v in repo.preprocess().items() if v is not None})
  described = {
    "task": "classification",
    "dataset": spec,
    "num_classes": num_classes,
    "class_names": repo.class_names(num_classes),
    "channels": channels,
    "image_size": [h, w],
    **pre.describe(),
  }
  config = default_config()
  config.model = mlc.ConfigDict(convert.model_config(module))
  config.data.name = spec
  if h == w:
    config.data.image_size = h
  else:  # the field is an int: a config of its own with (height, width), as a config file may give it
    config.data = mlc.ConfigDict({**config.data.to_dict(), "image_size": (h, w)})
  for k in ("mean", "std", "crop_fraction", "interpolation"):
    config.data.preprocess[k] = getattr(pre, k)
  config.init_from = spec
  return config, described, module, variables
