import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import cpu_backend_only, dot_operand_types, naive_attention

from vitjax import posenc
from vitjax.layers import NORMS, DecoderBlock, DropPath, EncoderBlock, FeedForward, Stack, drop_path_rates, gelu


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


def _mha(x, kv, p, mask=None, bias=None):
  proj = lambda y, n: np.einsum("btd,dhk->bthk", y, p[n]["kernel"]) + p[n]["bias"]
  o = naive_attention(proj(x, "query"), proj(kv, "key"), proj(kv, "value"), bias, mask)
  return np.einsum("bthk,hkd->btd", o, p["out"]["kernel"]) + p["out"]["bias"]


def _random_params(mod, *inputs, noise=0.2):
  """Parameters of mod's shapes drawn by numpy: LayerNorm scales 1 + noise * N(0, 1), the rest noise * N(0, 1).

  Only shapes are traced (eval_shape): jax's initializers would compile once per shape, seconds on CI's CPU.
  """
  rng = np.random.RandomState(7)
  shapes = flax.traverse_util.flatten_dict(jax.eval_shape(lambda: mod.init(jax.random.key(0), *inputs))["params"])
  draw = lambda k, s: jnp.asarray((k[-1] == "scale") + noise * rng.randn(*s.shape), jnp.float32)
  return flax.traverse_util.unflatten_dict({k: draw(k, s) for k, s in shapes.items()})


def test_gelu_is_exact_in_value_and_gradient():
  """vitjax's erf-form GELU (the fast one on XLA:CPU) against float64 x * Phi(x) and its derivative Phi + x * phi,
  over the tails too (x to -10, where 1 + erf(x / sqrt 2) cancels: absolute error there is what matters)."""
  x = np.linspace(-10, 10, 2001)
  y, dy = jax.vmap(jax.value_and_grad(gelu))(jnp.asarray(x, jnp.float32))
  from scipy.special import ndtr

  np.testing.assert_allclose(y, _gelu(x), atol=2e-6, rtol=1e-6)
  np.testing.assert_allclose(dy, ndtr(x) + x * np.exp(-0.5 * x**2) / np.sqrt(2 * np.pi), atol=2e-6)


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_ffn_matches_float64(rng, act):
  x = rng.randn(2, 3, 8)
  mod = FeedForward(16, act=act)
  p = _random_params(mod, jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(
    mod.apply({"params": p}, jnp.asarray(x, jnp.float32)), _ffn(x, _np(p), act), atol=1e-5, rtol=1e-5
  )


def _sublayer(norm, x, f, ln):
  """The three placements, written out: pre x + F(LN(x)), post LN(x + F(x)), respost x + LN(F(x))."""
  return {"pre": lambda: x + f(ln(x)), "post": lambda: ln(x + f(x)), "respost": lambda: x + ln(f(x))}[norm]()


@pytest.mark.parametrize("norm", NORMS)
def test_encoder_block_matches_float64(rng, norm):
  x = rng.randn(2, 5, 16)
  mask = np.tril(np.ones((5, 5), bool))[None, None]
  mod = EncoderBlock(num_heads=4, mlp_dim=32, norm=norm, act="relu")
  p = _random_params(mod, jnp.asarray(x, jnp.float32))
  got = mod.apply({"params": p}, jnp.asarray(x, jnp.float32), mask)
  q = _np(p)
  y = _sublayer(norm, x, lambda h: _mha(h, h, q["attn"], mask), lambda h: _ln(h, q["norm1"]))
  want = _sublayer(norm, y, lambda h: _ffn(h, q["mlp"], "relu"), lambda h: _ln(h, q["norm2"]))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_decoder_block_matches_float64_and_is_causal(rng, norm):
  x, enc = rng.randn(2, 4, 16), rng.randn(2, 6, 16)
  src_valid = np.array([[1] * 6, [1] * 3 + [0] * 3], bool)[:, None, None, :]
  mod = DecoderBlock(num_heads=2, mlp_dim=32, norm=norm, act="relu")
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  p = _random_params(mod, f32(x), f32(enc))
  got = mod.apply({"params": p}, f32(x), f32(enc), None, src_valid)
  q, causal = _np(p), np.tril(np.ones((4, 4), bool))[None, None]
  y = _sublayer(norm, x, lambda h: _mha(h, h, q["self_attn"], causal), lambda h: _ln(h, q["norm1"]))
  y = _sublayer(norm, y, lambda h: _mha(h, enc, q["cross_attn"], src_valid), lambda h: _ln(h, q["norm2"]))
  want = _sublayer(norm, y, lambda h: _ffn(h, q["mlp"], "relu"), lambda h: _ln(h, q["norm3"]))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  x2 = x.copy()
  x2[:, 2:] = rng.randn(2, 2, 16)  # change the future
  got2 = mod.apply({"params": p}, f32(x2), f32(enc), None, src_valid)
  np.testing.assert_allclose(got[:, :2], got2[:, :2], atol=1e-5)


def _hand_built_relative_bias(table, cls_bias, grid, cls_token):
  """[H, N, N] from loops over (query, key) pairs: table row (dy + h-1)(2w-1) + (dx + w-1) for the offset
  (dy, dx) = query cell - key cell; a class token (first) reads cls_bias rows 0 (cls -> patch), 1 (patch -> cls),
  2 (cls -> cls)."""
  h, w = grid
  cells = ([None] if cls_token else []) + [(i, j) for i in range(h) for j in range(w)]
  n = len(cells)
  out = np.zeros((table.shape[1], n, n))
  for a, qa in enumerate(cells):
    for b, kb in enumerate(cells):
      if qa is None:
        out[:, a, b] = cls_bias[2 if kb is None else 0]
      elif kb is None:
        out[:, a, b] = cls_bias[1]
      else:
        out[:, a, b] = table[(qa[0] - kb[0] + h - 1) * (2 * w - 1) + (qa[1] - kb[1] + w - 1)]
  return out


@pytest.mark.parametrize("cls_token", [False, True])
def test_encoder_block_relative_position_bias_matches_float64(rng, cls_token):
  grid = (2, 3)
  x = rng.randn(2, cls_token + 6, 8)
  mod = EncoderBlock(num_heads=2, mlp_dim=16, act="relu", rel_pos_grid=grid, rel_pos_cls_token=cls_token)
  p = _random_params(mod, jnp.asarray(x, jnp.float32))
  assert p["rel_pos"]["relative_position_bias_table"].shape == (3 * 5, 2)
  assert ("cls_bias" in p["rel_pos"]) == cls_token
  q = _np(p)
  extra = np.zeros((1, 1, 1, 1)) + 0.3 * rng.randn(1, 1, 1, x.shape[1])  # a caller's bias adds to it
  got = mod.apply({"params": p}, jnp.asarray(x, jnp.float32), None, jnp.asarray(extra, jnp.float32))
  rel = _hand_built_relative_bias(
    q["rel_pos"]["relative_position_bias_table"], q["rel_pos"].get("cls_bias"), grid, cls_token
  )
  y = x + _mha(_ln(x, q["norm1"]), _ln(x, q["norm1"]), q["attn"], bias=rel[None] + extra)
  want = y + _ffn(_ln(y, q["norm2"]), q["mlp"], "relu")
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(posenc.relative_position_index(grid, cls_token).shape, (x.shape[1],) * 2)
  with pytest.raises(ValueError, match="covers 7 tokens, got 6"):
    _random_params(
      EncoderBlock(num_heads=2, mlp_dim=16, rel_pos_grid=grid, rel_pos_cls_token=True), jnp.zeros((1, 6, 8))
    )


def test_norm_placement_final_norm_and_errors():
  x = jnp.zeros((1, 3, 8))
  for norm, final in [("pre", True), ("post", False), ("respost", True)]:
    stack = Stack(EncoderBlock, 2, (("num_heads", 2), ("mlp_dim", 16), ("norm", norm)))
    shapes = jax.eval_shape(lambda s=stack: s.init(jax.random.key(0), x))["params"]
    assert ("final_norm" in shapes) == final, norm
    assert set(shapes["block_0"]) == {"attn", "mlp", "norm1", "norm2"}  # the same names in every placement
  with pytest.raises(ValueError, match="unknown norm placement 'mid'; use one of 'pre', 'post', 'respost'"):
    _random_params(EncoderBlock(num_heads=2, mlp_dim=16, norm="mid"), x)


def _stack(scan, remat, **kw):
  block = dict(num_heads=2, mlp_dim=32, **kw)
  return Stack(EncoderBlock, 3, tuple(block.items()), scan=scan, remat=remat, drop_path_rate=0.2)


def test_scanned_and_rematerialised_stacks_equal_the_plain_stack(rng):
  x = jnp.asarray(rng.randn(2, 5, 16), jnp.float32)
  plain = _stack(False, False)
  p = _random_params(plain, x)
  want = jax.jit(plain.apply)({"params": p}, x)  # jitted here and below: op by op, a scan is 10x slower
  stacked = {
    "blocks": {"block": jax.tree.map(lambda *a: jnp.stack(a), *[p[f"block_{i}"] for i in range(3)])},
    "final_norm": p["final_norm"],
  }
  for scan, remat in [(True, False), (True, True), (False, True)]:
    mod = _stack(scan, remat)
    params = stacked if scan else p
    shapes = jax.tree.map(jnp.shape, jax.eval_shape(mod.init, jax.random.key(0), x)["params"])
    assert shapes == jax.tree.map(jnp.shape, params)
    np.testing.assert_allclose(jax.jit(mod.apply)({"params": params}, x), want, atol=1e-5)
    g = jax.jit(jax.grad(lambda q, mod=mod: mod.apply({"params": q}, x).sum()))(params)
    assert all(np.isfinite(np.asarray(a)).all() for a in jax.tree.leaves(g))


def test_training_mode_uses_dropout_and_stochastic_depth(rng):
  x = jnp.asarray(rng.randn(8, 5, 16), jnp.float32)
  for scan in (False, True):
    mod = _stack(scan, False, deterministic=False, dropout_rate=0.1)
    p = jax.jit(mod.init)({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x)
    apply = jax.jit(mod.apply)
    a = apply(p, x, rngs={"dropout": jax.random.key(2)})
    b = apply(p, x, rngs={"dropout": jax.random.key(2)})
    c = apply(p, x, rngs={"dropout": jax.random.key(3)})
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


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dots_dense_layers_are_flax_layers_with_the_same_parameters(rng, dtype):
  """vitjax.dots.Dense / DenseGeneral create flax's parameters (names, shapes, values) and in float32 compute
  flax's outputs bitwise; in bfloat16 on a CPU they take vitjax's own path, and match flax to bf16 rounding."""
  from vitjax import dots

  x = jnp.asarray(rng.randn(2, 5, 3, 16), dtype)
  init = dict(kernel_init=nn.initializers.normal(0.2), bias_init=nn.initializers.normal(0.5), dtype=dtype)
  for ours, theirs in [
    (dots.Dense(8, **init), nn.Dense(8, **init)),
    (dots.DenseGeneral((2, 4), **init), nn.DenseGeneral((2, 4), **init)),
    (dots.DenseGeneral(8, axis=(-2, -1), **init), nn.DenseGeneral(8, axis=(-2, -1), **init)),
    (dots.DenseGeneral(8, axis=1, **init), nn.DenseGeneral(8, axis=1, **init)),  # not the trailing dims: flax's
  ]:
    p = ours.init(jax.random.key(3), x)
    jax.tree.map(np.testing.assert_array_equal, p, theirs.init(jax.random.key(3), x))
    got, want = ours.apply(p, x), theirs.apply(p, x)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    if dtype == jnp.float32:
      np.testing.assert_array_equal(got, want)
      continue
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2**-7, atol=2e-2)
    grads = [jax.grad(lambda p, m=m: jnp.sum(m.apply(p, x).astype(jnp.float32) ** 2))(p) for m in (ours, theirs)]
    for g_ours, g_flax in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1]), strict=True):
      assert g_ours.dtype == g_flax.dtype == jnp.float32  # float32 parameters, float32 gradients
      assert np.abs(g_ours - g_flax).max() <= 2e-2 * np.abs(g_flax).max()  # flax's rounds more: bf16's rounding


@cpu_backend_only
@pytest.mark.parametrize("rows", [(2, 3), (3, 5)])  # 6 rows: split in two for the weight gradient; 15: not
def test_bf16_affine_accumulates_in_float32_forward_and_backward(rng, rows):
  """On a CPU a bfloat16 layer's matmul + bias is vitjax.dots.affine (bf16 operands, float32 accumulation, the bias
  added in float32, one rounding): its output and gradients match float64 at the rounded inputs to bf16's rounding,
  and the kernel's and bias's gradients come back in their float32, unrounded."""
  from vitjax import dots

  assert dots.low_precision_on_cpu(jnp.bfloat16) and not dots.low_precision_on_cpu(jnp.float32)  # tests: a CPU
  assert not dots.low_precision_on_cpu(None) and dots.low_precision_on_cpu(jnp.float16)  # float16 layers too
  x = jnp.asarray(rng.randn(*rows, 4, 64), jnp.bfloat16)  # contraction over the last two dims (attention's "out")
  w = jnp.asarray(rng.randn(4, 64, 32) / 16, jnp.float32)
  b = jnp.asarray(rng.randn(32), jnp.float32)
  y = dots.affine(x, w, b, 2)
  assert y.dtype == jnp.bfloat16 and y.shape == (*rows, 32)
  x64, w64 = np.asarray(x, np.float64), np.asarray(w.astype(jnp.bfloat16), np.float64)  # the rounded operands
  y64 = np.einsum("abij,ijn->abn", x64, w64) + np.asarray(b, np.float64)
  np.testing.assert_allclose(np.asarray(y, np.float64), y64, rtol=2**-8, atol=1e-6)  # one bf16 rounding
  f = lambda x, w, b: jnp.sum(dots.affine(x, w, b, 2).astype(jnp.float32) ** 2)
  gx, gw, gb = jax.grad(f, argnums=(0, 1, 2))(x, w, b)
  assert (gx.dtype, gw.dtype, gb.dtype) == (jnp.bfloat16, jnp.float32, jnp.float32)
  g = np.asarray((2 * y.astype(jnp.float32)).astype(jnp.bfloat16), np.float64)  # the cotangent, rounded as it flows
  np.testing.assert_allclose(np.asarray(gx, np.float64), np.einsum("abn,ijn->abij", g, w64), rtol=2**-7, atol=0.01)
  np.testing.assert_allclose(np.asarray(gw), np.einsum("abij,abn->ijn", x64, g), rtol=1e-5, atol=1e-4)  # float32 sums
  np.testing.assert_allclose(np.asarray(gb), g.sum((0, 1)), rtol=1e-5, atol=1e-4)
  assert dots.affine(x, w, None, 2).dtype == jnp.bfloat16  # a layer without a bias


@cpu_backend_only
@pytest.mark.parametrize("rows", [(2, 3), (3, 5)])
def test_bf16_tied_logits_accumulate_in_float32_forward_and_backward(rng, rows):
  """A bfloat16 Transformer's tied output logits on a CPU are vitjax.dots.logits (bf16 operands, float32 accumulation
  and result): value and gradients match float64 at the rounded operands; float32 x keeps flax's attend, bitwise."""
  from vitjax import dots

  embed = nn.Embed(40, 64, embedding_init=nn.initializers.normal(0.3))
  x = jnp.asarray(rng.randn(*rows, 64), jnp.float32)
  p = embed.init(jax.random.key(0), jnp.zeros((1,), jnp.int32))
  tied = lambda p, x: embed.apply(p, x, method=lambda m, x: dots.tied_logits(m, x))
  np.testing.assert_array_equal(tied(p, x), embed.apply(p, x, method=nn.Embed.attend))
  xb = x.astype(jnp.bfloat16)
  y = tied(p, xb)
  assert y.dtype == jnp.float32 and y.shape == (*rows, 40)
  table = p["params"]["embedding"]
  x64, t64 = np.asarray(xb, np.float64), np.asarray(table.astype(jnp.bfloat16), np.float64)
  np.testing.assert_allclose(np.asarray(y, np.float64), x64 @ t64.T, rtol=1e-5, atol=1e-5)  # float32 accumulation
  gp, gx = jax.grad(lambda p, x: jnp.sum(tied(p, x) ** 2), argnums=(0, 1))(p, xb)
  gt = gp["params"]["embedding"]
  assert (gx.dtype, gt.dtype) == (jnp.bfloat16, jnp.float32)
  g = np.asarray((2 * y).astype(jnp.bfloat16), np.float64)  # the float32 cotangent, rounded to the operands' dtype
  np.testing.assert_allclose(np.asarray(gx, np.float64), g @ t64, rtol=2**-7, atol=0.02)
  np.testing.assert_allclose(np.asarray(gt), g.reshape(-1, 40).T @ x64.reshape(-1, 64), rtol=1e-5, atol=1e-3)
  if np.prod(rows) % 2:  # an odd row count: the table's gradient is the unsplit (float32) dot, see dots
    return
  hlo = jax.jit(jax.grad(lambda p, x: jnp.sum(tied(p, x) ** 2), argnums=(0, 1))).lower(p, xb).compile().as_text()
  operands = dot_operand_types(hlo)  # forward, input gradient, table gradient: all in bf16 (XLA:CPU's fast dots)
  assert len(operands) == 3 and all(t.startswith("bf16[") for pair in operands for t in pair), operands


@pytest.mark.parametrize(
  "shape,features,kernel,strides,padding",
  [
    ((2, 9, 9, 6), 8, (3, 3), 2, 1),  # a convolutional stem's stride-2 3x3
    ((2, 9, 10, 3), 4, (3, 3), 2, (1, 2)),  # (rows, columns), each on both sides
    ((2, 9, 10, 3), 4, (3, 3), (2, 3), ((1, 0), (2, 1))),
    ((2, 10, 9, 6), 8, (3, 3), (2, 3), "SAME"),
    ((2, 17, 18, 3), 8, (4, 4), 4, "VALID"),  # patchify, with a remainder dropped as XLA's convolution drops it
    ((2, 5, 5, 6), 8, (1, 1), 1, "VALID"),  # the stem's 1x1 projection
  ],
)
def test_dots_conv_is_flax_conv_forward_and_matmul_backward(rng, shape, features, kernel, strides, padding):
  """vitjax.dots.Conv creates flax's parameters and computes flax's forward (bitwise in float32: XLA's convolution);
  its backward, the patches' matmuls, matches float64 autodiff of the convolution in float32 and to bf16 rounding
  in bfloat16 (parameter gradients in float32). On a CPU, whatever the padding's form, the parameters' gradient
  holds one convolution (the float32 forward's), in bfloat16 none, where flax's holds two."""
  from vitjax import dots

  x = jnp.asarray(rng.randn(*shape), jnp.float32)
  init = dict(kernel_init=nn.initializers.normal(0.3), bias_init=nn.initializers.normal(0.5))
  ours, theirs = (cls(features, kernel, strides=strides, padding=padding, **init) for cls in (dots.Conv, nn.Conv))
  p = ours.init(jax.random.key(1), x)
  jax.tree.map(np.testing.assert_array_equal, p, theirs.init(jax.random.key(1), x))
  np.testing.assert_array_equal(ours.apply(p, x), theirs.apply(p, x))
  with jax.enable_x64():
    p64, x64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), (p, x))
    want = jax.grad(lambda p, x: jnp.sum(theirs.apply(p, x) ** 2), argnums=(0, 1))(p64, x64)
  for dtype, rtol in [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)]:
    layer = dots.Conv(features, kernel, strides=strides, padding=padding, dtype=dtype, **init)
    got = jax.grad(lambda p, x, m=layer: jnp.sum(m.apply(p, x).astype(jnp.float32) ** 2), argnums=(0, 1))(p, x)
    assert got[0]["params"]["kernel"].dtype == jnp.float32 and layer.apply(p, x).dtype == dtype
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
      assert np.abs(np.asarray(g, np.float64) - np.asarray(w)).max() <= rtol * np.abs(np.asarray(w)).max()
  if jax.default_backend() == "cpu":  # (elsewhere dots.Conv is flax's layer)
    bf16 = dots.Conv(features, kernel, strides=strides, padding=padding, dtype=jnp.bfloat16, **init)
    assert (_grad_convs(ours, p, x), _grad_convs(theirs, p, x), _grad_convs(bf16, p, x)) == (1, 2, 0)


def _grad_convs(layer, p, x) -> int:
  """How many convolutions the gradient of sum(layer(x)^2) with respect to the parameters p holds."""
  grad = jax.grad(lambda p: jnp.sum(layer.apply(p, x).astype(jnp.float32) ** 2))
  return str(jax.make_jaxpr(grad)(p)).count("conv_general")


def test_dots_conv_takes_flax_s_layer_where_its_path_does_not_apply(rng):
  """A 1-D convolution (an integer kernel), cropping (negative padding) and an empty output run flax's layer; a
  bfloat16 kernel in a float32 computation (param_dtype) takes vitjax's path with flax's promotion: the same
  outputs as flax's, bitwise, and a kernel gradient in the kernel's dtype."""
  from vitjax import dots

  cases = [
    (dict(features=4, kernel_size=3, strides=2), (2, 9, 5)),
    (dict(features=4, kernel_size=(3, 3), strides=2, padding=((-1, 0), (0, 0))), (2, 9, 9, 5)),
    (dict(features=4, kernel_size=(4, 4), strides=4, padding="VALID"), (2, 3, 9, 5)),
    (dict(features=4, kernel_size=(2, 2), strides=2, param_dtype=jnp.bfloat16), (2, 8, 8, 5)),
  ]
  for kw, shape in cases:
    x = jnp.asarray(rng.randn(*shape), jnp.float32)
    ours, theirs = dots.Conv(**kw), nn.Conv(**kw)
    p = ours.init(jax.random.key(0), x)
    jax.tree.map(np.testing.assert_array_equal, p, theirs.init(jax.random.key(0), x))
    np.testing.assert_array_equal(ours.apply(p, x), theirs.apply(p, x))
    g = jax.grad(lambda p, x, m=ours: jnp.sum(m.apply(p, x) ** 2))(p, x)
    assert g["params"]["kernel"].dtype == kw.get("param_dtype", jnp.float32)


@cpu_backend_only
def test_bf16_layers_add_the_bias_in_float32_and_round_once():
  """A bfloat16 Dense, DenseGeneral and Conv (patchify and 1x1) on a CPU add their float32 bias to the float32
  product before the one rounding: -100 + 100.25 is 0.25, where a bias rounded to bfloat16 first (100) gives 0."""
  from vitjax import dots

  x = jnp.ones((1, 2, 2, 1), jnp.bfloat16)
  for layer, kernel in [
    (dots.Dense(1, dtype=jnp.bfloat16), -100.0),
    (dots.DenseGeneral(1, axis=(-2, -1), dtype=jnp.bfloat16), -50.0),  # two inputs of 1 each
    (dots.Conv(1, (1, 1), dtype=jnp.bfloat16), -100.0),
    (dots.Conv(1, (2, 2), strides=2, dtype=jnp.bfloat16), -25.0),  # four inputs of 1 each
  ]:
    p = layer.init(jax.random.key(0), x)
    p = {"params": {"kernel": jnp.full_like(p["params"]["kernel"], kernel), "bias": jnp.full((1,), 100.25)}}
    y = layer.apply(p, x)
    assert y.dtype == jnp.bfloat16 and np.all(np.asarray(y, np.float32) == 0.25), (layer, y)


@cpu_backend_only
def test_dots_conv_takes_flax_s_layer_for_grouped_dilated_and_unbiased_convolutions(rng):
  """Grouped and dilated convolutions and a caller's precision are flax's (its outputs bitwise, its convolutions in
  the backward); a convolution without a bias takes vitjax's path and matches flax's."""
  from vitjax import dots

  x = jnp.asarray(rng.randn(2, 9, 9, 4), jnp.float32)
  for kw, flax_s in [
    (dict(feature_group_count=2), True),
    (dict(kernel_dilation=2), True),
    (dict(input_dilation=2), True),
    (dict(precision=jax.lax.Precision.HIGHEST), True),
    (dict(use_bias=False), False),
  ]:
    ours, theirs = (cls(4, (3, 3), strides=2, padding=1, **kw) for cls in (dots.Conv, nn.Conv))
    p = theirs.init(jax.random.key(0), x)
    np.testing.assert_array_equal(ours.apply(p, x), theirs.apply(p, x))
    assert _grad_convs(ours, p, x) == (2 if flax_s else 1), kw
    grad, want = (jax.grad(lambda p, m=m: jnp.sum(m.apply(p, x) ** 2))(p) for m in (ours, theirs))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4), grad, want)


def test_bf16_dense_layers_cast_their_input_and_keep_a_callers_dot_general_and_batch_dims(rng):
  """A bfloat16 Dense given float32 input computes in bfloat16 (its output bfloat16, the same as from bfloat16
  input); a caller's dot_general is called; DenseGeneral with batch_dims is flax's."""
  from vitjax import dots

  x = jnp.asarray(rng.randn(3, 16), jnp.float32)
  layer = dots.Dense(8, dtype=jnp.bfloat16)
  p = layer.init(jax.random.key(0), x)
  y = layer.apply(p, x)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(y, layer.apply(p, x.astype(jnp.bfloat16)))
  called = []
  spy = lambda *args, **kwargs: called.append(1) or jax.lax.dot_general(*args, **kwargs)
  np.testing.assert_array_equal(dots.Dense(8, dtype=jnp.bfloat16, dot_general=spy).apply(p, x), nn.Dense(8, dtype=jnp.bfloat16).apply(p, x))  # fmt: skip
  assert called
  xb = jnp.asarray(rng.randn(2, 3, 16), jnp.bfloat16)
  ours, theirs = (cls(8, axis=-1, batch_dims=(0,), dtype=jnp.bfloat16) for cls in (dots.DenseGeneral, nn.DenseGeneral))
  p = theirs.init(jax.random.key(0), xb)
  np.testing.assert_array_equal(ours.apply(p, xb), theirs.apply(p, xb))


def test_tied_logits_of_a_float32_embedding_are_flax_s_attend_in_float32(rng):
  """An embedding computing in float32 (dtype=float32) keeps flax's attend on float32 x, bitwise, whatever x's dtype."""
  from vitjax import dots

  embed = nn.Embed(40, 64, dtype=jnp.float32)
  p = embed.init(jax.random.key(0), jnp.zeros((1,), jnp.int32))
  x = jnp.asarray(rng.randn(3, 64), jnp.bfloat16)
  y = embed.apply(p, x, method=lambda m, x: dots.tied_logits(m, x))
  assert y.dtype == jnp.float32
  np.testing.assert_array_equal(y, embed.apply(p, x.astype(jnp.float32), method=nn.Embed.attend))


@cpu_backend_only
def test_bf16_gradients_come_back_in_their_operands_dtypes(rng):
  """affine, strided_conv and logits with bfloat16 operands and parameters give each gradient in its operand's dtype
  (JAX does not cast a custom VJP's cotangents: a float32 one would reach the caller as float32)."""
  from vitjax import dots

  bf16 = lambda *shape: jnp.asarray(rng.randn(*shape), jnp.bfloat16)
  loss = lambda f: lambda *args: jnp.sum(f(*args).astype(jnp.float32) ** 2)
  cases = [
    (lambda x, w, b: dots.affine(x, w, b, 1), (bf16(6, 8), bf16(8, 4), bf16(4))),
    (
      lambda x, w, b: dots.strided_conv(x, w, b, (2, 2), ((1, 1), (1, 1))),
      (bf16(2, 6, 6, 3), bf16(3, 3, 3, 4), bf16(4)),
    ),
    (dots.logits, (bf16(6, 8), bf16(10, 8))),
  ]
  for f, args in cases:
    grads = jax.grad(loss(f), argnums=tuple(range(len(args))))(*args)
    assert [g.dtype for g in grads] == [jnp.bfloat16] * len(args), f


def test_decoder_block_stays_causal_under_a_callers_self_mask(rng):
  x, enc = rng.randn(1, 4, 16), rng.randn(1, 3, 16)
  mod = DecoderBlock(num_heads=2, mlp_dim=32)
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  p = _random_params(mod, f32(x), f32(enc))
  self_mask = jnp.ones((1, 1, 1, 4), bool)  # a target padding mask that pads nothing
  got = mod.apply({"params": p}, f32(x), f32(enc), self_mask)
  np.testing.assert_allclose(got, mod.apply({"params": p}, f32(x), f32(enc)), atol=1e-6)
  x2 = x.copy()
  x2[:, 2:] = rng.randn(1, 2, 16)  # change the future
  np.testing.assert_allclose(mod.apply({"params": p}, f32(x2), f32(enc), self_mask)[:, :2], got[:, :2], atol=1e-6)


def test_feed_forward_dropout_is_on_the_hidden_units_in_training():
  x = jnp.ones((4, 8))
  ffn = FeedForward(32, dropout_rate=0.5, deterministic=False)
  p = _random_params(FeedForward(32), x, noise=1.0)
  apply = lambda key: ffn.apply({"params": p}, x, rngs={"dropout": jax.random.key(key)})
  np.testing.assert_array_equal(apply(0), apply(0))
  assert not np.allclose(apply(0), apply(1))


def test_scanned_layers_draw_dropout_masks_of_their_own():
  """Each layer's branch is the constant 1 (all but fc2's bias zero): with dropout 0.5 it adds 0 or 2, so two layers
  add 0, 2 or 4; identical masks in both layers would never add 2."""
  x = jnp.zeros((2, 5, 16))
  block = (("num_heads", 2), ("mlp_dim", 32), ("dropout_rate", 0.5), ("deterministic", False))
  mod = Stack(EncoderBlock, 2, block, scan=True, final_norm=False)
  shapes = jax.eval_shape(lambda: mod.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x))["params"]
  p = jax.tree.map(lambda s: jnp.zeros(s.shape), shapes)
  p["blocks"]["block"]["mlp"]["fc2"]["bias"] = jnp.ones((2, 16))
  y = np.asarray(jax.jit(mod.apply)({"params": p}, x, rngs={"dropout": jax.random.key(2)}))
  added = {v: int((y == v).sum()) for v in (0, 2, 4)}
  assert sum(added.values()) == y.size and min(added.values()) > 0, added
