"""Issue 77's two tables on this CPU: a small student distilled from a trained ViT against the same student from
scratch, and low-rank adapters against full fine-tuning and the head alone, from a pre-trained encoder.

    python experiments/distill_lora.py --part=distill --seeds=0,1,2 --cores=1 --root=/tmp/dl
    python experiments/distill_lora.py --part=lora --seeds=0,1,2 --cores=1 --root=/tmp/dl
    python experiments/distill_lora.py --summary

distill: the teacher is the README's main job (configs/vit_digits.py, Ti/2: width 64, depth 4; seed 0). The student
is width 32, depth 2, 2 heads (an eighth of its parameters), trained with the main job's recipe (80 epochs), from
scratch, with function matching (loss soft, temperature 1, weight 1: the teacher on the same augmented view) and with
the teacher's hard labels (DeiT's). Every student carries an `agreement` evaluator on the test split (the teacher only
measured where it does not teach).

lora: the encoder is configs/mae_digits.py's MAE (labels unused; seed 0). Each variant fine-tunes configs/vit_digits.py
from it (init_from) for 30 epochs: every parameter, the head alone (config.frozen), and adapters of rank 4, 8 and 16 on
attention q/k/v/out and the MLP (config.lora, alpha = rank).

Each row: test accuracy of the best checkpoint (--mode=eval --split=test), trainable values and the optimizer state's
bytes (from the saved checkpoint), the process's peak resident memory (/usr/bin/time), steps/s (median of the logged
rows after the first), the checkpoint's size on disk. Rows go to results/distill_lora.jsonl. The dataset must be
prepared (`python -m vitjax.data.prepare --dataset=digits`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from main_job_spread import cpu, git_commit  # noqa: E402

OUT = os.path.join(ROOT, "experiments", "results", "distill_lora.jsonl")
STUDENT = [
  "--config.model.width=32",
  "--config.model.depth=2",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=64",
]
DISTILL = {
  "scratch": [],
  "function matching (soft, T=1)": ["--config.distill.loss=soft"],
  "hard labels": ["--config.distill.loss=hard"],
}
LORA = {
  "full fine-tuning": [],
  "head only": ["--config.frozen=('^(?!head/).*',)"],
  "LoRA r4": ["--config.lora.rank=4"],
  "LoRA r8": ["--config.lora.rank=8"],
  "LoRA r16": ["--config.lora.rank=16"],
}


def main_cmd(cores, *args) -> list[str]:
  pin = ["taskset", "-c", cores] if cores else []
  return [*pin, "/usr/bin/time", "-f", "maxrss_kb=%M", sys.executable, "-m", "vitjax.main", *args]


def train(cores, workdir, *args) -> tuple[dict, int, float]:
  """(the --json result, peak RSS in KiB, seconds) of one training run; an existing finished workdir is reused."""
  t0 = time.time()
  proc = subprocess.run(
    main_cmd(cores, f"--workdir={workdir}", "--json", *args), cwd=ROOT, capture_output=True, text=True
  )
  if proc.returncode:
    raise SystemExit(f"{workdir}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
  rss = int(proc.stderr.rsplit("maxrss_kb=", 1)[1].split()[0])
  return json.loads(proc.stdout.strip().splitlines()[-1]), rss, time.time() - t0


def test_accuracy(cores, workdir) -> float:
  proc = subprocess.run(
    main_cmd(cores, "--mode=eval", f"--workdir={workdir}", "--split=test", "--json"),
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=True,
  )
  return json.loads(proc.stdout.strip().splitlines()[-1])["eval/accuracy"]


def saved(workdir, step) -> dict:
  """Trainable values, the optimizer state's bytes and the checkpoint's bytes on disk, from checkpoint `step`."""
  import numpy as np
  import orbax.checkpoint as ocp

  path = os.path.join(workdir, "checkpoints", str(step))
  tree = ocp.PyTreeCheckpointer().metadata(os.path.join(path, "state")).item_metadata.tree
  import jax

  leaves = jax.tree_util.tree_leaves_with_path(tree["opt_state"], is_leaf=lambda x: hasattr(x, "shape"))
  sized = [(jax.tree_util.keystr(k), int(np.prod(v.shape)), np.dtype(v.dtype).itemsize) for k, v in leaves]
  opt_bytes = sum(n * b for _, n, b in sized)
  mu = [n for k, n, _ in sized if "mu" in k or "[0]" in k]
  disk = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
  return {"optimizer_state_bytes": opt_bytes, "checkpoint_bytes": disk, "first_moment_values": sum(mu)}


def rows_of(workdir) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def trainable(log: str) -> str:
  for line in log.splitlines():
    if "frozen in all" in line:
      return line.split("training", 1)[1].strip()
  return "all"


def record(part, name, seed, cores, workdir, result, rss, seconds) -> dict:
  rows = rows_of(workdir)
  speeds = [r["train/steps_per_s"] for r in rows if "train/steps_per_s" in r][1:]
  best = result["step"]
  agree = [r for r in rows if r.get("step") == best and "agree/agreement" in r]
  row = {
    "part": part,
    "variant": name,
    "seed": seed,
    "cores": cores or f"all ({os.cpu_count()})",
    "best_step": best,
    "valid_accuracy": result.get("eval/accuracy"),
    "test_accuracy": test_accuracy(cores, workdir),
    "agreement_test": agree[0]["agree/agreement"] if agree else None,
    "steps_per_s": round(statistics.median(speeds), 2) if speeds else None,
    "peak_rss_mib": round(rss / 1024),
    "train_s": round(seconds, 1),
    **saved(workdir, best),
    "commit": git_commit(),
    **cpu(),
  }
  with open(OUT, "a") as f:
    f.write(json.dumps(row) + "\n")
  print(json.dumps(row), flush=True)
  return row


def base(cores, workdir, config) -> None:
  if not os.path.isdir(os.path.join(workdir, "checkpoints")):
    train(cores, workdir, f"--config={config}", "--config.seed=0")


def run_distill(seeds, cores, root) -> None:
  teacher = os.path.join(root, "teacher")
  base(cores, teacher, "configs/vit_digits.py")
  for seed in seeds:
    for name, args in DISTILL.items():
      workdir = os.path.join(root, f"distill_{name.split()[0]}_{seed}")
      agree = {"eval": {"type": "classification"}, "agree": {"type": "agreement", "split": "test", "teacher": teacher}}
      more = [f"--config.distill.teacher={teacher}", *args] if args else []
      result, rss, s = train(
        cores, workdir, "--config=configs/vit_digits.py", f"--config.seed={seed}", *STUDENT, *more,
        f"--config.evals={agree!r}",
      )  # fmt: skip
      record("distill", name, seed, cores, workdir, result, rss, s)


def run_lora(seeds, cores, root) -> None:
  encoder = os.path.join(root, "mae")
  base(cores, encoder, "configs/mae_digits.py")
  for seed in seeds:
    for name, args in LORA.items():
      workdir = os.path.join(root, f"lora_{name.replace(' ', '_')}_{seed}")
      result, rss, s = train(
        cores, workdir, "--config=configs/vit_digits.py", f"--config.seed={seed}", f"--config.init_from={encoder}",
        "--config.num_epochs=30", *args,
      )  # fmt: skip
      record("lora", name, seed, cores, workdir, result, rss, s)


def summary() -> None:
  rows = [json.loads(line) for line in open(OUT)] if os.path.exists(OUT) else []
  for part in ("distill", "lora"):
    mine = [r for r in rows if r["part"] == part]
    if not mine:
      continue
    print(f"\n{part}: variant | test accuracy per seed (mean) | agreement | steps/s | opt. state | peak RSS | ckpt")
    for name in dict.fromkeys(r["variant"] for r in mine):
      rs = [r for r in mine if r["variant"] == name]
      acc = [r["test_accuracy"] for r in rs]
      agree = [r["agreement_test"] for r in rs if r["agreement_test"] is not None]
      print(
        f"{name} | {' / '.join(f'{100 * a:.2f}' for a in acc)} ({100 * statistics.mean(acc):.2f}) | "
        f"{' / '.join(f'{100 * a:.1f}' for a in agree) or '-'} | "
        f"{statistics.median(r['steps_per_s'] for r in rs):.1f} | "
        f"{statistics.median(r['optimizer_state_bytes'] for r in rs) / 1024:.0f} KiB | "
        f"{statistics.median(r['peak_rss_mib'] for r in rs):.0f} MiB | "
        f"{statistics.median(r['checkpoint_bytes'] for r in rs) / 1024:.0f} KiB"
      )


if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--part", choices=("distill", "lora"))
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--cores", default=None)
  p.add_argument("--root", default="/tmp/distill_lora")
  p.add_argument("--summary", action="store_true")
  a = p.parse_args()
  if a.summary:
    summary()
  else:
    seeds = [int(s) for s in a.seeds.split(",")]
    (run_distill if a.part == "distill" else run_lora)(seeds, a.cores, a.root)
    summary()
