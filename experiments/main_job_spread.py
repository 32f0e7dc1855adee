"""The README's main job over seeds, core counts and instruction sets: the range a user will see, not one draw.

Each row runs the main command's two vitjax steps (train configs/vit_digits.py, then evaluate its best checkpoint
on the test split) in a fresh workdir, with `--config.seed=SEED`, optionally pinned to cores (`taskset`) and with
XLA's CPU code limited to an instruction set (`--xla_cpu_max_isa`: AVX512, AVX2, AVX, SSE4_2; a way to see what
another CPU's rounding does on this one), and appends one JSON line to results/main_job_spread.jsonl: the machine,
the settings, the best step and its validation accuracy, the test accuracy and the wall times.

    python experiments/main_job_spread.py --seeds=0,1,2                       # 2 cores
    python experiments/main_job_spread.py --seeds=0 --cores=0                 # pinned to one core
    python experiments/main_job_spread.py --seeds=0 --isa=AVX                 # no AVX2 / FMA code
    python experiments/main_job_spread.py --summary                           # the table of what is recorded

The dataset must be prepared (`python -m vitjax.data.prepare --dataset=digits`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "experiments", "results", "main_job_spread.jsonl")


def cpu() -> dict:
  """The CPU's model name, core count and vector extensions, from /proc/cpuinfo."""
  name, flags = platform.processor() or "?", set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
          name = value.strip()
        elif key.strip() == "flags":
          flags = set(value.split())
  except OSError:
    pass
  simd = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
  return {"cpu": name, "cpu_count": os.cpu_count(), "simd": simd}


def git_commit() -> str:
  out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
  return out.stdout.strip() or "?"


def run(seed: int, cores: str | None, isa: str | None, workdir: str) -> dict:
  env = dict(os.environ)
  if isa:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_cpu_max_isa={isa}".strip()
  pin = ["taskset", "-c", cores] if cores else []
  main = [*pin, sys.executable, "-m", "vitjax.main"]
  train = [*main, "--config=configs/vit_digits.py", f"--workdir={workdir}", f"--config.seed={seed}", "--json"]
  evaluate = [*main, "--mode=eval", f"--workdir={workdir}", "--split=test", "--json"]
  t0 = time.time()
  trained = subprocess.run(train, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
  t1 = time.time()
  tested = subprocess.run(evaluate, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
  best, test = json.loads(trained.stdout), json.loads(tested.stdout)
  waits = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if "train/data_wait" in row:
        waits.append(row["train/data_wait"])
  return {
    "seed": seed,
    "cores": cores or f"all ({os.cpu_count()})",
    "isa": isa or "native",
    "best_step": best["step"],
    "valid_accuracy": best["eval/accuracy"],
    "test_accuracy": test["eval/accuracy"],
    "train_s": round(t1 - t0, 1),
    "eval_s": round(time.time() - t1, 1),
    "data_wait_median": sorted(waits)[len(waits) // 2] if waits else None,
    "command": " && ".join(_shown(c[len(pin) :], workdir) for c in (train, evaluate)),
  }


def _shown(cmd: list[str], workdir: str) -> str:
  """A command as a user would type it: `python`, the workdir as W."""
  return " ".join("python" if a == sys.executable else a for a in cmd).replace(workdir, "W")


def summary() -> None:
  with open(OUT) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  print("| commit | CPU | SIMD | cores | XLA ISA | seed | best step | validation | test | training |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for r in rows:
    print(
      f"| {r['commit']} | {r['cpu']} | {', '.join(r['simd'])} | {r['cores']} | {r['isa']} | {r['seed']} | "
      f"{r['best_step']} | {100 * r['valid_accuracy']:.2f}% | {100 * r['test_accuracy']:.2f}% | {r['train_s']:.0f} s |"
    )
  tests = [100 * r["test_accuracy"] for r in rows]
  print(f"\ntest accuracy over {len(rows)} runs: {min(tests):.2f}% to {max(tests):.2f}%")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", default="0", help="comma-separated config.seed values")
  ap.add_argument("--cores", default=None, help="taskset core list, e.g. 0 or 0,1 (default: not pinned)")
  ap.add_argument("--isa", default=None, help="XLA's --xla_cpu_max_isa (AVX512, AVX2, AVX, SSE4_2)")
  ap.add_argument("--summary", action="store_true", help="print the recorded rows as a table")
  args = ap.parse_args()
  if args.summary:
    summary()
    return
  for seed in (int(s) for s in args.seeds.split(",")):
    with tempfile.TemporaryDirectory(prefix="vitjax-spread-") as tmp:
      row = {"commit": git_commit(), **cpu(), **run(seed, args.cores, args.isa, os.path.join(tmp, "w"))}
    print(json.dumps(row), flush=True)
    with open(OUT, "a") as f:
      f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
