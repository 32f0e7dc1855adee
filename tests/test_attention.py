import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import cpu_backend_only, dot_operand_types, naive_attention

from vitjax.attention import MultiHeadAttention, causal_mask, dot_product_attention, padding_mask

IMPLS = ["fast", "explicit", "xla", "reference"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("with_bias,with_mask", [(False, False), (True, False), (False, True), (True, True)])
def test_matches_float64_reference(rng, impl, with_bias, with_mask):
  b, t, s, h, d = 2, 5, 7, 3, 8
  q, k, v = rng.randn(b, t, h, d), rng.randn(b, s, h, d), rng.randn(b, s, h, d)
  bias = rng.randn(1, h, t, s) if with_bias else None
  mask = rng.rand(b, 1, t, s) > 0.3 if with_mask else None
  got = dot_product_attention(
    *(jnp.asarray(a, jnp.float32) for a in (q, k, v)),
    bias=None if bias is None else jnp.asarray(bias, jnp.float32),
    mask=mask,
    implementation=impl,
  )
  np.testing.assert_allclose(got, naive_attention(q, k, v, bias, mask), atol=2e-5, rtol=1e-5)


def test_value_width_may_differ_from_key_width(rng):
  q, k, v = rng.randn(1, 4, 2, 6), rng.randn(1, 3, 2, 6), rng.randn(1, 3, 2, 5)
  got = dot_product_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)))
  np.testing.assert_allclose(got, naive_attention(q, k, v), atol=2e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_fully_masked_rows_are_finite_and_agree(rng, impl):
  q, k, v = (jnp.asarray(rng.randn(2, 4, 2, 8), jnp.float32) for _ in range(3))
  mask = np.ones((2, 1, 4, 4), bool)
  mask[0, :, 1] = False  # query 1 of example 0 may attend to nothing
  mask[1] = False  # example 1 entirely masked
  out = dot_product_attention(q, k, v, mask=mask, implementation=impl)
  assert np.isfinite(np.asarray(out)).all()
  np.testing.assert_allclose(out, naive_attention(q, k, v, None, mask), atol=2e-5)
  grads = jax.grad(lambda q: dot_product_attention(q, k, v, mask=mask, implementation=impl).sum())(q)
  assert np.isfinite(np.asarray(grads)).all()


@pytest.mark.parametrize("bias_shape", [None, (1, 3, 5, 7), (2, 3, 5, 7), (1, 1, 1, 7)])
@pytest.mark.parametrize("masked", [False, True])
def test_explicit_backward_equals_autodiff_of_the_reference(rng, bias_shape, masked):
  """The hand-written backward of "explicit" gives JAX's autodiff gradients of the einsum reference for q, k, v
  and a learned bias of any broadcast shape (relative position tables, ALiBi), masked rows included."""
  b, t, s, h, d = 2, 5, 7, 3, 8
  q, k, v = (jnp.asarray(rng.randn(b, n, h, d), jnp.float32) for n in (t, s, s))
  bias = None if bias_shape is None else jnp.asarray(rng.randn(*bias_shape), jnp.float32)
  mask = None
  if masked:
    mask = rng.rand(b, 1, t, s) > 0.3
    mask[0, :, 2] = False  # a query that may attend to nothing
  w = jnp.asarray(rng.randn(b, t, h, d), jnp.float32)  # a loss that weighs every output differently

  def grads(impl):
    def loss(q, k, v, bias):
      return jnp.sum(w * dot_product_attention(q, k, v, bias=bias, mask=mask, implementation=impl))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2) if bias is None else (0, 1, 2, 3)))(q, k, v, bias)

  for got, want in zip(grads("explicit"), grads("reference"), strict=True):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bias_shape,masked", [(None, False), ((1, 3, 5, 7), True)])
def test_explicit_backward_in_bfloat16_matches_float32_autodiff(rng, bias_shape, masked):
  """In bfloat16 the explicit backward runs on the [B, T, H, K] layout (bf16 operands, float32 accumulation): its
  gradients match float32 autodiff of the reference at the same rounded inputs, to bfloat16's rounding."""
  b, t, s, h, d = 2, 5, 7, 3, 8
  q, k, v = (jnp.asarray(rng.randn(b, n, h, d), jnp.bfloat16) for n in (t, s, s))
  bias = None if bias_shape is None else jnp.asarray(rng.randn(*bias_shape), jnp.float32)
  mask = rng.rand(b, 1, t, s) > 0.3 if masked else None
  w = jnp.asarray(rng.randn(b, t, h, d), jnp.float32)

  def grads(impl, dtype):
    def loss(q, k, v, bias):
      return jnp.sum(w * dot_product_attention(q, k, v, bias=bias, mask=mask, implementation=impl).astype(jnp.float32))

    args = [a.astype(dtype) for a in (q, k, v)] + [bias]
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2) if bias is None else (0, 1, 2, 3)))(*args)

  for got, want in zip(grads("explicit", jnp.bfloat16), grads("reference", jnp.float32), strict=True):
    assert got.shape == want.shape
    got, want = np.asarray(got, np.float32), np.asarray(want)
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


@cpu_backend_only
def test_bfloat16_attention_layer_dots_stay_bfloat16_on_cpu(rng):
  """XLA:CPU computes a bf16 dot in float32 (a third of the speed) unless it takes bf16 operands to a float32
  result with the lhs's last dimension contracted: every dot of a bf16 attention layer's forward and backward
  (projections and attention alike) must compile to bf16 operands (vitjax.dots, the explicit backward's layout)."""
  x = jnp.asarray(rng.randn(2, 9, 32), jnp.bfloat16)
  layer = MultiHeadAttention(num_heads=4, dtype=jnp.bfloat16, implementation="explicit")
  params = layer.init(jax.random.key(0), x)
  loss = lambda p, x: jnp.sum(layer.apply(p, x, bias=jnp.zeros((1, 4, 9, 9))).astype(jnp.float32) ** 2)
  hlo = jax.jit(jax.grad(loss)).lower(params, x).compile().as_text()
  operands = dot_operand_types(hlo)
  assert len(operands) >= 12  # 4 projections x 3 and attention's 2 + 4 (XLA merges some that share an operand)
  assert all(t.startswith("bf16[") for pair in operands for t in pair), operands


def test_explicit_runs_in_bfloat16_with_float32_softmax(rng):
  q, k, v = (jnp.asarray(rng.randn(2, 6, 2, 8), jnp.bfloat16) for _ in range(3))
  out = dot_product_attention(q, k, v, implementation="explicit")
  assert out.dtype == jnp.bfloat16
  want = naive_attention(*(np.asarray(a, np.float32) for a in (q, k, v)))
  np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=3e-2)
  g = jax.grad(lambda q: dot_product_attention(q, k, v, implementation="explicit").astype(jnp.float32).sum())(q)
  assert g.dtype == jnp.bfloat16 and np.isfinite(np.asarray(g, np.float32)).all()


def test_attention_dropout_is_seeded_and_unbiased(rng):
  q, k, v = (jnp.asarray(rng.randn(1, 4, 2, 8), jnp.float32) for _ in range(3))
  kw = dict(dropout_rate=0.5, deterministic=False)
  a = dot_product_attention(q, k, v, dropout_rng=jax.random.key(1), **kw)
  b = dot_product_attention(q, k, v, dropout_rng=jax.random.key(1), **kw)
  c = dot_product_attention(q, k, v, dropout_rng=jax.random.key(2), **kw)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)
  keys = jax.random.split(jax.random.key(0), 2000)
  mean = jax.vmap(lambda r: dot_product_attention(q, k, v, dropout_rng=r, **kw))(keys).mean(0)
  np.testing.assert_allclose(mean, dot_product_attention(q, k, v), atol=0.1)
  with pytest.raises(ValueError, match="dropout_rng"):
    dot_product_attention(q, k, v, **kw)


def test_bad_inputs_raise_clear_errors(rng):
  x = jnp.zeros((1, 4, 2, 8))
  with pytest.raises(ValueError, match="unknown attention implementation"):
    dot_product_attention(x, x, x, implementation="flash")
  with pytest.raises(ValueError, match="incompatible"):
    dot_product_attention(x, jnp.zeros((1, 4, 2, 4)), x)
  with pytest.raises(ValueError, match="not divisible by num_heads"):
    MultiHeadAttention(num_heads=3).init(jax.random.key(0), jnp.zeros((1, 4, 8)))


def _mha_reference(params, xq, xkv, mask):
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), flax.core.unfreeze(params))
  proj = lambda x, n: np.einsum("btd,dhk->bthk", x, p[n]["kernel"]) + p[n]["bias"]
  o = naive_attention(proj(xq, "query"), proj(xkv, "key"), proj(xkv, "value"), None, mask)
  return np.einsum("bthk,hkd->btd", o, p["out"]["kernel"]) + p["out"]["bias"]


def test_multihead_cross_attention_matches_reference(rng):
  xq, xkv = rng.randn(2, 3, 16), rng.randn(2, 5, 16)
  valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
  mha = MultiHeadAttention(num_heads=4)
  params = mha.init(jax.random.key(0), jnp.asarray(xq, jnp.float32), jnp.asarray(xkv, jnp.float32))["params"]
  params = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(jax.random.key(1), a.shape), params)
  mask = padding_mask(None, jnp.asarray(valid))
  got = mha.apply({"params": params}, jnp.asarray(xq, jnp.float32), jnp.asarray(xkv, jnp.float32), mask=mask)
  np.testing.assert_allclose(got, _mha_reference(params, xq, xkv, np.asarray(mask)), atol=1e-4, rtol=1e-4)
  assert params["query"]["kernel"].shape == (16, 4, 4) and params["out"]["kernel"].shape == (4, 4, 16)


def test_causal_mask_future_tokens_do_not_change_earlier_outputs(rng):
  x = jnp.asarray(rng.randn(1, 6, 16), jnp.float32)
  mha = MultiHeadAttention(num_heads=2)
  params = mha.init(jax.random.key(0), x)
  y1 = mha.apply(params, x, mask=causal_mask(6))
  x2 = x.at[:, 4:].set(jnp.asarray(rng.randn(1, 2, 16), jnp.float32))
  y2 = mha.apply(params, x2, mask=causal_mask(6))
  np.testing.assert_allclose(y1[:, :4], y2[:, :4], atol=1e-6)
  assert not np.allclose(y1[:, 4:], y2[:, 4:])


def test_kv_cache_decoding_equals_full_causal_pass(rng):
  b, t, d = 2, 7, 16
  x = jnp.asarray(rng.randn(b, t, d), jnp.float32)
  full = MultiHeadAttention(num_heads=4)
  params = full.init(jax.random.key(0), x)["params"]
  want = full.apply({"params": params}, x, mask=causal_mask(t))
  dec = MultiHeadAttention(num_heads=4, decode=True)
  cache = dec.init(jax.random.key(0), x)["cache"]
  outs = []
  step = jax.jit(lambda c, xi: dec.apply({"params": params, "cache": c}, xi, mutable=["cache"]))
  for i in range(t):  # one token at a time ...
    y, upd = step(cache, x[:, i : i + 1])
    cache = upd["cache"]
    outs.append(y)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, atol=1e-5)
  cache = dec.init(jax.random.key(0), x)["cache"]  # ... or in chunks (a prompt, then tokens)
  y0, upd = dec.apply({"params": params, "cache": cache}, x[:, :4], mutable=["cache"])
  y1, upd = dec.apply({"params": params, "cache": upd["cache"]}, x[:, 4:], mutable=["cache"])
  np.testing.assert_allclose(jnp.concatenate([y0, y1], 1), want, atol=1e-5)
  # past the cache's end: NaN (jax would clamp the write onto the last slot and answer as if nothing were wrong)
  y, _ = step(upd["cache"], x[:, :1])  # the cache is full: index 7 of 7
  assert np.isnan(np.asarray(y)).all()
  with pytest.raises(ValueError, match="cache holds 7 tokens; called with 8 at once"):
    dec.apply(
      {"params": params, "cache": dec.init(jax.random.key(0), x)["cache"]},
      jnp.tile(x, (1, 2, 1))[:, :8],
      mutable=["cache"],
    )


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_a_mask_or_bias_attention_would_misread_is_refused(rng, impl):
  """A float (additive) mask read as boolean is inverted; a [B, S] padding mask reads as [T, S] when B == T."""
  b, t, h, k = 4, 4, 2, 8
  q = jnp.asarray(rng.randn(b, t, h, k), jnp.float32)
  valid = jnp.asarray(rng.rand(b, t) > 0.3)
  attend = functools.partial(dot_product_attention, q, q, q, implementation=impl)
  for kwargs, says in (
    (
      {"mask": jnp.where(valid, 0.0, -jnp.inf)[:, None, None]},
      "mask is float32: a mask is boolean .* pass `m == 0` .* as bias=",
    ),
    ({"mask": valid}, r"mask has shape \(4, 4\); give it 4 dimensions .* \[4, 2, 4, 4\]: a padding mask \[B, S\]"),
    ({"mask": valid[:, None, :, None][:, :, :3]}, r"mask has shape \(4, 1, 3, 1\), which does not broadcast"),
    ({"bias": jnp.zeros((3, t, t))}, r"bias has shape \(3, 4, 4\), which does not broadcast .* \[H, T, S\]"),
    ({"bias": jnp.zeros((t,))}, r"bias has shape \(4,\), which does not broadcast"),
  ):
    with pytest.raises(ValueError, match=says):
      attend(**kwargs)
  for other in (q[:, :, :1], q[:2]):  # keys and values with other heads or batch: an einsum's error inside, before
    with pytest.raises(ValueError, match=r"incompatible q/k/v shapes .* share B and H"):
      dot_product_attention(q, other, other, implementation=impl)
  want = attend(mask=padding_mask(None, valid))  # the right spelling; integer masks read as boolean too
  np.testing.assert_array_equal(attend(mask=padding_mask(None, valid).astype(jnp.int32)), want)
  np.testing.assert_array_equal(attend(mask=valid[:, None, None, :]), want)


@pytest.mark.parametrize("bias_shape", [None, (1, 2, 9, 9)], ids=["no_bias", "bias"])
@pytest.mark.parametrize("masked", [False, True])
def test_cudnn_padding_of_odd_lengths_is_exact(rng, bias_shape, masked, monkeypatch, caplog):
  """cudnn_attention pads odd lengths to even ones (jax refuses cuDNN's backward otherwise); the padding and its
  masking are checked here with XLA's kernel in cuDNN's place (no GPU), forward and gradients."""
  from vitjax import attention

  real = jax.nn.dot_product_attention
  calls = []

  def xla_in_place_of_cudnn(*args, implementation=None, **kw):
    calls.append(args[0].shape)
    return real(*args, implementation="xla", **kw)

  monkeypatch.setattr(attention.jax.nn, "dot_product_attention", xla_in_place_of_cudnn)
  q, k, v = (jnp.asarray(rng.randn(2, 9, 2, 8), jnp.float32) for _ in range(3))
  bias = None if bias_shape is None else jnp.asarray(rng.randn(*bias_shape), jnp.float32)
  mask = jnp.asarray(rng.rand(2, 1, 9, 9) > 0.3) if masked else None

  def loss(fn, q, k, v, b):
    return jnp.sum(fn(q, k, v, b) * jnp.arange(8.0))

  cudnn = lambda q, k, v, b: attention.cudnn_attention(q, k, v, b, mask, 8**-0.5)
  ref = lambda q, k, v, b: attention.reference_attention(q, k, v, bias=b, mask=mask)
  np.testing.assert_allclose(cudnn(q, k, v, bias), ref(q, k, v, bias), atol=2e-6)
  argnums = (0, 1, 2, 3) if bias is not None else (0, 1, 2)
  got = jax.grad(lambda *a: loss(cudnn, *a), argnums=argnums)(q, k, v, bias)
  want = jax.grad(lambda *a: loss(ref, *a), argnums=argnums)(q, k, v, bias)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, atol=5e-6)
  assert calls and calls[0] == (2, 10, 2, 8)  # padded to an even length


def test_fast_attention_logs_once_when_cudnn_refuses(rng, monkeypatch, caplog):
  """On a GPU, "fast" falls back to XLA's attention when cuDNN refuses, and says so once (forced here on the CPU)."""
  from vitjax import attention

  def refuse(*args, implementation=None, **kw):
    if implementation == "cudnn":
      raise NotImplementedError("The head dim must be <= 256 and a multiple of 8, but got 6.")
    return real(*args, implementation=implementation, **kw)

  real = jax.nn.dot_product_attention
  monkeypatch.setattr(attention.jax.nn, "dot_product_attention", refuse)
  monkeypatch.setattr(attention.jax, "default_backend", lambda: "gpu")
  attention._fallback_once.cache_clear()
  q = jnp.asarray(rng.randn(1, 4, 2, 6), jnp.bfloat16)
  with caplog.at_level("WARNING"):
    out = [dot_product_attention(q, q, q) for _ in range(3)]
  want = dot_product_attention(q, q, q, implementation="reference")
  np.testing.assert_allclose(np.float32(out[0]), np.float32(want), atol=2e-2)
  lines = [r.getMessage() for r in caplog.records if "cuDNN refused" in r.getMessage()]
  assert len(lines) == 1 and "multiple of 8" in lines[0], lines


def test_padding_mask_with_query_flags_is_their_outer_and():
  query_valid = jnp.array([[1, 1, 0], [1, 0, 0]], bool)
  key_valid = jnp.array([[1, 0, 1, 1], [0, 1, 1, 0]], bool)
  got = np.asarray(padding_mask(query_valid, key_valid))
  assert got.shape == (2, 1, 3, 4)
  want = np.asarray(query_valid)[:, :, None] & np.asarray(key_valid)[:, None, :]
  np.testing.assert_array_equal(got[:, 0], want)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_given_scale_replaces_one_over_sqrt_k(rng, impl):
  q, k, v = rng.randn(2, 5, 3, 8), rng.randn(2, 7, 3, 8), rng.randn(2, 7, 3, 8)
  got = dot_product_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)), scale=0.9, implementation=impl)
  # naive_attention divides by sqrt(K): scaling q by 0.9 sqrt(K) makes its logits q k^T * 0.9
  np.testing.assert_allclose(got, naive_attention(q * 0.9 * np.sqrt(8), k, v), atol=2e-5, rtol=1e-5)


def test_kv_cache_decoding_keeps_the_callers_mask(rng):
  """With decode=True a caller's mask (here: key 2 hidden) is and-ed with the cache's causal one, not replaced."""
  b, t, d = 1, 5, 16
  x = jnp.asarray(rng.randn(b, t, d), jnp.float32)
  full = MultiHeadAttention(num_heads=2)
  params = full.init(jax.random.key(0), x)["params"]
  hide = jnp.ones((1, 1, 1, t), bool).at[..., 2].set(False)
  want = full.apply({"params": params}, x, mask=causal_mask(t) & hide)
  dec = MultiHeadAttention(num_heads=2, decode=True)
  cache = dec.init(jax.random.key(0), x)["cache"]
  outs = []
  for i in range(t):
    y, upd = dec.apply({"params": params, "cache": cache}, x[:, i : i + 1], mask=hide, mutable=["cache"])
    cache = upd["cache"]
    outs.append(y)
  np.testing.assert_allclose(jnp.concatenate(outs, 1)[:, 3:], want[:, 3:], atol=1e-5)


def test_biases_of_the_projections_can_be_left_out():
  x = jnp.zeros((1, 3, 8))
  for qkv_bias, out_bias in [(False, True), (True, False)]:
    mha = MultiHeadAttention(num_heads=2, qkv_bias=qkv_bias, out_bias=out_bias)
    params = jax.eval_shape(lambda m=mha: m.init(jax.random.key(0), x))["params"]
    assert ("bias" in params["query"]) == qkv_bias and ("bias" in params["value"]) == qkv_bias
    assert ("bias" in params["out"]) == out_bias


def test_kv_cache_chunk_running_one_past_the_end_is_nan(rng):
  x = jnp.asarray(rng.randn(1, 7, 16), jnp.float32)
  dec = MultiHeadAttention(num_heads=2, decode=True)
  variables = dec.init(jax.random.key(0), x)
  y, upd = dec.apply(variables, x[:, :4], mutable=["cache"])
  assert np.isfinite(np.asarray(y)).all()
  y, _ = dec.apply({**variables, **upd}, x[:, 3:], mutable=["cache"])  # 4 more: slots 4..7 of 0..6
  assert np.isnan(np.asarray(y)).all()


def test_sown_attention_weights_are_those_the_layer_used(rng):
  """What attention maps draw: with a bias and a mask, the sown weights times the values give the layer's output."""
  x = jnp.asarray(rng.randn(2, 5, 8), jnp.float32)
  bias = jnp.asarray(rng.randn(2, 5, 5), jnp.float32)
  mask = jnp.asarray(rng.rand(2, 1, 5, 5) > 0.3)
  mha = MultiHeadAttention(num_heads=2, implementation="reference")
  params = mha.init(jax.random.key(0), x)["params"]
  y, inter = mha.apply({"params": params}, x, mask=mask, bias=bias, mutable=["intermediates"])
  (w,) = inter["intermediates"]["attention_weights"]
  assert w.shape == (2, 2, 5, 5)
  v = jnp.einsum("btd,dhk->bthk", x, params["value"]["kernel"]) + params["value"]["bias"]
  o = jnp.einsum("bhts,bshk->bthk", w, v)
  np.testing.assert_allclose(
    jnp.einsum("bthk,hkd->btd", o, params["out"]["kernel"]) + params["out"]["bias"], y, atol=1e-5
  )
