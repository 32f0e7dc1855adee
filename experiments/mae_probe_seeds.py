"""MAE against training from scratch on Fashion-MNIST, over seeds, judged two ways: fine-tuned at equal training
FLOPs (experiments/README.md, "Pre-training"), and frozen (linear probe, 10-shot, k-NN: `--eval=probe`) beside
a random encoder and the supervised one.

Each (arm, seed) runs in its own workdir under --root and appends one JSON line to
results/mae_probe_seeds.jsonl (skipped when that line exists: rerun to resume after an interruption):

    random   the encoder at initialisation (--eval=probe --checkpoint=init)
    mae      MAE pre-training, 5 epochs; its encoder probed; then fine-tuned 7.12 epochs (layer decay 0.75) and
             evaluated on test (5 MAE epochs cost 2.88 classifier epochs: 2.88 + 7.12 = 10)
    scratch  the same ViT trained 10 epochs from scratch; probed; evaluated on test

    python experiments/mae_probe_seeds.py --arms=random,mae --seeds=0,1,2 --cores=0 --root=/tmp/mps &
    python experiments/mae_probe_seeds.py --arms=scratch --seeds=0,1,2 --cores=1 --root=/tmp/mps &
    python experiments/mae_probe_seeds.py --summary           # the table: mean ± standard deviation over seeds

Fashion-MNIST must be prepared (`python -m vitjax.data.prepare --dataset=fashion_mnist`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "experiments", "results", "mae_probe_seeds.jsonl")
VIT = "configs/vit_fashion_mnist_from_mae.py"
MAE = "configs/mae_fashion_mnist.py"


def main_cmd(cores: str | None, *args: str) -> dict:
  """Runs `python -m vitjax.main ARGS --json` (pinned to `cores`); its JSON result, with the wall time."""
  cmd = [sys.executable, "-m", "vitjax.main", *args, "--json"]
  if cores:
    cmd = ["taskset", "-c", cores, *cmd]
  print("+", " ".join(cmd), flush=True)
  start = time.time()
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  if proc.returncode:
    sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
  return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": round(time.time() - start, 1)}


def probe(cores, *args) -> dict:
  """--eval=probe on valid and on test: {split: {linear, knn, 10shot, ...}} and the seconds both took."""
  keep = ("linear", "knn", "10shot", "10shot_std", "1shot", "5shot", "25shot")
  rows = {s: main_cmd(cores, "--mode=eval", "--eval=probe", f"--split={s}", *args) for s in ("valid", "test")}
  return {s: {k: r[f"probe/{k}"] for k in keep} for s, r in rows.items()}, sum(r["wall_s"] for r in rows.values())


def run(arm: str, seed: int, root: str, cores: str | None) -> dict:
  w = os.path.join(root, f"{arm}_{seed}")
  s = f"--config.seed={seed}"
  if arm == "random":
    rows, wall = probe(cores, f"--config={VIT}", f"--workdir={w}", s, "--config.init_from=", "--checkpoint=init")
    return {"probe": rows, "probe_s": wall}
  if arm == "scratch":
    train = [f"--config={VIT}", "--config.init_from=", "--config.optim.layer_decay=1.0", "--config.num_epochs=10"]
    t = main_cmd(cores, *train, f"--workdir={w}", s)
    e = main_cmd(cores, "--mode=eval", f"--workdir={w}", "--split=test")
    p, _ = probe(cores, f"--workdir={w}")
    return {"valid": t["eval/accuracy"], "test": e["eval/accuracy"], "train_s": t["wall_s"], "probe": p}
  if arm == "mae":
    pre = main_cmd(cores, f"--config={MAE}", f"--workdir={w}/mae", "--config.num_epochs=5", s)
    p, _ = probe(cores, f"--workdir={w}/mae")
    ft = [f"--config={VIT}", f"--config.init_from={w}/mae", "--config.num_epochs=7.12"]
    t = main_cmd(cores, *ft, f"--workdir={w}/finetune", s)
    e = main_cmd(cores, "--mode=eval", f"--workdir={w}/finetune", "--split=test")
    return {
      "valid": t["eval/accuracy"],
      "test": e["eval/accuracy"],
      "train_s": pre["wall_s"] + t["wall_s"],
      "probe": p,
    }
  raise SystemExit(f"unknown arm {arm!r}: use random, mae, scratch")


def summary() -> None:
  rows = [json.loads(line) for line in open(OUT)] if os.path.exists(OUT) else []

  def fmt(v):  # mean ± standard deviation over seeds (ddof=1: the spread of one more seed)
    if not v:
      return "-"
    return f"{100 * v[0]:.2f}" if len(v) == 1 else f"{100 * np.mean(v):.2f} ± {100 * np.std(v, ddof=1):.2f}"

  print("| arm | seeds | fine-tuned test | linear (test) | 10-shot (test) | k-NN (test) |")
  print("| --- | --- | --- | --- | --- | --- |")
  for arm in ("random", "mae", "scratch"):
    mine = [r for r in rows if r["arm"] == arm]
    if not mine:
      continue
    get = lambda k, m=mine: [r["probe"]["test"][k] for r in m]
    tests = [r["test"] for r in mine if "test" in r]
    seeds = ",".join(str(r["seed"]) for r in mine)
    print(f"| {arm} | {seeds} | {fmt(tests)} | {fmt(get('linear'))} | {fmt(get('10shot'))} | {fmt(get('knn'))} |")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--arms", default="random,mae,scratch")
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--cores", default=None, help="taskset core list, e.g. 0")
  ap.add_argument("--root", default="/tmp/mae_probe_seeds")
  ap.add_argument("--summary", action="store_true")
  a = ap.parse_args()
  if a.summary:
    return summary()
  done = {(r["arm"], r["seed"]) for r in map(json.loads, open(OUT))} if os.path.exists(OUT) else set()
  for seed in map(int, a.seeds.split(",")):
    for arm in a.arms.split(","):
      if (arm, seed) in done:
        continue
      row = {"arm": arm, "seed": seed, "cores": a.cores, **run(arm, seed, a.root, a.cores)}
      with open(OUT, "a") as f:
        f.write(json.dumps(row) + "\n")
      print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()
