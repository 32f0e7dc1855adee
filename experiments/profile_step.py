"""Where a ViT training step's time goes on this machine: the step cut into parts, each timed alone, and attention's
forward + backward beside torch's scaled_dot_product_attention on the same tensors.

    taskset -c 0,1 python experiments/profile_step.py --image_size=448 --batch=2
    taskset -c 0,1 python experiments/profile_step.py --image_size=224 --batch=8 --attention=reference
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=dot taskset -c 0,1 python experiments/profile_step.py ...

Parts (median of --repeats after a warm-up, each its own jit):
  forward          loss of one batch, train=True
  forward+backward jax.value_and_grad of it
  bare step        forward+backward + optax.adamw, parameters and optimizer state donated
  trainer step     vitjax.train.make_train_step as the trainer jits it (clipping, guard, metrics)
  optimizer        the AdamW update alone, on gradients of the right shapes
  attention f+b    one layer's attention (q, k, v [B, T, heads, 64]) forward + backward, vitjax's implementation
  torch sdpa f+b   the same in torch (F.scaled_dot_product_attention), same threads
Prints one JSON line per part (appended to experiments/results/profile_step.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from bench_train import median_time  # noqa: E402  (experiments/ is the script's directory)


def timeit(fn, repeats):
  return median_time(fn, repeats)[0]


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="vit_s16")
  ap.add_argument("--image_size", type=int, default=224)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--attention", default="fast", help="config.model.implementation (vitjax.attention)")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--parts", default="forward,grad,bare,trainer,optimizer,attention,torch_attention")
  ap.add_argument("--tag", default="")
  ap.add_argument("--out", default=os.path.join(HERE, "results", "profile_step.jsonl"))
  args = ap.parse_args()
  parts = args.parts.split(",")

  import ml_collections as mlc

  from vitjax.attention import dot_product_attention
  from vitjax.config import default_config
  from vitjax.tasks import ImageClassification
  from vitjax.train import build_model, initial_state, make_train_step, setup

  c = default_config()
  c.model = mlc.ConfigDict({"name": args.model, "num_classes": 1000})
  if "swin" not in args.model:
    c.model.head_zeroinit = False  # a zero head would give zero gradients below it
  if args.attention != "fast":
    c.model.implementation = args.attention
  c.data.image_size = args.image_size
  c.batch_size = args.batch
  c.compute_dtype = args.dtype
  module = build_model(c)
  r = np.random.RandomState(0)
  x = jnp.asarray(r.randn(args.batch, args.image_size, args.image_size, 3).astype(np.float32))
  y = jnp.asarray(r.randint(0, 1000, args.batch).astype(np.int32))
  params = jax.jit(lambda: module.init(jax.random.key(0), x[:1])["params"])()
  rng = jax.random.key(1)
  tx = optax.adamw(1e-3, weight_decay=0.05)

  def loss_fn(p):
    logits = module.apply({"params": p}, x, train=True, rngs={"dropout": rng})[0]
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()

  results = {}
  if "forward" in parts:
    f = jax.jit(loss_fn)
    results["forward"] = timeit(lambda: f(params).block_until_ready(), args.repeats)
  if "grad" in parts:
    g = jax.jit(jax.value_and_grad(loss_fn))
    results["forward+backward"] = timeit(lambda: jax.block_until_ready(g(params)), args.repeats)
  if "bare" in parts or "optimizer" in parts:

    def step(p, o):
      loss, grads = jax.value_and_grad(loss_fn)(p)
      u, o = tx.update(grads, o, p)
      return optax.apply_updates(p, u), o, loss

    def update(p, o, grads):
      u, o = tx.update(grads, o, p)
      return optax.apply_updates(p, u), o

    box = [jax.tree.map(jnp.copy, params), tx.init(params)]
    if "bare" in parts:
      s = jax.jit(step, donate_argnums=(0, 1))

      def once():
        box[0], box[1], loss = s(*box)
        loss.block_until_ready()

      results["bare step"] = timeit(once, args.repeats)
    if "optimizer" in parts:
      u = jax.jit(update, donate_argnums=(0, 1))
      grads = jax.tree.map(jnp.ones_like, params)

      def upd():
        box[0], box[1] = u(box[0], box[1], grads)
        jax.block_until_ready(box[0])

      results["optimizer"] = timeit(upd, args.repeats)
  if "trainer" in parts:
    described = {"task": "classification", "num_classes": 1000, "class_names": [str(i) for i in range(1000)]}
    described.update(channels=3, image_size=[args.image_size] * 2)
    task = ImageClassification(c, "", described)
    exp = setup(c, task, total_steps=1000)
    fn = jax.jit(
      make_train_step(exp.model, exp.tx, exp.schedule, c, task, exp.state_sharding.params),
      in_shardings=(exp.state_sharding, exp.batch_sharding),
      out_shardings=(exp.state_sharding, None),
      donate_argnums=0,
    )
    batch = jax.device_put({"image": x, "label": y}, exp.batch_sharding)
    tbox = [initial_state(exp)]

    def tstep():
      tbox[0], m = fn(tbox[0], batch)
      float(m["train/loss"])

    results["trainer step"] = timeit(tstep, args.repeats)
  tokens = (args.image_size // 16) ** 2 + 1  # ViT/16's sequence; the attention parts are for ViTs
  if "attention" in parts or "torch_attention" in parts:
    q, k, v = (jnp.asarray(r.randn(args.batch, tokens, module.num_heads, 64).astype(np.float32)) for _ in range(3))
  if "attention" in parts:
    impl = "fast" if args.attention == "fast" else args.attention

    def attn_loss(q, k, v):
      return jnp.sum(dot_product_attention(q, k, v, implementation=impl) ** 2)

    ag = jax.jit(jax.grad(attn_loss, argnums=(0, 1, 2)))
    results[f"attention f+b ({impl}) x{module.depth}"] = module.depth * timeit(
      lambda: jax.block_until_ready(ag(q, k, v)), args.repeats * 3
    )
  if "torch_attention" in parts:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    tq, tk, tv = (torch.from_numpy(np.asarray(a).transpose(0, 2, 1, 3).copy()).requires_grad_() for a in (q, k, v))

    def tattn():
      out = F.scaled_dot_product_attention(tq, tk, tv)
      (out**2).sum().backward()

    results[f"torch sdpa f+b x{module.depth}"] = module.depth * timeit(tattn, args.repeats * 3)
  common = {
    "model": args.model,
    "image_size": args.image_size,
    "batch": args.batch,
    "dtype": args.dtype,
    "attention": args.attention,
    "tokens": tokens,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "cores": len(os.sched_getaffinity(0)),
    "tag": args.tag,
  }
  with open(args.out, "a") as f:
    for part, seconds in results.items():
      row = {"part": part, "seconds": seconds, **common}
      print(f"{part:32s} {seconds * 1e3:9.1f} ms")
      f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
