"""Tasks: what differs between image classification and translation, behind one small interface, so that one
trainer (vitjax.train) serves both. A task knows its inputs, its loss and its evaluation; the trainer knows
the mesh, the optimizer, checkpoints and reporting.

Interface (duck-typed):
  check()                          validate the config against the devices, before anything is written
  model_overrides() -> dict        model attributes the data decides (vocabulary size, ...)
  example_inputs() -> tuple        batch-1 inputs for model.init
  train_input() -> (iterator, num_examples, steps_per_epoch); the iterator has get_state/set_state
  model_inputs(batch) -> tuple     positional model inputs taken from a batch
  loss(logits, batch) -> (scalar, {name: scalar})
  data_state(it) -> str / restore_data_state(it, str)
  evaluate(exp, params, model_state, split, limit) -> {"eval/...": float}
  batch_keys                       keys of a training batch that go to the devices
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np

from vitjax import data as data_lib


class ConfigError(ValueError):
  """A problem with the experiment's config, workdir or checkpoints; the message says how to fix it."""


def check_batch(batch_size: int, what: str = "batch_size") -> None:
  n, procs = jax.device_count(), jax.process_count()
  if batch_size % n:
    lo, hi = (batch_size // n) * n, (batch_size // n + 1) * n
    raise ConfigError(
      f"{what}={batch_size} is not divisible by the {n} devices; use a multiple of {n} "
      f"(e.g. --config.{what}={hi}{f' or {lo}' if lo else ''})"
    )
  if batch_size % procs:
    raise ConfigError(f"{what}={batch_size} is not divisible by the {procs} processes")


def to_global(batch: dict, sharding, keys) -> dict:
  """Process-local numpy batch -> global jax arrays split over the mesh's data axis."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(batch[k])) for k in keys if k in batch}


def cross_entropy(logits, labels, num_classes: int, smoothing: float = 0.0):
  """Label-smoothed cross-entropy. labels: int [...] or soft [..., K]; logits [..., K] -> [...]."""
  targets = jax.nn.one_hot(labels, num_classes) if labels.ndim == logits.ndim - 1 else labels
  if smoothing:
    targets = targets * (1.0 - smoothing) + smoothing / num_classes
  return -jnp.sum(targets * jax.nn.log_softmax(logits.astype(jnp.float32)), axis=-1)


# -------------------------------------------------------------------------------- classification


class ImageClassification:
  """Images -> class, from tfds datasets read with grain (vitjax.data)."""

  batch_keys = ("image", "label")

  def __init__(self, config, workdir: str, log=print):
    self.config, self.workdir, self.log = config, workdir, log
    self._eval_step = None

  def check(self):
    c = self.config
    check_batch(c.batch_size)
    check_batch(c.data.eval_batch_size, "data.eval_batch_size")
    if c.optim.accum_steps < 1 or c.batch_size % (c.optim.accum_steps * jax.device_count()):
      raise ConfigError(
        f"optim.accum_steps={c.optim.accum_steps}: each micro-batch (batch_size / accum_steps) "
        f"must split evenly over the {jax.device_count()} devices"
      )
    _check_best_metric(c, ("eval/accuracy", "eval/loss"))

  def _input(self, split, train, **kw):
    d = self.config.data
    return data_lib.make_input(
      d.name,
      split,
      global_batch_size=kw.pop("batch", d.eval_batch_size),
      image_size=d.image_size,
      train=train,
      data_dir=d.data_dir,
      read_threads=d.read_threads,
      **kw,
    )

  def model_overrides(self) -> dict:
    return {}

  def example_inputs(self):
    _, info = self._input(self.config.data.eval_split, False)
    h, w = (self.config.data.image_size,) * 2
    return (jnp.zeros((1, h, w, info.image_shape[-1]), jnp.float32),)

  def train_input(self):
    c, d = self.config, self.config.data
    it, info = self._input(
      d.train_split, True, batch=c.batch_size, seed=c.seed, augment=d.augment, worker_count=d.worker_count
    )
    if c.model.get("num_classes") != info.num_classes:
      raise ConfigError(
        f"config.model.num_classes={c.model.get('num_classes')} but {d.name} has "
        f"{info.num_classes} classes; set --config.model.num_classes={info.num_classes}"
      )
    self.num_classes = info.num_classes
    return it, info.num_examples, max(info.num_examples // c.batch_size, 1)

  def model_inputs(self, batch):
    return (batch["image"],)

  def loss(self, logits, batch):
    labels = batch["label"]
    loss = cross_entropy(logits, labels, logits.shape[-1], self.config.label_smoothing).mean()
    hard = labels if labels.ndim == 1 else labels.argmax(-1)
    return loss, {"accuracy": jnp.mean(logits.argmax(-1) == hard)}

  def data_state(self, it) -> str:
    s = it.get_state()
    return s.decode() if isinstance(s, bytes) else json.dumps(s)

  def restore_data_state(self, it, state: str) -> None:
    it.set_state(state.encode())

  def evaluate(self, exp, params, model_state, split, limit=None) -> dict:
    if self._eval_step is None:

      def eval_step(params, model_state, batch):
        logits, _ = exp.model.apply({"params": params, **model_state}, batch["image"], train=False)
        mask = batch["mask"].astype(jnp.float32)
        loss = cross_entropy(logits, batch["label"], logits.shape[-1])
        return {
          "loss_sum": jnp.sum(loss * mask),
          "correct": jnp.sum((logits.argmax(-1) == batch["label"]) * mask),
          "count": jnp.sum(mask),
        }

      self._eval_step = jax.jit(eval_step)
    it, _ = self._input(split, False)
    sums = None
    for batch in it:
      out = self._eval_step(params, model_state, to_global(batch, exp.batch_sharding, ("image", "label", "mask")))
      sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
    sums = jax.device_get(sums)
    return {
      "eval/loss": float(sums["loss_sum"] / sums["count"]),
      "eval/accuracy": float(sums["correct"] / sums["count"]),
      "eval/examples": float(sums["count"]),
    }


# ----------------------------------------------------------------------------------- translation


class Translation:
  """Source sentence -> target sentence with the encoder-decoder Transformer (vitjax.data.text pipelines).

  The SentencePiece tokenizer is trained on the training split at the first start and stored as
  WORKDIR/tokenizer.model, so evaluation and decoding use the same vocabulary. Held-out splits ("valid",
  "test") are fixed by config.data.split_seed.
  """

  batch_keys = ("src", "tgt")

  def __init__(self, config, workdir: str, log=print):
    self.config, self.workdir, self.log = config, workdir, log
    self._splits = None
    self._tokenizer = None
    self._eval_loss = None

  # -- data
  @property
  def splits(self) -> dict:
    if self._splits is None:
      from vitjax.data import text

      d = self.config.data
      try:
        pairs = text.load_pairs(d.source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir)
        self._splits = text.split_pairs(pairs, d.split_seed, d.num_valid, d.num_test)
        if d.get("test_source"):
          self._splits["test"] = text.load_pairs(
            d.test_source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir
          )
      except text.SourceNotAvailableError as e:
        raise data_lib.DatasetNotPreparedError(str(e)) from None
      self.log(
        f"{d.source} {d.src_lang}->{d.tgt_lang}: "
        + ", ".join(f"{k} {len(v)}" for k, v in self._splits.items())
        + " pairs"
      )
    return self._splits

  @property
  def tokenizer(self):
    if self._tokenizer is None:
      from vitjax.data import text

      path = os.path.join(self.workdir, "tokenizer.model")
      parent = os.path.join(self.config.init_from, "tokenizer.model") if self.config.get("init_from") else ""
      if not os.path.exists(path) and parent and os.path.exists(parent):
        os.makedirs(self.workdir, exist_ok=True)  # fine-tuning keeps the vocabulary of the weights it starts from
        if jax.process_index() == 0:
          shutil.copyfile(parent, path + ".tmp")
          os.replace(path + ".tmp", path)
        if jax.process_count() > 1:
          from jax.experimental import multihost_utils

          multihost_utils.sync_global_devices("tokenizer")
        self.log(f"tokenizer copied from {parent}")
      if not os.path.exists(path):
        d = self.config.data
        train = self.splits["train"]
        texts = [s for pair in train for s in pair]
        self.log(f"training a {d.vocab_size}-piece SentencePiece model on {len(texts)} training sentences")
        os.makedirs(self.workdir, exist_ok=True)
        if jax.process_index() == 0:  # deterministic, so other processes wait and read the same file
          tmp = os.path.join(self.workdir, "tokenizer.tmp")
          text.Tokenizer.train(
            texts, tmp, vocab_size=d.vocab_size, seed=self.config.seed, input_sentence_size=d.tokenizer_sentences
          )
          os.replace(tmp + ".model", path)
          if os.path.exists(tmp + ".vocab"):
            os.replace(tmp + ".vocab", os.path.join(self.workdir, "tokenizer.vocab"))
        if jax.process_count() > 1:
          from jax.experimental import multihost_utils

          multihost_utils.sync_global_devices("tokenizer")
      self._tokenizer = text.Tokenizer.load(path)
    return self._tokenizer

  def check(self):
    c = self.config
    check_batch(c.data.eval_batch_size, "data.eval_batch_size")
    if c.optim.accum_steps < 1:
      raise ConfigError("optim.accum_steps must be at least 1")
    if c.decode.method not in ("beam", "greedy", "sample"):
      raise ConfigError(f"unknown decode.method {c.decode.method!r}; use 'beam', 'greedy' or 'sample'")
    _check_best_metric(c, ("eval/bleu", "eval/chrf", "eval/loss"))
    if c.init_from and c.init_from.startswith(("timm:", "npz:")):
      raise ConfigError("translation can start only from another translation workdir (init_from=WORKDIR)")

  def model_overrides(self) -> dict:
    return {"vocab_size": self.tokenizer.vocab_size, "max_len": self.config.data.max_len}

  def example_inputs(self):
    return jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32)

  def train_input(self):
    from vitjax.data import text

    c, d = self.config, self.config.data
    multiple = jax.local_device_count() * c.optim.accum_steps
    it = text.make_batches(
      self.splits["train"],
      self.tokenizer,
      tokens_per_batch=d.tokens_per_batch // jax.process_count(),
      max_len=d.max_len,
      too_long=d.too_long,
      batch_multiple=multiple,
      seed=c.seed,
      shuffle=True,
      num_epochs=None,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
    )
    return it, len(self.splits["train"]), it.steps_per_epoch

  def model_inputs(self, batch):
    return batch["src"], batch["tgt"]

  def loss(self, logits, batch):
    tgt = batch["tgt"]
    w = (tgt != 0).astype(jnp.float32)
    ce = cross_entropy(logits, tgt, logits.shape[-1], self.config.label_smoothing)
    n = jnp.maximum(w.sum(), 1.0)
    return (ce * w).sum() / n, {"accuracy": ((logits.argmax(-1) == tgt) * w).sum() / n, "tokens": w.sum()}

  def data_state(self, it) -> str:
    return json.dumps(it.get_state())

  def restore_data_state(self, it, state: str) -> None:
    it.set_state(json.loads(state))

  # -- evaluation
  def translate_batch(self, exp, params, src, max_len: int):
    """Token ids [B, S] (global array) -> token ids [B, max_len] with the configured decoding."""
    from vitjax import decode

    g = self.config.decode
    if g.method == "beam":
      return decode.beam_search(exp.model, params, src, beam_size=g.beam_size, max_len=max_len, alpha=g.alpha)[0]
    if g.method == "greedy":
      return decode.greedy(exp.model, params, src, max_len=max_len)
    if g.method == "sample":
      return decode.sample(
        exp.model,
        params,
        src,
        jax.random.key(self.config.seed),
        max_len=max_len,
        temperature=g.temperature,
        top_k=g.top_k,
      )
    raise ConfigError(f"unknown decode.method {g.method!r}; use 'beam', 'greedy' or 'sample'")

  def decode_len(self, src_len: int) -> int:
    return int(min(self.config.data.max_len, src_len * 1.5 + self.config.decode.extra_len))

  def evaluate(self, exp, params, model_state, split, limit=None) -> dict:
    import sacrebleu

    from vitjax.data import text

    d = self.config.data
    if split not in self.splits:
      raise ConfigError(f"no split {split!r}; translation splits are {sorted(self.splits)}")
    pairs = self.splits[split][:limit] if limit else self.splits[split]
    batches = text.make_eval_batches(
      pairs,
      self.tokenizer,
      batch_size=d.eval_batch_size // jax.process_count(),
      max_len=d.max_len,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
    )
    if self._eval_loss is None:

      def eval_loss(params, batch):
        logits, _ = exp.model.apply({"params": params}, batch["src"], batch["tgt"], train=False)
        w = (batch["tgt"] != 0) & batch["mask"][:, None]
        ce = cross_entropy(logits, batch["tgt"], logits.shape[-1])
        return jnp.sum(ce * w), jnp.sum(w)

      self._eval_loss = jax.jit(eval_loss)
    hyps = [""] * len(pairs)
    loss_sum = count = 0.0
    for b in batches:
      g = to_global(b, exp.batch_sharding, ("src", "tgt", "mask"))
      batch_loss, n = self._eval_loss(params, g)
      loss_sum, count = loss_sum + float(batch_loss), count + float(n)
      out = self.translate_batch(exp, params, g["src"], self.decode_len(b["src"].shape[1]))
      out, index = _gather(out), _gather(jax.make_array_from_process_local_data(exp.batch_sharding, b["index"]))
      for row, i in zip(self.tokenizer.decode_batch(out), index):
        if i >= 0:
          hyps[i] = row
    refs = [t for _, t in pairs]
    return {
      "eval/loss": loss_sum / max(count, 1.0),
      "eval/bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
      "eval/chrf": sacrebleu.corpus_chrf(hyps, [refs]).score,
      "eval/bleu_copy_source": sacrebleu.corpus_bleu([s for s, _ in pairs], [refs]).score,
      "eval/examples": float(len(pairs)),
    }


def _check_best_metric(config, valid):
  if config.best_metric not in valid:
    raise ConfigError(f"best_metric={config.best_metric!r} is not reported by this task; use one of {list(valid)}")
  if config.best_mode not in ("max", "min"):
    raise ConfigError(f"best_mode must be 'max' or 'min', got {config.best_mode!r}")


def _gather(x) -> np.ndarray:
  """A global array -> all of its rows as numpy on every process."""
  if jax.process_count() == 1:
    return np.asarray(jax.device_get(x))
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


TASKS = {"classification": ImageClassification, "translation": Translation}


def get(config, workdir: str, log=print):
  name = config.get("task", "classification")
  if name not in TASKS:
    raise ConfigError(f"unknown task {name!r}; use one of {sorted(TASKS)}")
  return TASKS[name](config, workdir, log)
