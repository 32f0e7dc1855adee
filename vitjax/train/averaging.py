"""Checkpoint averaging (Vaswani et al. 2017; T2T's and fairseq's average_checkpoints).

The mean of several steps' parameters, written as WORKDIR/averaged, which --checkpoint=averaged reads wherever a
checkpoint is read (`--mode=eval` with any evaluator, vitjax.load, export, translate).

The members are restored as the other checkpoints are (sharded over the mesh, every array checked against its
checksum): a corrupt member stops the averaging with one line naming it, and nothing is written. The mean is taken
on the devices, in float32, with the layout the parameters train with; integer collections are the newest
member's. The result is written beside checkpoints/ (not among them: the training run's keep and best policies
never see it) through a new directory that replaces the old average only once it is complete (a crash between the
two renames leaves averaged.old, which --checkpoint=averaged then reads). It holds the workdir's lock: not beside a
training run, which deletes old steps, or another averaging.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
from absl import logging

from vitjax import config as config_lib
from vitjax import evaluators, tasks
from vitjax.errors import ConfigError
from vitjax.mesh import sync
from vitjax.models import checkpoints as reader
from vitjax.train import checkpoints as ckpt_lib
from vitjax.train import workdir as workdir_lib


def choose(available: list[int], last: int | None = None, steps=None) -> list[int]:
  """The members: the `last` newest of `available`, or the given `steps` (each must be there)."""
  if (last is None) == (not steps):
    raise ConfigError("give either --last=N (the N newest checkpoints) or --steps=a,b,c")
  if steps:
    try:
      steps = sorted({int(s) for s in steps})
    except ValueError:
      raise ConfigError(f"--steps={','.join(map(str, steps))}: give step numbers, e.g. --steps=8000,9000") from None
    missing = [s for s in steps if s not in available]
    if missing:
      raise ConfigError(f"--steps: no checkpoint for step(s) {missing}; the workdir has {available}")
    return steps
  if last < 1:
    raise ConfigError(f"--last={last} must be at least 1")
  if last > len(available):
    raise ConfigError(f"--last={last}: the workdir keeps {len(available)} checkpoints ({available}); give at most that")
  return available[-last:]


@jax.jit
def _add(total, tree):
  return jax.tree.map(lambda t, x: t + x.astype(t.dtype) if jnp.issubdtype(t.dtype, jnp.floating) else x, total, tree)


def average(config, workdir: str, last: int | None = None, steps=None) -> dict:
  """Writes the mean of the chosen checkpoints' parameters (and float model state) to WORKDIR/averaged.

  Returns {"workdir", "steps": the members, "step": the newest member's}.
  """
  workdir = os.path.abspath(workdir)
  workdir_lib.check_recordable(workdir, "an average")
  lock = workdir_lib.Lock(workdir)
  lock.acquire()  # one writer: not beside a training run (which deletes old steps) or another averaging
  try:
    return _average(config, workdir, last, steps)
  finally:
    lock.release()


def _average(config, workdir: str, last, steps) -> dict:
  task = tasks.get(config, workdir, described=config_lib.read_task(workdir))
  net = tasks.network(config, task)
  with reader.Checkpoints(workdir, config.best, evaluators.best_mode(config)) as ckpts:
    members = choose(ckpts.steps(), last, steps)
    total = None
    for step in members:
      try:
        _, variables, _ = ckpts.restore(str(step), net.abstract, with_data=False, variables_only=True)
      except ConfigError as e:
        others = [str(s) for s in members if s != step]
        hint = f"--steps={','.join(others)}" if others else "--steps= other steps"
        raise ConfigError(f"{e}: average without step {step}, e.g. {hint}") from None
      variables = {"params": variables[0], "model_state": variables[1]}
      logging.info("averaging: read step %d", step)
      total = variables if total is None else _add(total, variables)
  n = len(members)
  mean = jax.jit(lambda t: jax.tree.map(lambda x: x / n if jnp.issubdtype(x.dtype, jnp.floating) else x, t))(total)
  new = ckpt_lib.AVERAGED + ".new"
  if jax.process_index() == 0:
    shutil.rmtree(os.path.join(workdir, new), ignore_errors=True)  # a half-written one from an interrupted run
  sync("averaging_start")
  with ckpt_lib.Checkpoints(workdir, config.best, evaluators.best_mode(config), keep=1, subdir=new) as out:
    out.save(members[-1], mean, json.dumps({"averaged_steps": members}))
  if jax.process_index() == 0:
    final, old = os.path.join(workdir, ckpt_lib.AVERAGED), os.path.join(workdir, ckpt_lib.AVERAGED + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if os.path.isdir(final):
      os.replace(final, old)  # (folders: checked for links by check_recordable)
    os.replace(os.path.join(workdir, new), final)  # (folders: checked for links by check_recordable)
    shutil.rmtree(old, ignore_errors=True)
  sync("averaging_done")
  logging.info("averaged steps %s into %s", ", ".join(map(str, members)), os.path.join(workdir, ckpt_lib.AVERAGED))
  return {"workdir": workdir, "steps": members, "step": members[-1]}
