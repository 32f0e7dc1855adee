"""Command line: train, resume or evaluate an experiment.

    python -m vitjax.main --config=configs/vit_digits.py --workdir=workdirs/vit_digits
    python -m vitjax.main --config=configs/vit_digits.py --workdir=workdirs/vit_digits --config.optim.lr=3e-3
    python -m vitjax.main --config=configs/vit.py:variant=S/16,dataset=fashion_mnist --workdir=...
    python -m vitjax.main --mode=eval --workdir=workdirs/vit_digits [--checkpoint=best|latest|STEP] [--split=test]
    python -m vitjax.main --mode=eval --eval=probe --workdir=workdirs/vit_digits   # linear probe, few-shot, k-NN

Training resumes from the workdir's latest checkpoint. Without --config, a resume and an evaluation take the config
saved in the workdir (config.json with the changes of config_history.jsonl). In eval mode --checkpoint=best is the
kept step with the best `config.best`, and --eval=NAME runs any evaluator of config.evals (default: the one `best`
names), or any type by name with its default options (classification, probe, mae, translation: vitjax.evaluators).

The eval flags (--eval, --checkpoint, --split, --weights) without --mode=eval, and --coordinator_address,
--num_processes or --process_id without --multihost, are refused: a training would ignore them.

Several processes (hosts): the same command on each, with --multihost --coordinator_address=HOST0:PORT
--num_processes=N --process_id=I (or --multihost alone under SLURM, Open MPI, Kubernetes or on TPU pods, where
jax.distributed finds them). config.mesh lays the devices out (vitjax.mesh). A process that dies makes the others
stop within --peer_timeout seconds with one line and exit 75 (vitjax.distributed); rerun them all to resume.

Resuming compares the config with the workdir's: a change to the experiment (model, data, optimizer, schedule,
seed, batch size, steps) is refused unless --allow_config_change, which records it in config_history.jsonl;
bookkeeping fields (log/eval/checkpoint cadence, max_train_minutes, ...) change freely. One run per workdir: a
second one stops at once, naming the first.

Output: the result on stdout, one line (or one JSON object with --json): training's best checkpoint with its
validation metrics, or the evaluated checkpoint with its metrics. The log goes to stderr: progress, evaluations
during training and one closing line at the default --verbosity=0; --verbosity=1 adds the libraries' INFO lines
(orbax, grain, tfds), 2 their debug lines too, --verbosity=-1 keeps warnings and errors only (see vitjax.logs).

Exit status: 0 done; 2 a problem you can fix (one "error: ..." line naming the fix; the workdir is left as it
was); 3 the loss or parameters stopped being finite (nothing non-finite saved); 74 the workdir's disk filled up (or
turned read-only) during training (one line; the last good checkpoint kept); 75 stopped by SIGTERM/SIGINT
after checkpointing the step in flight, or another process or a data worker process was lost (rerun to resume);
128 + N a second signal N (see vitjax.errors).
"""

import json
import os

from absl import flags

from vitjax import cli, config_flag
from vitjax.config import config_source, read_config
from vitjax.errors import ConfigError

config_flag.define("experiment config file (configs/*.py), with :args")
flags.DEFINE_string("workdir", None, "where checkpoints, metrics and summaries go", required=True)
flags.DEFINE_enum("mode", "train", ["train", "eval"], "train (resumes if possible), or evaluate a checkpoint")
flags.DEFINE_string(
  "eval", None, "eval mode: the evaluator, a name in config.evals or a type (probe, ...); default: best's"
)
flags.DEFINE_string(
  "checkpoint",
  "best",
  "eval mode: 'best' (by config.best), 'latest', a step number, 'averaged' (vitjax.average) or 'init' (the "
  "initial weights)",
)
flags.DEFINE_string("split", None, "eval mode: the split to evaluate (default: the evaluator's)")
flags.DEFINE_enum(
  "weights",
  None,
  ["params", "ema"],
  "eval mode: the trained parameters, or their moving average (config.ema_decay); default: the evaluator's",
)
flags.DEFINE_bool("multihost", False, "run as one of several processes (jax.distributed; see --coordinator_address)")
flags.DEFINE_string(
  "coordinator_address", None, "multihost: HOST:PORT of process 0 (absent: detected from SLURM, Open MPI, k8s, TPU)"
)
flags.DEFINE_string(
  "coordinator_bind_address",
  None,
  "multihost: where process 0 listens (default: --coordinator_address itself; 0.0.0.0:PORT: every interface)",
)
flags.DEFINE_integer("num_processes", None, "multihost: how many processes in all")
flags.DEFINE_integer("process_id", None, "multihost: this process's index, 0 .. num_processes - 1")
flags.DEFINE_integer(
  "peer_timeout", 30, "multihost: seconds without a sign of life after which another process counts as lost"
)
flags.DEFINE_bool(
  "allow_config_change",
  False,
  "resume even though the config changes the experiment; the change is recorded in WORKDIR/config_history.jsonl",
)
flags.DEFINE_bool("json", False, "print the result on stdout as one JSON object instead of one line of text")
FLAGS = flags.FLAGS


def _config(workdir):
  """The run's config: --config, or else the workdir's.

  The workdir's is config.json with the changes recorded in config_history.jsonl (a resume or an evaluation needs no
  --config); a new workdir without --config is a ConfigError.
  """
  from absl import logging

  if FLAGS.config is not None:
    return FLAGS.config
  if FLAGS.mode == "train" and not os.path.exists(os.path.join(workdir, "config.json")):
    raise ConfigError(f"training needs --config=configs/NAME.py ({workdir} has no config.json to take it from)")
  config = read_config(workdir)  # evaluating where no run is: one line naming config.json
  logging.info("config: %s", config_source(workdir))  # (config.json alone is stale after an allowed change)
  return config


def _print_result(result: dict) -> None:
  """The result on stdout, from process 0 only (logs go to stderr): one line, or JSON with --json."""
  import jax

  from vitjax.train.reporting import format_result

  if jax.process_index() == 0:
    print(json.dumps(result) if FLAGS.json else format_result(result), flush=True)


EVAL_FLAGS = ("eval", "checkpoint", "split", "weights")
MULTIHOST_FLAGS = ("coordinator_address", "coordinator_bind_address", "num_processes", "process_id")


def _check_flags() -> None:
  """ConfigError for flags the mode or --multihost would ignore (an evaluation's, given to a training, trains)."""
  for given, needs, fix in (
    (EVAL_FLAGS, FLAGS.mode == "eval", "add --mode=eval to evaluate"),
    (MULTIHOST_FLAGS, FLAGS.multihost, "add --multihost to run as one of several processes"),
  ):
    present = [f"--{n}" for n in given if FLAGS[n].present]
    if present and not needs:
      flag = "--mode=eval" if given is EVAL_FLAGS else "--multihost"
      raise ConfigError(
        f"{', '.join(present)} {'is' if len(present) == 1 else 'are'} for {flag} only: {fix}, or leave "
        f"{'it' if len(present) == 1 else 'them'} out"
      )


def main() -> None:
  """Command line entry: trains (--mode=train) or evaluates (--mode=eval) the experiment in --workdir.

  Prints the result line. With --multihost it first joins the other processes (vitjax.distributed); a lost peer
  ends the run with exit status 75.
  """
  from vitjax import distributed, train

  _check_flags()
  if FLAGS.multihost:
    distributed.initialize(
      FLAGS.coordinator_address,
      FLAGS.num_processes,
      FLAGS.process_id,
      FLAGS.peer_timeout,
      FLAGS.coordinator_bind_address,
    )
  with distributed.PeerWatch(FLAGS.peer_timeout):  # a lost process: one line, exit 75
    config = _config(os.path.abspath(FLAGS.workdir))
    if FLAGS.mode == "train":
      result = train.train(config, FLAGS.workdir, allow_config_change=FLAGS.allow_config_change)
    else:
      result = train.evaluate(config, FLAGS.workdir, FLAGS.checkpoint, FLAGS.split, FLAGS.weights, FLAGS.eval)
  _print_result(result)


if __name__ == "__main__":
  cli.run(main)
