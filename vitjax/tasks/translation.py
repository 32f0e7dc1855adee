"""Translation: source sentence -> target sentence with the encoder-decoder Transformer (vitjax.data.text).

The SentencePiece tokenizer is trained on the training split at the first start and stored as
WORKDIR/tokenizer.model, so evaluation, decoding and vitjax.load use the same vocabulary. Held-out splits
("valid", "test") are fixed by config.data.split_seed.

Special ids: the tokenizer is trained with config.model.pad_id, eos_id, bos_id (None: vitjax's 0, 1, 2; bos_id
equal to pad_id: no bos piece, decoding starts from pad, as flax's examples/wmt), and the model always gets the
tokenizer's ids. An id set in the config that the workdir's (or init_from's) tokenizer.model does not have is a
ConfigError naming the value to set.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from vitjax import convert, decode, paths
from vitjax import mesh as mesh_lib
from vitjax.data import text
from vitjax.errors import ConfigError
from vitjax.logs import Progress
from vitjax.tasks.base import TrainInput, check_batch, cross_entropy


class Translation:
  """See the module docstring; the interface is vitjax.tasks.base.Task."""

  batch_keys = ("src", "tgt")

  def __init__(self, config, workdir: str, described: dict | None = None, layout: mesh_lib.Layout | None = None):
    del described  # everything prediction needs is config.json and WORKDIR/tokenizer.model
    self.config, self.workdir = config, workdir
    self.layout = layout or mesh_lib.Layout.of(config)
    self._splits = None
    self._tokenizer = None
    self._references = None  # references(), read once

  # -- data
  @property
  def splits(self) -> dict:
    """Each split's (source, target) pairs, {"train", "valid", "test"}, read once.

    "valid" and "test" are drawn by data.split_seed, or are the books data.valid_books and data.test_books name;
    data.test_source, when set, replaces "test".

    Raises:
      ConfigError: the source cannot be read or split.
    """
    if self._splits is None:
      d = self.config.data
      try:
        books = {
          k: [b.strip() for b in str(d.get(k) or "").split(",") if b.strip()] for k in ("valid_books", "test_books")
        }
        refs = [] if any(books.values()) else None
        pairs = text.load_pairs(d.source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir, refs=refs)
        if refs is None:
          self._splits = text.split_pairs(pairs, d.split_seed, d.num_valid, d.num_test)
        else:
          self._splits = text.split_by_books(pairs, refs, books["valid_books"], books["test_books"])
        repeated = len(pairs) - sum(len(v) for v in self._splits.values())  # (the splits hold each pair once)
        if d.get("test_source"):
          self._splits["test"] = text.load_pairs(
            d.test_source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir
          )
      except ValueError as e:
        raise ConfigError(f"config.data: {e}") from None
      sizes = ", ".join(f"{k} {len(v)}" for k, v in self._splits.items())
      dropped = f" ({len(pairs)} read, {repeated} repeated pairs left out)" if repeated else ""
      logging.info("%s %s->%s: %s pairs%s", d.source, d.src_lang, d.tgt_lang, sizes, dropped)
    return self._splits

  @property
  def tokenizer(self) -> text.Tokenizer:
    """WORKDIR/tokenizer.model; copied from init_from's workdir, or trained on the training split, if missing."""
    if self._tokenizer is None:
      path, parent = self._tokenizer_paths()
      if not os.path.exists(path) and parent and os.path.exists(parent):
        os.makedirs(self.workdir, exist_ok=True)  # fine-tuning keeps the vocabulary of the weights it starts from
        if jax.process_index() == 0:
          with open(parent, "rb") as src, paths.replacing(path) as dst:
            shutil.copyfileobj(src, dst)
        mesh_lib.sync("tokenizer")
        logging.info("tokenizer copied from %s", parent)
      if not os.path.exists(path):
        d = self.config.data
        texts = [s for pair in self.splits["train"] for s in pair]
        logging.info("training a %d-piece SentencePiece model on %d training sentences", d.vocab_size, len(texts))
        os.makedirs(self.workdir, exist_ok=True)
        if jax.process_index() == 0:  # deterministic, so other processes wait and read the same file
          with tempfile.TemporaryDirectory(prefix=".tokenizer-", dir=self.workdir) as fresh:  # (a folder of its own)
            tmp = os.path.join(fresh, "tokenizer")
            try:
              text.Tokenizer.train(
                texts,
                tmp,
                vocab_size=d.vocab_size,
                seed=self.config.seed,
                input_sentence_size=d.tokenizer_sentences,
                **self._configured_ids(),
              )
            except ConfigError as e:  # the vocabulary this text cannot give
              raise ConfigError(f"config.data.{e}; set --config.data.vocab_size") from None
            if os.path.exists(tmp + ".vocab"):
              paths.publish(tmp + ".vocab", os.path.join(self.workdir, "tokenizer.vocab"))
            paths.publish(tmp + ".model", path)
        mesh_lib.sync("tokenizer")
      tok = text.Tokenizer.load(path)
      for name, want in self._configured_ids(defaults=False).items():
        if want != tok.special_ids[name]:
          have = ", ".join(f"{k}={v}" for k, v in tok.special_ids.items())
          raise ConfigError(
            f"config.model.{name}={want} but {path} has {have}: set --config.model.{name}={tok.special_ids[name]} "
            "(or leave it unset to take the tokenizer's), or use a new workdir to train a tokenizer with these ids"
          )
      self._tokenizer = tok
    return self._tokenizer

  def _configured_ids(self, defaults: bool = True) -> dict:
    """config.model's pad_id, eos_id, bos_id that are set (with defaults: every one, unset ones 0, 1, 2)."""
    m = self.config.model
    ids = {k: m.get(k) for k in ("pad_id", "eos_id", "bos_id") if m.get(k) is not None}
    return {"pad_id": text.PAD_ID, "eos_id": text.EOS_ID, "bos_id": text.BOS_ID, **ids} if defaults else ids

  # -- interface
  def check(self):
    """Validates the config before anything is written.

    Checks that data.eval_batch_size splits over the layout, data.max_len, too_long and tokens_per_batch can batch,
    init_from is not imported weights (only a translation workdir), and the data can be read.

    Raises:
      ConfigError: naming the setting and what is wrong.
    """
    c = self.config
    d = c.data
    check_batch(d.eval_batch_size, "data.eval_batch_size", self.layout)
    if not isinstance(d.max_len, int) or d.max_len < 2:
      raise ConfigError(f"data.max_len={d.max_len!r} must be at least 2 tokens (EOS included), e.g. 128")
    if d.too_long not in ("drop", "truncate"):
      raise ConfigError(f"data.too_long={d.too_long!r}: use 'drop' or 'truncate'")
    if not isinstance(d.tokens_per_batch, int) or d.tokens_per_batch < d.max_len:
      raise ConfigError(
        f"data.tokens_per_batch={d.tokens_per_batch!r} must hold at least one pair of data.max_len={d.max_len} "
        "tokens, e.g. --config.data.tokens_per_batch=4096"
      )
    if convert.WeightSource.parse(c.init_from).imported:
      raise ConfigError("translation can start only from another translation workdir (init_from=WORKDIR)")
    self._check_kept_tokenizer()
    self.splits  # noqa: B018 (reads the data now: a missing source stops the run before anything is written)

  def _tokenizer_paths(self) -> tuple[str, str]:
    """(WORKDIR/tokenizer.model, init_from's workdir's or ''): the run's tokenizer, and the one fine-tuning keeps."""
    source = convert.WeightSource.parse(self.config.init_from)
    parent = os.path.join(source.path, "tokenizer.model") if source.kind == "workdir" else ""
    return os.path.join(self.workdir or "", "tokenizer.model"), parent

  def _check_kept_tokenizer(self) -> None:
    """ConfigError where the tokenizer a run keeps (its own, or init_from's) has another size than data.vocab_size.

    Before, a resumed or fine-tuned run with another vocab_size recorded the change and trained on the old tokenizer.
    """
    for path in self._tokenizer_paths()[0 if self.workdir else 1 :]:
      if path and os.path.exists(path):
        have, want = text.Tokenizer.load(path).vocab_size, self.config.data.vocab_size
        if have != want:
          raise ConfigError(
            f"config.data.vocab_size={want} but {path} has {have} pieces: a run keeps its tokenizer (fine-tuning, "
            f"that of init_from); set --config.data.vocab_size={have}, or train a new tokenizer in a new workdir"
          )
        return

  def check_split(self, split: str, what: str) -> None:
    """ConfigError naming the setting `what` if there is no split `split`."""
    if split not in self.splits:
      raise ConfigError(f"config.{what}={split!r}: this task has the splits {list(self.splits)}")

  def has_split(self, split: str) -> bool:
    """Whether there is a split `split`."""
    return split in self.splits

  @property
  def data_name(self) -> str:
    """The text source's name in messages: config.data.source."""
    return self.config.data.source

  def describe(self) -> dict:
    """What prediction needs beyond config.json.

    Returns:
      dict: {"task": "translation", "src_lang", "tgt_lang", "tokenizer": "tokenizer.model" (the file in the workdir),
      "vocab_size", "max_len"}.
    """
    d = self.config.data
    return {
      "task": "translation",
      "src_lang": d.src_lang,
      "tgt_lang": d.tgt_lang,
      "tokenizer": "tokenizer.model",
      "vocab_size": self.tokenizer.vocab_size,
      "max_len": d.max_len,
    }

  def model_overrides(self) -> dict:
    """The model attributes the tokenizer and the data decide.

    Returns:
      {"vocab_size", "max_len", "pad_id", "eos_id", "bos_id"}.
    """
    return {"vocab_size": self.tokenizer.vocab_size, "max_len": self.config.data.max_len, **self.tokenizer.special_ids}

  def example_inputs(self):
    """(src, tgt): ones int32 [1, 8] each."""
    return jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32)

  def train_input(self) -> TrainInput:
    """This process's share of the training split's length-bucketed batches, shuffled by config.seed, endless.

    A global batch holds data.tokens_per_batch tokens, with empty rows up to a multiple of the batch shards times
    optim.accum_steps.
    """
    c, d = self.config, self.config.data
    it = text.make_batches(
      self.splits["train"],
      self.tokenizer,
      tokens_per_batch=d.tokens_per_batch,  # global: the batches do not depend on the devices or processes
      max_len=d.max_len,
      too_long=d.too_long,
      seed=c.seed,
      shuffle=True,
      num_epochs=None,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
      pad_multiple=self.layout.batch_shards * c.optim.accum_steps,  # empty rows, no weight in the loss
    )
    return TrainInput(it, len(self.splits["train"]), it.steps_per_epoch, None, f"{d.source} {d.src_lang}-{d.tgt_lang}")

  def device_batch(self, batch, key):
    """The batch unchanged: translation has no batch-level work on the devices."""
    return batch

  def model_inputs(self, batch):
    """(src int [B, S], tgt int [B, T]) from a batch."""
    return batch["src"], batch["tgt"]

  def loss(self, logits, batch):
    """The label-smoothed cross-entropy per target token, padding excluded.

    Args:
      logits: float [B, T, V].
      batch: with "tgt", int [B, T], the tokenizer's PAD after the end.

    Returns:
      tuple: (the mean loss per token, {"accuracy": per token, "tokens": the target tokens counted}).
    """
    tgt = batch["tgt"]
    w = (tgt != self.tokenizer.PAD).astype(jnp.float32)
    ce = cross_entropy(logits, tgt, logits.shape[-1], self.config.label_smoothing)
    n = jnp.maximum(w.sum(), 1.0)
    return (ce * w).sum() / n, {"accuracy": ((logits.argmax(-1) == tgt) * w).sum() / n, "tokens": w.sum()}

  # -- decoding
  def translate_batch(self, model, params, src, max_len: int, decoding: dict):
    """Token ids [B, S] (global array) -> token ids [B, max_len] with `decoding` (DECODING's keys).

    Each row is decoded to at most decode_len(its source's tokens, extra_len) tokens (max_len, static, is at least
    that of the longest: decode_len(S, extra_len)); so a sentence's translation does not depend on the rest of its
    batch, nor on the references.
    """
    g = {**decode.DECODING, **decoding}
    lengths = decode.row_lengths(src, self.tokenizer.PAD, max_len, float(g["extra_len"]), self.config.data.max_len)
    return decode.search(model, params, src, max_len, g, rng=jax.random.key(self.config.seed), lengths=lengths)

  def decode_len(self, src_len: int, extra_len: int) -> int:
    """The most tokens decoded for a source of `src_len` tokens with its EOS (decode.cap, at most data.max_len)."""
    return int(decode.cap(src_len, extra_len, self.config.data.max_len))

  def eval_batches(self, split: str, limit: int | None = None):
    """(pairs, this process's batches) of a split's first `limit` pairs (None: all).

    Batches of src, tgt, index (-1 for padding rows), mask: what evaluators (vitjax.evaluators.translation) read.
    """
    self.check_split(split, "split")
    d = self.config.data
    pairs = self.splits[split][:limit] if limit else self.splits[split]
    batches = text.make_eval_batches(
      pairs,
      self.tokenizer,
      batch_size=d.eval_batch_size // jax.process_count(),
      max_len=d.max_len,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
    )
    return pairs, batches

  def references(self) -> dict:
    """{pair: every acceptable target} for a source with several (the Ding dictionary's synonyms), read once.

    {} for a source with one reference each.
    """
    if self._references is None:
      d = self.config.data
      found = text.load_references(d.source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir)
      self._references = found if found is not None else {}
    return self._references

  # -- prediction (vitjax.load, vitjax.translate)
  def translate(self, model, variables, lines, sharding, batch_size: int = 32, warn=logging.warning, **decode_args):
    """Source strings -> translated strings, one per line and in order; an empty line gives an empty line.

    Lines longer than the model's max_len tokens are truncated (with a warning naming the line); characters the
    tokenizer does not know become the unknown token. decode_args (method, beam_size, alpha, temperature, top_k,
    extra_len; None: left as is) override the run's decoding: that of the evaluator that chose its best
    (vitjax.decode.configured). Every process passes the same lines and gets all translations.
    """
    g = {**decode.configured(self.config), **{k: v for k, v in decode_args.items() if v is not None}}
    decode.check_decoding(g, vocab_size=self.tokenizer.vocab_size)
    decode.check_method_options(g["method"], {k: v for k, v in decode_args.items() if k != "method"})
    tok, max_len = self.tokenizer, self.config.data.max_len
    out = [""] * len(lines)
    todo = []
    for i, line in enumerate(lines):
      line = line.strip()
      if not line:
        continue
      ids = tok.encode(line)
      if len(ids) > max_len - 1:
        warn(f"line {i + 1} has {len(ids)} tokens; truncated to the model's max_len of {max_len} (with EOS)")
        ids = ids[: max_len - 1]
      todo.append((i, ids + [tok.EOS]))
    n_dev = jax.device_count()
    batch_size = -(-batch_size // n_dev) * n_dev
    todo.sort(key=lambda x: len(x[1]))  # similar lengths together: less padding
    progress = Progress("translate", -(-len(todo) // batch_size), unit="lines")
    for start in range(0, len(todo), batch_size):
      chunk = todo[start : start + batch_size]
      width = min(-(-max(len(ids) for _, ids in chunk) // 8) * 8, max_len)  # few distinct shapes, few compilations
      src = np.full((batch_size, width), tok.PAD, np.int32)
      for r, (_, ids) in enumerate(chunk):
        src[r, : len(ids)] = ids
      local = src.reshape(jax.process_count(), -1, width)[jax.process_index()]
      src = mesh_lib.to_global({"src": local}, sharding, ("src",))["src"]
      tokens = mesh_lib.gather(
        self.translate_batch(model, variables["params"], src, self.decode_len(width, g["extra_len"]), g)
      )
      for (i, _), line in zip(chunk, tok.decode_batch(tokens[: len(chunk)])):
        out[i] = line
      progress.update(len(chunk))
    return out
