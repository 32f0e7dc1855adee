"""vitjax.decode: greedy, beam search and sampling with the KV cache, each row's cap, and the decoding options."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vitjax import decode, models
from vitjax.models.transformer import EOS, PAD


def tiny(**kw):
  args = dict(vocab_size=7, d_model=32, num_heads=2, d_ff=64, num_layers=2, dropout_rate=0.0, max_len=16)
  return models.create("transformer_tiny", **{**args, **kw})


@functools.cache  # one compilation per model, not per call (a new jax.jit of model.init compiles again)
def _jitted(model, method: str):
  return jax.jit(getattr(model, method))


@jax.jit  # (op by op: one compilation per parameter shape)
def _scaled(params, scale):
  return jax.tree.map(lambda p: p * scale, params)


def init(model, seed=0, scale=1.0):
  src, tgt = jnp.ones((1, 5), jnp.int32), jnp.ones((1, 4), jnp.int32)
  params = _jitted(model, "init")(jax.random.key(seed), src, tgt)["params"]  # jitted: op by op is 10x slower
  if scale != 1.0:  # sharper distributions make search differences visible
    params = _scaled(params, scale)
  return params


SRC = jnp.array([[3, 4, 5, 6, EOS, PAD], [6, 5, EOS, PAD, PAD, PAD]], jnp.int32)


@pytest.mark.parametrize(
  "kw", [dict(), dict(norm="pre", posemb="learned", share_embeddings=False, tie_output=False), dict(scan=True)]
)
def test_cached_greedy_equals_uncached_greedy(kw):
  model = tiny(**kw)
  params = init(model, scale=3.0)
  got = np.asarray(decode.greedy(model, params, SRC, max_len=8))
  # without the cache: the full decoder on the prefix so far, padded to 8 (causal: later positions do not matter)
  full = jax.jit(lambda src, tgt: model.apply({"params": params}, src, tgt)[0])
  for b in range(2):
    seq = []
    for _ in range(8):
      tgt = np.full((1, 8), PAD, np.int32)
      tgt[0, : len(seq)] = seq
      logits = full(SRC[b : b + 1], jnp.asarray(tgt))
      seq.append(int(jnp.argmax(logits[0, len(seq)])))
      if seq[-1] == EOS:
        break
    np.testing.assert_array_equal(got[b, : len(seq)], seq)
    assert (got[b, len(seq) :] == PAD).all()


def sequence_scores(model, params, src, tokens, alpha):
  """Teacher-forced log p(tokens | src) / length_penalty(n) of rows ending in EOS (None for the others)."""
  tgt = jnp.asarray(tokens)
  logits, _ = _jitted(model, "apply")({"params": params}, src, tgt)
  lp = np.asarray(jax.nn.log_softmax(logits))
  out = []
  for r, row in enumerate(np.asarray(tokens).tolist()):
    n = row.index(EOS) + 1 if EOS in row else None
    out.append(None if n is None else sum(lp[r, i, row[i]] for i in range(n)) / decode.length_penalty(n, alpha))
  return out


def test_beam_of_one_is_greedy_or_better():
  """A beam of 1 follows the greedy path but also finishes an EOS ranked second (the standard rule): it returns
  greedy's tokens, or a finished sequence scoring at least as high. finish="beam" (vitjax's old rule) is greedy."""
  model = tiny()
  differ = 0
  for seed in range(3):
    params = init(model, seed, scale=3.0)
    g = np.asarray(decode.greedy(model, params, SRC, max_len=10))
    old, _ = decode.beam_search(model, params, SRC, beam_size=1, max_len=10, alpha=0.0, finish="beam")
    np.testing.assert_array_equal(old, g)
    tokens, scores = map(np.asarray, decode.beam_search(model, params, SRC, beam_size=1, max_len=10, alpha=0.0))
    greedy_scores = sequence_scores(model, params, SRC, g, 0.0)
    for r in range(len(g)):
      if not np.array_equal(tokens[r], g[r]):
        differ += 1
        assert EOS in tokens[r].tolist()
        assert greedy_scores[r] is None or scores[r] >= greedy_scores[r] - 1e-5
      elif greedy_scores[r] is not None:
        assert scores[r] == pytest.approx(greedy_scores[r], abs=1e-5)
  assert differ >= 1  # the rules do differ on these models


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_wide_beam_finds_the_exhaustive_best(alpha):
  model = tiny(vocab_size=5)
  params = init(model, seed=1, scale=2.0)
  max_len = 4
  src = jnp.array([[3, 4, 3, EOS]], jnp.int32)  # ids < vocab_size
  non_eos = [t for t in range(5) if t != EOS]
  seqs = [
    list(prefix) + [EOS]
    for n in range(1, max_len + 1)  # every sequence ending in EOS within max_len
    for prefix in itertools.product(non_eos, repeat=n - 1)
  ]
  tgt = jnp.asarray([s + [PAD] * (max_len - len(s)) for s in seqs], jnp.int32)
  logits, _ = jax.jit(model.apply)({"params": params}, jnp.repeat(src, len(seqs), 0), tgt)  # one teacher-forced pass
  lp = np.asarray(jax.nn.log_softmax(logits))
  scores = [
    sum(lp[j, i, t] for i, t in enumerate(s)) / decode.length_penalty(len(s), alpha) for j, s in enumerate(seqs)
  ]
  best_seq, best = seqs[int(np.argmax(scores))], max(scores)
  # a beam as wide as all candidates of a step (4^3 live x 5 tokens) keeps every hypothesis: exhaustive
  tokens, score = decode.beam_search(model, params, src, beam_size=320, max_len=max_len, alpha=alpha)
  assert decode.strip(tokens)[0] + [EOS] == best_seq
  assert float(score[0]) == pytest.approx(best, abs=1e-4)


def test_sampling_is_seeded_and_top_k_1_is_greedy():
  model = tiny()
  params = init(model, scale=3.0)
  g = decode.greedy(model, params, SRC, max_len=8)
  np.testing.assert_array_equal(decode.sample(model, params, SRC, jax.random.key(0), max_len=8, top_k=1), g)
  a = decode.sample(model, params, SRC, jax.random.key(1), max_len=8, temperature=2.0)
  b = decode.sample(model, params, SRC, jax.random.key(1), max_len=8, temperature=2.0)
  np.testing.assert_array_equal(a, b)
  many = [
    np.asarray(decode.sample(model, params, SRC, jax.random.key(s), max_len=8, temperature=5.0)) for s in range(5)
  ]
  assert len({m.tobytes() for m in many}) > 1


def test_each_rows_length_cap_decodes_it_as_its_own_max_len_would():
  """lengths caps each row: row b is what decoding it alone with max_len=lengths[b] gives (tokens, beam scores),
  whatever the batch's max_len; translation caps each sentence by its own source this way. (Sampling shares greedy's
  loop.)"""
  model = tiny(vocab_size=9)
  params = init(model, seed=2, scale=0.5)  # flat distributions: sequences run long, so the caps bite
  src = jnp.array([[3, 4, 5, 6, EOS, PAD], [6, 5, EOS, PAD, PAD, PAD]], jnp.int32)
  lengths = jnp.array([7, 2], jnp.int32)
  runs = {
    "greedy": lambda s, n, **kw: (decode.greedy(model, params, s, max_len=n, **kw), None),
    "beam": lambda s, n, **kw: decode.beam_search(model, params, s, beam_size=3, max_len=n, alpha=0.6, **kw),
  }
  capped_somewhere = False
  for name, run in runs.items():
    tokens, scores = run(src, 10, lengths=lengths)
    for b, n in enumerate(lengths.tolist()):
      want, score = run(src[b : b + 1], n)
      np.testing.assert_array_equal(np.asarray(tokens)[b, :n], np.asarray(want)[0], err_msg=f"{name}, row {b}")
      assert (np.asarray(tokens)[b, n:] == PAD).all(), (name, b)
      capped_somewhere |= EOS not in np.asarray(want)[0].tolist()
      if score is not None:
        assert float(scores[b]) == pytest.approx(float(score[0]), abs=1e-5)
  assert capped_somewhere  # some row ran into its cap: the test tells capped decoding from plain
  listed = decode.greedy(model, params, src, max_len=10, lengths=lengths.tolist())  # a list: 'Cannot determine dtype'
  np.testing.assert_array_equal(listed, decode.greedy(model, params, src, max_len=10, lengths=lengths))
  with pytest.raises(ValueError, match=r"lengths holds 2\.\.11: each must be in 1\.\.max_len=10"):
    decode.greedy(model, params, src, max_len=10, lengths=jnp.array([2, 11]))
  with pytest.raises(ValueError, match=r"lengths must be integers \[B\] = \[2\], one per row"):
    decode.sample(model, params, src, jax.random.key(0), max_len=10, lengths=jnp.array([2, 3, 4]))


def test_padding_does_not_change_outputs():
  model = tiny()
  params = init(model, scale=2.0)
  tgt = jnp.array([[3, 4, EOS], [5, EOS, PAD]], jnp.int32)
  logits, _ = jax.jit(model.apply)({"params": params}, SRC, tgt)
  src_pad = jnp.pad(SRC, ((0, 0), (0, 5)))
  tgt_pad = jnp.pad(tgt, ((0, 0), (0, 4)))
  logits2, _ = jax.jit(model.apply)({"params": params}, src_pad, tgt_pad)
  # masked keys change only the order of float sums: differences of a few ulps of the largest logit
  np.testing.assert_allclose(logits2[:, :3], logits, rtol=0, atol=1e-5 * np.abs(logits).max())
  np.testing.assert_array_equal(
    decode.greedy(model, params, src_pad, max_len=8), decode.greedy(model, params, SRC, max_len=8)
  )
  np.testing.assert_array_equal(
    decode.beam_search(model, params, src_pad, beam_size=3, max_len=8)[0],
    decode.beam_search(model, params, SRC, beam_size=3, max_len=8)[0],
  )


def test_future_target_tokens_do_not_change_earlier_outputs():
  model = tiny()
  params = init(model)
  tgt = jnp.array([[3, 4, 5, 6, 3, EOS]], jnp.int32)
  logits, _ = jax.jit(model.apply)({"params": params}, SRC[:1], tgt)
  logits2, _ = jax.jit(model.apply)({"params": params}, SRC[:1], tgt.at[0, 3:].set(4))
  np.testing.assert_allclose(logits[:, :4], logits2[:, :4], atol=1e-6)  # position t sees tgt[:t]
  assert not np.allclose(logits[:, 4:], logits2[:, 4:])


def test_errors():
  with pytest.raises(ValueError, match="max_len"):
    decode.greedy(tiny(), init(tiny()), SRC, max_len=32)
  with pytest.raises(ValueError, match="unknown Transformer|Did you mean"):
    models.create("transformer_huge", vocab_size=5)
  # token ids the vocabulary lacks would embed as NaN and spoil the whole batch's logits: one line, where known
  model = tiny()
  params = init(model)
  tgt = jnp.ones((2, 4), jnp.int32)
  for src, t, says in (
    (SRC.at[0, 0].set(7), tgt, r"src holds token ids 0..7, outside the vocabulary's 0..6"),
    (SRC, tgt.at[1, 1].set(-3), r"tgt holds token ids -3..2, outside the vocabulary's 0..6"),
    (SRC.astype(jnp.float32), tgt, r"src must be integer token ids \[B, L\]; got float32 of shape \(2, 6\)"),
  ):
    with pytest.raises(ValueError, match=says):
      model.apply({"params": params}, src, t)
  # the decoders check what they would fail on deep inside jax, or misread: an id out of range decoded as padding
  key = jax.random.key(0)
  for call, says in (
    (lambda: decode.greedy(model, params, SRC.at[1, 0].set(7), max_len=5), "src holds token ids 0..7, outside"),
    (lambda: decode.beam_search(model, params, SRC.at[1, 0].set(9), 2, 5), "src holds token ids 0..9, outside"),
    (lambda: decode.greedy(model, params, SRC, max_len=0), "max_len=0 must be a whole number, at least 1"),
    (lambda: decode.beam_search(model, params, SRC, beam_size=0, max_len=5), "beam_size=0 must be a whole number"),
    (lambda: decode.sample(model, params, SRC, key, max_len=5, top_k=50), "top_k=50 is more than the run's 7 tokens"),
    (lambda: decode.sample(model, params, SRC, key, max_len=5, temperature=-1.0), "temperature=-1.0 must be 0 or"),
    (lambda: decode.sample(model, params, SRC, 0, max_len=5), r"rng must be a PRNG key, e.g. jax.random.key\(0\)"),
    (lambda: decode.beam_search(model, params, SRC, 2, 5, alpha=-1.0), "alpha=-1.0 must be 0 or more"),
  ):
    with pytest.raises(ValueError, match=says):
      call()
  # a list of ids is taken, and inside a caller's jit the ids are not known: nothing is checked there
  want = decode.greedy(model, params, SRC, max_len=5)
  np.testing.assert_array_equal(decode.greedy(model, params, SRC.tolist(), max_len=5), want)
  np.testing.assert_array_equal(jax.jit(lambda s: decode.greedy(model, params, s, max_len=5))(SRC), want)


def test_sampling_at_temperature_zero_is_greedy_and_draws_anew_at_each_step():
  model = tiny()
  params = init(model, scale=3.0)
  g = decode.greedy(model, params, SRC, max_len=8)
  np.testing.assert_array_equal(decode.sample(model, params, SRC, jax.random.key(0), max_len=8, temperature=0.0), g)
  # all-zero parameters: every step's distribution is uniform over the 7 tokens, so only the key decides
  flat = _scaled(params, 0.0)
  rows = [decode.strip(decode.sample(model, flat, SRC, jax.random.key(s), max_len=8)) for s in range(4)]
  runs = [r for rs in rows for r in rs if len(r) >= 3]
  assert runs and any(len(set(r)) > 1 for r in runs)  # one key per step: not one token repeated


def test_a_beam_row_stops_at_its_own_cap_while_other_rows_go_on():
  model = tiny(vocab_size=9)
  params = init(model, seed=2, scale=0.5)  # flat distributions: sequences run long, so the caps bite
  src = jnp.array([[3, 4, 5, 6, EOS, PAD], [6, 5, EOS, PAD, PAD, PAD]], jnp.int32)
  # row 1 is capped at 2 tokens while row 0 decodes on to 6: row 1 is what max_len=2 gives it
  tokens, scores = decode.beam_search(model, params, src, beam_size=2, max_len=6, lengths=jnp.array([6, 2]))
  want, score = decode.beam_search(model, params, src[1:], beam_size=2, max_len=2)
  np.testing.assert_array_equal(np.asarray(tokens)[1, :2], np.asarray(want)[0])
  assert (np.asarray(tokens)[1, 2:] == PAD).all()
  assert float(scores[1]) == pytest.approx(float(score[0]), abs=1e-5)


def test_beam_search_stopping_early_never_changes_the_result():
  """A row alone stops once no live hypothesis can beat its finished ones (log p / the longest length's penalty); the
  same row next to one that decodes on is searched further: both must find the same best (alpha 2 rewards length)."""
  model = tiny()
  params = init(model, seed=0)
  tokens, scores = decode.beam_search(model, params, SRC, beam_size=2, max_len=10, alpha=2.0)
  alone, score = decode.beam_search(model, params, SRC[1:], beam_size=2, max_len=10, alpha=2.0)
  np.testing.assert_array_equal(np.asarray(tokens)[1], np.asarray(alone)[0])
  assert float(scores[1]) == pytest.approx(float(score[0]), abs=1e-3)


def test_each_sentence_is_decoded_to_its_own_sources_cap():
  """translate_batch caps each row at decode_len of its own source tokens (it capped the whole batch by its padded
  width, which the longest source or reference set: an 8-token source was allowed 82 tokens)."""
  from vitjax.decode import row_lengths as _row_lengths

  src = np.array([[5, 5, 5, 1, 0, 0, 0, 0], [5] * 7 + [1], [0] * 8], np.int32)  # 4 and 8 tokens, and a padding row
  assert _row_lengths(src, 0, 22, 10.0, 64).tolist() == [16, 22, 10]  # int(1.5 n + 10)
  assert _row_lengths(src, 0, 22, 10.0, 12).tolist() == [12, 12, 10]  # at most data.max_len
  assert _row_lengths(src, 0, 22, 0.0, 64).tolist() == [6, 12, 1]  # at least 1


def test_the_default_decoding_is_the_best_evaluators_then_the_first_translation_evaluators():
  """decoding(config): the options of the translation evaluator that config.best names (its METRIC after the slash),
  else the first translation evaluator's (not another type's), else DECODING; options it leaves out are DECODING's."""
  from vitjax.decode import DECODING
  from vitjax.decode import configured as decoding

  evals = {
    "acc": {"type": "classification", "split": "test"},
    "greedy": {"type": "translation", "method": "greedy", "extra_len": 3},
    "beam": {"type": "translation", "method": "beam", "beam_size": 2, "alpha": 1.0},
  }
  assert decoding({"evals": evals, "best": "beam/bleu"}) == {**DECODING, "beam_size": 2, "alpha": 1.0}
  first = {**DECODING, "method": "greedy", "extra_len": 3}
  assert decoding({"evals": evals, "best": "greedy/chrf"}) == first
  assert decoding({"evals": evals, "best": "acc/accuracy"}) == first == decoding({"evals": evals, "best": None})
  assert decoding({"evals": {"acc": evals["acc"]}, "best": "acc/accuracy"}) == DECODING == decoding({})
