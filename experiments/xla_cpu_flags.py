"""XLA:CPU flags against the default, on bench_train's vitjax training step: which ones make the step faster here?

    taskset -c 0,1 python experiments/xla_cpu_flags.py --models=fashion_mnist,swin_t_224_b4,vit_s16_224_b8
    taskset -c 0,1 python experiments/xla_cpu_flags.py --models=swin_t_224_b4 --dtype=bfloat16 --rounds=2

Each (flag set, model) runs in its own process (XLA reads XLA_FLAGS once per process), with the flags added to the
XLA_FLAGS it was started with: bench_train's image_case / transformer_case and vitjax_step (jit of value_and_grad +
optax.adamw, --repeats steps after a warm-up, median). The flag sets run in turn, --rounds times, so that a drift
of the machine falls on all of them alike; a set's time is the median over its rounds. The first loss is printed
too: a flag that changes the numerics shows there.

Flag sets (--sets, comma-separated names):
  default      no flags
  onednn_dot   dots by oneDNN instead of YNNPACK (--xla_cpu_experimental_ynn_fusion_type=-dot
               --xla_cpu_experimental_onednn_fusion_type=dot): oneDNN is the library PyTorch's CPU matmuls use
  eigen_dot    dots by XLA's own Eigen path (--xla_cpu_experimental_ynn_fusion_type=-dot)
  no_ynn       no YNNPACK fusions at all (--xla_cpu_experimental_ynn_fusion_type=)
  vector512    XLA's own loops with 512-bit vectors (--xla_cpu_prefer_vector_width=512; XLA's default is 256)
  no_fusion_emitters   XLA's older loop emitters (--xla_cpu_use_fusion_emitters=false)
  fast_runtime the "fast runtime" optimisation preset (--xla_cpu_opt_preset=CPU_OPT_PRESET_FAST_RUNTIME)
  region_copies  copy insertion with region analysis (--xla_cpu_copy_insertion_use_region_analysis=true)
Appends one JSON line per (model, flag set) to --out (experiments/results/xla_cpu_flags.jsonl) with the command,
date, host, CPU flags, git revision, every round's median and the machine's load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "xla_cpu_flags.jsonl")
SETS = {
  "default": "",
  "onednn_dot": "--xla_cpu_experimental_ynn_fusion_type=-dot --xla_cpu_experimental_onednn_fusion_type=dot",
  "eigen_dot": "--xla_cpu_experimental_ynn_fusion_type=-dot",
  "no_ynn": "--xla_cpu_experimental_ynn_fusion_type=",
  "vector512": "--xla_cpu_prefer_vector_width=512",
  "no_fusion_emitters": "--xla_cpu_use_fusion_emitters=false",
  "fast_runtime": "--xla_cpu_opt_preset=CPU_OPT_PRESET_FAST_RUNTIME",
  "region_copies": "--xla_cpu_copy_insertion_use_region_analysis=true",
}


def child(model: str, dtype: str, repeats: int) -> None:
  """One measurement in this process (under whatever XLA_FLAGS it was given): prints one JSON line."""
  sys.path.insert(0, HERE)
  import bench_train as bt

  names, torch, _ = bt.start(argparse.ArgumentParser(), argparse.Namespace(models=model))
  kind, batch, size = bt.MODELS[names[0]]
  if kind == "transformer_small":
    case = bt.transformer_case(names[0], batch, size, dtype, torch)
  else:
    case = bt.image_case(names[0], kind, batch, size, dtype, torch)
  r = bt.vitjax_step(case, repeats, 1e9)
  print("RESULT " + json.dumps({"step_s": r["step_s"], "compile_s": r["compile_s"], "first_loss": r["first_loss"]}))


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default="fashion_mnist,swin_t_224_b4,vit_s16_224_b8")
  ap.add_argument("--sets", default="default,onednn_dot", help=f"comma-separated, from {', '.join(SETS)}")
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--repeats", type=int, default=7, help="timed steps per process")
  ap.add_argument("--rounds", type=int, default=3, help="processes per (model, flag set), taken in turn")
  ap.add_argument("--out", default=RESULTS)
  ap.add_argument("--child", default="", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    return child(args.child, args.dtype, args.repeats)
  unknown = [s for s in args.sets.split(",") if s not in SETS]
  if unknown:
    ap.error(f"unknown flag set(s) {unknown}; choose from {list(SETS)}")
  sys.path.insert(0, HERE)
  from bench_train import cpu_flags, git_revision, machine_state

  command = " ".join([os.path.basename(sys.executable)] + sys.argv)
  before = machine_state()
  print(f"before: load {before['loadavg']}, busy: {before['cpu_users']}", flush=True)
  sets = args.sets.split(",")
  runs = {(m, s): [] for m in args.models.split(",") for s in sets}
  for rnd in range(args.rounds):
    for model in args.models.split(","):
      for name in sets:
        env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {SETS[name]}".strip()}
        cmd = [sys.executable, __file__, f"--child={model}", f"--dtype={args.dtype}", f"--repeats={args.repeats}"]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not line:
          tail = (out.stderr.strip().splitlines() or ["?"])[-1]
          print(f"round {rnd}: {model} {name}: failed ({tail})", flush=True)
          runs[(model, name)].append({"error": tail})
          continue
        r = json.loads(line[0][len("RESULT ") :])
        runs[(model, name)].append(r)
        print(
          f"round {rnd}: {model:16s} {name:11s} {1e3 * r['step_s']:8.1f} ms  loss {r['first_loss']:.6f}", flush=True
        )
  after = machine_state()
  print(f"after: load {after['loadavg']}, busy: {after['cpu_users']}")
  run = {
    "command": command,
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "cpu_flags": cpu_flags(),
    "git": git_revision(),
    "cpu_count": len(os.sched_getaffinity(0)),
    "machine_before": before,
    "machine_after": after,
  }
  print(f"\n{'model':16s} {'flag set':11s} {'median ms':>10s} {'vs default':>10s}  rounds (ms)")
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "a") as f:
    for model in args.models.split(","):
      base = [r["step_s"] for r in runs[(model, "default")] if "step_s" in r] if "default" in sets else []
      for name in sets:
        times = [r["step_s"] for r in runs[(model, name)] if "step_s" in r]
        med = statistics.median(times) if times else None
        ratio = statistics.median(base) / med if base and med else None
        print(
          f"{model:16s} {name:11s} {1e3 * med if med else float('nan'):10.1f} "
          f"{ratio if ratio else float('nan'):10.3f}  {[round(1e3 * t, 1) for t in times]}"
        )
        row = {"model": model, "flag_set": name, "xla_flags": SETS[name], "dtype": args.dtype}
        row.update(median_step_s=med, default_over_this=ratio, rounds=runs[(model, name)], repeats=args.repeats)
        f.write(json.dumps({**row, **run}) + "\n")
  print("vs default: the default's median step time over this set's (above 1: the flags make the step faster)")


if __name__ == "__main__":
  main()
