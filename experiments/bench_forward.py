"""Forward-pass time of vitjax vs timm on the same machine, same weights, same input, in one run.

    python experiments/bench_forward.py --batch=8 --models=vit_base_patch16_224,swin_tiny_patch4_window7_224

Prints one line per model and appends them to experiments/results/bench_forward.jsonl. Times are the median
of --repeats calls after a warm-up (and, for vitjax, after compilation), in float32 inference mode.
FLOPs are XLA's count for the compiled vitjax forward pass; the peak is a float32 4096x4096 matmul timed on
the same machine in the same run, so utilisation = (FLOPs / time) / peak.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # torchvision_ops_shim


def median_time(fn, repeats):
  fn()  # warm-up
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def peak_flops(n=4096, repeats=5):
  """float32 FLOP/s of a large matmul: the practical peak of this machine for jax."""
  a = jax.random.normal(jax.random.key(0), (n, n), jax.numpy.float32)
  mm = jax.jit(lambda x: x @ x)
  return 2 * n**3 / median_time(lambda: mm(a).block_until_ready(), repeats)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--models", default="vit_base_patch16_224,swin_tiny_patch4_window7_224")
  args = ap.parse_args()
  import timm
  import torch
  import torchvision_ops_shim  # noqa: F401

  from vitjax import convert

  torch.set_num_threads(os.cpu_count())
  peak = peak_flops()
  print(f"peak: {peak / 1e9:.1f} GFLOP/s (float32 4096x4096 matmul in jax)", flush=True)
  for name in args.models.split(","):
    ref = timm.create_model(name, pretrained=False).eval()
    module, variables = convert.from_timm(name, {k: v.numpy() for k, v in ref.state_dict().items()})
    hw = ref.default_cfg["input_size"][1:]
    x = np.random.RandomState(0).randn(args.batch, 3, *hw).astype(np.float32)
    xt, xj = torch.from_numpy(x), jax.device_put(x.transpose(0, 2, 3, 1))
    fwd = jax.jit(lambda v, im, module=module: module.apply(v, im)[0])
    cost = fwd.lower(variables, xj).compile().cost_analysis()
    flops = float((cost[0] if isinstance(cost, (list, tuple)) else cost).get("flops", float("nan")))
    t = time.perf_counter()
    fwd(variables, xj).block_until_ready()
    compile_s = time.perf_counter() - t
    with torch.inference_mode():
      t_timm = median_time(lambda ref=ref, xt=xt: ref(xt), args.repeats)
      want = ref(xt).numpy()
    t_jax = median_time(lambda f=fwd, v=variables, x=xj: f(v, x).block_until_ready(), args.repeats)
    err = float(np.abs(np.asarray(fwd(variables, xj)) - want).max() / np.abs(want).max())
    util = flops / t_jax / peak
    row = dict(
      model=name,
      batch=args.batch,
      vitjax_s=round(t_jax, 4),
      timm_s=round(t_timm, 4),
      images_per_s=round(args.batch / t_jax, 2),
      gflops=round(flops / 1e9, 1),
      gflops_per_s=round(flops / t_jax / 1e9, 1),
      peak_gflops_per_s=round(peak / 1e9, 1),
      utilisation=round(util, 3),
      vitjax_compile_s=round(compile_s, 2),
      rel_err=err,
      cpu=platform.processor() or platform.machine(),
      cores=os.cpu_count(),
      jax=jax.__version__,
      torch=torch.__version__,
      timm=timm.__version__,
      date=time.strftime("%Y-%m-%d"),
    )
    print(
      f"{name}: batch {args.batch}: vitjax {t_jax * 1e3:.0f} ms ({args.batch / t_jax:.1f} img/s, "
      f"{flops / 1e9:.0f} GFLOP, {util:.0%} of peak), timm {t_timm * 1e3:.0f} ms "
      f"(vitjax compile {compile_s:.1f} s, relative max error {err:.1e})",
      flush=True,
    )
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "bench_forward.jsonl"), "a") as f:
      f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
