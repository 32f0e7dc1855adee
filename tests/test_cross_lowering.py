"""Every model's training step lowers for CUDA and for TPU from this CPU host (jax.export with those platforms), in
float32 and bfloat16: an op with a CPU lowering only, or a CPU-only branch taken on an accelerator, fails here and not
first on a lent GPU (issue 44).

The step is traced as it would be on that platform: `jax.default_backend()` answers "gpu" or "tpu" (vitjax picks
its attention and Dense paths by it), and for CUDA, jax's cuDNN attention is told it has cuDNN 9.19 on a Hopper GPU
(the versions the lent H100 reported, experiments/README.md "On a GPU"), so that the "fast" attention takes its
cuDNN branch wherever cuDNN's constraints allow, as on the GPU. Those two are private jax functions
(jax._src.cudnn.fused_attention_stablehlo); if a jax upgrade renames them, `_as_if_on` fails naming them.
"""

import contextlib
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import export

from vitjax import models

CUDNN_TARGETS = [f"__cudnn$fmha{k}{b}" for k in ("Softmax", "ScaleBiasSoftmax") for b in ("", "Backward")]


@contextlib.contextmanager
def _as_if_on(platform: str):
  backend = {"cuda": "gpu", "tpu": "tpu"}[platform]
  with contextlib.ExitStack() as stack:
    stack.enter_context(mock.patch("jax.default_backend", return_value=backend))
    if platform == "cuda":
      from jax._src.cudnn import fused_attention_stablehlo as fa

      for name, value in (("check_cudnn_version", 91900), ("check_compute_capability", True)):
        assert hasattr(fa, name), f"jax._src.cudnn.fused_attention_stablehlo.{name} is gone: update _as_if_on"
        stack.enter_context(mock.patch.object(fa, name, return_value=value))
    yield


def _image(b=2, hw=16, c=3):
  return jnp.asarray(np.random.RandomState(0).rand(b, hw, hw, c), jnp.float32)


def _tokens(b=2, t=9):
  return jnp.asarray(np.random.RandomState(0).randint(3, 50, size=(b, t)), jnp.int32)


# name -> (model, inputs, loss of (model output) -> scalar). Tiny, but with the shapes that choose paths: ViT's 17
# tokens and Swin's 49-token windows with bias and shift mask (odd: cuDNN's padding), the Transformer's causal and
# padding masks, MAE's kept patches.
CASES = {
  "vit": lambda dt: (
    models.create("Ti/4", depth=2, width=32, num_heads=2, mlp_dim=64, num_classes=5, dtype=dt),
    (_image(),),
    lambda out: out[0].astype(jnp.float32).mean(),
  ),
  "vit_modern": lambda dt: (  # DINOv2's parts: registers, LayerScale, a table of the patches only, SwiGLU; QK-norm;
    # EVA-02's: rotary positions (applied to q and k before the kernel), sub-LayerNorms, no key bias
    models.create(
      "Ti/4",
      depth=2,
      width=32,
      num_heads=2,
      mlp_dim=64,
      num_classes=5,
      num_registers=4,
      class_posemb=False,
      init_values=1e-5,
      qk_norm="layernorm",
      ffn="swiglu",
      act="silu",
      rope="axial",
      ffn_norm=True,
      attn_norm=True,
      key_bias=False,
      dtype=dt,
    ),
    (_image(),),
    lambda out: out[0].astype(jnp.float32).mean(),
  ),
  "swin": lambda dt: (
    models.create("swin_t", embed_dim=16, depths=(2, 2), num_heads=(2, 2), window_size=7, num_classes=3, dtype=dt),
    (_image(hw=56),),
    lambda out: out[0].astype(jnp.float32).mean(),
  ),
  "mae": lambda dt: (
    models.create(
      "mae",
      encoder={"name": "Ti/4", "depth": 1, "width": 32, "num_heads": 2},
      decoder_width=16,
      decoder_heads=2,
      dtype=dt,
    ),
    (_image(), jnp.asarray(np.random.RandomState(1).rand(2, 16), jnp.float32)),
    lambda out: out[0]["pred"].astype(jnp.float32).mean(),
  ),
  "transformer": lambda dt: (
    models.create("transformer_tiny", vocab_size=50, dtype=dt),
    (_tokens(), _tokens(t=8)),
    lambda out: out[0].astype(jnp.float32).mean(),
  ),
}


def _train_step(name: str, dtype):
  """(step function, example arguments): forward, backward and an AdamW update, parameters float32."""
  model, inputs, loss_of = CASES[name](dtype)
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))
  tx = optax.adamw(1e-3)

  def step(params, opt_state, inputs, rng):
    def loss(p):
      out = model.apply({"params": p}, *inputs, train=True, rngs={"dropout": rng, "drop_path": rng})
      return loss_of(out)

    grads = jax.grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params = variables["params"]
  return step, (params, jax.eval_shape(tx.init, params), inputs, jax.random.key(1))


def _lower(name: str, dtype, platform: str) -> str:
  step, args = _train_step(name, dtype)
  with _as_if_on(platform):
    checks = [export.DisabledSafetyCheck.custom_call(t) for t in CUDNN_TARGETS]
    exported = export.export(jax.jit(step), platforms=(platform,), disabled_checks=checks)(*args)
  assert exported.platforms == (platform,)
  return exported.mlir_module()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_training_step_lowers(platform, name, dtype):
  text = _lower(name, dtype, platform)
  cudnn = text.count("__cudnn$fmha")
  if platform == "cuda" and dtype == jnp.bfloat16:
    # cuDNN's kernels forward and backward, for every attention of the model (the Transformer's three kinds too)
    assert cudnn >= 2, f"{name}: the bf16 step on CUDA does not use cuDNN attention"
    assert "__cudnn$fmhaSoftmaxBackward" in text or "__cudnn$fmhaScaleBiasSoftmaxBackward" in text
  else:  # float32 (XLA's attention), and every TPU step
    assert cudnn == 0


def test_the_cuda_lowering_is_not_the_cpu_program():
  """The mock matters: without it the "fast" attention is the CPU's explicit one; with it, cuDNN's."""
  step, args = _train_step("vit", jnp.bfloat16)
  plain = jax.jit(step).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "__cudnn" not in plain
  assert "__cudnn$fmha" in _lower("vit", jnp.bfloat16, "cuda")
