"""Training batches made on the devices (data.on_device=True) vs by the host (False): speed, data wait, accuracy.

Each row trains one config in a fresh workdir with one `--config.data.on_device` and seed, evaluates its best
checkpoint on the test split, and appends one JSON line to results/on_device_cpu.jsonl: the machine, the job,
the mode, steps/s over the training time (train/elapsed_s: evaluations and saves left out), the median data wait
of the progress rows, the test accuracy and the commands.

    python experiments/on_device_cpu.py --job=digits --seeds=0,1,2 --cores=1       # the README's main job
    python experiments/on_device_cpu.py --job=fashion --seeds=0,1,2 --cores=1      # Fashion-MNIST, one epoch
    python experiments/on_device_cpu.py --summary                                  # the table

The datasets must be prepared (`python -m vitjax.data.prepare --dataset=digits`, `--dataset=fashion_mnist`); give
`--data_dir` where they are not in the default one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from main_job_spread import _shown, cpu, git_commit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "experiments", "results", "on_device_cpu.jsonl")
JOBS = {
  "digits": ["--config=configs/vit_digits.py"],
  "fashion": ["--config=configs/vit_fashion_mnist.py", "--config.num_epochs=1", "--config.eval_every=1 epoch"],
}


def run(job: str, on_device: bool, seed: int, cores: str | None, data_dir: str | None, workdir: str) -> dict:
  pin = ["taskset", "-c", cores] if cores else []
  main = [*pin, sys.executable, "-m", "vitjax.main"]
  common = [f"--config.data.data_dir={data_dir}"] if data_dir else []
  train = [*main, *JOBS[job], f"--workdir={workdir}", f"--config.seed={seed}", f"--config.data.on_device={on_device}"]
  train += [*common, "--json"]
  evaluate = [*main, "--mode=eval", f"--workdir={workdir}", "--split=test", "--json"]
  t0 = time.time()
  subprocess.run(train, cwd=ROOT, capture_output=True, text=True, check=True)
  t1 = time.time()
  tested = json.loads(subprocess.run(evaluate, cwd=ROOT, capture_output=True, text=True, check=True).stdout)
  waits, last = [], {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if "train/data_wait" in row:
        waits.append(row["train/data_wait"])
        last = row
  return {
    "job": job,
    "on_device": on_device,
    "seed": seed,
    "cores": cores or f"all ({os.cpu_count()})",
    "steps": last["step"],
    "steps_per_s": round(last["step"] / last["train/elapsed_s"], 2),
    "data_wait_median": sorted(waits)[len(waits) // 2],
    "test_accuracy": tested["eval/accuracy"],
    "train_s": round(t1 - t0, 1),
    "command": " && ".join(_shown(c[len(pin) :], workdir) for c in (train, evaluate)),
  }


def summary() -> None:
  with open(OUT) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  print("| commit | job | data.on_device | cores | seed | steps/s | data wait | test accuracy | wall |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for r in rows:
    print(
      f"| {r['commit']} | {r['job']} | {r['on_device']} | {r['cores']} | {r['seed']} | {r['steps_per_s']:.2f} | "
      f"{100 * r['data_wait_median']:.1f}% | {100 * r['test_accuracy']:.2f}% | {r['train_s']:.0f} s |"
    )
  for job in dict.fromkeys(r["job"] for r in rows):
    for mode in (False, True):
      got = [r for r in rows if r["job"] == job and r["on_device"] == mode]
      if got:
        speed = sum(r["steps_per_s"] for r in got) / len(got)
        acc = [100 * r["test_accuracy"] for r in got]
        print(
          f"\n{job}, on_device={mode}: {len(got)} runs, mean {speed:.2f} steps/s, test {min(acc):.2f}-{max(acc):.2f}%"
        )


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--job", choices=sorted(JOBS), default="digits")
  ap.add_argument("--seeds", default="0", help="comma-separated config.seed values")
  ap.add_argument("--modes", default="False,True", help="data.on_device values, in the order run")
  ap.add_argument("--cores", default=None, help="taskset core list, e.g. 1 (default: not pinned)")
  ap.add_argument("--data_dir", default=None)
  ap.add_argument("--summary", action="store_true", help="print the recorded rows as a table")
  args = ap.parse_args()
  if args.summary:
    summary()
    return
  for seed in (int(s) for s in args.seeds.split(",")):
    for mode in (m.strip() == "True" for m in args.modes.split(",")):
      with tempfile.TemporaryDirectory(prefix="vitjax-on-device-") as tmp:
        row = run(args.job, mode, seed, args.cores, args.data_dir, os.path.join(tmp, "w"))
      row = {"commit": git_commit(), **cpu(), **row}
      print(json.dumps(row), flush=True)
      with open(OUT, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
