"""Autoregressive generation for the encoder-decoder Transformer, jit-compiled with static shapes and the
decoder's KV cache: greedy, beam search with the GNMT length penalty ((5 + len) / 6)^alpha, and temperature /
top-k sampling. Every function returns tokens [B, max_len] that end with EOS (when one was produced) and are
padded with 0 after it.

    tokens = greedy(model, params, src, max_len=64)
    tokens, scores = beam_search(model, params, src, beam_size=4, alpha=0.6, max_len=64)
    tokens = sample(model, params, src, jax.random.key(0), temperature=0.8, top_k=20, max_len=64)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vitjax.models.transformer import EOS, PAD

NEG_INF = -1.0e9


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


def _check(model, max_len):
  if max_len > model.max_len:
    raise ValueError(f"max_len={max_len} exceeds the model's max_len={model.max_len}")


def _sequential(model, params, src, max_len, choose):
  """Shared loop of greedy decoding and sampling: choose(logits [B, V], i) -> next tokens [B]."""
  encoded = model.apply({"params": params}, src, method=model.encode)
  dec, cache = _init_cache(model, params, src, encoded, max_len)
  b = src.shape[0]

  def cond(state):
    i, _, _, done, _ = state
    return (i < max_len) & ~jnp.all(done)

  def body(state):
    i, prev, out, done, cache = state
    logits, cache = _step(dec, params, cache, prev, encoded, src, i)
    tok = jnp.where(done, model.pad_id, choose(logits, i))
    out = out.at[:, i].set(tok)
    return i + 1, tok, out, done | (tok == model.eos_id), cache

  init = (
    0,
    jnp.full((b,), model.bos_id, jnp.int32),
    jnp.full((b, max_len), model.pad_id, jnp.int32),
    jnp.zeros((b,), bool),
    cache,
  )
  return jax.lax.while_loop(cond, body, init)[2]


@functools.partial(jax.jit, static_argnames=("model", "max_len"))
def greedy(model, params, src, max_len: int):
  """Most probable token at each step. src [B, S] -> tokens [B, max_len]."""
  _check(model, max_len)
  return _sequential(model, params, src, max_len, lambda logits, i: jnp.argmax(logits, -1).astype(jnp.int32))


@functools.partial(jax.jit, static_argnames=("model", "max_len", "top_k"))
def sample(model, params, src, rng, max_len: int, temperature: float = 1.0, top_k: int = 0):
  """Samples from softmax(logits / temperature), restricted to the top_k tokens when top_k > 0."""
  _check(model, max_len)

  def choose(logits, i):
    logits = logits / jnp.maximum(temperature, 1e-6)
    if top_k:
      kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
      logits = jnp.where(logits < kth, NEG_INF, logits)
    return jax.random.categorical(jax.random.fold_in(rng, i), logits).astype(jnp.int32)

  return _sequential(model, params, src, max_len, choose)


def length_penalty(length, alpha: float):
  """GNMT: ((5 + length) / 6)^alpha."""
  return ((5.0 + length) / 6.0) ** alpha


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "max_len"))
def beam_search(model, params, src, beam_size: int, max_len: int, alpha: float = 0.6):
  """Beam search. src [B, S] -> (tokens [B, max_len], scores [B]) for the best beam of each example.

  A hypothesis ending in EOS after n tokens (EOS included) scores log p / ((5 + n) / 6)^alpha; it is kept when it
  ranks within the beam among the step's candidates (so a beam of 1 is greedy decoding). The search stops
  when no live hypothesis can beat the worst kept finished one, or at max_len; if nothing finished, the best
  live hypothesis is returned.
  """
  _check(model, max_len)
  b, k = src.shape[0], beam_size
  encoded = model.apply({"params": params}, src, method=model.encode)
  rep = lambda x: jnp.repeat(x, k, axis=0)  # [B, ...] -> [B*K, ...]
  enc_k, src_k = rep(encoded), rep(src)
  dec, cache = _init_cache(model, params, src_k, enc_k, max_len)

  # live: [B, K] log-probs, [B, K, L] tokens; only beam 0 is alive at first.
  live_lp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (b, 1))
  live_seq = jnp.full((b, k, max_len), model.pad_id, jnp.int32)
  fin_score = jnp.full((b, k), NEG_INF)
  fin_seq = jnp.full((b, k, max_len), model.pad_id, jnp.int32)

  def cond(state):
    i, live_lp, _, fin_score, _, _ = state
    best_possible = live_lp[:, 0] / length_penalty(max_len, alpha)  # log p only falls; lp rises with length
    worst_kept = jnp.min(fin_score, axis=1)
    return (i < max_len) & ~jnp.all(best_possible < worst_kept)

  def body(state):
    i, live_lp, live_seq, fin_score, fin_seq, cache = state
    prev = jnp.where(i == 0, model.bos_id, live_seq[:, :, jnp.maximum(i - 1, 0)]).reshape(b * k)
    logits, cache = _step(dec, params, cache, prev, enc_k, src_k, i)
    v = logits.shape[-1]
    lp = jax.nn.log_softmax(logits).reshape(b, k, v) + live_lp[:, :, None]
    # 2K candidates, so that K live ones remain even if K of them end in EOS
    top_lp, top_idx = jax.lax.top_k(lp.reshape(b, k * v), min(2 * k, k * v))
    beam, tok = top_idx // v, (top_idx % v).astype(jnp.int32)
    seq = jnp.take_along_axis(live_seq, beam[:, :, None], axis=1).at[:, :, i].set(tok)
    is_eos = tok == model.eos_id
    # finished: EOS candidates that rank within the beam (so beam 1 is greedy), merged with those kept so far
    in_beam = jnp.arange(top_lp.shape[1])[None, :] < k
    score = jnp.where(is_eos & in_beam, top_lp / length_penalty(i + 1, alpha), NEG_INF)
    all_score = jnp.concatenate([fin_score, score], axis=1)
    all_seq = jnp.concatenate([fin_seq, seq], axis=1)
    fin_score, keep = jax.lax.top_k(all_score, k)
    fin_seq = jnp.take_along_axis(all_seq, keep[:, :, None], axis=1)
    # live: the best K candidates that did not end
    live_cand = jnp.where(is_eos, NEG_INF, top_lp)
    live_lp, keep = jax.lax.top_k(live_cand, k)
    live_seq = jnp.take_along_axis(seq, keep[:, :, None], axis=1)
    src_beam = jnp.take_along_axis(beam, keep, axis=1)  # which old beam each new live one extends
    flat = (jnp.arange(b)[:, None] * k + src_beam).reshape(-1)
    # cached keys/values are [B*K, T, H, D], or [layers, B*K, T, H, D] when the stack is scanned
    cache = jax.tree.map(lambda c: jnp.take(c, flat, axis=c.ndim - 4) if c.ndim >= 4 else c, cache)
    return i + 1, live_lp, live_seq, fin_score, fin_seq, cache

  state = (0, live_lp, live_seq, fin_score, fin_seq, cache)
  _, live_lp, live_seq, fin_score, fin_seq, _ = jax.lax.while_loop(cond, body, state)
  any_fin = fin_score[:, 0] > NEG_INF / 2
  tokens = jnp.where(any_fin[:, None], fin_seq[:, 0], live_seq[:, 0])
  scores = jnp.where(any_fin, fin_score[:, 0], live_lp[:, 0] / length_penalty(max_len, alpha))
  return tokens, scores


def strip(tokens, eos: int = EOS, pad: int = PAD) -> list[list[int]]:
  """Token rows -> lists of ids without EOS and what follows it (the model's eos_id, pad_id)."""
  out = []
  for row in np.asarray(tokens).tolist():
    out.append(row[: row.index(eos)] if eos in row else [t for t in row if t != pad])
  return out
