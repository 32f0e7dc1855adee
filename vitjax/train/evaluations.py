"""The evaluations during training: the evaluators due at a step, its save with their metrics, the best so far."""

from __future__ import annotations

import time

from absl import logging

from vitjax import evaluators
from vitjax.errors import ConfigError, Preempted
from vitjax.tasks.base import EvaluationInterrupted
from vitjax.train import notes, optim
from vitjax.train import state as state_lib
from vitjax.train.guard import finite
from vitjax.train.reporting import Reporter


class Evaluations:
  """Evaluates a step and saves it.

  With its metrics (a candidate for best) when the evaluator of config.best ran; one log line per evaluator, the best
  one's saying whether it is the best so far. `run`: the loop's run (config, exp, evals, ckpts, lock, stop).
  """

  def __init__(self, run, reporter: Reporter):
    self.run_, self.reporter = run, reporter
    config, ckpts = run.config, run.ckpts
    self.best, mode = evaluators.best_of(config, run.evals)
    best = ckpts.best_step()
    self.best_value = (ckpts.metrics(best) or {}).get(config.best) if best is not None else None
    self.sign = 1 if mode == "max" else -1

  def _interrupted(self) -> bool:  # asked between evaluation batches
    self.run_.lock.touch()
    return self.run_.stop.requested()

  def run(self, step: int, state, data_state, due, resave: bool = False) -> None:
    """Runs the evaluators `due` at `step` and saves the step.

    An interrupted evaluation saves the step without metrics (it runs again on resume) and raises Preempted. The
    reporter is told how long each evaluator took (the ETA) and that none of it was training time.
    """
    with self.reporter.pause():
      self._run(step, state, data_state, due, resave)

  def _run(self, step: int, state, data_state, due, resave: bool) -> None:
    run, ckpts = self.run_, self.run_.ckpts
    weights = {"params": lambda: state_lib.variables(state)}
    weights["ema"] = lambda: {"params": optim.ema_params(state.opt_state), **state.model_state}
    results = {}
    try:
      for e in due:
        started = time.time()
        results[e.name] = e.run(run.exp, weights[e.weights](), self._interrupted, step)
        self.reporter.evaluated(e.name, time.time() - started)
        if e is self.best:
          e.check_reports(run.config.best, results[e.name])
    except (EvaluationInterrupted, evaluators.EvaluatorError) as e:  # the step is kept, evaluated again on resume
      if not resave:
        self.reporter.checkpoint(step)
        ckpts.save(step, state, data_state)
      if isinstance(e, EvaluationInterrupted):
        raise Preempted(notes.preempted(run.stop, step, ckpts)) from None
      raise ConfigError(f"step {step}: {e}; step {step} is checkpointed: rerun the same command to resume") from None
    metrics = {k: v for r in results.values() for k, v in r.items()}
    candidate = self.best.name in results
    if not finite(metrics):
      logging.warning("step %d: the evaluation is not finite (%s): not a candidate for best", step, metrics)
    self.reporter.checkpoint(step)  # the training time at this save, evaluation included
    if resave:  # the step is saved already, without metrics: save it again with them
      ckpts.wait()
      ckpts.manager.delete(step)
    ckpts.save(step, state, data_state, metrics=metrics if candidate else None)
    if resave:
      ckpts.wait()
    self.reporter.write(step, metrics)
    for e in due:
      note = self._note(metrics) if e is self.best else ""
      self.reporter.evaluation(step, e.split, results[e.name], note)
      if note:  # the best so far, or a tie that makes this later step best
        self.reporter.best(step, metrics)

  def _note(self, metrics: dict) -> str:
    config = self.run_.config
    value = metrics.get(config.best)
    if (
      value is not None
      and value == value
      and (self.best_value is None or self.sign * value > self.sign * self.best_value)
    ):
      self.best_value = value
      return f" | best {config.best} so far"
    if value is not None and value == self.best_value:  # orbax keeps the later of equal steps as best
      return f" | ties the best {config.best}: this later step becomes best"
    return ""
