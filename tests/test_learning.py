"""Models learn, checked by default (issue 50): a tiny ViT and a tiny Swin trained by vitjax's own training step
(the trainer's setup, optimizer, schedule and loss) on a synthetic image task, and a tiny Transformer on sequence
reversal, each in seconds, each to a level an untrained or broken model cannot reach (chance: 25% and ~0%)."""

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
import optax
import pytest

from vitjax import decode, models
from vitjax.config import default_config
from vitjax.models.transformer import EOS, PAD
from vitjax.tasks import ImageClassification
from vitjax.train import initial_state, make_train_step, setup


def _quadrant_images(rng, n, size=16):
  """uint8 [n, size, size, 1] noise with a bright square in one of four quadrants; the quadrant is the label."""
  labels = rng.integers(0, 4, n)
  x = rng.normal(70, 25, (n, size, size, 1)).clip(0, 255)
  h = size // 2
  for i, k in enumerate(labels):
    r = (k // 2) * h + rng.integers(0, h - 5)
    c = (k % 2) * h + rng.integers(0, h - 5)
    x[i, r : r + 5, c : c + 5] = 220
  return x.astype(np.uint8), labels.astype(np.int32)


STEPS = 120  # at 80, 74-89%: the threshold needs the whole schedule
MODELS = {
  "vit": dict(name="Ti/4", width=32, depth=2, num_heads=2, mlp_dim=64),
  "swin": dict(name="swin_t", embed_dim=16, depths=(2, 2), num_heads=(2, 2), window_size=4, patch_size=2),
}


@pytest.mark.parametrize("family", sorted(MODELS))
def test_a_tiny_image_model_learns_through_the_train_step(family):
  c = default_config()
  c.model = mlc.ConfigDict({**MODELS[family], "num_classes": 4})
  c.data.image_size = 16
  c.batch_size = 32
  c.optim.lr = 3e-3
  c.optim.weight_decay = 0.0
  described = {"task": "classification", "num_classes": 4, "class_names": list("abcd"), "channels": 1}
  task = ImageClassification(c, "", {**described, "image_size": [16, 16]})
  exp = setup(c, task, total_steps=STEPS, warmup=10)
  state = initial_state(exp)
  step = jax.jit(make_train_step(exp.model, exp.tx, exp.schedule, c, task, exp.state_sharding.params), donate_argnums=0)
  predict = jax.jit(lambda params, x: exp.model.apply({"params": params}, x)[0].argmax(-1))
  rng = np.random.default_rng(0)
  test_x, test_y = _quadrant_images(np.random.default_rng(1), 256)
  as_input = lambda x: x.astype(np.float32) * (2 / 255) - 1  # the trainer's normalisation (device_ops.to_float)
  before = float((np.asarray(predict(state.params, as_input(test_x))) == test_y).mean())
  for _ in range(STEPS):
    x, y = _quadrant_images(rng, 32)
    state, metrics = step(state, {"image": x, "label": y})
  after = float((np.asarray(predict(state.params, as_input(test_x))) == test_y).mean())
  assert before < 0.5 and after >= 0.95, (before, after, float(metrics["train/loss"]))


@pytest.mark.parametrize(
  "size",
  [
    dict(d_model=32, num_heads=2, d_ff=64, num_layers=1, symbols=6, longest=4, lr=1e-2, warmup=30, steps=400, want=0.9),
    pytest.param(  # 45 s: lengths 2-6 over 8 symbols, learnt to every sequence
      dict(
        d_model=64, num_heads=4, d_ff=128, num_layers=2, symbols=8, longest=6, lr=3e-3, warmup=50, steps=600, want=1
      ),
      marks=pytest.mark.slow,
    ),
  ],
  ids=["tiny", "small"],
)
def test_a_transformer_learns_to_reverse_sequences(size):
  """3 special ids + some symbols, lengths 2 to `longest`, reversed: exact match (greedy) on new sequences."""
  n, width = 3 + size["symbols"], size["longest"] + 1
  arch = {k: size[k] for k in ("d_model", "num_heads", "d_ff", "num_layers")}
  model = models.create("transformer_tiny", vocab_size=n, max_len=width + 1, **arch)
  rng = np.random.RandomState(0)

  def batch(b):
    src, tgt = np.zeros((b, width), np.int32), np.zeros((b, width), np.int32)
    for i in range(b):
      k = rng.randint(2, size["longest"] + 1)
      s = rng.randint(3, n, size=k)
      src[i, :k], src[i, k] = s, EOS
      tgt[i, :k], tgt[i, k] = s[::-1], EOS
    return jnp.asarray(src), jnp.asarray(tgt)

  src0, tgt0 = batch(2)
  params = model.init(jax.random.key(0), src0, tgt0)["params"]
  tx = optax.adam(optax.warmup_cosine_decay_schedule(0, size["lr"], size["warmup"], size["steps"]))
  opt = tx.init(params)

  @jax.jit
  def step(params, opt, src, tgt):
    def loss_fn(p):
      logits, _ = model.apply({"params": p}, src, tgt)
      w = (tgt != PAD).astype(jnp.float32)
      return (optax.softmax_cross_entropy_with_integer_labels(logits, tgt) * w).sum() / w.sum()

    loss, g = jax.value_and_grad(loss_fn)(params)
    upd, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, upd), opt, loss

  src, tgt = batch(200)
  decoded = lambda p: decode.strip(decode.greedy(model, p, src, max_len=width + 1))
  exact = lambda p: np.mean([a == b for a, b in zip(decoded(p), decode.strip(tgt))])
  before = exact(params)
  for _ in range(size["steps"]):
    params, opt, loss = step(params, opt, *batch(64))
  after = exact(params)
  assert before < 0.05 and after >= size["want"], (before, after, float(loss))
