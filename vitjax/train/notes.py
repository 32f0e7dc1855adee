"""What a run says besides its progress: the opening lines and warnings, a resume's schedule change, stop lines.

The train loop (vitjax.train.loop) calls these between its phases; none of them changes what the run does.
"""

from __future__ import annotations

import json
import math

import jax
from absl import logging

from vitjax import config as config_lib
from vitjax import durations
from vitjax import mesh as mesh_lib
from vitjax.errors import ConfigError
from vitjax.logs import muted
from vitjax.models import network as network_lib
from vitjax.train import optim
from vitjax.train import state as state_lib


def opening(config, exp, data, plan, evals, state, start: int) -> None:
  """The run's opening lines: the model, data, devices, sharding and the optimizer's rules; then _warnings."""
  logging.info(
    "%s: %s parameters | %s: %d training examples, %d steps/epoch | %d steps | %d devices, %d process%s",
    config.model.name,
    f"{state_lib.num_params(state):,}",
    data.name,
    data.num_examples,
    data.steps_per_epoch,
    plan.total,
    jax.device_count(),
    jax.process_count(),
    "es" if jax.process_count() > 1 else "",
  )
  logging.info(
    "sharding=%s%s, %s",
    config.sharding,
    " + sharding_rules" if config.sharding_rules else "",
    mesh_lib.describe(exp.mesh, exp.abstract_state.params, exp.state_sharding.params),
  )
  idle = [a for a in {"fsdp": ("fsdp",), "tp": ("tensor",), "fsdp_tp": ("fsdp", "tensor")}.get(config.sharding, ())
          if exp.mesh.shape.get(a, 1) == 1]  # fmt: skip
  if idle and jax.device_count() > 1:
    logging.warning(
      "sharding=%s splits over the mesh axis %s, which has size 1 in config.mesh=%s: nothing is split; e.g. "
      "--config.mesh=\"(('%s', -1),)\"",
      config.sharding,
      " and ".join(idle),
      tuple(tuple(x) for x in config.mesh),
      idle[0],
    )
  for line in optim.describe(config, exp.model, exp.abstract_state.params):
    logging.info("%s", line)
  _warnings(config, exp, plan, evals, start)


def _warnings(config, exp, plan, evals, start: int) -> None:
  """Warnings and notes for settings that do not do here what they may seem to.

  The compute dtype on this CPU, profile_steps outside this session, label smoothing's train/loss, unread settings,
  a moving average no evaluator reads or that leaves BatchNorm statistics out.
  """
  dtype = network_lib.compute_dtype(config.compute_dtype)
  bf16_cpu = None if jax.default_backend() != "cpu" else network_lib.bfloat16_is_fast()  # None: not a CPU
  if config.compute_dtype == "auto":
    logging.info("compute_dtype=auto: %s on %s", dtype, jax.default_backend())
  elif dtype == "bfloat16" and bf16_cpu is False:
    logging.warning(
      "compute_dtype=bfloat16 on a CPU without AVX512-BF16 or AMX: no faster than float32 there "
      "(experiments/README.md); --config.compute_dtype=float32 (or auto) is this CPU's setting"
    )
  elif dtype == "float32" and bf16_cpu:
    logging.info(
      "compute_dtype=float32 on a CPU with AVX512-BF16 or AMX: bfloat16 (--config.compute_dtype=bfloat16 or auto) "
      "trained 1.20-1.59x faster on an AVX512-BF16 EPYC (experiments/README.md, issue 28)"
    )
  p = config.profile_steps
  if p is not None and (p[1] > plan.total or p[0] <= start):  # the trace never starts, or never stops
    logging.warning(
      "profile_steps=%s is not within this session's steps %d..%d: no profile is written; e.g. "
      '--config.profile_steps="(%d, %d)"',
      tuple(p),
      start + 1,
      plan.total,
      min(start + 5, plan.total),
      min(start + 7, plan.total),
    )
  if config.get("label_smoothing"):  # train/loss next to eval/loss read as a 5x gap
    logging.info("%s", smoothing(config.label_smoothing, exp.model))
  unread = unread_settings(config)
  if unread:
    logging.warning("%s", unread)
  if config.ema_decay and not any(e.weights == "ema" for e in evals):
    logging.warning(
      "ema_decay=%g: the moving average is kept (vitjax.load(W, weights='ema'), --mode=eval --weights=ema) but no "
      "evaluator reads it: evaluations, best and the result are the raw weights'; add an entry with weights='ema'",
      config.ema_decay,
    )
  if config.ema_decay and jax.tree.leaves(exp.abstract_state.model_state):
    logging.warning(
      "ema_decay: the moving average covers the parameters only; this model's %s (BatchNorm statistics) stay the "
      "raw model's, so eval_ema/... can lag the raw weights: compare them before choosing best by eval_ema",
      "/".join(exp.abstract_state.model_state),
    )


def schedule_change(run, old, start: int) -> None:
  """One line when a resume's config changes the learning-rate schedule: its length, or its rate at the next step.

  `old`: the config that trained the checkpoint. The schedule is rebuilt over the new total, so a longer run does not
  continue the old curve: from its end (or wherever the run stopped) the learning rate jumps to the new curve's (a
  warm restart), which deserves saying, as the config's change alone does not. `run`: its data, exp and plan.
  """
  data, exp = run.data, run.exp
  try:
    with muted():  # the old config's own notes (which of total_steps and num_epochs wins) were said in its session
      before = durations.resolve(old, data.steps_per_epoch, data.examples_per_step)
      schedule = optim.make_schedule(old, before.total, data.steps_per_epoch, before.warmup)
  except ConfigError:  # the old config no longer resolves (its data changed): nothing to compare with
    return
  was, would = float(schedule(start - 1)), float(schedule(start))  # step N trains at schedule(N - 1)
  now = float(exp.schedule(start))
  total = run.plan.total
  if before.total == total and math.isclose(now, would, rel_tol=1e-3, abs_tol=1e-12):
    return
  spans = f"now spans {total} steps (it spanned {before.total})" if before.total != total else "changed"
  if math.isclose(now, would, rel_tol=1e-3, abs_tol=1e-12):
    logging.info(
      "the learning-rate schedule %s: the learning rate goes on from %.2e (step %d) to %.2e (step %d), as the old "
      "schedule would have",
      spans,
      was,
      start,
      now,
      start + 1,
    )
    return
  logging.warning(
    "the learning-rate schedule %s: the learning rate goes from %.2e (step %d, the old schedule's) to %.2e (step %d, "
    "the new one's): %s, not a continuation",
    spans,
    was,
    start,
    now,
    start + 1,
    "a warm restart" if now > would else "a jump down",
  )


def smoothing(eps: float, model) -> str:
  """What train/loss is under label smoothing, with its floor where the model says how many classes it scores."""
  k = next((getattr(model, a) for a in ("num_classes", "tgt_vocab_size", "vocab_size") if getattr(model, a, None)), 0)
  floor = ""
  if k > 1:  # the entropy of the smoothed target: the loss of predicting it exactly
    hit, miss = 1 - eps + eps / k, eps / k
    floor = f" (at least {-(hit * math.log(hit) + (k - 1) * miss * math.log(miss)):.3f} with {k} classes)"
  return (
    f"label_smoothing={eps:g}: train/loss is the smoothed objective{floor}, eval/loss the plain cross-entropy: "
    "train/loss above eval/loss is not a generalisation gap"
  )


def unread_settings(config) -> str:
  """A line naming settings changed from their defaults that this run never reads, or ''."""
  default, said = config_lib.default_config(), []
  names, wandb = tuple(config.get("trackers", ("tensorboard",))), config.get("wandb") or {}
  if "wandb" not in names:
    # (not name or group: a sweep sets those for every trial, whatever its trackers)
    changed = [
      k
      for k in ("project", "entity", "tags", "notes")
      if json.dumps(wandb.get(k, default.wandb[k])) != json.dumps(default.wandb[k])  # (a list read back: a tuple)
    ]
    if changed:
      said.append(
        f"config.wandb.{changed[0]} is set but 'wandb' is not in config.trackers={names}: nothing "
        "goes to W&B; add it, e.g. --config.trackers=\"('tensorboard', 'wandb')\""
      )
  if config.on_nonfinite == "stop" and config.max_nonfinite_skips != default.max_nonfinite_skips:
    said.append(
      f"max_nonfinite_skips={config.max_nonfinite_skips} is read only with on_nonfinite='skip' (this run stops at "
      "the first non-finite step); add --config.on_nonfinite=skip"
    )
  return "; ".join(said)


def lost_input(why: str, trained: int, saved: int, ckpts) -> str:
  """The stop line of a run whose input stopped (a data worker died) after step `trained`, `saved` kept."""
  n = jax.process_count()
  again = "rerun the same command" if n == 1 else f"the other processes stop within --peer_timeout; rerun all {n}"
  kept = f"checkpoint {saved} is in {ckpts.directory}: {again} to resume"
  if not saved:
    kept = f"nothing was checkpointed yet: {again} to start again"
  return f"the training input stopped after step {trained}: {why}; {kept}"


def preempted(stop, step: int, ckpts) -> str:
  """The stop line of a run a signal stopped at `step`, checkpointed."""
  return (
    f"{stop.name}: stopped at step {step}, checkpoint {step} written to {ckpts.directory}; "
    "rerun the same command to resume"
  )
