"""Training-step time of vitjax vs PyTorch on the same machine, same model, same weights, same batch, in one run.

    taskset -c 0,1 python experiments/bench_train.py --repeats=7
    taskset -c 0,1 python experiments/bench_train.py --repeats=7 --dtype=bfloat16
    python experiments/bench_train.py --models=fashion_mnist,transformer_small --repeats=1   # a quick look
    taskset -c 0,1 python experiments/bench_train.py --models=vit_s16_224_b8,dinov2_s14_reg4_224_b8,eva02_s14_224_b8 \
      --repeats=5 --no_compile   # the modern backbones (issue 75) beside timm's VisionTransformer and Eva

On a GPU (torch's CUDA build; JAX on its default backend, the GPU), bf16 at large batches, MFU against the
H100 SXM's dense bf16 peak (989.4 TFLOP/s; experiments/gpu_check.sh runs it on a lent GPU; experiments/README.md, "On a GPU"):

    python3 experiments/bench_train.py --torch_device=cuda --dtype=bfloat16 --peak_tflops=989.4 \
      --models=vit_b16_224_b8,swin_t_224_b4,transformer_small --batch=128 --no_trainer

One step is forward, backward and the AdamW update. Rows, per model:
  vitjax          a step written here: jax.jit over value_and_grad(softmax cross-entropy) + optax.adamw (lr 1e-3,
                  weight decay 0.05 on every parameter), parameters and optimizer state donated.
  vitjax-trainer  vitjax's own step (vitjax.train.make_train_step from setup(config, task), jitted as the trainer
                  jits it): adds the config's global-norm clipping, label smoothing, the non-finite guard and the
                  schedule. Image models only: the translation task needs a SentencePiece tokenizer trained
                  from data for its loss and model sizes, so the Transformer has no such row.
  torch           eager PyTorch: timm's VisionTransformer / Eva / SwinTransformer built by vitjax.convert.build_timm
                  and loaded with the vitjax weights (load_state_dict strict=True); torch.optim.AdamW with the
                  same settings. The Fashion-MNIST ViT's convolutional stem has no timm equivalent: timm's
                  ViT gets the same stem (3x3 stride-2 convs, BatchNorm, ReLU, 1x1) as its patch embedding,
                  with the same weights. The Transformer is torch.nn.Transformer of the same sizes (post-norm,
                  ReLU, no final encoder/decoder norm, no attention dropout, as vitjax's) with shared, scaled
                  token embeddings, sinusoidal positions and a tied output projection; weights differ.
  torch.compile   the same with torch.compile on the model and on the optimizer step; "n/a" if it fails.
--dtype=bfloat16: vitjax with the model's dtype=bfloat16 (parameters float32), torch under
torch.autocast(device, dtype=torch.bfloat16) (timm with AMP); optimizer states stay float32 in both.

Times are the median of --repeats steps after a warm-up step (and after compilation). Dropout and drop-path are
the models' own (Swin-T 0.1 drop-path, transformer_small 0.1 dropout; the ViTs none), in both frameworks.
FLOPs per step, two counts: "analytic" counts only the matmuls and convolutions (forward 2 x multiply-adds of
every weight per token it applies to, plus the attention's QK^T and AV; training = 3 x forward); "XLA" is
cost_analysis() of the compiled vitjax step (it counts elementwise work too, and may over-count).
GFLOP/s = analytic FLOPs / step time; "% peak" is that over the matmul peak of the same framework in the same dtype
(JAX f32, JAX bf16, torch f32, torch bf16 square matmuls timed at the start of the run; the JAX
bf16-in/f32-accumulate matmul is measured too). "torch/vitjax" (torch rows) is vitjax's step time over that row's:
above 1, torch is faster. "x torch" (vitjax rows; speedup_over_torch) is torch eager's step time over that row's:
above 1, vitjax is faster. The parity column is the relative max error of the eval-mode logits (same weights, same
input) between vitjax and torch, before any step.

Prints a table and appends one JSON row per (model, framework, dtype) to experiments/results/bench_train.jsonl,
with the command, host and versions, and the processes that used the CPU at the start and end of the run.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tests"))  # torchvision_ops_shim
RESULTS = os.path.join(HERE, "results", "bench_train.jsonl")
LR, WEIGHT_DECAY = 1e-3, 0.05
VOCAB = 8000  # translation_config's data.vocab_size

# name: (kind, batch, image size); the Transformer's "image size" is (sentences, tokens a side)
MODELS = {
  "vit_s16_224_b8": ("vit_s16", 8, 224),
  "swin_t_224_b4": ("swin_t", 4, 224),
  "fashion_mnist": ("fashion_mnist", 128, None),
  "transformer_small": ("transformer_small", 32, 64),
  "vit_s16_224_b2": ("vit_s16", 2, 224),
  "vit_s16_320_b2": ("vit_s16", 2, 320),
  "vit_s16_448_b2": ("vit_s16", 2, 448),
  "vit_b16_224_b8": ("vit_b16", 8, 224),  # not in the default list on a CPU (--models): for a GPU
  "transformer_base": ("transformer_base", 32, 64),  # likewise (experiments/gpu_check.sh)
  # the backbones of issue 75, beside timm's same model (VisionTransformer; EVA-02: timm's Eva), likewise not default:
  "dinov2_s14_reg4_224_b8": ("dinov2_s14_reg4", 8, 224),  # registers, LayerScale, patch 14
  "eva02_s14_224_b8": ("eva02_s14", 8, 224),  # 2-D rotary positions, SwiGLU
}
NOT_DEFAULT = ("vit_b16", "transformer_base", "dinov2_", "eva02_")
DEFAULT_MODELS = [name for name in MODELS if not name.startswith(NOT_DEFAULT)]


# -- timing, peaks, host


def median_time(fn, repeats: int, warm_up: bool = True) -> tuple[float, list[float]]:
  """fn() once to warm up, then the median of `repeats` timed calls (fn must block until its work is done)."""
  if warm_up:
    fn()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times), times


def timed(fn, repeats: int, max_row_s: float) -> tuple[float, list[float]]:
  """A timed warm-up call, then the median of `repeats` calls, fewer (at least one) if they would take over max_row_s."""
  t = time.perf_counter()
  fn()
  warm = time.perf_counter() - t
  return median_time(fn, max(1, min(repeats, int(max_row_s / warm))), warm_up=False)


def _peak(make_call, sizes=(8192, 4096, 2048, 1024, 512), repeats=3, slow_s=2.0) -> dict:
  """FLOP/s of an n x n matmul: n the largest of `sizes` whose call should take under slow_s (timed at 512 first)."""
  call = make_call(512)
  call()
  t = time.perf_counter()
  call()
  t512 = time.perf_counter() - t
  n = next((s for s in sizes if t512 * (s / 512) ** 3 < slow_s), sizes[-1])
  if n != 512:
    call = make_call(n)
  t, _ = median_time(call, repeats)
  return {"n": n, "gflops_per_s": round(2 * n**3 / t / 1e9, 2)}


def matmul_peaks(torch, device, slow_s: float = 2.0) -> dict:
  def jax_mm(dtype, out=None):
    def make(n):
      a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
      b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
      f = jax.jit(lambda x, y: jax.lax.dot(x, y, preferred_element_type=out))
      return lambda: f(a, b).block_until_ready()

    return make

  def torch_mm(dtype):
    def make(n):
      g = torch.Generator().manual_seed(0)
      a, b = (torch.randn(n, n, generator=g).to(device=device, dtype=dtype) for _ in range(2))
      return lambda: torch.mm(a, b).sum().item()  # item(): waits for the device

    return make

  peaks = {
    "jax_f32": _peak(jax_mm(jnp.float32), slow_s=slow_s),
    "jax_bf16": _peak(jax_mm(jnp.bfloat16), slow_s=slow_s),
    "jax_bf16_f32acc": _peak(jax_mm(jnp.bfloat16, jnp.float32), slow_s=slow_s),
    "torch_f32": _peak(torch_mm(torch.float32), slow_s=slow_s),
    "torch_bf16": _peak(torch_mm(torch.bfloat16), slow_s=slow_s),
  }
  return peaks


def cpu_users(interval: float = 1.0, min_share: float = 0.05) -> list[dict]:
  """Processes (other than this one) that used at least min_share of a core over `interval` seconds."""

  def sample():
    out = {}
    for pid in os.listdir("/proc"):
      if not pid.isdigit():
        continue
      try:
        with open(f"/proc/{pid}/stat") as f:
          fields = f.read().rsplit(")", 1)[1].split()
        out[int(pid)] = int(fields[11]) + int(fields[12])  # utime + stime, clock ticks
      except (OSError, IndexError, ValueError):
        pass
    return out

  tick = os.sysconf("SC_CLK_TCK")
  a = sample()
  time.sleep(interval)
  b = sample()
  users = []
  for pid, ticks in b.items():
    share = (ticks - a.get(pid, ticks)) / tick / interval
    if share >= min_share and pid != os.getpid():
      try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
          cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
      except OSError:
        cmd = "?"
      users.append({"pid": pid, "cpu": round(share, 2), "cmd": cmd})
  return sorted(users, key=lambda u: -u["cpu"])


def machine_state() -> dict:
  ci = subprocess.run(["pgrep", "-f", "bash .ci/run"], capture_output=True, text=True).stdout.split()
  return {"loadavg": [round(x, 2) for x in os.getloadavg()], "ci_running": bool(ci), "cpu_users": cpu_users()}


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile")


def cpu_flags() -> dict:
  """Which of the instruction sets that matter for matmuls the CPU has (from /proc/cpuinfo)."""
  from vitjax.models import network as network_lib

  flags = network_lib.cpu_flags()
  return {k: k in flags for k in CPU_FLAGS}


def git_revision() -> str:
  """The commit the benchmark ran at, with "+dirty" when the working tree had changes ("" outside a checkout). The
  results folder does not count: the benchmarks append their rows there as they go."""
  run = lambda *a: subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True).stdout.strip()
  rev = run("rev-parse", "--short", "HEAD")
  changed = run("status", "--porcelain", "--untracked-files=no", "--", ".", ":!experiments/results")
  return rev + ("+dirty" if rev and changed else "")


def host_info(torch, timm) -> dict:
  model = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  import flax

  return {
    "platform": platform.platform(),
    "cpu": model,
    "cpu_count": os.cpu_count(),
    "affinity": sorted(os.sched_getaffinity(0)),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "flax": flax.__version__,
    "optax": optax.__version__,
    "torch": torch.__version__,
    "timm": timm.__version__,
    "torch_threads": torch.get_num_threads(),
  }


# -- analytic FLOPs (matmuls and convolutions only; forward)


def vit_flops(m, hw: tuple[int, int], channels: int) -> float:
  p = tuple(m.patch_size) if isinstance(m.patch_size, (tuple, list)) else (m.patch_size,) * 2
  gh, gw = hw[0] // p[0], hw[1] // p[1]
  d, f = m.width, m.mlp_dim or 4 * m.width
  if m.stem == "patch":
    flops = 2 * gh * gw * p[0] * p[1] * channels * d
  else:  # ConvStem: log2(p) 3x3 stride-2 convolutions, then a 1x1 to the width
    n, (h, w), cin, flops = int(math.log2(p[0])), hw, channels, 0
    for i in range(n):
      cout, h, w = max(d // 2 ** (n - 1 - i), 8), (h + 1) // 2, (w + 1) // 2
      flops += 2 * h * w * 9 * cin * cout
      cin = cout
    flops += 2 * h * w * cin * d
  t = gh * gw + int(m.has_class_token) + m.num_registers
  ffn = 3 if m.ffn == "swiglu" else 2  # SwiGLU: two d x f matrices in, one out
  flops += m.depth * (2 * t * (4 * d * d + ffn * d * f) + 4 * t * t * d)
  return flops + 2 * d * (m.num_classes or 0)


def swin_flops(m, hw: tuple[int, int], channels: int) -> float:
  h, w, c = hw[0] // m.patch_size, hw[1] // m.patch_size, m.embed_dim
  window = m.window_size if isinstance(m.window_size, int) else m.window_size[0]
  flops = 2 * h * w * m.patch_size**2 * channels * c
  for s, depth in enumerate(m.depths):
    if s > 0:
      h, w = (h + 1) // 2, (w + 1) // 2
      flops += 2 * h * w * 4 * c * 2 * c  # patch merging: 4C -> 2C
      c *= 2
    n, win = h * w, min(window, h) * min(window, w)
    flops += depth * (2 * n * (4 * c * c + 2 * c * int(c * m.mlp_ratio)) + 4 * n * win * c)
  return flops + 2 * c * (m.num_classes or 0)


def transformer_flops(m, s: int, t: int) -> float:
  d, f, n = m.d_model, m.d_ff, m.num_layers
  enc = n * (2 * s * (4 * d * d + 2 * d * f) + 4 * s * s * d)
  # decoder: self-attention (the full T x T logits, masked), cross-attention (q, out on T; k, v on S), FFN
  dec = n * (2 * t * (4 * d * d + 2 * d * d + 2 * d * f) + 2 * s * 2 * d * d + 4 * t * t * d + 4 * t * s * d)
  return enc + dec + 2 * t * d * (m.tgt_vocab_size or m.vocab_size)


# -- the models


@dataclasses.dataclass
class Case:
  name: str
  module: Any  # the vitjax model in the benchmark's dtype
  variables: dict  # float32
  x: tuple  # numpy inputs of the vitjax model
  y: np.ndarray  # integer labels
  units: str  # "examples" | "tokens"
  per_step: int  # examples or target tokens per step
  analytic_flops: float  # per training step
  config: Any = None  # the vitjax config for make_train_step (None: no trainer row)
  trainer_skip: str = ""
  torch_model: Any = None
  torch_x: tuple = ()
  torch_skip: str = ""
  info: dict = dataclasses.field(default_factory=dict)


def _image_config(kind: str, image_size: int, batch: int, dtype: str):
  import ml_collections as mlc

  from vitjax.config import default_config, load_module

  if kind == "fashion_mnist":
    c = load_module(os.path.join(ROOT, "configs", "vit_fashion_mnist.py")).get_config()
    channels, classes = 1, 10  # Fashion-MNIST: grey, 10 classes
  else:
    c = default_config()
    c.model = mlc.ConfigDict({"name": kind, "num_classes": 1000})
    c.data.image_size = image_size
    channels, classes = 3, 1000
  c.batch_size = batch
  c.compute_dtype = dtype
  return c, channels, classes


def _torch_conv_stem(torch, stem_params: dict, stats: dict):
  """timm-side copy of vitjax's ConvStem (3x3 stride-2 conv, BatchNorm, ReLU; ...; 1x1 conv) and its state dict."""
  nn = torch.nn
  layers, sd, i = [], {}, 0
  while f"conv_{i}" in stem_params:
    k = np.asarray(stem_params[f"conv_{i}"]["kernel"])  # [3, 3, Cin, Cout]
    layers += [nn.Conv2d(k.shape[2], k.shape[3], 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(k.shape[3])]
    layers.append(nn.ReLU())
    j = len(layers) - 3
    sd[f"{j}.weight"] = k.transpose(3, 2, 0, 1)
    bn, st = stem_params[f"bn_{i}"], stats[f"bn_{i}"]
    sd[f"{j + 1}.weight"], sd[f"{j + 1}.bias"] = np.asarray(bn["scale"]), np.asarray(bn["bias"])
    sd[f"{j + 1}.running_mean"], sd[f"{j + 1}.running_var"] = np.asarray(st["mean"]), np.asarray(st["var"])
    sd[f"{j + 1}.num_batches_tracked"] = np.zeros((), np.int64)
    i += 1
  k = np.asarray(stem_params["proj"]["kernel"])
  layers.append(nn.Conv2d(k.shape[2], k.shape[3], 1))
  sd[f"{len(layers) - 1}.weight"] = k.transpose(3, 2, 0, 1)
  sd[f"{len(layers) - 1}.bias"] = np.asarray(stem_params["proj"]["bias"])
  return nn.Sequential(*layers), sd


def image_case(name: str, kind: str, batch: int, image_size: int | None, dtype: str, torch, layers: int = 0) -> Case:
  from vitjax import convert, models
  from vitjax.train import build_model

  config, channels, classes = _image_config(kind, image_size, batch, dtype)
  # head_zeroinit=False (ViT): a zero head would make the parity check compare zeros
  overrides = {"head_zeroinit": False} if models.vit.parse_name(kind) or kind == "fashion_mnist" else {}
  if layers:  # --layers: a toy depth (gpu_check.sh --dry)
    overrides.update({"depths": (layers,) * 4} if kind.startswith("swin") else {"depth": layers})
  config.model.update(overrides)
  module = build_model(config)
  size = config.data.image_size
  hw = (size, size) if isinstance(size, int) else tuple(size)
  rng = np.random.RandomState(0)
  x = rng.randn(batch, *hw, channels).astype(np.float32)
  y = rng.randint(0, classes, size=(batch,)).astype(np.int32)
  module32 = module.clone(dtype=None)
  variables = jax.device_get(jax.jit(lambda: module32.init(jax.random.key(0), jnp.asarray(x[:1])))())
  variables = jax.tree.map(np.asarray, variables)
  if isinstance(module, models.ViT):
    fwd = vit_flops(module, hw, channels)
  else:
    fwd = swin_flops(module, hw, channels)
  case = Case(name, module, variables, (x,), y, "examples", batch, 3 * batch * fwd, config=config)
  case.info = {"image_size": list(hw), "channels": channels, "classes": classes, "model_config": config.model.to_dict()}

  # the same weights in timm
  params = variables["params"]
  stem = getattr(module, "stem", "patch")
  if stem == "conv":  # timm's ViT with the conv stem as its patch embedding: convert the rest with a stand-in patchify
    p = tuple(module.patch_size)
    fake = {k: v for k, v in params.items() if k != "conv_stem"}
    fake["embedding"] = {"kernel": np.zeros((*p, channels, module.width), np.float32), "bias": np.zeros(module.width)}
    sd, cfg = convert.to_timm(module32.clone(stem="patch"), {"params": fake}, hw)
    sd = {k: v for k, v in sd.items() if not k.startswith("patch_embed.proj.")}
    proj, stem_sd = _torch_conv_stem(torch, params["conv_stem"], variables["batch_stats"]["conv_stem"])
    sd.update({f"patch_embed.proj.{k}": v for k, v in stem_sd.items()})
  else:
    sd, cfg = convert.to_timm(module32, variables, hw)
    proj = None
  cfg = copy.deepcopy(cfg)
  cfg["kwargs"]["drop_path_rate"] = float(getattr(module, "drop_path_rate", 0.0))
  ref = convert.build_timm(cfg)
  if proj is not None:
    ref.patch_embed.proj = proj
  ref.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()}, strict=True)
  case.torch_model = ref
  case.torch_x = (torch.from_numpy(x.transpose(0, 3, 1, 2).copy()),)
  case.info["timm_class"] = type(ref).__name__
  return case


def _sinusoidal(n: int, d: int) -> np.ndarray:
  from vitjax.posenc import sinusoidal_1d

  return np.asarray(sinusoidal_1d(n, d), np.float32)


def transformer_case(name: str, kind: str, sentences: int, tokens: int, dtype: str, torch, layers: int = 0) -> Case:
  from vitjax import models

  module = models.create(kind, vocab_size=VOCAB, **({"num_layers": layers} if layers else {}))
  if dtype == "bfloat16":
    module = module.clone(dtype=jnp.bfloat16)
  rng = np.random.RandomState(0)
  src = rng.randint(3, VOCAB, size=(sentences, tokens)).astype(np.int32)  # no padding, no special ids
  tgt = rng.randint(3, VOCAB, size=(sentences, tokens)).astype(np.int32)
  module32 = module.clone(dtype=None)
  variables = jax.device_get(jax.jit(lambda: module32.init(jax.random.key(0), jnp.asarray(src), jnp.asarray(tgt)))())
  variables = jax.tree.map(np.asarray, variables)
  fwd = transformer_flops(module, tokens, tokens)
  case = Case(name, module, variables, (src, tgt), tgt, "tokens", sentences * tokens, 3 * sentences * fwd)
  case.trainer_skip = "the translation task needs a SentencePiece tokenizer trained from data"
  case.info = {"sentences": sentences, "tokens_per_side": tokens, "vocab": VOCAB}

  nn = torch.nn

  class TorchTransformer(nn.Module):
    def __init__(self, m):
      super().__init__()
      d = m.d_model
      self.d, self.bos, self.pad = d, m.bos_id, m.pad_id
      self.embed = nn.Embedding(m.vocab_size, d)
      nn.init.normal_(self.embed.weight, std=d**-0.5)
      self.register_buffer("pos", torch.from_numpy(_sinusoidal(m.max_len, d)), persistent=False)
      self.drop = nn.Dropout(m.dropout_rate)
      self.core = nn.Transformer(
        d,
        m.num_heads,
        m.num_layers,
        m.num_layers,
        m.d_ff,
        m.dropout_rate,
        activation="relu",
        layer_norm_eps=1e-6,
        batch_first=True,
        norm_first=False,
      )
      self.core.encoder.norm = None  # vitjax's post-norm stacks end without a final LayerNorm
      self.core.decoder.norm = None
      for mod in self.core.modules():
        if isinstance(mod, nn.MultiheadAttention):
          mod.dropout = 0.0  # vitjax: attention_dropout_rate 0

    def forward(self, src, tgt):
      tgt_in = torch.cat([torch.full_like(tgt[:, :1], self.bos), tgt[:, :-1]], 1)
      scale = math.sqrt(self.d)
      xs = self.drop(self.embed(src) * scale + self.pos[: src.shape[1]])
      xt = self.drop(self.embed(tgt_in) * scale + self.pos[: tgt.shape[1]])
      pad = src == self.pad
      causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
      out = self.core(
        xs,
        xt,
        tgt_mask=causal,
        src_key_padding_mask=pad,
        memory_key_padding_mask=pad,
        tgt_is_causal=True,
      )
      return out @ self.embed.weight.T  # tied output projection

  torch.manual_seed(0)
  ref = TorchTransformer(module)
  n_jax = sum(v.size for v in jax.tree.leaves(variables["params"]))
  n_torch = sum(p.numel() for p in ref.parameters())
  case.torch_model = ref
  case.torch_x = (torch.from_numpy(src).long(), torch.from_numpy(tgt).long())
  case.info.update(params_vitjax=int(n_jax), params_torch=int(n_torch))
  return case


# -- the steps


def compiled_step(case: Case, compiler_options: dict | None = None):
  """vitjax's bare training step for a case (AdamW, no trainer), compiled: (compiled, state list, xs, y, rng),
  where compiled(*state, xs, y, rng) -> (*new state, loss) donates the state. `compiler_options`: XLA options for
  this compilation alone (e.g. {"xla_gpu_enable_triton_gemm": False}; an unknown name is XLA's error)."""
  module, variables = case.module, case.variables
  tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
  model_state0 = {k: v for k, v in variables.items() if k != "params"}

  def loss_fn(params, model_state, xs, y, rng):
    out, new_state = module.apply(
      {"params": params, **model_state}, *xs, train=True, rngs={"dropout": rng}, mutable=list(model_state)
    )
    loss = optax.softmax_cross_entropy_with_integer_labels(out[0].astype(jnp.float32), y).mean()
    return loss, dict(new_state)

  def step(params, opt_state, model_state, xs, y, rng):
    (loss, model_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, model_state, xs, y, rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, model_state, loss

  params = jax.device_put(variables["params"])
  state = [params, jax.jit(tx.init)(params), jax.device_put(model_state0)]
  xs, y, rng = tuple(jax.device_put(a) for a in case.x), jax.device_put(case.y), jax.random.key(1)
  lowered = jax.jit(step, donate_argnums=(0, 1, 2)).lower(*state, xs, y, rng)
  return lowered.compile(compiler_options=compiler_options), state, xs, y, rng


def step_runner(compiled, state: list, xs, y, rng, losses: list):
  """A call that runs the compiled step once, carries its state forward and appends its loss (which blocks)."""

  def once():
    *new, loss = compiled(*state, xs, y, rng)
    state[:] = new
    losses.append(float(loss))  # blocks until the step is done

  return once


def vitjax_step(case: Case, repeats: int, max_row_s: float, compiler_options: dict | None = None) -> dict:
  t = time.perf_counter()
  compiled, *args = compiled_step(case, compiler_options)
  compile_s = time.perf_counter() - t
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  losses = []
  once = step_runner(compiled, *args, losses)
  once()  # the first step: its loss is the one before any update
  med, times = timed(once, repeats, max_row_s)
  return {
    "step_s": med,
    "times_s": times,
    "compile_s": compile_s,
    "xla_flops": float(cost.get("flops", float("nan"))),
    "first_loss": losses[0],
  }


def trainer_step(case: Case, repeats: int, max_row_s: float) -> dict:
  from vitjax.tasks import ImageClassification
  from vitjax.train import initial_state, make_train_step, setup

  c, info = case.config, case.info
  described = {
    "task": "classification",
    "num_classes": info["classes"],
    "class_names": [str(i) for i in range(info["classes"])],
    "channels": info["channels"],
    "image_size": info["image_size"],
  }
  task = ImageClassification(c, "", described)  # described: no dataset needed
  exp = setup(c, task, total_steps=1000)
  state = initial_state(exp)
  fn = jax.jit(
    make_train_step(exp.model, exp.tx, exp.schedule, c, task, exp.state_sharding.params),
    in_shardings=(exp.state_sharding, exp.batch_sharding),
    out_shardings=(exp.state_sharding, None),
    donate_argnums=0,
  )
  batch = jax.device_put({"image": case.x[0], "label": case.y}, exp.batch_sharding)
  t = time.perf_counter()
  compiled = fn.lower(state, batch).compile()
  compile_s = time.perf_counter() - t
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  box = [state]

  def once():
    box[0], metrics = compiled(box[0], batch)
    float(metrics["train/loss"])

  once()
  med, times = timed(once, repeats, max_row_s)
  return {"step_s": med, "times_s": times, "compile_s": compile_s, "xla_flops": float(cost.get("flops", float("nan")))}


def torch_step(case: Case, repeats: int, max_row_s: float, dtype: str, compile_: bool, torch, device) -> dict:
  import torch.nn.functional as F

  model = copy.deepcopy(case.torch_model).to(device).train()
  opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
  y = torch.from_numpy(case.y).long().reshape(-1).to(device)
  xs = tuple(x.to(device) for x in case.torch_x)
  fwd, opt_step = model, opt.step
  if compile_:
    fwd = torch.compile(model)
    opt_step = torch.compile(opt.step, fullgraph=False)

  def once():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
      out = fwd(*xs)
    loss = F.cross_entropy(out.float().reshape(y.shape[0], -1), y)
    loss.backward()
    opt_step()
    return loss.detach().item()  # item(): waits for the device

  t = time.perf_counter()
  first_loss = once()  # compiles, for torch.compile
  first_s = time.perf_counter() - t
  med, times = timed(once, repeats, max_row_s)
  return {
    "step_s": med,
    "times_s": times,
    "compile_s" if compile_ else "first_step_s": first_s,
    "first_loss": first_loss,
  }


def parity(case: Case, dtype: str, torch, device) -> float:
  """Relative max error of the eval-mode logits, vitjax vs torch, same weights and input (image models)."""
  out = jax.jit(lambda v, x: case.module.apply(v, x)[0])(case.variables, case.x[0])
  want_model = copy.deepcopy(case.torch_model).to(device).eval()
  with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
    want = want_model(*(x.to(device) for x in case.torch_x)).float().cpu().numpy()
  return float(np.abs(np.asarray(out) - want).max() / np.abs(want).max())


# -- main


def start(ap, args):
  """(model names of --models, torch, timm): an unknown name is the parser's error; torch and timm imported late
  (after JAX), with the CPU build's torchvision op names defined."""
  names = args.models.split(",")
  unknown = [n for n in names if n not in MODELS]
  if unknown:
    ap.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")

  import torch

  if torch.version.cuda is None:  # the CPU build of torch: timm needs torchvision's op names defined (tests/)
    import torchvision_ops_shim  # noqa: F401

  # isort: split
  import timm

  return names, torch, timm


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
  ap.add_argument("--torch_device", default="cpu", help="where torch runs: cpu, or cuda on a GPU (JAX: its default)")
  ap.add_argument("--peak_tflops", type=float, default=0.0, help="the accelerator's spec peak: adds an MFU column")
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--peak_s", type=float, default=2.0, help="the matmul peaks' size: the largest n x n under this")
  ap.add_argument("--max_row_s", type=float, default=20.0, help="fewer repeats (at least 1) for rows slower than this")
  ap.add_argument(
    "--max_step_s", type=float, default=30.0, help="skip torch rows whose step would take longer at torch's matmul peak"
  )
  ap.add_argument("--batch", type=int, default=0, help="override every model's batch (0: the models' own)")
  ap.add_argument("--layers", type=int, default=0, help="override the depth (Swin: each stage's); 0: the models' own")
  ap.add_argument("--size", type=int, default=0, help="override the image size (Transformer: tokens a side); 0: own")
  ap.add_argument("--no_compile", action="store_true", help="skip the torch.compile rows")
  ap.add_argument("--no_trainer", action="store_true", help="skip the vitjax-trainer rows")
  ap.add_argument("--out", default=RESULTS)
  args = ap.parse_args()
  names, torch, timm = start(ap, args)
  device = torch.device(args.torch_device)
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  command = " ".join([os.path.basename(sys.executable)] + sys.argv)
  taskset = subprocess.run(["taskset", "-pc", str(os.getpid())], capture_output=True, text=True).stdout.strip()
  before = machine_state()
  host = host_info(torch, timm)
  print(f"host: {host['cpu']}, {host['cpu_count']} CPUs ({taskset}), jax {jax.__version__}, torch {torch.__version__}")
  print(f"before: load {before['loadavg']}, CI running: {before['ci_running']}, busy: {before['cpu_users']}")
  peaks = matmul_peaks(torch, device, args.peak_s)
  print("matmul peaks (GFLOP/s): " + ", ".join(f"{k} {v['gflops_per_s']:.1f} (n={v['n']})" for k, v in peaks.items()))
  own_peak = {
    "vitjax": peaks["jax_f32" if args.dtype == "float32" else "jax_bf16"]["gflops_per_s"],
    "torch": peaks["torch_f32" if args.dtype == "float32" else "torch_bf16"]["gflops_per_s"],
  }
  own_peak["vitjax-trainer"] = own_peak["vitjax"]
  own_peak["torch.compile"] = own_peak["torch"]

  run = {
    "command": command,
    "taskset": taskset,
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "host": host,
    "cpu_flags": cpu_flags(),
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "git": git_revision(),
    "peaks": peaks,
    "machine_before": before,
    "jax_backend": jax.default_backend(),
    "jax_devices": [str(d) for d in jax.devices()],
    "torch_device": args.torch_device,
    "peak_tflops": args.peak_tflops or None,
    "lr": LR,
    "weight_decay": WEIGHT_DECAY,
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  rows = []

  def write(name, case, results, frameworks, err, batch):
    """Appends the rows of `frameworks` (keys of results) to --out; returns the machine's state after."""
    xla = results["vitjax"]["xla_flops"]
    t_jax = results["vitjax"]["step_s"]
    t_torch = results.get("torch", {}).get("step_s")
    model_rows = []
    for fw in frameworks:
      r = results[fw]
      row = {
        "model": name,
        "framework": fw,
        "dtype": args.dtype,
        "batch": batch,
        **case.info,
        "units": case.units,
        "per_step": case.per_step,
        "analytic_gflop_per_step": round(case.analytic_flops / 1e9, 3),
        "xla_gflop_per_step": round(xla / 1e9, 3),
        "xla_over_analytic": round(xla / case.analytic_flops, 3),
        "parity_rel_err": err,
      }
      if "error" in r:
        row.update(step_s=None, error=r["error"])
      else:
        t = r["step_s"]
        gfs = case.analytic_flops / t / 1e9
        row.update(
          step_s=round(t, 5),
          times_s=[round(x, 5) for x in r["times_s"]],
          repeats=len(r["times_s"]),
          per_s=round(case.per_step / t, 2),
          gflops_per_s=round(gfs, 2),
          xla_gflops_per_s=round(xla / t / 1e9, 2) if fw.startswith("vitjax") else None,
          share_of_own_peak=round(gfs / own_peak[fw], 4),
          share_of_best_f32_peak=round(
            gfs / max(peaks["jax_f32"]["gflops_per_s"], peaks["torch_f32"]["gflops_per_s"]), 4
          ),
          torch_over_vitjax=round(t_jax / t, 3) if fw.startswith("torch") else None,
          speedup_over_torch=round(t_torch / t, 3) if fw.startswith("vitjax") and t_torch else None,
        )
        if args.peak_tflops:
          row["mfu"] = round(gfs / (args.peak_tflops * 1e3), 4)  # model FLOPs / the spec's dense peak
        for k in ("compile_s", "first_step_s"):
          if k in r:
            row[k] = round(r[k], 2)
        if fw == "vitjax-trainer":
          row["trainer_xla_gflop_per_step"] = round(r["xla_flops"] / 1e9, 3)
        if "first_loss" in r:
          row["first_loss"] = round(r["first_loss"], 5)
      model_rows.append(row)
      _print_row(row)
    # rows as soon as they are measured: a run stopped by a time limit (in torch.compile, say) keeps them
    after = machine_state()
    with open(args.out, "a") as f:
      for row in model_rows:
        f.write(json.dumps({**row, **run, "machine_after": after}) + "\n")
    rows.extend(model_rows)
    return after

  for name in names:
    kind, batch, size = MODELS[name]
    batch, size = args.batch or batch, args.size or size
    t0 = time.perf_counter()
    if kind.startswith("transformer"):
      case = transformer_case(name, kind, batch, size, args.dtype, torch, args.layers)
    else:
      case = image_case(name, kind, batch, size, args.dtype, torch, args.layers)
    err = parity(case, args.dtype, torch, device) if case.units == "examples" else None
    results, reps = {}, (args.repeats, args.max_row_s)
    results["vitjax"] = vitjax_step(case, *reps)
    if case.config is None or args.no_trainer:
      results["vitjax-trainer"] = {"error": case.trainer_skip or "skipped (--no_trainer)"}
    else:
      results["vitjax-trainer"] = trainer_step(case, *reps)
    predicted = case.analytic_flops / (own_peak["torch"] * 1e9)  # at least this long, at torch's matmul peak
    if predicted > args.max_step_s:
      skip = {
        "error": f"skipped: at least {predicted:.0f} s a step at torch's {args.dtype} matmul peak "
        f"({own_peak['torch']:.1f} GFLOP/s) > --max_step_s={args.max_step_s:g}"
      }
      results["torch"] = results["torch.compile"] = skip
    else:
      results["torch"] = torch_step(case, *reps, args.dtype, False, torch, device)
    after = write(name, case, results, ("vitjax", "vitjax-trainer", "torch"), err, batch)
    if "torch.compile" in results:  # skipped with torch above
      pass
    elif args.no_compile:
      results["torch.compile"] = {"error": "skipped (--no_compile)"}
    else:
      try:
        results["torch.compile"] = torch_step(case, *reps, args.dtype, True, torch, device)
      except Exception as e:  # inductor needs a C++ toolchain and can fail in many ways
        results["torch.compile"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
      torch._dynamo.reset()
    after = write(name, case, results, ("torch.compile",), err, batch)
    print(f"  ({name}: {time.perf_counter() - t0:.0f} s)", flush=True)

  print(f"after: load {after['loadavg']}, CI running: {after['ci_running']}, busy: {after['cpu_users']}")
  print()
  _print_table(rows)


def _fmt(v, spec):
  return "n/a" if v is None else format(v, spec)


def _print_row(r):
  if r.get("error"):
    print(f"{r['model']:18s} {r['framework']:15s} n/a: {r['error']}", flush=True)
    return
  print(
    f"{r['model']:18s} {r['framework']:15s} {r['step_s'] * 1e3:9.1f} ms  {r['per_s']:9.1f} {r['units']}/s  "
    f"{r['gflops_per_s']:6.1f} GFLOP/s ({r['share_of_own_peak']:.0%} of peak)  "
    + (f"torch/vitjax {_fmt(r['torch_over_vitjax'], '.2f')}" if r["framework"].startswith("torch") else "")
    + (f"x torch {_fmt(r.get('speedup_over_torch'), '.2f')}" if r["framework"].startswith("vitjax") else "")
    + (f"  MFU {r['mfu']:.1%}" if "mfu" in r else "")
    + (f"  compile {r['compile_s']:.1f} s" if "compile_s" in r else "")
    + (f"  (x{r['repeats']})" if r["repeats"] < 3 else ""),
    flush=True,
  )


def _print_table(rows):
  head = (
    f"{'model':18s} {'framework':15s} {'dtype':8s} {'step ms':>9s} {'per s':>9s} {'GFLOP/s':>8s} {'%peak':>6s} "
    f"{'torch/vj':>8s} {'x torch':>7s} {'GFLOP an.':>9s} {'GFLOP XLA':>9s} {'parity':>8s}"
  )
  print(head)
  print("-" * len(head))
  for r in rows:
    ok = r.get("step_s") is not None
    print(
      f"{r['model']:18s} {r['framework']:15s} {r['dtype']:8s} "
      f"{_fmt(r['step_s'] * 1e3 if ok else None, '9.1f'):>9s} {_fmt(r.get('per_s'), '9.1f'):>9s} "
      f"{_fmt(r.get('gflops_per_s'), '8.1f'):>8s} {_fmt(r.get('share_of_own_peak') and 100 * r['share_of_own_peak'], '5.1f'):>6s} "
      f"{_fmt(r.get('torch_over_vitjax'), '8.2f'):>8s} {_fmt(r.get('speedup_over_torch'), '7.2f'):>7s} "
      f"{r['analytic_gflop_per_step']:9.1f} {r['xla_gflop_per_step']:9.1f} "
      f"{_fmt(r['parity_rel_err'], '8.1e'):>8s}"
    )
  print("per s: examples/s (tokens/s, target side, for transformer_small); %peak: of the same framework's matmul peak")
  print("in this dtype; torch/vj (torch rows): vitjax step time / this row's (above 1: torch faster); x torch (vitjax")
  print("rows): torch eager's step time / this row's (above 1: vitjax faster, issue 28's measure); GFLOP an./XLA: per")
  print("step, analytic (matmuls) and XLA's cost analysis of the vitjax step; parity: eval logits, rel. max error.")


if __name__ == "__main__":
  main()
