import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import naive_attention

from vitjax.layers import DecoderBlock, DropPath, EncoderBlock, FeedForward, Stack, drop_path_rates


def _np(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), flax.core.unfreeze(tree))


def _ln(x, p, eps=1e-6):
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _gelu(x):
  from scipy.special import erf

  return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def _ffn(x, p, act):
  h = x @ p["fc1"]["kernel"] + p["fc1"]["bias"]
  h = np.maximum(h, 0) if act == "relu" else _gelu(h)
  return h @ p["fc2"]["kernel"] + p["fc2"]["bias"]


def _mha(x, kv, p, mask=None):
  proj = lambda y, n: np.einsum("btd,dhk->bthk", y, p[n]["kernel"]) + p[n]["bias"]
  o = naive_attention(proj(x, "query"), proj(kv, "key"), proj(kv, "value"), None, mask)
  return np.einsum("bthk,hkd->btd", o, p["out"]["kernel"]) + p["out"]["bias"]


def _perturb(params):
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  return jax.tree.unflatten(tree, [a + 0.2 * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)])


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_ffn_matches_float64(rng, act):
  x = rng.randn(2, 3, 8)
  mod = FeedForward(16, act=act)
  p = _perturb(mod.init(jax.random.key(0), jnp.asarray(x, jnp.float32))["params"])
  np.testing.assert_allclose(
    mod.apply({"params": p}, jnp.asarray(x, jnp.float32)), _ffn(x, _np(p), act), atol=1e-5, rtol=1e-5
  )


@pytest.mark.parametrize("prenorm", [True, False])
def test_encoder_block_matches_float64(rng, prenorm):
  x = rng.randn(2, 5, 16)
  mask = np.tril(np.ones((5, 5), bool))[None, None]
  mod = EncoderBlock(num_heads=4, mlp_dim=32, prenorm=prenorm, act="relu")
  p = _perturb(mod.init(jax.random.key(0), jnp.asarray(x, jnp.float32))["params"])
  got = mod.apply({"params": p}, jnp.asarray(x, jnp.float32), mask)
  q = _np(p)
  if prenorm:
    y = x + _mha(_ln(x, q["norm1"]), _ln(x, q["norm1"]), q["attn"], mask)
    want = y + _ffn(_ln(y, q["norm2"]), q["mlp"], "relu")
  else:
    y = _ln(x + _mha(x, x, q["attn"], mask), q["norm1"])
    want = _ln(y + _ffn(y, q["mlp"], "relu"), q["norm2"])
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prenorm", [True, False])
def test_decoder_block_matches_float64_and_is_causal(rng, prenorm):
  x, enc = rng.randn(2, 4, 16), rng.randn(2, 6, 16)
  src_valid = np.array([[1] * 6, [1] * 3 + [0] * 3], bool)[:, None, None, :]
  mod = DecoderBlock(num_heads=2, mlp_dim=32, prenorm=prenorm, act="relu")
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  p = _perturb(mod.init(jax.random.key(0), f32(x), f32(enc))["params"])
  got = mod.apply({"params": p}, f32(x), f32(enc), None, src_valid)
  q, causal = _np(p), np.tril(np.ones((4, 4), bool))[None, None]
  if prenorm:
    y = x + _mha(_ln(x, q["norm1"]), _ln(x, q["norm1"]), q["self_attn"], causal)
    y = y + _mha(_ln(y, q["norm2"]), enc, q["cross_attn"], src_valid)
    want = y + _ffn(_ln(y, q["norm3"]), q["mlp"], "relu")
  else:
    y = _ln(x + _mha(x, x, q["self_attn"], causal), q["norm1"])
    y = _ln(y + _mha(y, enc, q["cross_attn"], src_valid), q["norm2"])
    want = _ln(y + _ffn(y, q["mlp"], "relu"), q["norm3"])
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
  x2 = x.copy()
  x2[:, 2:] = rng.randn(2, 2, 16)  # change the future
  got2 = mod.apply({"params": p}, f32(x2), f32(enc), None, src_valid)
  np.testing.assert_allclose(got[:, :2], got2[:, :2], atol=1e-5)


def _stack(scan, remat, **kw):
  block = dict(num_heads=2, mlp_dim=32, **kw)
  return Stack(EncoderBlock, 3, tuple(block.items()), scan=scan, remat=remat, drop_path_rate=0.2)


def test_scanned_and_rematerialised_stacks_equal_the_plain_stack(rng):
  x = jnp.asarray(rng.randn(2, 5, 16), jnp.float32)
  plain = _stack(False, False)
  p = _perturb(plain.init(jax.random.key(0), x)["params"])
  want = plain.apply({"params": p}, x)
  stacked = {
    "blocks": {"block": jax.tree.map(lambda *a: jnp.stack(a), *[p[f"block_{i}"] for i in range(3)])},
    "final_norm": p["final_norm"],
  }
  for scan, remat in [(True, False), (True, True), (False, True)]:
    mod = _stack(scan, remat)
    params = stacked if scan else p
    shapes = jax.tree.map(jnp.shape, mod.init(jax.random.key(0), x)["params"])
    assert shapes == jax.tree.map(jnp.shape, params)
    np.testing.assert_allclose(mod.apply({"params": params}, x), want, atol=1e-5)
    g = jax.grad(lambda q, mod=mod: mod.apply({"params": q}, x).sum())(params)
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(g))


def test_training_mode_uses_dropout_and_stochastic_depth(rng):
  x = jnp.asarray(rng.randn(8, 5, 16), jnp.float32)
  for scan in (False, True):
    mod = _stack(scan, False, deterministic=False, dropout_rate=0.1)
    p = mod.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x)
    a = mod.apply(p, x, rngs={"dropout": jax.random.key(2)})
    b = mod.apply(p, x, rngs={"dropout": jax.random.key(2)})
    c = mod.apply(p, x, rngs={"dropout": jax.random.key(3)})
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_drop_path():
  x = jnp.ones((1000, 3))
  np.testing.assert_array_equal(DropPath(deterministic=True).apply({}, x, 0.5), x)
  y = DropPath(deterministic=False).apply({}, x, 0.25, rngs={"dropout": jax.random.key(0)})
  kept = np.asarray(y[:, 0] != 0)
  assert 0.7 < kept.mean() < 0.8
  np.testing.assert_allclose(np.asarray(y)[kept], 1 / 0.75, rtol=1e-6)
  np.testing.assert_allclose(drop_path_rates(0.3, 4), [0, 0.1, 0.2, 0.3], atol=1e-7)
