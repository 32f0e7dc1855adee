"""The training step: batch-level work, forward, loss, gradients, optimizer update.

The task's batch-level work on the device (task.device_batch), forward, the task's loss, gradients (accumulated over
micro-batches), optimizer update. With accumulation the loss, gradient and metrics are the full batch's: each
micro-batch's means weighted by what they are over (its "tokens" where the task counts them, else equally), so
that accum_steps changes the memory a step needs, not the update.

Pure and jit-compiled by the loop with donated state; the task decides the model's inputs and the loss.
Divergence guard: the update is applied only if the loss, the gradient norm and every new parameter are finite
(checked as the new parameters' global norm, which also flags parameters past 1e19);
otherwise the state stays as it was (but for the step count, and the learning-rate schedule's with it) and
`train/nonfinite` is 1, for the loop to stop or skip (config.on_nonfinite).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from vitjax.tasks import distill
from vitjax.train import optim
from vitjax.train.state import TrainState


def make_train_step(model, tx, schedule, config, task, grad_sharding=None, teacher=None) -> Callable:
  """(state, batch) -> (state, metrics): forward, task loss, gradients (accumulated over micro-batches), update.

  Long: the step is one traced function, read in one place. grad_sharding: the parameters' shardings; accumulated
  gradients are laid out like their parameters. teacher: a vitjax.tasks.distill.Teacher (config.distill); the step
  then takes its variables as a third argument, (state, batch, teacher_variables), and its loss is blended with the
  distillation loss of the teacher's logits on the same device batch.
  """
  accum = config.optim.accum_steps
  dropout_key = jax.random.key(config.seed + 2)
  batch_key = jax.random.key(config.seed + 3)

  def loss_fn(params, model_state, batch, rng):
    if optim.frozen_rules(config):  # no gradient flows to frozen parameters: their backward pass is not computed at all
      frozen = optim.frozen_tree(config, params)
      params = jax.tree.map(lambda p, f: jax.lax.stop_gradient(p) if f else p, params, frozen)
    variables = {"params": params, **model_state}
    out, new_state = model.apply(
      variables, *task.model_inputs(batch), train=True, rngs={"dropout": rng}, mutable=list(model_state)
    )
    own, taught = distill.heads(out) if teacher is not None else (out[0], None)  # (DeiT: two heads)
    loss, metrics = task.loss(own, batch)
    if teacher is not None:  # (1 - w) * the task's loss + w * the teacher's
      loss, metrics = distill.blended(config, loss, metrics, taught, batch["teacher_logits"])
    return loss, (dict(new_state), metrics)

  def train_step(state: TrainState, batch, teacher_variables=None):
    rng = jax.random.fold_in(dropout_key, state.step)
    batch = task.device_batch(batch, jax.random.fold_in(batch_key, state.step))
    if teacher is not None:  # on the whole device batch, the view the student sees (its first input: the images)
      batch = {**batch, "teacher_logits": teacher.forward(teacher_variables, task.model_inputs(batch)[0])}
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if accum == 1:
      (loss, (model_state, metrics)), grads = grad_fn(state.params, state.model_state, batch, rng)
    else:  # micro-batches in sequence: one optimizer step per global batch, the full batch's loss and gradient
      loss, model_state, metrics, grads = _accumulated(grad_fn, state, batch, rng, accum, grad_sharding)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.global_norm(grads)
    # One reduction over the new parameters (a NaN or inf anywhere makes their norm non-finite): a finiteness flag
    # per leaf, and-ed together, made XLA take 26 s instead of 7 to compile ViT-S's step, for the same step time.
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.global_norm(params))
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    metrics = {
      "train/loss": loss,
      **{f"train/{k}": v for k, v in metrics.items()},
      "train/grad_norm": grad_norm,
      "train/lr": schedule(state.step),
      "train/nonfinite": 1.0 - finite.astype(jnp.float32),
    }
    new_state = TrainState(
      state.step + 1,
      keep(params, state.params),
      optim.kept_state(finite, opt_state, state.opt_state),  # (the schedule's counts go on with the step)
      keep(model_state, state.model_state),
    )
    return new_state, metrics

  return train_step


def _accumulated(grad_fn, state: TrainState, batch, rng, accum: int, grad_sharding):
  """(loss, model_state, metrics, grads) of the global batch, from `accum` micro-batches in sequence.

  Each micro-batch's means are weighted by what they are over (its "tokens", or 1), so that the result is the full
  batch's; micro-batch i takes rows i, i + accum, ...: every micro-batch spans all devices of the data axis.
  """
  micro = jax.tree.map(lambda x: jnp.swapaxes(x.reshape((x.shape[0] // accum, accum) + x.shape[1:]), 0, 1), batch)

  def body(carry, xs):  # sums weighted by what each micro-batch's means are over (its tokens, or 1)
    grads, model_state, loss, metrics, weight, i = carry
    (micro_loss, (model_state, m)), g = grad_fn(state.params, model_state, xs, jax.random.fold_in(rng, i))
    w = m.get("tokens", 1.0)
    return (
      jax.tree.map(lambda a, b: a + w * b, grads, g),
      model_state,
      loss + w * micro_loss,
      {k: metrics[k] + (v if k == "tokens" else w * v) for k, v in m.items()},
      weight + w,
      i + 1,
    ), None

  zeros = jax.tree.map(jnp.zeros_like, state.params)
  if grad_sharding is not None:
    zeros = jax.lax.with_sharding_constraint(zeros, grad_sharding)
  shapes = jax.eval_shape(lambda: grad_fn(state.params, state.model_state, jax.tree.map(lambda x: x[0], micro), rng))
  m0 = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes[0][1][1])
  carry = (zeros, state.model_state, 0.0, m0, 0.0, 0)
  (grads, model_state, loss, metrics, weight, _), _ = jax.lax.scan(body, carry, micro)
  weight = jnp.maximum(weight, 1.0)  # (no tokens at all: every sum is 0)
  grads, loss = jax.tree.map(lambda g: g / weight, grads), loss / weight
  metrics = {k: v if k == "tokens" else v / weight for k, v in metrics.items()}  # token counts add up
  return loss, model_state, metrics, grads
