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

import functools
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from vitjax import convert, decode
from vitjax import mesh as mesh_lib
from vitjax.data import text
from vitjax.errors import ConfigError
from vitjax.logs import Progress
from vitjax.tasks.base import TrainInput, check_batch, check_best_metric, check_stop, cross_entropy

METHODS = ("beam", "greedy", "sample")


class Translation:
  """See the module docstring; the interface is vitjax.tasks.base.Task."""

  batch_keys = ("src", "tgt")

  def __init__(self, config, workdir: str, described: dict | None = None, layout: mesh_lib.Layout | None = None):
    del described  # everything prediction needs is config.json and WORKDIR/tokenizer.model
    self.config, self.workdir = config, workdir
    self.layout = layout or mesh_lib.Layout.of(config)
    self._splits = None
    self._tokenizer = None
    self._references = None  # _synonym_scores(): {pair: every acceptable target}, read once

  # -- data
  @property
  def splits(self) -> dict:
    if self._splits is None:
      d = self.config.data
      try:
        pairs = text.load_pairs(d.source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir)
        self._splits = text.split_pairs(pairs, d.split_seed, d.num_valid, d.num_test)
        if d.get("test_source"):
          self._splits["test"] = text.load_pairs(
            d.test_source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir
          )
      except ValueError as e:
        raise ConfigError(f"config.data: {e}") from None
      sizes = ", ".join(f"{k} {len(v)}" for k, v in self._splits.items())
      logging.info("%s %s->%s: %s pairs", d.source, d.src_lang, d.tgt_lang, sizes)
    return self._splits

  @property
  def tokenizer(self) -> text.Tokenizer:
    """WORKDIR/tokenizer.model; copied from init_from's workdir, or trained on the training split, if missing."""
    if self._tokenizer is None:
      path = os.path.join(self.workdir, "tokenizer.model")
      source = convert.WeightSource.parse(self.config.init_from)
      parent = os.path.join(source.path, "tokenizer.model") if source.kind == "workdir" else ""
      if not os.path.exists(path) and parent and os.path.exists(parent):
        os.makedirs(self.workdir, exist_ok=True)  # fine-tuning keeps the vocabulary of the weights it starts from
        if jax.process_index() == 0:
          shutil.copyfile(parent, path + ".tmp")
          os.replace(path + ".tmp", path)
        mesh_lib.sync("tokenizer")
        logging.info("tokenizer copied from %s", parent)
      if not os.path.exists(path):
        d = self.config.data
        texts = [s for pair in self.splits["train"] for s in pair]
        logging.info("training a %d-piece SentencePiece model on %d training sentences", d.vocab_size, len(texts))
        os.makedirs(self.workdir, exist_ok=True)
        if jax.process_index() == 0:  # deterministic, so other processes wait and read the same file
          tmp = os.path.join(self.workdir, "tokenizer.tmp")
          text.Tokenizer.train(
            texts,
            tmp,
            vocab_size=d.vocab_size,
            seed=self.config.seed,
            input_sentence_size=d.tokenizer_sentences,
            **self._configured_ids(),
          )
          os.replace(tmp + ".model", path)
          if os.path.exists(tmp + ".vocab"):
            os.replace(tmp + ".vocab", os.path.join(self.workdir, "tokenizer.vocab"))
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
    c = self.config
    check_batch(c.data.eval_batch_size, "data.eval_batch_size", self.layout)
    if c.decode.method not in METHODS:
      raise ConfigError(f"unknown decode.method {c.decode.method!r}; use 'beam', 'greedy' or 'sample'")
    check_best_metric(c, ("eval/bleu", "eval/chrf", "eval/loss"))
    if convert.WeightSource.parse(c.init_from).imported:
      raise ConfigError("translation can start only from another translation workdir (init_from=WORKDIR)")
    # reads the data now: a missing source stops the run before anything is written
    if c.data.eval_split not in self.splits:
      raise ConfigError(f"config.data.eval_split={c.data.eval_split!r}: this task has the splits {list(self.splits)}")
    for name, split, *_ in (e for e in c.get("evals") or () if isinstance(e, list | tuple) and len(e) == 4):
      if split not in self.splits:
        raise ConfigError(f"config.evals[{name}]: split {split!r}; this task has the splits {list(self.splits)}")

  def describe(self) -> dict:
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
    return {"vocab_size": self.tokenizer.vocab_size, "max_len": self.config.data.max_len, **self.tokenizer.special_ids}

  def example_inputs(self):
    return jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32)

  def train_input(self) -> TrainInput:
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
    return batch

  def model_inputs(self, batch):
    return batch["src"], batch["tgt"]

  def loss(self, logits, batch):
    tgt = batch["tgt"]
    w = (tgt != self.tokenizer.PAD).astype(jnp.float32)
    ce = cross_entropy(logits, tgt, logits.shape[-1], self.config.label_smoothing)
    n = jnp.maximum(w.sum(), 1.0)
    return (ce * w).sum() / n, {"accuracy": ((logits.argmax(-1) == tgt) * w).sum() / n, "tokens": w.sum()}

  # -- decoding
  def decode_len(self, src_len: int) -> int:
    return int(min(self.config.data.max_len, src_len * 1.5 + self.config.decode.extra_len))

  def translate_batch(self, model, params, src, max_len: int, **overrides):
    """Token ids [B, S] (global array) -> token ids [B, max_len] with config.decode (and `overrides`)."""
    g = {**self.config.decode.to_dict(), **{k: v for k, v in overrides.items() if v is not None}}
    if g["method"] == "beam":
      return decode.beam_search(model, params, src, beam_size=g["beam_size"], max_len=max_len, alpha=g["alpha"])[0]
    if g["method"] == "greedy":
      return decode.greedy(model, params, src, max_len=max_len)
    if g["method"] == "sample":
      key = jax.random.key(self.config.seed)
      return decode.sample(model, params, src, key, max_len=max_len, temperature=g["temperature"], top_k=g["top_k"])
    raise ConfigError(f"unknown decode method {g['method']!r}; use 'beam', 'greedy' or 'sample'")

  def evaluate(self, model, variables, split, sharding, limit=None, stop=None, step=None) -> dict:
    import sacrebleu

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
    params = variables["params"]
    progress = Progress(f"eval {split}", len(batches), unit="sentences")
    hyps = [""] * len(pairs)
    loss_sum = count = 0.0
    for b in batches:
      check_stop(stop)
      g = mesh_lib.to_global(b, sharding, ("src", "tgt", "mask"))
      batch_loss, n = _eval_loss(model, params, g)
      loss_sum, count = loss_sum + float(batch_loss), count + float(n)
      out = self.translate_batch(model, params, g["src"], self.decode_len(b["src"].shape[1]))
      out = mesh_lib.gather(out)
      index = mesh_lib.gather(jax.make_array_from_process_local_data(sharding, b["index"]))
      for row, i in zip(self.tokenizer.decode_batch(out), index):
        if i >= 0:
          hyps[i] = row
      progress.update(int((index >= 0).sum()))
    refs = [t for _, t in pairs]
    return {
      "eval/loss": loss_sum / max(count, 1.0),
      "eval/bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
      "eval/chrf": sacrebleu.corpus_chrf(hyps, [refs]).score,
      "eval/bleu_copy_source": sacrebleu.corpus_bleu([s for s, _ in pairs], [refs]).score,
      "eval/examples": float(len(pairs)),
      **self._synonym_scores(pairs, hyps),
    }

  def _synonym_scores(self, pairs, hyps) -> dict:
    """synonym_scores() against the source's references, read once; {} for a source with one reference each."""
    if self._references is None:
      d = self.config.data
      found = text.load_references(d.source, src_lang=d.src_lang, tgt_lang=d.tgt_lang, data_dir=d.data_dir)
      self._references = found if found is not None else {}
    return synonym_scores(self._references, pairs, hyps)

  # -- prediction (vitjax.load, vitjax.translate)
  def translate(self, model, variables, lines, sharding, batch_size: int = 32, warn=logging.warning, **decode_args):
    """Source strings -> translated strings, one per line and in order; an empty line gives an empty line.

    Lines longer than the model's max_len tokens are truncated (with a warning naming the line); characters the
    tokenizer does not know become the unknown token. decode_args override config.decode (method, beam_size,
    alpha, temperature, top_k). Every process passes the same lines and gets all translations.
    """
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
        self.translate_batch(model, variables["params"], src, self.decode_len(width), **decode_args)
      )
      for (i, _), line in zip(chunk, tok.decode_batch(tokens[: len(chunk)])):
        out[i] = line
      progress.update(len(chunk))
    return out


@functools.partial(jax.jit, static_argnums=0)
def _eval_loss(model, params, batch):
  logits, _ = model.apply({"params": params}, batch["src"], batch["tgt"], train=False)
  w = (batch["tgt"] != model.pad_id) & batch["mask"][:, None]
  ce = cross_entropy(logits, batch["tgt"], logits.shape[-1])
  return jnp.sum(ce * w), jnp.sum(w)


def synonym_scores(references: dict, pairs, hyps) -> dict:
  """For a source whose entries have several correct translations (the Ding dictionary's synonyms; references as
  text.load_references gives them): eval/exact_match (the share of translations equal to one of them) and
  eval/bleu_synonyms (BLEU with all of them as references); {} when references is empty."""
  import sacrebleu

  if not references:
    return {}
  refs = [references.get(pair, [pair[1]]) for pair in pairs]
  width = max(len(r) for r in refs)
  streams = [[r[k] if k < len(r) else None for r in refs] for k in range(width)]
  exact = sum(h.strip() in r for h, r in zip(hyps, refs, strict=True))
  return {
    "eval/exact_match": exact / max(len(pairs), 1),
    "eval/bleu_synonyms": sacrebleu.corpus_bleu(hyps, streams).score,
  }
