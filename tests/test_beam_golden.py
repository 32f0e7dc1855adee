"""vitjax's beam search reproduces flax's examples/wmt beam search (the reference) beam for beam.

The fixture (experiments/golden/make_beam.py) holds a tiny random Transformer with flax's ids (pad 0, eos 1,
decoding from 0) and, for 24 sources, beam sizes 1-4 and alphas 0, 0.6, 1: the best beam of flax's search run
on that model through vitjax's decoder and KV cache (288 outputs; they finish at 11 different lengths, 1-10 and 12,
and 171 are unfinished at max_len), and the noise floor of those scores, measured by the generator.

Scores are compared relative to max(1, |score|) (they run from -3.1 to -17.3), within BOUND_FACTOR x the fixture's
noise floor: the most that float32 rounding noise (every weight moved by 1-3 ulps) moved flax's scores when the
fixture was made, 7.5e-7, so the bound is 1.5e-5. That noise stands in for another CPU's arithmetic (AVX2 vs
AVX-512, other XLA thread counts). The first fixture's model was ill-conditioned (its floor was 5.6e-3): another
CPU missed its stored scores by 1.6e-3 against a bound of 1e-5. The tokens must be identical: the generator
required every best beam to survive that noise and noise 1024 times larger, and each best beam to lead its
runner-up (beam sizes 2-4) by over 1000 x the floor (the least lead is 3.3e-3). Where the fixture was made (AVX2;
1 or 2 cores, XLA's Eigen threads on or off, 8 host devices), vitjax's scores equal flax's bit for bit, and with
the weights 1-3 ulps off the same beams come back, their scores within 7.5e-7.
"""

import json
import os

import jax.numpy as jnp
import numpy as np

from vitjax import decode
from vitjax.models.transformer import Transformer

FIXTURE = os.path.join(os.path.dirname(__file__), "golden", "beam_flax_wmt.npz")
BOUND_FACTOR = 20  # the scores' bound, in units of the fixture's measured noise floor
MAX_BOUND = 1e-4  # and the bound itself must stay this small (relative), or the fixture is too ill-conditioned


def load_fixture(perturb_seed=None):
  """(npz, model, params); with perturb_seed, every nonzero weight moved one float32 ulp up or down at random."""
  z = np.load(FIXTURE)
  rng = None if perturb_seed is None else np.random.default_rng(perturb_seed)
  params = {}
  for key in z.files:
    if key.startswith("params/"):
      *path, leaf = key.split("/")[1:]
      node = params
      for p in path:
        node = node.setdefault(p, {})
      v = z[key]
      if rng is not None:
        step = np.where(rng.random(v.shape) < 0.5, -np.inf, np.inf).astype(v.dtype)
        v = np.where(v == 0, v, np.nextafter(v, step))
      node[leaf] = jnp.asarray(v)
  model = Transformer(**json.loads(str(z["config"])))
  return z, model, params


def bound(z):
  return BOUND_FACTOR * float(z["noise_floor"])


def compare(search=decode.beam_search, perturb_seed=None):
  """(outputs, mismatched [(beam size, alpha, row)], largest relative score difference among the matched, tokens)
  of `search` on the fixture; one compilation per beam size (alpha is traced)."""
  z, model, params = load_fixture(perturb_seed)
  src, max_len = jnp.asarray(z["src"]), int(z["max_len"])
  total, bad, worst, outputs = 0, [], 0.0, {}
  for k in z["beam_sizes"].tolist():
    for a in z["alphas"].tolist():
      tokens, scores = map(np.asarray, search(model, params, src, beam_size=k, max_len=max_len, alpha=a))
      outputs[k, a] = tokens
      want_t, want_s = z[f"tokens/beam{k}/alpha{a}"], z[f"scores/beam{k}/alpha{a}"]
      for r in range(len(src)):
        total += 1
        if not np.array_equal(tokens[r], want_t[r]):
          bad.append((k, a, r))
        else:
          got, want = float(scores[r]), float(want_s[r])
          worst = max(worst, abs(got - want) / max(1.0, abs(want)))
  return total, bad, worst, outputs


def test_beam_search_reproduces_flax_wmt():
  """Every best beam the same, scores within BOUND_FACTOR x the fixture's noise floor (vitjax's rule before the
  standard one, finish="beam": 112 of the 288 beams differ)."""
  z, model, _ = load_fixture()
  assert 0 < bound(z) <= MAX_BOUND
  total, bad, worst, outputs = compare()
  assert total == 288
  assert not bad, f"{len(bad)} of {total} best beams differ from flax's (beam size, alpha, row): {bad[:10]}"
  assert worst <= bound(z), f"scores off by {worst:.2e} (relative), bound {bound(z):.2e}"
  for tokens in outputs.values():  # EOS, then the model's pad_id (0 here, as flax leaves it)
    for row in tokens:
      if model.eos_id in row:
        assert (row[int(np.argmax(row == model.eos_id)) + 1 :] == model.pad_id).all()


def test_bound_covers_rounding_noise():
  """Another CPU, simulated: with every weight one ulp off, the beams are still flax's and the scores within the
  bound."""
  z, _, _ = load_fixture()
  total, bad, worst, _ = compare(perturb_seed=12345)
  assert total == 288 and not bad, bad[:10]
  assert worst <= bound(z), f"scores off by {worst:.2e} (relative), bound {bound(z):.2e}"


def test_fixture_covers_the_cases():
  """The fixture's beams finish at many lengths, and some are unfinished at max_len; the start token is the pad
  id (flax's), not vitjax's default bos_id, so the test also checks that decoding starts from model.bos_id."""
  z, model, _ = load_fixture()
  assert model.bos_id == model.pad_id == 0 and model.eos_id == 1
  lengths, unfinished = set(), 0
  for key in z.files:
    if key.startswith("tokens/"):
      for row in z[key]:
        if model.eos_id in row:
          lengths.add(int(np.argmax(row == model.eos_id)) + 1)
        else:
          unfinished += 1
  assert len(lengths) >= 10 and unfinished >= 10
