"""Command line: average a run's last checkpoints (or chosen steps) into WORKDIR/averaged (vitjax.train.averaging).

    python -m vitjax.average --workdir=workdirs/bible_en_es --last=5
    python -m vitjax.average --workdir=W --steps=8000,9000,10000
    python -m vitjax.main --mode=eval --workdir=W --checkpoint=averaged --split=test     # and vitjax.load(W, "averaged")

Exit status: 0 written; 2 a problem you can fix (one "error: ..." line: no such workdir, a step that is not kept,
a corrupt member); checkpoints/ is only read.
"""

import os

from absl import flags

from vitjax import cli
from vitjax.config import read_config

flags.DEFINE_string("workdir", None, "the run whose checkpoints to average", required=True)
flags.DEFINE_integer("last", None, "average the N newest kept checkpoints")
flags.DEFINE_list("steps", None, "or these steps, e.g. 8000,9000,10000")
FLAGS = flags.FLAGS


def main() -> None:
  """Command line entry: averages --last N or --steps of --workdir's checkpoints into WORKDIR/averaged."""
  from vitjax.train import averaging

  workdir = os.path.abspath(FLAGS.workdir)
  result = averaging.average(read_config(workdir), workdir, FLAGS.last, FLAGS.steps)
  print(f"averaged steps {', '.join(map(str, result['steps']))} into {workdir}/averaged", flush=True)


if __name__ == "__main__":
  cli.run(main)
