"""The one trainer: a config in, a trained, checkpointed, evaluated model out; it never asks which task it runs.

One concern per module::

    loop.py            train(): the order of a run (set-up, restore, the steps, checkpoints, the end)
    checkpoint_eval.py evaluate(): one evaluator on a checkpoint (--mode=eval), the run's result
    evaluations.py     the evaluations during training, the best so far
    notes.py           what a run says besides its progress: opening lines, warnings, stop lines
    guard.py           the non-finite guard (config.on_nonfinite)
    prefetch.py        the training batches on their way to the devices
    state.py           setup() -> Experiment: the task's Network (vitjax.models.network) with the optimizer and
                       the sharded TrainState; initial_state (init_from: vitjax.pretrained)
    step.py            the jit-compiled training step (gradient accumulation included; config.distill's teacher,
                       vitjax.tasks.distill, runs in it, its variables an argument beside the batch)
    optim.py           any optax optimizer by name, lr_mults / wd_mults / frozen rules, learning-rate schedule
    checkpoints.py     the writer: latest N + best kept, corrupt steps set aside (vitjax.models.checkpoints reads them:
                       checksums, fallback to the newest intact step)
    workdir.py         config.json and its history, the one-writer lock, metrics.jsonl rows, task.json
    preemption.py      SIGTERM / SIGINT: checkpoint the step in flight, then stop
    reporting.py       progress lines, metrics.jsonl, TensorBoard, the profiler

Around it: vitjax.tasks (what differs between tasks: data, inputs, loss), vitjax.evaluators (what a run measures,
config.evals: the loop runs them without knowing what they are), vitjax.mesh (devices and shardings), vitjax.logs, and
vitjax.errors. `python -m vitjax.main` is the command line; vitjax.load restores a trained model without this package
(vitjax.pretrained).
"""

from vitjax.errors import ConfigError, Diverged, Preempted
from vitjax.models.network import Network, build_model
from vitjax.tasks import network
from vitjax.train.checkpoint_eval import evaluate
from vitjax.train.checkpoints import Checkpoints
from vitjax.train.loop import train
from vitjax.train.optim import decay_mask, make_optimizer, make_schedule
from vitjax.train.state import Experiment, TrainState, initial_state, setup
from vitjax.train.step import make_train_step

__all__ = [
  "Checkpoints",
  "ConfigError",
  "Diverged",
  "Experiment",
  "Network",
  "TrainState",
  "build_model",
  "decay_mask",
  "evaluate",
  "initial_state",
  "make_optimizer",
  "make_schedule",
  "network",
  "make_train_step",
  "Preempted",
  "setup",
  "train",
]
