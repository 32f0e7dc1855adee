"""The Python steps of experiments/gpu_check.sh (read that file's docstring first): each writes JSON lines to --out.

    python experiments/gpu_check.py env --out=DIR                    # (a) device, driver, versions, jax.devices()
    python experiments/gpu_check.py attention --out=DIR [--dry]      # (c) "fast" vs "reference", vs torch's SDPA
    python experiments/gpu_check.py run --out=DIR --workdir=W --name=N [--curve=FILE]   # (e) one run's figures
    python experiments/gpu_check.py subset --src=DIR --dst=DIR --n=N  # a small Fashion-MNIST for --dry
    python experiments/gpu_check.py curve --out=DIR --workdir=W --curve=FILE --command=... --host=...
                                     # a CPU run's losses as the reference curve (results/gpu_check_cpu_curve_*.json)
    python experiments/gpu_check.py profile --out=DIR [--dry]        # where ViT-B/16's bf16 step spends its time
    python experiments/gpu_check.py variants --out=DIR [--dry] [--peak_tflops=P]   # that step under XLA's options
    python experiments/gpu_check.py summary --out=DIR                # the table at the end

Attention cases (--dry: the same cases at toy sizes): ViT-B/16 (197 tokens, 12 heads of 64, no mask), Swin-T's first
stage (49-token windows, 3 heads of 32, the relative-position bias [1, H, 49, 49] and the shift mask [B*nW, 1, 49,
49]), a causal decoder self-attention with key padding, and the KV-cache decode step (vitjax's MultiHeadAttention
with decode=True, one token against a half-filled cache). Each in bfloat16 and float32, forward and backward (the
gradients of q, k, v and the bias), decode forward only. "truth" is the "reference" implementation in float32 at
HIGHEST matmul precision; a row gives the max abs and relative (over max |truth|) error of "fast" and of "reference"
in the row's dtype, which path "fast" took (cudnn, xla or explicit, read from the compiled program), and ok: fast's
error is at most twice the reference's, or under 1e-5 (float32) / 1e-2 (bfloat16). Times are ms per layer call
(median of 10 after a warm-up), vitjax "fast" against torch.nn.functional.scaled_dot_product_attention on the same
shapes, masks as torch's attn_mask (torch on its GPU where it has one).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def emit(out: str, row: dict) -> None:
  """Appends one JSON line to OUT/gpu_check.jsonl and echoes it."""
  row = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **row}
  with open(os.path.join(out, "gpu_check.jsonl"), "a") as f:
    f.write(json.dumps(row) + "\n")
  print(json.dumps(row), flush=True)


def _version(name: str) -> str | None:
  from importlib import metadata

  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return None


# -- (a) environment


def env_step(args) -> None:
  import jax

  gpus = []
  try:
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"]
    smi = subprocess.run(query, capture_output=True, text=True)
    gpus = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
  except OSError:  # no NVIDIA driver on this machine
    pass
  cuda = {}
  try:  # the CUDA plugin's own record of what it was built with and what it found (absent on a CPU-only jaxlib)
    from jax._src.lib import cuda_versions

    if cuda_versions is not None:
      for key in ("cuda_runtime_get_version", "cudnn_get_version", "cublas_get_version", "cuda_driver_get_version"):
        fn = getattr(cuda_versions, key, None)
        cuda[key.removesuffix("_get_version")] = fn() if fn else None
  except Exception as e:  # noqa: BLE001 (a report, not a check: any failure is written down)
    cuda["error"] = f"{type(e).__name__}: {e}"
  torch_info = {}
  try:
    import torch

    torch_info = {
      "torch": torch.__version__,
      "torch_cuda": torch.version.cuda,
      "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
      torch_info["torch_device"] = torch.cuda.get_device_name(0)
      torch_info["cudnn"] = torch.backends.cudnn.version()
  except Exception as e:  # noqa: BLE001
    torch_info["error"] = f"{type(e).__name__}: {e}"
  packages = "jax jaxlib jax-cuda13-plugin jax-cuda13-pjrt jax-cuda12-plugin flax optax orbax-checkpoint numpy "
  packages += "tensorflow-datasets grain array-record ml-collections timm torch"
  emit(
    args.out,
    {
      "step": "env",
      "gpus": gpus,
      "python": platform.python_version(),
      "cpus": os.cpu_count(),
      "jax_backend": jax.default_backend(),
      "jax_devices": [str(d) for d in jax.devices()],
      "device_kind": jax.devices()[0].device_kind,
      "cuda": cuda,
      **torch_info,
      "versions": {p: _version(p) for p in packages.split()},
    },
  )


# -- (c) attention


def _cases(dry: bool):
  """name -> (q, k, v shapes as (B, T, S, H, K), bias?, mask kind)."""
  if dry:
    return {
      "vit": (2, 17, 17, 2, 8, False, None),
      "swin": (2 * 4, 9, 9, 2, 8, True, "shift"),
      "causal": (2, 12, 12, 2, 8, False, "causal_pad"),
      "decode": (2, 1, 12, 2, 8, False, "decode"),
    }
  return {
    "vit": (64, 197, 197, 12, 64, False, None),  # ViT-B/16 at 224 px, batch 64
    "swin": (16 * 64, 49, 49, 3, 32, True, "shift"),  # Swin-T stage 1 at 224 px: 64 windows an image, batch 16
    "causal": (64, 128, 128, 8, 64, False, "causal_pad"),  # transformer_base decoder, 128 tokens
    "decode": (64, 1, 128, 8, 64, False, "decode"),  # one decode step against a 128-slot cache
  }


def _inputs(case, dry):
  import numpy as np

  from vitjax.attention import causal_mask
  from vitjax.models.swin import shift_attention_mask

  b, t, s, h, k, has_bias, mask_kind = _cases(dry)[case]
  rng = np.random.RandomState(0)
  q = rng.randn(b, t, h, k).astype(np.float32)
  kk = rng.randn(b, s, h, k).astype(np.float32)
  v = rng.randn(b, s, h, k).astype(np.float32)
  bias = rng.randn(1, h, t, s).astype(np.float32) if has_bias else None
  mask = None
  if mask_kind == "shift":  # Swin's shifted windows: windows laid out as a square grid of side `win`
    win = int(round(t**0.5))
    grid = 2 if dry else 8  # windows a side: 4 (dry) or Swin-T stage 1's 64 windows an image
    m = shift_attention_mask((grid * win, grid * win), (win, win), (win // 2, win // 2))  # [nW, N, N]
    nw = m.shape[0]
    mask = np.broadcast_to(m[None, :, None], (b // nw, nw, 1, t, s)).reshape(b, 1, t, s)
  elif mask_kind == "causal_pad":
    lengths = rng.randint(s // 2, s + 1, size=b)
    pad = np.arange(s)[None, :] < lengths[:, None]  # [B, S]
    mask = np.logical_and(np.asarray(causal_mask(t, s)), pad[:, None, None, :])
  elif mask_kind == "decode":
    filled = s // 2
    mask = np.broadcast_to((np.arange(s) <= filled)[None, None, None, :], (b, 1, 1, s))
  return q, kk, v, bias, mask


def _compiled_path(compiled_text: str, implementation: str, backend: str) -> str:
  if "cudnn$fmha" in compiled_text or "__cudnn" in compiled_text:
    return "cudnn"
  if implementation == "reference":
    return "reference"
  return "xla" if backend == "gpu" else "explicit"


def _time(call, arg, repeats=20) -> float:
  """ms: the median of `repeats` calls of call(arg) after a warm-up (call must wait for the device)."""
  call(arg)
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    call(arg)
    times.append(time.perf_counter() - t)
  return 1e3 * statistics.median(times)


def _errors(got, want) -> tuple[float, float]:
  import numpy as np

  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  err = float(np.abs(got - want).max())
  return err, err / max(float(np.abs(want).max()), 1e-30)


def _ok(fast_rel: float, reference_rel: float, dtype) -> bool:
  """fast's relative error is at most twice the reference's in the same dtype, or within the dtype's floor (1e-5 for
  float32, the project's parity bound; 1e-2 for bfloat16, a few units in its last place)."""
  import jax.numpy as jnp

  return fast_rel <= max(2 * reference_rel, 1e-2 if dtype == jnp.bfloat16 else 1e-5)


def _torch_sdpa(q, k, v, bias, mask, backward, dry):
  """ms per call of torch's SDPA on the same shapes ([B, H, T, K] layout), None without torch."""
  try:
    import torch
    import torch.nn.functional as F
  except ImportError:
    return None
  dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  dtype = torch.bfloat16 if q.dtype.name == "bfloat16" else torch.float32
  to = lambda a: torch.from_numpy(a.astype("float32")).to(dev, dtype).transpose(1, 2).contiguous()
  tq, tk, tv = (to(a).requires_grad_(backward) for a in (q, k, v))
  attn_mask = None
  if bias is not None or mask is not None:
    import numpy as np

    m = np.zeros((1, 1, 1, 1), np.float32) if bias is None else bias
    if mask is not None:
      m = m + np.where(mask, 0.0, -1e9).astype(np.float32)
    attn_mask = torch.from_numpy(np.ascontiguousarray(m)).to(dev, dtype)
  sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
  dout = torch.ones_like(tq[..., : tv.shape[-1]]) if backward else None

  def call(backward):
    out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=attn_mask)
    if backward:
      out.backward(dout)
    sync()

  return _time(call, backward, 3 if dry else 20)


def attention_step(args) -> None:
  import jax.numpy as jnp

  cases = args.cases.split(",") if args.cases else list(_cases(args.dry))
  for case in cases:
    for dtype in [jnp.dtype(d).type for d in args.dtypes.split(",")]:
      t0 = time.perf_counter()
      row = {
        "step": "attention",
        "case": case,
        "dtype": jnp.dtype(dtype).name,
        "shape_btshk": _cases(args.dry)[case][:5],
      }
      try:
        row.update(_decode_case(dtype, args.dry) if case == "decode" else _attention_case(case, dtype, args.dry))
      except Exception as e:  # noqa: BLE001 (a report: the failing case is written down and the next one runs)
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        row["ok"] = False
      row["seconds"] = round(time.perf_counter() - t0, 1)
      emit(args.out, row)


def _attention_case(case: str, dtype, dry: bool) -> dict:
  """One case in one dtype: "fast" and "reference" against float32 truth, forward and backward; times."""
  import functools

  import jax
  import jax.numpy as jnp
  import numpy as np

  from vitjax.attention import dot_product_attention

  q0, k0, v0, bias0, mask0 = _inputs(case, dry)
  mask = None if mask0 is None else jnp.asarray(mask0)
  argnums = (0, 1, 2, 3) if bias0 is not None else (0, 1, 2)
  dout = jnp.asarray(np.random.RandomState(1).randn(*q0.shape[:3], v0.shape[-1]), jnp.float32)

  def fwd(q, k, v, bias, impl):
    return dot_product_attention(q, k, v, bias=bias, mask=mask, implementation=impl)

  def both(impl, inputs):  # one program: the output and the gradients
    g = jax.value_and_grad(lambda *a: (lambda o: (loss_of(o), o))(fwd(*a, impl)), argnums=argnums, has_aux=True)
    return jax.jit(lambda *a: (lambda r: (r[0][1], r[1]))(g(*a))).lower(*inputs).compile()

  def loss_of(out):
    return jnp.sum(out.astype(jnp.float32) * dout)

  cast = lambda d: tuple(None if a is None else jnp.asarray(a, d) for a in (q0, k0, v0, bias0))
  t0 = time.perf_counter()
  with jax.default_matmul_precision("highest"):
    truth_out, truth_grads = both("reference", cast(jnp.float32))(*cast(jnp.float32))
  low, row, backend, reps = cast(dtype), {}, jax.default_backend(), 3 if dry else 10
  row["truth_s"] = round(time.perf_counter() - t0, 2)  # where the step's time goes (the H100 took ~25 s a row)
  # "xla": XLA's own attention (scores materialised, softmax fused), timed beside cuDNN's: which kernel "fast"
  # should take at each length (ViT-B's 197 tokens, Swin's 49, the decoder's 128)
  for impl in ("fast", "reference", "xla"):
    t0 = time.perf_counter()
    cb = both(impl, low)
    out, grads = cb(*low)
    row[f"{impl}_fwd_max_abs"], row[f"{impl}_fwd_max_rel"] = _errors(out, truth_out)
    grad_errors = [_errors(a, b) for a, b in zip(grads, truth_grads)]
    row[f"{impl}_bwd_max_abs"] = max(e[0] for e in grad_errors)
    row[f"{impl}_bwd_max_rel"] = max(e[1] for e in grad_errors)
    if impl != "reference":
      cf = jax.jit(functools.partial(fwd, impl=impl)).lower(*low).compile()
      name = "vitjax" if impl == "fast" else impl
      row[f"{name}_fwd_ms"] = _time(lambda f: jax.block_until_ready(f(*low)), cf, reps)
      row[f"{name}_fwd_bwd_ms"] = _time(lambda f: jax.block_until_ready(f(*low)), cb, reps)
    if impl == "fast":
      row["path_fwd"] = _compiled_path(cf.as_text(), impl, backend)
      row["path_bwd"] = _compiled_path(cb.as_text(), impl, backend)
    row[f"{impl}_s"] = round(time.perf_counter() - t0, 2)
  row["ok"] = all(
    _ok(row[f"{impl}_{p}_max_rel"], row[f"reference_{p}_max_rel"], dtype)
    for impl in ("fast", "xla")
    for p in ("fwd", "bwd")
  )
  arrays = [np.asarray(a, np.float32) for a in (q0, k0, v0)]
  arrays = [a.astype(jnp.bfloat16) if dtype == jnp.bfloat16 else a for a in arrays]
  t0 = time.perf_counter()
  row["torch_fwd_ms"] = _torch_sdpa(*arrays, bias0, mask0, False, dry)
  row["torch_fwd_bwd_ms"] = _torch_sdpa(*arrays, bias0, mask0, True, dry)
  row["torch_s"] = round(time.perf_counter() - t0, 2)
  return row


def _decode_case(dtype, dry) -> dict:
  """One KV-cache decode step of MultiHeadAttention(decode=True): "fast" and "reference" against float32 truth."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from vitjax.attention import MultiHeadAttention

  b, _, s, h, k = _cases(dry)["decode"][:5]
  d = h * k
  rng = np.random.RandomState(2)
  prefix = rng.randn(b, s // 2, d).astype(np.float32)
  token = rng.randn(b, 1, d).astype(np.float32)
  row = {}

  def step_fn(impl, dt):
    m = MultiHeadAttention(h, decode=True, implementation=impl, dtype=dt)
    params = m.init(jax.random.key(0), jnp.zeros((b, s, d), jnp.float32))["params"]
    cache = m.init(jax.random.key(0), jnp.zeros((b, s, d), jnp.float32))["cache"]
    _, upd = m.apply({"params": params, "cache": cache}, jnp.asarray(prefix), mutable=["cache"])  # fills s // 2

    def one(cache_):
      return m.apply({"params": params, "cache": cache_}, jnp.asarray(token), mutable=["cache"])[0]

    return jax.jit(one), upd["cache"]

  with jax.default_matmul_precision("highest"):
    f, c = step_fn("reference", jnp.float32)
    truth = f(c)
  for impl in ("fast", "reference"):
    f, c = step_fn(impl, dtype)
    cf = f.lower(c).compile()
    out = cf(c)
    row[f"{impl}_fwd_max_abs"], row[f"{impl}_fwd_max_rel"] = _errors(out, truth)
    if impl == "fast":
      row["path_fwd"] = _compiled_path(cf.as_text(), impl, jax.default_backend())
      row["vitjax_fwd_ms"] = _time(lambda fc: jax.block_until_ready(fc[0](fc[1])), (cf, c), 3 if dry else 20)
  row["ok"] = _ok(row["fast_fwd_max_rel"], row["reference_fwd_max_rel"], dtype)
  q = rng.randn(b, 1, h, k).astype(np.float32)
  kv = rng.randn(b, s, h, k).astype(np.float32)
  mask = np.broadcast_to((np.arange(s) <= s // 2)[None, None, None, :], (b, 1, 1, s))
  arrays = [a.astype(jnp.bfloat16) if dtype == jnp.bfloat16 else a for a in (q, kv, kv)]
  row["torch_fwd_ms"] = _torch_sdpa(*arrays, None, mask, False, dry)
  return row


# -- (e) a run's figures


def run_step(args) -> None:
  """steps/s, data wait and the losses of WORKDIR/metrics.jsonl; with --curve, the same steps of a CPU run beside."""
  rows = [json.loads(line) for line in open(os.path.join(args.workdir, "metrics.jsonl")) if line.strip()]
  train = [r for r in rows if "train/loss" in r]
  evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
  rates = [r["train/steps_per_s"] for r in train if "train/steps_per_s" in r]
  waits = [r["train/data_wait"] for r in train if "train/data_wait" in r]
  row = {
    "step": "run",
    "name": args.name,
    "steps": train[-1]["step"] if train else None,
    "steps_per_s_median": statistics.median(rates) if rates else None,
    "steps_per_s_last": rates[-1] if rates else None,
    "data_wait_median": statistics.median(waits) if waits else None,
    "loss": {int(r["step"]): round(r["train/loss"], 4) for r in train},
    "last_eval": {k: v for k, v in (evals[-1] if evals else {}).items() if k.startswith("eval/")},
  }
  for path in sorted(glob.glob(os.path.join(args.workdir, "eval_test_*.json"))):
    with open(path) as f:
      row["test"] = {k: v for k, v in json.load(f).items() if isinstance(v, (int, float))}
  if args.curve:
    with open(args.curve) as f:
      ref = json.load(f)
    row["cpu_loss"] = {int(s): v for s, v in ref["loss"].items() if int(s) in row["loss"]}
    diffs = [abs(row["loss"][s] - v) for s, v in row["cpu_loss"].items()]
    row["max_abs_loss_diff"] = max(diffs) if diffs else None
    row["cpu_curve"] = {k: ref[k] for k in ("command", "host", "last_eval") if k in ref}
  emit(args.out, row)


def curve_step(args) -> None:
  """Writes the CPU reference curve (--curve FILE) from a finished CPU run's WORKDIR/metrics.jsonl."""
  rows = [json.loads(line) for line in open(os.path.join(args.workdir, "metrics.jsonl")) if line.strip()]
  loss = {int(r["step"]): round(r["train/loss"], 4) for r in rows if "train/loss" in r}
  evals = [{k: v for k, v in r.items() if k.startswith("eval/")} for r in rows if any(k.startswith("eval/") for k in r)]
  with open(args.curve, "w") as f:
    json.dump(
      {"command": args.command, "host": args.host, "loss": loss, "last_eval": evals[-1] if evals else {}}, f, indent=1
    )
    f.write("\n")


def subset_step(args) -> None:
  """The first --n training and --n / 5 test examples of the Fashion-MNIST IDX files in --src, written to --dst (a
  dry run's data: preparing 70,000 images would be most of its time)."""
  import gzip

  os.makedirs(args.dst, exist_ok=True)
  for name, n in (("train", args.n), ("t10k", args.n // 5)):
    for kind, header in (("images-idx3", 16), ("labels-idx1", 8)):
      file = f"{name}-{kind}-ubyte.gz"
      with gzip.open(os.path.join(args.src, file)) as f:
        data = f.read()
      item = 28 * 28 if kind.startswith("images") else 1
      head = bytearray(data[:header])
      head[4:8] = n.to_bytes(4, "big")  # the record count
      with gzip.open(os.path.join(args.dst, file), "wb") as f:
        f.write(bytes(head) + data[header : header + n * item])


# -- the summary


def summary_step(args) -> None:
  rows = []
  for line in open(os.path.join(args.out, "gpu_check.jsonl")):
    if line.strip():
      rows.append(json.loads(line))
  steps = [r for r in rows if r["step"] == "status"]
  print("\n== gpu_check summary ==")
  for r in rows:
    if r["step"] == "env":
      print(f"device: {r['gpus'] or r['jax_devices']}  backend {r['jax_backend']}  jax {r['versions'].get('jax')}")
      print(f"  cuda {r.get('cuda')}  torch {r.get('torch')} (cuda {r.get('torch_cuda')})")
  print(f"{'step':28s} {'status':8s} {'seconds':>8s}  note")
  for r in steps:
    print(f"{r['name']:28s} {r['status']:8s} {r['seconds']:8.0f}  {r.get('note', '')}")
  att = [r for r in rows if r["step"] == "attention"]
  if att:
    print(
      f"\n{'attention':8s} {'dtype':9s} {'path f/b':16s} {'fast rel f/b':>19s} {'ref rel f/b':>19s} {'ok':>3s}"
      f" {'vitjax ms f/fb':>15s} {'xla ms f/fb':>15s} {'torch ms f/fb':>15s}"
    )
    fmt = lambda v, s=".1e": "-" if v is None else format(v, s)
    for r in att:
      if "error" in r:
        print(f"{r['case']:8s} {r['dtype']:9s} error: {r['error']}")
        continue
      print(
        f"{r['case']:8s} {r['dtype']:9s} {r.get('path_fwd', '-') + '/' + r.get('path_bwd', '-'):16s} "
        f"{fmt(r.get('fast_fwd_max_rel')):>9s}/{fmt(r.get('fast_bwd_max_rel')):9s} "
        f"{fmt(r.get('reference_fwd_max_rel')):>9s}/{fmt(r.get('reference_bwd_max_rel')):9s} "
        f"{'yes' if r.get('ok') else 'NO':>3s} "
        f"{fmt(r.get('vitjax_fwd_ms'), '.2f'):>7s}/{fmt(r.get('vitjax_fwd_bwd_ms'), '.2f'):7s} "
        f"{fmt(r.get('xla_fwd_ms'), '.2f'):>7s}/{fmt(r.get('xla_fwd_bwd_ms'), '.2f'):7s} "
        f"{fmt(r.get('torch_fwd_ms'), '.2f'):>7s}/{fmt(r.get('torch_fwd_bwd_ms'), '.2f'):7s}"
      )
  bench = []
  for path in sorted(glob.glob(os.path.join(args.out, "bench_train*.jsonl"))):
    bench += [json.loads(line) for line in open(path) if line.strip()]
  if bench:
    print(f"\n{'model':18s} {'framework':15s} {'batch':>5s} {'step ms':>9s} {'per s':>10s} {'MFU':>6s} {'x torch':>7s}")
    for r in bench:
      if r.get("step_s") is None:
        print(f"{r['model']:18s} {r['framework']:15s} {r['batch']:5d} n/a: {r.get('error', '')[:60]}")
        continue
      mfu = r.get("mfu")
      print(
        f"{r['model']:18s} {r['framework']:15s} {r['batch']:5d} {1e3 * r['step_s']:9.2f} {r['per_s']:10.1f} "
        f"{'-' if mfu is None else format(mfu, '.1%'):>6s} "
        f"{'-' if r.get('speedup_over_torch') is None else format(r['speedup_over_torch'], '.2f'):>7s}"
      )
  for r in rows:
    if r["step"] == "profile":
      cats = ", ".join(f"{k} {v:.2f}" for k, v in r["categories_ms"].items())
      print(
        f"\nprofile {r['model']} batch {r['batch']}, attention {r.get('implementation', 'fast')}: step "
        f"{r['step_ms']:.2f} ms, kernels busy {r['busy_ms']:.2f} ms,"
        f" idle {r['idle_ms']:.2f} ms; ms by category: {cats}; trace in {r['archive']}"
      )
  variants = [r for r in rows if r["step"] == "variants"]
  if variants:
    r = variants[0]
    print(f"\nvariants of {r['model']}'s bf16 step, batch {r['batch']} (x default: per example)")
    print(f"{'variant':20s} {'batch':>5s} {'step ms':>9s} {'MFU':>6s} {'x default':>9s} {'loss diff':>9s}  options")
    for r in variants:
      if "error" in r:
        print(f"{r['variant']:20s} error: {r['error'][:100]}")
        continue
      mfu, x, diff = r.get("mfu"), r.get("x_default"), r.get("loss_diff")
      print(
        f"{r['variant']:20s} {r['batch']:5d} {r['step_ms']:9.2f} {'-' if mfu is None else format(mfu, '.1%'):>6s} "
        f"{'-' if x is None else format(x, '.3f'):>9s} {'-' if diff is None else format(diff, '.1e'):>9s}  "
        f"{json.dumps(r['options'])}"
      )
  for r in rows:
    if r["step"] == "run":
      diff = r.get("max_abs_loss_diff")
      print(
        f"\nrun {r['name']}: {r['steps']} steps, {r['steps_per_s_median'] or 0:.1f} steps/s (median), data wait "
        f"{100 * (r['data_wait_median'] or 0):.0f}%, last eval {r['last_eval']}, test {r.get('test', {})}"
        + ("" if diff is None else f", max |loss - CPU loss| {diff:.4f} over {len(r['cpu_loss'])} logged steps")
      )
  failed = [r["name"] for r in steps if r["status"] != "ok"]
  print(f"\nsteps failed: {', '.join(failed) if failed else 'none'}")
  again = [r["name"] for r in steps if r["status"] in ("skipped", "timeout")]
  if again:
    print(f"not run or not finished in the time given; their own call: {args.command} --steps={','.join(again)}")


def _bf16_case(args, batch: int | None = None):
  """(bench_train's bf16 case of --model at `batch` (else --batch), seconds it took): --dry, one layer at 32 px,
  batch 2 (or `batch`)."""
  sys.path.insert(0, HERE)
  import torch  # bench_train's case builds the timm twin too
  from bench_train import MODELS, image_case

  if torch.version.cuda is None:  # the CPU build of torch: timm needs torchvision's op names defined (tests/)
    import torchvision_ops_shim  # noqa: F401

  kind, _, size = MODELS[args.model]
  batch, layers = batch or (2 if args.dry else args.batch), (1 if args.dry else 0)
  t = time.perf_counter()
  case = image_case(args.model, kind, batch, 32 if args.dry else size, "bfloat16", torch, layers=layers)
  return case, time.perf_counter() - t


# XLA options that may move ViT-B/16's bf16 step on a GPU (issue 44's MFU goal), each compiled into the same step
# with `Lowered.compile(compiler_options=...)`: one process, one case and its weights, no restart per flag.
# "attention" and "batch" are not XLA options: one swaps the model's attention implementation, the other builds the
# case at another batch (compared per example; the MFU goal is at the largest batch that fits). A name this jaxlib
# does not know fails its own row. --dry: the CPU's counterparts, to exercise the step.
VARIANTS = {
  "gpu": {
    "default": {},
    "attention_xla": {"attention": "xla"},  # XLA's attention, not cuDNN's (padded 197 -> 198)
    "no_triton_gemm": {"xla_gpu_enable_triton_gemm": False},  # cuBLAS for every GEMM, no Triton GEMM fusions
    "triton_gemm_any": {"xla_gpu_triton_gemm_any": True},  # Triton for any GEMM where autotuning finds it faster
    "cublaslt": {"xla_gpu_enable_cublaslt": True},  # cuBLASLt: bias (and GELU) epilogues fused into the GEMM
    "cudnn_layer_norm": {"xla_gpu_enable_cudnn_layer_norm": True},  # LayerNorm as cuDNN's kernel
    "no_command_buffer": {"xla_gpu_enable_command_buffer": ""},  # no CUDA graphs: what launches cost
    "batch_512": {"batch": 512},  # twice the images a step: does a larger step keep the GPU busier?
  },
  "cpu": {
    "default": {},
    "attention_xla": {"attention": "xla"},
    "no_fusion_emitters": {"xla_cpu_use_fusion_emitters": False},
    "batch_4": {"batch": 4},
  },
}
FASTER = 0.98  # a variant joins "combined" when its step takes under 98% of the default's per example


def _with_attention(case, implementation: str | None):
  """The case with its model's attention implementation swapped (None: the case itself), same weights and batch."""
  if implementation is None:
    return case
  return dataclasses.replace(case, module=case.module.clone(implementation=implementation))


def _time_variant(cases: dict, options: dict, args) -> dict:
  """One variant's row: bench_train's bare step compiled with `options` (its "attention" swapped into the model,
  its "batch" a case of its own: the same seed, more images). cases: {batch: case}, the default's first; a new
  batch's case is built once and kept there (the combined row may need it again)."""
  from bench_train import vitjax_step

  options = dict(options)
  batch = options.pop("batch", next(iter(cases)))
  if batch not in cases:
    cases[batch] = _bf16_case(args, batch)[0]
  case = _with_attention(cases[batch], options.pop("attention", None))
  r = vitjax_step(case, args.repeats, max_row_s=20.0, compiler_options=options or None)
  row = {"batch": batch, "step_ms": 1e3 * r["step_s"], "times_ms": [1e3 * x for x in r["times_s"]]}
  return row | {
    "analytic_tflop": case.analytic_flops / 1e12,
    "compile_s": r["compile_s"],
    "first_loss": r["first_loss"],
  }


def variants_step(args) -> None:
  """ViT-B/16 224 px bf16's bare training step (bench_train's, AdamW) under each of VARIANTS' options, then under
  the union of those that beat the default by 2% ("combined"): step time, MFU at --peak_tflops, time against the
  default, and the first step's loss against the default's (the same weights and batch: a variant must not change
  what the step computes beyond rounding). A variant at another batch is compared per example and has no loss
  difference (other images). A variant that fails writes its error and the next one runs."""
  import jax

  base, setup_s = _bf16_case(args)
  variants = dict(VARIANTS["cpu" if jax.default_backend() == "cpu" else "gpu"])
  if args.variants:
    variants = {k: v for k, v in variants.items() if k in args.variants.split(",") or k == "default"}
  rows, default, cases = [], None, {base.per_step: base}

  def measure(name, options):
    batch = options.get("batch", base.per_step)
    row = {"step": "variants", "model": base.name, "batch": batch, "dtype": "bfloat16", "variant": name}
    row.update(options=dict(options), setup_s=setup_s)
    try:
      row.update(_time_variant(cases, options, args))
    except Exception as e:  # an option this XLA does not know, a kernel or batch that does not fit: its row says so
      row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
    if "step_ms" in row:
      if args.peak_tflops:
        row["mfu"] = row["analytic_tflop"] / (row["step_ms"] / 1e3) / args.peak_tflops
      if default is not None:  # per example: a batch variant's step does more
        row["x_default"] = (default["step_ms"] / default["batch"]) / (row["step_ms"] / row["batch"])
        if row["batch"] == default["batch"]:
          row["loss_diff"] = abs(row["first_loss"] - default["first_loss"])
    emit(args.out, row)
    rows.append(row)
    text = row.get("error") or f"step {row['step_ms']:.2f} ms, compiled in {row['compile_s']:.1f} s"
    if "mfu" in row:
      text += f", MFU {row['mfu']:.1%}"
    if "x_default" in row:
      text += f", {row['x_default']:.3f}x the default, first loss {row['first_loss']:.5f}"
    print(f"variant {name}: {text}")
    return row

  for name, options in variants.items():
    row = measure(name, options)
    if name == "default":
      if "step_ms" not in row:
        sys.exit(f"variants: the default step failed ({row['error']}); nothing to compare with")
      default = row
  combined = combined_options(rows)
  if combined is not None:
    measure("combined", combined)


def combined_options(rows: list[dict]) -> dict | None:
  """The union of the options of the variants whose step took under FASTER x the default's per example (rows[0];
  `x_default` > 1 / FASTER), where there are at least two of them (one alone is its own row); else None."""
  better = [r for r in rows[1:] if r.get("x_default", 0.0) > 1 / FASTER]
  if len(better) < 2:
    return None
  combined = {}
  for r in sorted(better, key=lambda r: r["x_default"]):  # where two set one option, the fastest's value wins
    combined.update(r["options"])
  return combined


def profile_step(args) -> None:
  """ViT-B/16 224 px bf16's training step (experiments/bench_train.py's bare step, AdamW) traced and read op by op
  with experiments/op_profile.py's profile_vitjax, once per attention implementation in --implementations (the
  first is the models' default, "fast": cuDNN's kernels on a GPU; "xla": XLA's own attention): a row each with the
  device's busy time, the time per category, the largest ops and the dots by shape, and for the first
  OUT/profile_<model>.tar.gz (the xplane and the compiled HLO text, for a closer reading here). --dry: one layer
  at 32 px, batch 2, on the CPU."""
  from op_profile import profile_vitjax

  base, setup_s = _bf16_case(args)
  name, batch = base.name, base.per_step
  for i, implementation in enumerate(args.implementations.split(",")):  # the same weights and batch, each path
    case = _with_attention(base, implementation)
    archive, steps = os.path.join(args.out, f"profile_{name}.tar.gz") if i == 0 else None, args.profile_steps
    r = profile_vitjax(case, steps, archive=archive)
    row = {"step": "profile", "model": name, "implementation": implementation, "batch": batch, "dtype": "bfloat16"}
    row.update(steps=steps, setup_s=setup_s, analytic_tflop=case.analytic_flops / 1e12)
    row.update({k: r[k] for k in ("step_ms", "busy_ms", "planes", "events", "event_stats", "top_ops")})
    row.update(ops=r["n_ops"], ops_in_hlo=r["n_in_hlo"], kernel_ms=r["ops_own_ms"], idle_ms=r["step_ms"] - r["busy_ms"])
    row["categories_ms"] = dict(
      sorted(((c, round(sum(o.values()), 4)) for c, o in r["ops"].items()), key=lambda x: -x[1])
    )
    row.update(matmuls=r["matmuls"][:15], other_modules_ms=r["other_modules_ms"], archive=None)
    if archive:
      row["archive"], row["archive_mb"] = os.path.basename(archive), os.path.getsize(archive) / 2**20
      if row["archive_mb"] > 15.5:  # the device tool brings back files of at most 16 MiB
        os.remove(archive)
        row["archive"] = None
    emit(args.out, row)
    print(
      f"profile {name} batch {batch}, attention {implementation}: step {row['step_ms']:.2f} ms, kernels busy "
      f"{row['busy_ms']:.2f} ms (idle {row['idle_ms']:.2f}), {row['ops']} ops ({row['ops_in_hlo']} named in the HLO), "
      f"{row['events']} events"
    )
    for cat, ms in row["categories_ms"].items():
      print(f"  {cat:12s} {ms:9.3f} ms")
    for op in row["top_ops"][:12]:
      print(f"  {op['ms']:9.3f} ms  {op['category']:11s} x{op['kernels']:<4d} {op['op'][:90]}")


def status_step(args) -> None:
  emit(
    args.out, {"step": "status", "name": args.name, "status": args.status, "seconds": args.seconds, "note": args.note}
  )


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument(
    "what", choices=["env", "attention", "profile", "variants", "run", "curve", "subset", "summary", "status"]
  )
  ap.add_argument("--out", required=True)
  ap.add_argument("--dry", action="store_true")
  ap.add_argument("--cases", default="", help="attention: a comma-separated subset of vit,swin,causal,decode")
  ap.add_argument("--dtypes", default="bfloat16,float32", help="attention: the dtypes")
  ap.add_argument("--workdir")
  ap.add_argument("--name", default="")
  ap.add_argument("--curve", default="")
  ap.add_argument("--command", default="bash experiments/gpu_check.sh", help="curve: the run's; summary: this one's")
  ap.add_argument("--host", default="")
  ap.add_argument("--src", default="")
  ap.add_argument("--dst", default="")
  ap.add_argument("--n", type=int, default=2000)
  ap.add_argument("--model", default="vit_b16_224_b8", help="profile: a model of bench_train.MODELS")
  ap.add_argument("--batch", type=int, default=128, help="profile, variants: its batch")
  ap.add_argument("--variants", default="", help="variants: a comma-separated subset of VARIANTS (the default always)")
  ap.add_argument("--peak_tflops", type=float, default=0.0, help="variants: the device's dense bf16 peak, for MFU")
  ap.add_argument("--repeats", type=int, default=10, help="variants: timed steps per variant (a median)")
  ap.add_argument("--profile_steps", type=int, default=5, help="profile: steps traced (after 2 untraced)")
  ap.add_argument("--implementations", default="fast,xla", help="profile: the attention implementations, in turn")
  ap.add_argument("--status", default="")
  ap.add_argument("--seconds", type=float, default=0.0)
  ap.add_argument("--note", default="")
  args = ap.parse_args()
  os.makedirs(args.out, exist_ok=True)
  steps = {
    "env": env_step,
    "attention": attention_step,
    "profile": profile_step,
    "variants": variants_step,
    "run": run_step,
    "curve": curve_step,
    "subset": subset_step,
    "summary": summary_step,
    "status": status_step,
  }
  steps[args.what](args)


if __name__ == "__main__":
  main()
