"""Golden fixture for vitjax.decode.beam_search: the beams of flax's examples/wmt beam search on a vitjax model.

flax's `beam_search` (examples/wmt/decode.py, the reference implementation; not copied into vitjax) drives a tiny
random vitjax Transformer through a `tokens_to_logits` callback that runs vitjax's decoder with its KV cache.
The model uses flax's ids (pad 0, eos 1, decoding starts from 0: bos_id=0), and its weights are scaled so that
the distributions are peaky and EOS comes at many lengths, some hypotheses unfinished at max_len. Saved in
tests/golden/beam_flax_wmt.npz: the params ('/'-joined keys), the model config (JSON), the sources [N, S], and
flax's best beam per (beam size, alpha): tokens [N, max_len] (without flax's leading start token) and scores [N].
tests/test_beam_golden.py checks vitjax's beam_search against them.

    # flax's decode.py at the commit the fixture was made with (any clone of github.com/google/flax will do):
    mkdir -p /work/runs/beam/flax_wmt
    git clone https://github.com/google/flax /work/runs/beam/flax && \
      git -C /work/runs/beam/flax checkout 18f8f311c275d57f46d95e41b15aa97b454754c0
    cp /work/runs/beam/flax/examples/wmt/decode.py /work/runs/beam/flax_wmt/decode.py
    # then, from the repository root, with vitjax's venv:
    PYTHONPATH=/work/runs/beam/flax_wmt python experiments/golden/make_beam.py --out=tests/golden/beam_flax_wmt.npz

flax's decode.py imports only flax, jax and numpy. Its max_decode_len counts the start token, so a vitjax
max_len of L is flax's max_decode_len of L + 1 (both generate at most L tokens).
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from vitjax.models.transformer import Transformer

CONFIG = dict(
  vocab_size=16,
  d_model=32,
  num_heads=2,
  d_ff=64,
  num_layers=2,
  dropout_rate=0.0,
  max_len=16,
  posemb="learned",
  pad_id=0,
  eos_id=1,
  bos_id=0,
)
BEAM_SIZES = (1, 2, 3, 4)
ALPHAS = (0.0, 0.6, 1.0)
MAX_LEN = 12  # generated tokens at most
NUM_SOURCES = 24
SCALE = 3.0  # weights x SCALE: peaky distributions, so that beams differ
POS_STD = 2.0  # the decoder's learned positions ~ N(0, POS_STD): EOS becomes likely at many different lengths
SEED = 6  # of seeds 0-9, the one whose beams end at the most different lengths (and some at none)


def sources(rng: np.random.Generator, n: int, vocab: int, width: int = 10) -> np.ndarray:
  """n random sentences of 3-9 tokens in [2, vocab), each ending with EOS (1), padded with 0 to width."""
  out = np.zeros((n, width), np.int32)
  for i in range(n):
    k = int(rng.integers(3, width))
    out[i, :k] = rng.integers(2, vocab, size=k)
    out[i, k] = 1
  return out


def init_params(model: Transformer, seed: int, scale: float, pos_std: float):
  params = model.init(jax.random.key(seed), jnp.ones((1, 5), jnp.int32), jnp.ones((1, 4), jnp.int32))["params"]
  params = jax.tree.map(lambda p: p * scale, params)
  pos = params["decoder"]["pos_embedding"]
  params["decoder"]["pos_embedding"] = pos_std * jax.random.normal(jax.random.key(seed + 100), pos.shape)
  return params


def flatten(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}/"))
    else:
      out[f"{prefix}{k}"] = np.asarray(v)
  return out


def flax_beams(flax_decode, model, params, src, beam_size, alpha, max_len):
  """flax's beam search on vitjax's decoder: (tokens [N, max_len], scores [N]) of the best beam."""
  dec = model.clone(decode=True)
  encoded = model.apply({"params": params}, src, method=model.encode)
  # the KV cache for the batch (flax feeds positions 0 .. max_len - 1); flax's beam_init tiles it over the beams (its scalar cache_index is left as is)
  cache = dec.init(
    jax.random.key(0), jnp.zeros((src.shape[0], max_len), jnp.int32), encoded, src, method=dec.decode_logits
  )["cache"]
  cache = jax.tree.map(jnp.zeros_like, cache)
  enc_k = flax_decode.flat_batch_beam_expand(encoded, beam_size)
  src_k = flax_decode.flat_batch_beam_expand(src, beam_size)

  def tokens_to_logits(ids, cache):  # ids [N*K, 1]; the position is the cache's index
    i = _cache_index(cache)
    logits, upd = dec.apply(
      {"params": params, "cache": cache},
      ids,
      enc_k,
      src_k,
      positions=jnp.full((1, 1), i),
      method=dec.decode_logits,
      mutable=["cache"],
    )
    return logits[:, 0], upd["cache"]

  seqs, scores = flax_decode.beam_search(
    src, cache, tokens_to_logits, beam_size=beam_size, alpha=alpha, eos_id=model.eos_id, max_decode_len=max_len + 1
  )
  return seqs[:, -1, 1:], scores[:, -1]  # flax sorts the beams worst first; drop its start token


def _cache_index(cache):
  """The decoder's position: the cache_index of (any) self-attention layer."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(cache):
    if getattr(path[-1], "key", None) == "cache_index":
      return leaf
  raise ValueError("no cache_index in the cache")


def main():
  import decode as flax_decode  # flax's examples/wmt/decode.py, on PYTHONPATH (see the module docstring)

  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default="tests/golden/beam_flax_wmt.npz")
  args = ap.parse_args()
  model = Transformer(**CONFIG)
  params = init_params(model, SEED, SCALE, POS_STD)
  src = jnp.asarray(sources(np.random.default_rng(0), NUM_SOURCES, CONFIG["vocab_size"]))
  out = {f"params/{k}": v for k, v in flatten(params).items()}
  out["config"] = np.asarray(json.dumps(CONFIG))
  out["src"] = np.asarray(src)
  out["max_len"] = np.asarray(MAX_LEN)
  out["beam_sizes"] = np.asarray(BEAM_SIZES)
  out["alphas"] = np.asarray(ALPHAS)
  for k in BEAM_SIZES:
    search = jax.jit(lambda p, s, a, k=k: flax_beams(flax_decode, model, p, s, k, a, MAX_LEN))
    for a in ALPHAS:
      tokens, scores = map(np.asarray, search(params, src, a))
      out[f"tokens/beam{k}/alpha{a}"], out[f"scores/beam{k}/alpha{a}"] = tokens, scores
      finished = (tokens == CONFIG["eos_id"]).any(1)
      lengths = [int(np.argmax(t == CONFIG["eos_id"])) + 1 for t in tokens[finished]]
      print(
        f"beam {k} alpha {a}: {finished.sum()}/{len(tokens)} finished, lengths {sorted(set(lengths))}, "
        f"mean score {scores.mean():.3f}"
      )
  np.savez_compressed(args.out, **out)
  print(f"wrote {args.out}: {len(BEAM_SIZES) * len(ALPHAS) * NUM_SOURCES} outputs")


if __name__ == "__main__":
  main()
