"""vitjax's beam search reproduces flax's examples/wmt beam search (the reference) beam for beam.

The fixture (experiments/golden/make_beam.py) holds a tiny random Transformer with flax's ids (pad 0, eos 1,
decoding from 0) and, for 24 sources, beam sizes 1-4 and alphas 0, 0.6, 1: the best beam of flax's search run
on that model through vitjax's decoder and KV cache (288 outputs; some finish at every length from 1 to 12,
some are unfinished at max_len).
"""

import json
import os

import jax.numpy as jnp
import numpy as np

from vitjax import decode
from vitjax.models.transformer import Transformer

FIXTURE = os.path.join(os.path.dirname(__file__), "golden", "beam_flax_wmt.npz")


def load_fixture():
  z = np.load(FIXTURE)
  params = {}
  for key in z.files:
    if key.startswith("params/"):
      *path, leaf = key.split("/")[1:]
      node = params
      for p in path:
        node = node.setdefault(p, {})
      node[leaf] = jnp.asarray(z[key])
  model = Transformer(**json.loads(str(z["config"])))
  return z, model, params


def compare(search=decode.beam_search):
  """(outputs, mismatched [(beam size, alpha, row)], largest score difference among the matched, tokens) of
  `search` on the fixture; one compilation per beam size (alpha is traced)."""
  z, model, params = load_fixture()
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
          worst = max(worst, abs(float(scores[r]) - float(want_s[r])))
  return total, bad, worst, outputs


def test_beam_search_reproduces_flax_wmt():
  """Every best beam the same, scores to 1e-5 (vitjax's rule before the standard one: 103 of 288 differed)."""
  total, bad, worst, outputs = compare()
  assert total == 288
  assert not bad, f"{len(bad)} of {total} best beams differ from flax's (beam size, alpha, row): {bad[:10]}"
  assert worst < 1e-5
  _, model, _ = load_fixture()
  for tokens in outputs.values():  # EOS, then the model's pad_id (0 here, as flax leaves it)
    for row in tokens:
      if model.eos_id in row:
        assert (row[int(np.argmax(row == model.eos_id)) + 1 :] == model.pad_id).all()


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
