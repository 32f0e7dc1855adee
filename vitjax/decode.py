"""Autoregressive generation for the encoder-decoder Transformer: greedy, beam search and sampling.

Jit-compiled with static shapes and the decoder's KV cache: greedy, beam search with the GNMT length penalty ((5 + len)
/ 6)^alpha, and temperature / top-k sampling. Decoding starts from the model's bos_id (the start token is not part of
the output) and stops at its eos_id; every function returns tokens [B, max_len] that end with EOS (when one was
produced) and are padded with the model's pad_id after it. `lengths` (int [B], optional) caps each row at its own
length within max_len: row b is then decoded exactly as with max_len=lengths[b] (translation caps each sentence by its
source's length), whatever the other rows of the batch.

beam_search is the standard search of tensor2tensor and flax's examples/wmt/decode.py: every EOS-ending
candidate among the top 2K of a step finishes (see beam_search; tests/test_beam_golden.py checks 288 beams of
flax's search, tokens exactly and scores to 1e-5). Conventions as flax's: n in the penalty counts the generated
tokens with EOS and without the start token; with nothing finished, the best live hypothesis comes back with its
log-probability without penalty. flax's max_decode_len counts its start token (vitjax's max_len L is flax's
L + 1), and its stopping test divides by the penalty of that length; vitjax divides by that of L, the longest a
hypothesis can get: a tighter bound, so it can stop sooner, with the same outputs. A beam of 1 is not greedy
decoding (an EOS ranked second still finishes a hypothesis); beam_search(..., finish="beam") is the rule vitjax
had before, under which it is.

    tokens = greedy(model, params, src, max_len=64)
    tokens, scores = beam_search(model, params, src, beam_size=4, alpha=0.6, max_len=64)
    tokens = sample(model, params, src, jax.random.key(0), temperature=0.8, top_k=20, max_len=64)

The decoding options (DECODING: method, beam_size, alpha, temperature, top_k, extra_len) live here too, with the one
check every way to decode runs (check_decoding, check_method_options) and the dispatch on them (`search`): the
translation task, its evaluator and the command lines pass options in. This module imports nothing of vitjax above
its leaves: `model` is any module with encode, decode_logits (a KV cache), check_ids and the ids bos_id, eos_id,
pad_id (vitjax.models.transformer.Transformer).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vitjax.errors import ConfigError

NEG_INF = -1.0e9

# How a trained run translates unless told otherwise: the decoding of the evaluator that chose its best
# (configured), else these.
DECODING = {"method": "beam", "beam_size": 4, "alpha": 0.6, "temperature": 1.0, "top_k": 0, "extra_len": 10}
METHODS = ("beam", "greedy", "sample")
# The options each method reads; another given to it is refused by check_method_options (it did nothing, silently).
APPLIES = {"beam": ("beam_size", "alpha"), "greedy": (), "sample": ("temperature", "top_k")}
_EXAMPLE = {"beam_size": 4, "top_k": 40, "extra_len": 10, "alpha": 0.6, "temperature": 1}
_ZERO = {"alpha": "no length penalty", "temperature": "always the most likely token"}


def configured(config) -> dict:
  """How a run translates by default: the options of the translation evaluator that reports config.best.

  Else the first translation evaluator's (config.evals entries of type 'translation'); else DECODING.
  """
  found = {name: dict(e) for name, e in (config.get("evals") or {}).items() if dict(e).get("type") == "translation"}
  best = str(config.get("best") or "").split("/")[0]
  entry = found.get(best) or next(iter(found.values()), {})
  return {k: entry.get(k, v) for k, v in DECODING.items()}


def check_decoding(options: dict, name=str, vocab_size: int | None = None) -> None:
  """ConfigError naming the first decoding option out of range; the one check of every way to decode.

  Args:
    options: some of DECODING's keys (a value None: unset, not checked; other keys: not checked).
    name: key -> the option as its user spells it ("--beam_size", "--config.evals.eval.beam_size").
    vocab_size: the tokens top_k may keep at most (None: not checked).

  Raises:
    ConfigError: method not one of METHODS; beam_size not a whole number >= 1; top_k or extra_len not a whole
      number >= 0, or top_k above vocab_size; alpha or temperature negative or NaN.
  """
  for key, value in options.items():
    if value is None or key not in DECODING:
      continue
    n = name(key)
    if key == "method":
      if value not in METHODS:
        raise ConfigError(f"{n}={value!r}; use 'beam', 'greedy' or 'sample'")
    elif key in ("beam_size", "top_k", "extra_len"):
      low = 1 if key == "beam_size" else 0
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{n}={value!r} must be a whole number, at least {low} (e.g. {n}={_EXAMPLE[key]})")
      if key == "top_k" and vocab_size is not None and value > vocab_size:
        raise ConfigError(
          f"{n}={value} is more than the run's {vocab_size} tokens (e.g. {n}={min(40, vocab_size)}; 0: all)"
        )
    elif not isinstance(value, (int, float, np.number)) or isinstance(value, bool) or not value >= 0:  # (NaN too)
      raise ConfigError(f"{n}={value!r} must be 0 or more (0: {_ZERO[key]}; e.g. {n}={_EXAMPLE[key]})")


def check_method_options(method: str, given: dict, name=str) -> None:
  """ConfigError for an option of `given` (decoding keys; None: not given) that `method` does not read.

  extra_len applies to every method. name: as in check_decoding.
  """
  for key, value in given.items():
    if value is None or key in ("method", "extra_len") or key not in DECODING or key in APPLIES.get(method, ()):
      continue
    users = [m for m, keys in APPLIES.items() if key in keys]
    raise ConfigError(
      f"{name(key)}={value!r} does nothing with {name('method')}={method!r}: it is an option of "
      f"{' and '.join(map(repr, users))} decoding; set {name('method')}={users[0]!r} or leave it out"
    )


def cap(src_len, extra_len, max_len):
  """floor(1.5 src_len + extra_len), at most max_len: the most tokens decoded for a source of src_len tokens.

  src_len counts the source's EOS; a number or an array of them.
  """
  return jnp.floor(jnp.minimum(max_len, src_len * 1.5 + extra_len))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def row_lengths(src, pad: int, width: int, extra_len: float, max_len: int):
  """Cap of each row's source tokens (those that are not `pad`): int32 [B] in 1..width."""
  n = jnp.sum(src != pad, axis=1).astype(jnp.float32)
  return jnp.clip(cap(n, extra_len, max_len), 1, width).astype(jnp.int32)


def search(model, params, src, max_len: int, options: dict, rng=None, lengths=None):
  """Token ids [B, S] -> token ids [B, max_len] decoded as `options` say (DECODING's keys; left out: DECODING's).

  rng: sampling's key (method 'sample'); lengths: each row's cap (module doc).
  """
  g = {**DECODING, **options}
  if g["method"] == "beam":
    beam, alpha = g["beam_size"], g["alpha"]
    return beam_search(model, params, src, beam_size=beam, max_len=max_len, alpha=alpha, lengths=lengths)[0]
  if g["method"] == "greedy":
    return greedy(model, params, src, max_len=max_len, lengths=lengths)
  if g["method"] == "sample":
    return sample(model, params, src, rng, max_len, temperature=g["temperature"], top_k=g["top_k"], lengths=lengths)
  raise ConfigError(f"unknown decoding method {g['method']!r}; use {', '.join(map(repr, METHODS))}")


def _init_cache(model, params, src, encoded, max_len):
  """Zero KV cache for a decode-mode clone of `model`, for batch src.shape[0] and max_len positions."""
  dec = model.clone(decode=True)
  shapes = jax.eval_shape(
    lambda: dec.init(
      jax.random.key(0), jnp.zeros((src.shape[0], max_len), jnp.int32), encoded, src, method=dec.decode_logits
    )
  )["cache"]
  return dec, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _step(dec, params, cache, tokens, encoded, src, i):
  """Logits [B, V] for position i given tokens [B] at position i - 1 (BOS at i = 0)."""
  logits, upd = dec.apply(
    {"params": params, "cache": cache},
    tokens[:, None],
    encoded,
    src,
    positions=jnp.full((1, 1), i),
    method=dec.decode_logits,
    mutable=["cache"],
  )
  return logits[:, 0], upd["cache"]


def _check(model, src, max_len, beam_size=1, top_k=0, temperature=1.0, alpha=0.0, rng=None, lengths=None):
  """ValueError of one line for an argument the search would fail on deep inside jax, or misread silently.

  src: integer [B, S] ids in the source vocabulary (checked where known: outside a caller's jit; an id out of range
  encoded as NaN and decoded as padding). max_len in 1..model.max_len; the decoding options as every way to decode
  checks them (check_decoding; a traced one is not known); rng a jax.random.key; lengths None or integer [B] in
  1..max_len (its values where known).
  """
  model.check_ids("src", src, model.vocab_size)
  if not isinstance(max_len, (int, np.integer)) or isinstance(max_len, bool) or max_len < 1:
    raise ValueError(f"max_len={max_len!r} must be a whole number, at least 1")
  if max_len > model.max_len:
    raise ValueError(f"max_len={max_len} exceeds the model's max_len={model.max_len}")
  options = {"beam_size": beam_size, "top_k": top_k, "temperature": temperature, "alpha": alpha}
  known = {k: np.asarray(v).item() if np.ndim(v) == 0 and hasattr(v, "dtype") else v  # (a 0-d array: its number)
           for k, v in options.items() if not isinstance(v, jax.core.Tracer)}  # fmt: skip
  check_decoding(known, vocab_size=model.tgt_vocab_size or model.vocab_size)
  if rng is not None and not (
    jnp.issubdtype(jnp.result_type(rng), jax.dtypes.prng_key)
    or (jnp.shape(rng) == (2,) and jnp.result_type(rng) == jnp.uint32)
  ):
    raise ValueError(f"rng must be a PRNG key, e.g. jax.random.key(0); got {jnp.result_type(rng)} {jnp.shape(rng)}")
  if lengths is not None:
    if jnp.shape(lengths) != src.shape[:1] or not jnp.issubdtype(jnp.result_type(lengths), jnp.integer):
      raise ValueError(
        f"lengths must be integers [B] = [{src.shape[0]}], one per row; got {jnp.result_type(lengths)} "
        f"{tuple(jnp.shape(lengths))}"
      )
    if not isinstance(lengths, jax.core.Tracer) and getattr(lengths, "is_fully_addressable", True):
      low, high = int(np.min(lengths)), int(np.max(lengths))
      if low < 1 or high > max_len:
        raise ValueError(f"lengths holds {low}..{high}: each must be in 1..max_len={max_len}")


def _as_lengths(lengths):
  """`lengths` as an array (a list or tuple of ints is taken as numpy's), or None."""
  return np.asarray(lengths) if isinstance(lengths, list | tuple) else lengths


def _as_ids(src):
  return src if isinstance(src, (jax.Array, jax.core.Tracer)) else jnp.asarray(src)


def _lengths(src, max_len, lengths):
  """Each row's cap: int32 [B] (max_len for every row when lengths is None)."""
  return jnp.full(src.shape[:1], max_len, jnp.int32) if lengths is None else jnp.asarray(lengths, jnp.int32)


def _sequential(model, params, src, max_len, choose, lengths):
  """Greedy decoding's and sampling's loop: choose(logits [B, V], i) -> next tokens [B]; row b stops at lengths[b]."""
  encoded = model.apply({"params": params}, src, method=model.encode)
  dec, cache = _init_cache(model, params, src, encoded, max_len)
  b = src.shape[0]

  def cond(state):
    i, _, _, done, _ = state
    return (i < max_len) & ~jnp.all(done)

  def body(state):
    i, prev, out, done, cache = state
    logits, cache = _step(dec, params, cache, prev, encoded, src, i)
    stop = done | (i >= lengths)
    tok = jnp.where(stop, model.pad_id, choose(logits, i))
    out = out.at[:, i].set(tok)
    return i + 1, tok, out, stop | (tok == model.eos_id), cache

  init = (
    0,
    jnp.full((b,), model.bos_id, jnp.int32),
    jnp.full((b, max_len), model.pad_id, jnp.int32),
    jnp.zeros((b,), bool),
    cache,
  )
  return jax.lax.while_loop(cond, body, init)[2]


def greedy(model, params, src, max_len: int, lengths=None):
  """Most probable token at each step. src [B, S] -> tokens [B, max_len]; lengths: each row's cap (module doc)."""
  src = _as_ids(src)
  lengths = _as_lengths(lengths)
  _check(model, src, max_len, lengths=lengths)
  return _greedy(model, params, src, max_len, _lengths(src, max_len, lengths))


@functools.partial(jax.jit, static_argnames=("model", "max_len"))
def _greedy(model, params, src, max_len: int, lengths):
  choose = lambda logits, i: jnp.argmax(logits, -1).astype(jnp.int32)
  return _sequential(model, params, src, max_len, choose, lengths)


def sample(model, params, src, rng, max_len: int, temperature: float = 1.0, top_k: int = 0, lengths=None):
  """Samples from softmax(logits / temperature), restricted to the top_k tokens when top_k > 0.

  src [B, S] -> tokens [B, max_len]; rng: a jax.random.key; temperature 0: the most likely token; lengths: each
  row's cap (module doc).
  """
  src = _as_ids(src)
  lengths = _as_lengths(lengths)
  _check(model, src, max_len, top_k=top_k, temperature=temperature, rng=rng, lengths=lengths)
  return _sample(model, params, src, rng, max_len, temperature, top_k, _lengths(src, max_len, lengths))


@functools.partial(jax.jit, static_argnames=("model", "max_len", "top_k"))
def _sample(model, params, src, rng, max_len: int, temperature: float, top_k: int, lengths):
  def choose(logits, i):
    logits = logits / jnp.maximum(temperature, 1e-6)
    if top_k:
      kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
      logits = jnp.where(logits < kth, NEG_INF, logits)
    return jax.random.categorical(jax.random.fold_in(rng, i), logits).astype(jnp.int32)

  return _sequential(model, params, src, max_len, choose, lengths)


def length_penalty(length, alpha: float):
  """GNMT: ((5 + length) / 6)^alpha."""
  return ((5.0 + length) / 6.0) ** alpha


def beam_search(
  model, params, src, beam_size: int, max_len: int, alpha: float = 0.6, finish: str = "candidates", lengths=None
):
  """Beam search. src [B, S] -> (tokens [B, max_len], scores [B]) for the best beam of each example.

  The standard search of tensor2tensor and flax's examples/wmt (tests/test_beam_golden.py: the same beams and
  scores as flax's): decoding starts from the model's bos_id with one live hypothesis; each step extends the
  K live ones by every token and takes the 2K most probable candidates. Every candidate among those 2K that
  ends in EOS after n tokens (EOS included) moves to the finished set with score log p / ((5 + n) / 6)^alpha,
  which keeps the K best; the K best of the others stay live. The search stops at max_len, or once K
  hypotheses have finished and none of them could be beaten by a live one (whose best possible score is
  log p / length_penalty(max_len)). Returned: the best finished hypothesis, or, where none finished, the best
  live one and its log-probability without length penalty (as flax).

  A beam of 1 is therefore not greedy decoding: an EOS that is the second most probable token still finishes a
  hypothesis, which wins if nothing the greedy path reaches later scores higher.
  finish="beam" is vitjax's rule before this one (kept to reproduce old results; there beam 1 is greedy): an
  EOS candidate finishes only if it ranks within the top K, so hypotheses that scored higher were dropped.
  lengths: each row's cap (module doc): row b's search stops at lengths[b], as it would with that max_len.
  """
  src = _as_ids(src)
  lengths = _as_lengths(lengths)
  _check(model, src, max_len, beam_size=beam_size, alpha=alpha, lengths=lengths)
  if finish not in ("candidates", "beam"):
    raise ValueError(f"unknown finish rule {finish!r}; use 'candidates' (the standard) or 'beam'")
  return _beam_search(model, params, src, beam_size, max_len, alpha, finish, _lengths(src, max_len, lengths))


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "max_len", "finish"))
def _beam_search(model, params, src, beam_size: int, max_len: int, alpha: float, finish: str, lengths):
  """The jitted search of beam_search (see its docstring).

  Long: the search's state and its one step are a while_loop, kept together.
  """
  b, k = src.shape[0], beam_size
  encoded = model.apply({"params": params}, src, method=model.encode)
  rep = lambda x: jnp.repeat(x, k, axis=0)  # [B, ...] -> [B*K, ...]
  enc_k, src_k = rep(encoded), rep(src)
  dec, cache = _init_cache(model, params, src_k, enc_k, max_len)

  # live: [B, K] log-probs, [B, K, L] tokens; only beam 0 is alive at first. finished: scores, tokens, and
  # whether the slot holds a finished hypothesis at all.
  live_lp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (b, 1))
  live_seq = jnp.full((b, k, max_len), model.pad_id, jnp.int32)
  fin_score = jnp.full((b, k), NEG_INF)
  fin_seq = jnp.full((b, k, max_len), model.pad_id, jnp.int32)
  fin_flag = jnp.zeros((b, k), bool)
  max_penalty = length_penalty(lengths, alpha)  # [B]: the longest each row's hypotheses can get

  def cond(state):
    i, live_lp, _, fin_score, _, fin_flag, _ = state
    best_possible = live_lp[:, 0] / max_penalty  # log p only falls and the penalty only grows (alpha >= 0)
    worst_kept = jnp.where(jnp.all(fin_flag, axis=1), jnp.min(fin_score, axis=1), NEG_INF)
    return (i < max_len) & ~jnp.all((i >= lengths) | (worst_kept > best_possible))

  def body(state):
    old = state
    i, live_lp, live_seq, fin_score, fin_seq, fin_flag, cache = state
    prev = jnp.where(i == 0, model.bos_id, live_seq[:, :, jnp.maximum(i - 1, 0)]).reshape(b * k)
    logits, cache = _step(dec, params, cache, prev, enc_k, src_k, i)
    v = logits.shape[-1]
    lp = jax.nn.log_softmax(logits).reshape(b, k, v) + live_lp[:, :, None]
    # 2K candidates, so that K live ones remain even if K of them end in EOS
    top_lp, top_idx = jax.lax.top_k(lp.reshape(b, k * v), min(2 * k, k * v))
    beam, tok = top_idx // v, (top_idx % v).astype(jnp.int32)
    seq = jnp.take_along_axis(live_seq, beam[:, :, None], axis=1).at[:, :, i].set(tok)
    real = top_lp > NEG_INF / 2  # not an extension of an empty beam slot (only when fewer than 2K are real)
    is_eos = (tok == model.eos_id) & real
    if finish == "beam":
      is_eos &= jnp.arange(top_lp.shape[1])[None, :] < k
    score = jnp.where(is_eos, top_lp / length_penalty(i + 1, alpha), NEG_INF)
    all_score = jnp.concatenate([fin_score, score], axis=1)
    fin_score, keep = jax.lax.top_k(all_score, k)
    fin_seq = jnp.take_along_axis(jnp.concatenate([fin_seq, seq], axis=1), keep[:, :, None], axis=1)
    fin_flag = jnp.take_along_axis(jnp.concatenate([fin_flag, is_eos], axis=1), keep, axis=1)
    # live: the best K candidates that did not end
    live_cand = jnp.where((tok == model.eos_id) | ~real, NEG_INF, top_lp)
    live_lp, keep = jax.lax.top_k(live_cand, k)
    live_seq = jnp.take_along_axis(seq, keep[:, :, None], axis=1)
    src_beam = jnp.take_along_axis(beam, keep, axis=1)  # which old beam each new live one extends
    flat = (jnp.arange(b)[:, None] * k + src_beam).reshape(-1)
    # cached keys/values are [B*K, T, H, D], or [layers, B*K, T, H, D] when the stack is scanned
    cache = jax.tree.map(lambda c: jnp.take(c, flat, axis=c.ndim - 4) if c.ndim >= 4 else c, cache)
    # a row past its own length keeps its hypotheses as they were (its cache no longer matters)
    going = i < lengths
    keep = lambda new, was: jnp.where(going.reshape((b,) + (1,) * (new.ndim - 1)), new, was)
    searched = (live_lp, live_seq, fin_score, fin_seq, fin_flag)
    return i + 1, *map(keep, searched, old[1:6]), cache

  state = (0, live_lp, live_seq, fin_score, fin_seq, fin_flag, cache)
  _, live_lp, live_seq, fin_score, fin_seq, fin_flag, _ = jax.lax.while_loop(cond, body, state)
  any_fin = fin_flag[:, 0]  # the best slot holds a finished hypothesis whenever any does
  tokens = jnp.where(any_fin[:, None], fin_seq[:, 0], live_seq[:, 0])
  scores = jnp.where(any_fin, fin_score[:, 0], live_lp[:, 0])
  return tokens, scores


def strip(tokens, eos: int = 1, pad: int = 0) -> list[list[int]]:
  """Token rows -> lists of ids without EOS and what follows it (the model's eos_id, pad_id; the defaults: vitjax's)."""
  out = []
  for row in np.asarray(tokens).tolist():
    out.append(row[: row.index(eos)] if eos in row else [t for t in row if t != pad])
  return out
