"""float32 against bfloat16 on one machine: bench_train's vitjax step for each model in both dtypes, timed in turn.

    taskset -c 0,1 python experiments/dtype_ab.py
    taskset -c 0,1 python experiments/dtype_ab.py --models=swin_t_224_b4 --rounds=20

Both steps of a model are compiled in this one process (bench_train's image_case / transformer_case and its bare
jit step: value_and_grad + optax.adamw), then run in alternation, --rounds times after a warm-up step each: a drift
of a shared machine falls on both alike, where separate bench_train runs in each dtype can differ by 15-30% on
their own. The ratio that counts is float32's median step time over bfloat16's (issue 28's goal on a CPU with
bfloat16 instructions: at least 1.4). The first loss of each dtype is printed too (the same initial parameters:
bfloat16's differs by its rounding only). Appends one JSON line per model to --out
(experiments/results/dtype_ab.jsonl) with the command, date, host, CPU flags, git revision and every step's time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import jax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_train as bt  # noqa: E402

RESULTS = os.path.join(HERE, "results", "dtype_ab.jsonl")
DTYPES = ("float32", "bfloat16")


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default="swin_t_224_b4,vit_s16_224_b8,fashion_mnist,transformer_small")
  ap.add_argument("--rounds", type=int, default=12, help="timed steps per dtype, alternating")
  ap.add_argument("--out", default=RESULTS)
  args = ap.parse_args()
  names, torch, timm = bt.start(ap, args)
  command = " ".join([os.path.basename(sys.executable)] + sys.argv)
  taskset = subprocess.run(["taskset", "-pc", str(os.getpid())], capture_output=True, text=True).stdout.strip()
  host = bt.host_info(torch, timm)
  print(f"host: {host['cpu']} ({taskset}), jax {jax.__version__}, CPU flags {bt.cpu_flags()}")
  for name in names:
    kind, batch, size = bt.MODELS[name]
    steps = {}
    for dtype in DTYPES:
      if kind == "transformer_small":
        case = bt.transformer_case(name, batch, size, dtype, torch)
      else:
        case = bt.image_case(name, kind, batch, size, dtype, torch)
      t = time.perf_counter()
      compiled, state, xs, y, rng = bt.compiled_step(case)
      compile_s = time.perf_counter() - t
      *state[:], loss = compiled(*state, xs, y, rng)
      steps[dtype] = {"run": (compiled, state, xs, y, rng), "first_loss": float(loss), "compile_s": compile_s, "t": []}
    before = bt.machine_state()
    for _ in range(args.rounds):
      for s in steps.values():
        compiled, state, xs, y, rng = s["run"]
        t = time.perf_counter()
        *state[:], loss = compiled(*state, xs, y, rng)
        float(loss)  # blocks until the step is done
        s["t"].append(time.perf_counter() - t)
    ms = {d: 1e3 * statistics.median(s["t"]) for d, s in steps.items()}
    row = {
      "model": name,
      "batch": batch,
      "rounds": args.rounds,
      **{f"{d}_ms": round(ms[d], 1) for d in DTYPES},
      **{f"{d}_min_ms": round(1e3 * min(steps[d]["t"]), 1) for d in DTYPES},
      "float32_over_bfloat16": round(ms["float32"] / ms["bfloat16"], 3),
      **{f"{d}_first_loss": steps[d]["first_loss"] for d in DTYPES},
      **{f"{d}_compile_s": round(steps[d]["compile_s"], 1) for d in DTYPES},
      **{f"{d}_times_s": [round(x, 4) for x in steps[d]["t"]] for d in DTYPES},
      "command": command,
      "taskset": taskset,
      "date": time.strftime("%Y-%m-%d %H:%M:%S"),
      "host": host,
      "cpu_flags": bt.cpu_flags(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "git": bt.git_revision(),
      "before": before,
      "after": bt.machine_state(),
    }
    print(
      f"{name:20s} float32 {ms['float32']:8.1f} ms  bfloat16 {ms['bfloat16']:8.1f} ms  "
      f"float32/bfloat16 {row['float32_over_bfloat16']:.2f}  first loss {row['float32_first_loss']:.6f} / "
      f"{row['bfloat16_first_loss']:.6f}",
      flush=True,
    )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
      f.write(json.dumps(row) + "\n")
    del steps


if __name__ == "__main__":
  main()
