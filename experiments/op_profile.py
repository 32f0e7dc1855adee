"""Per-op accounting of one CPU training step, vitjax against PyTorch: where the time goes, by category.

    taskset -c 0,1 python experiments/op_profile.py --models=swin_t_224_b4,vit_s16_224_b8,transformer_small
    taskset -c 0,1 python experiments/op_profile.py --models=swin_t_224_b4 --dtype=bfloat16
    python experiments/op_profile.py --models=fashion_mnist --steps=1   # a quick look

The models, weights, batches and steps are experiments/bench_train.py's (its builders image_case /
transformer_case, its compiled_step and its eager torch_step are called as they are): one step is forward, backward
and the AdamW update, on the CPU. Each framework runs the step 2 + --steps times; the last --steps are profiled.

  vitjax  jax.profiler traces the last --steps steps; jaxlib's own reader of the trace (jax.profiler.ProfileData,
          no xprof needed) gives, on the CPU, one event per executed thunk of the XLA runtime, i.e. per HLO
          instruction of the entry computation (a fusion, a dot, a copy, ...; the thunks a call / while thunk runs
          are counted, not the call itself), and on a GPU one per kernel, each with its HLO op, module and run id. XLA runs independent thunks concurrently: each moment of the step is split
          equally among the ops running then, so the ops' times sum to the time during which any op ran (their
          own durations, summed, are printed too). Each op is categorised from the compiled HLO text
          (compiled.as_text()): its opcode or, for a fusion, a vote of the instructions it fuses, from their
          metadata: the primitive's name stack and the Python stack (file, function, line) that traced it, e.g.
          flax's LayerNorm.__call__ -> norms, optax -> optimizer, vitjax.models.swin.window_partition -> window.
  torch   torch.profiler (CPU activity) over the same steps: self CPU time of every aten op and autograd node
          (the per-op times that key_averages() sums by name), categorised by the op's name and, for generic ops
          (mul, add, empty, ...), by the op, node or scope around it: the optimizer step, a window function, the
          attention module (record_function scopes this script adds, for the run, around timm's / torch's
          attention forward, Swin's window_partition, window_reverse and relative-bias gather); a backward op takes
          the scopes of the forward op that made its autograd node (same sequence number).

Categories (both frameworks):
  matmul       dots, matmuls and convolutions: XLA, any fusion containing a dot or convolution (attention's QK^T
               fusion takes the softmax's max and exp with it), and a Dense layer's bias add / bias gradient;
               torch, mm/addmm/bmm/matmul/linear/convolution and what runs inside their backward nodes (the bias
               gradient's sum). Attention's QK^T and AV are here where they are separate matmuls (vitjax on the CPU,
               timm's Swin): the "attention's own matmuls" line gives their share
  attention    the rest of attention's core (softmax, scale, bias and mask), and the fused kernels that contain
               their matmuls: cuDNN's (vitjax's "fast" attention on a GPU, a custom call) and torch's
               scaled_dot_product_attention (timm's ViT, torch's MultiheadAttention): compare "matmul + attention"
               across frameworks
  norms        LayerNorm / BatchNorm forward and backward
  activations  GELU / ReLU / tanh / erf and their derivatives
  window       Swin's window partition / reverse, cyclic shift (roll) and the relative-position-bias gather,
               forward and backward
  optimizer    AdamW's update (optax's transforms and apply_updates; torch's Optimizer.step, zero_grad)
  copies       transposes, copies, reshapes, broadcasts, concatenations, slices, pads, casts outside the above
  other        the rest: residual adds, dropout / drop-path (random bits), the loss, embeddings, ...
Columns: vitjax ms and torch ms, time per step in the category (op times summed, over the profiled steps); diff =
vitjax - torch (above 0: vitjax spends longer there). Below: the sum over categories, the wall time of the profiled
steps (bench_train's own timing of each step, mean) and their difference, time in no op (Python, dispatch, the
runtime, waiting; for torch the profiler's per-op overhead too). The "x torch >= 1.2" line is issue 28's goal as a
budget: vitjax's step may take torch's / 1.2; its matmuls and attention take what they take, and the rest of its
step (norms, activations, copies, runtime, ...) must fit in what is left, printed beside torch's own rest. --top
lists each category's largest ops. The machine's load is printed: on a busy machine an op that loses its core
mid-way is charged the wait.

Appends one JSON line per (model, framework, category) to --out (experiments/results/op_profile.jsonl), with the
command, date, host (bench_train.host_info), CPU flags (avx512_bf16, amx_bf16, ...) and the machine's load.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import glob
import io
import json
import linecache
import os
import re
import statistics
import sys
import tarfile
import tempfile
import time

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_train import (  # noqa: E402
  MODELS,
  compiled_step,
  cpu_flags,
  git_revision,
  host_info,
  image_case,
  machine_state,
  start,
  step_runner,
  torch_step,
  transformer_case,
)

RESULTS = os.path.join(HERE, "results", "op_profile.jsonl")
CATEGORIES = ("matmul", "attention", "norms", "activations", "window", "optimizer", "copies", "other")
GOAL = 1.2  # issue 28: torch's step time over vitjax's
# -- the compiled HLO: instructions, what they fuse, the Python stack that traced them

_INSTR = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"(?<![\w.\-%$])([a-z][a-z0-9\-]*)\(")
_CALLED = re.compile(
  r"\b(calls|to_apply|body|condition|branch_computations|called_computations)=(\{[^}]*\}|%?[\w.\-]+)"
)
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_SOURCE = re.compile(r'source_file="([^"]*)"\s+source_line=(\d+)')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_KV = re.compile(r"(\w+)=(\d+)")
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")

MATMUL_OPS = {"dot", "convolution"}
# data movement: copies, unless a window function or the optimizer did it
MOVE_OPS = set(
  "copy transpose reshape bitcast broadcast concatenate slice dynamic-slice dynamic-update-slice pad reverse "
  "copy-start copy-done bitcast-convert convert".split()
)
GLUE_OPS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "broadcast", "reshape", "convert", "iota"}
WINDOW_FUNCTIONS = {"window_partition", "window_reverse", "shift_attention_mask", "relative_position_index"}
WINDOW_FUNCTIONS.add("RelativePositionBias.__call__")  # the relative-bias gather (vitjax.posenc)
_NORM_FUNCTION = re.compile(r"^(\w*Norm)\.__call__$|^_normalize$|^_compute_stats")
_ACT_LINE = re.compile(r"\b(activation|act_fn|gelu|relu|relu6|silu|swish|sigmoid|tanh|elu|mish|softplus)\s*\(")
ACT_FUNCTIONS = {"gelu"}  # vitjax.layers.gelu: its own lines call erf, not an activation
_ROLL_LINE = re.compile(r"\broll\s*\(")
_RANDOM = re.compile(r"threefry|random_bits|random_wrap|random_unwrap|random_split|random_fold_in")
PRIORITY = ("matmul", "optimizer", "window", "norms", "attention", "activations")  # ties in a fusion's vote


class Hlo:
  """The parts of an HLO module's text (compiled.as_text()) that categorising its ops needs."""

  def __init__(self, text: str):
    self.name = re.search(r"^HloModule\s+([\w.\-]+)", text, re.M).group(1)
    self.instrs: dict[str, dict] = {}
    self.computations: dict[str, list[str]] = {}
    self.users: dict[str, list[str]] = collections.defaultdict(list)
    tables: dict[str, dict[int, str]] = collections.defaultdict(dict)
    section, comp = None, None
    for line in text.splitlines():
      if not line.strip():
        continue
      if comp is None and line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
        section = line
        continue
      if section and re.match(r"^\d+ ", line):
        k, v = line.split(" ", 1)
        tables[section][int(k)] = v
        continue
      if not line.startswith(" ") and line.rstrip().endswith("{"):  # a computation's header
        section = None
        comp = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)", line).group(1)
        self.computations[comp] = []
        continue
      if line.startswith("}"):
        comp = None
        continue
      m = _INSTR.match(line) if comp else None
      if not m:
        continue
      name, rhs = m.groups()
      opcode = _OPCODE.search(rhs)
      called = []  # the computations it runs (not a reduction's scalar to_apply)
      for key, value in _CALLED.findall(rhs):
        if key != "to_apply":
          called.extend(re.findall(r"%?([\w.\-]+)", value))
      op_name, frame, source, target = (r.search(rhs) for r in (_OP_NAME, _FRAME_ID, _SOURCE, _TARGET))
      operands = []
      if opcode:  # the names inside the opcode's parentheses
        depth, i = 1, opcode.end()
        while i < len(rhs) and depth:
          depth += {"(": 1, ")": -1}.get(rhs[i], 0)
          i += 1
        operands = re.findall(r"%([\w.\-]+)", rhs[opcode.end() : i])
      for o in operands:
        self.users[o].append(name)
      self.instrs[name] = {
        "opcode": opcode.group(1) if opcode else "?",
        "called": called,
        "op_name": op_name.group(1) if op_name else "",
        "frame": int(frame.group(1)) if frame else 0,
        "source": (source.group(1), int(source.group(2))) if source else None,
        "target": target.group(1) if target else "",
        "text": rhs if opcode and opcode.group(1) in MATMUL_OPS else "",
        "shape": _ARRAY.match(rhs).groups() if _ARRAY.match(rhs) else None,  # (element type, "d0,d1,...")
        "operands": operands,
      }
      self.computations[comp].append(name)
    self._frames = self._stack_frames(tables)

  @staticmethod
  def _stack_frames(tables) -> dict[int, list[tuple[str, str, int]]]:
    """stack_frame_id -> [(file, function, line), ...], innermost first."""

    def unquote(s):
      return s.strip().strip('"')

    files = {k: unquote(v) for k, v in tables["FileNames"].items()}
    functions = {k: unquote(v) for k, v in tables["FunctionNames"].items()}
    locations = {}
    for k, v in tables["FileLocations"].items():
      kv = dict((a, int(b)) for a, b in _KV.findall(v))
      locations[k] = (
        files.get(kv.get("file_name_id"), "?"),
        functions.get(kv.get("function_name_id"), "?"),
        kv["line"],
      )
    raw = {k: dict((a, int(b)) for a, b in _KV.findall(v)) for k, v in tables["StackFrames"].items()}
    # The text prints a frame's parent as its id + 1 (0: none) in the XLA of this writing: a root frame then reads
    # as its own parent. Where no frame does, the ids are taken as printed.
    offset = 1 if any(f.get("parent_frame_id") == k for k, f in raw.items()) else 0
    frames = {}
    for k in raw:
      chain, seen, i = [], set(), k
      while i and i in raw and i not in seen:
        seen.add(i)
        chain.append(locations.get(raw[i].get("file_location_id"), ("?", "?", 0)))
        i = raw[i].get("parent_frame_id", 0) - offset
      frames[k] = chain
    return frames

  def stack(self, ins: dict) -> list[tuple[str, str, int]]:
    if ins["frame"]:
      return self._frames.get(ins["frame"], [])
    if ins["source"]:
      return [(ins["source"][0], "?", ins["source"][1])]
    return []

  def fused(self, name: str) -> list[dict]:
    """The instructions an op runs: itself, or (fusions, calls, loops) those of the computations it calls."""
    ins = self.instrs[name]
    if not ins["called"]:
      return [ins]
    out, todo, seen = [], list(ins["called"]), set()
    while todo:
      comp = todo.pop()
      if comp in seen or comp not in self.computations:
        continue
      seen.add(comp)
      for n in self.computations[comp]:
        sub = self.instrs[n]
        out.append(sub)
        todo.extend(sub["called"])
    return out


def _line(frame) -> str:
  return linecache.getline(frame[0], frame[2]) if frame[2] else ""


@functools.cache
def _stack_category(stack: tuple) -> str | None:
  """The category the Python stack of an HLO instruction implies, None if it implies none (see the docstring)."""
  if any("/optax/" in f and "/optax/losses/" not in f for f, _, _ in stack):
    return "optimizer"
  if any(fn in WINDOW_FUNCTIONS for _, fn, _ in stack):
    return "window"
  own = [fr for fr in stack if "/flax/" not in fr[0]]  # innermost frame of the model's code (not flax's)
  if own and own[0][0].endswith(os.path.join("models", "swin.py")) and _ROLL_LINE.search(_line(own[0])):
    return "window"
  return None


def _instr_category(hlo: Hlo, ins: dict) -> str:
  op = ins["opcode"]
  if op in MATMUL_OPS or (op == "custom-call" and re.search(r"matmul|conv|gemm|dot", ins["target"], re.I)):
    return "matmul"
  if op == "custom-call" and re.search(r"fmha|flash|attention", ins["target"], re.I):  # cuDNN's fused attention
    return "attention"
  if _RANDOM.search(ins["op_name"]):  # random bits (dropout, drop-path): its jitted helpers carry stale stacks
    return "other"
  stack = tuple(hlo.stack(ins))
  cat = _stack_category(stack)
  if cat:
    return cat
  if op in MOVE_OPS:
    return "copies"
  if any("/flax/linen/normalization.py" in f or _NORM_FUNCTION.match(fn) for f, fn, _ in stack):
    return "norms"
  if stack and stack[0][0].endswith("/flax/linen/linear.py"):  # a Dense / Conv layer's bias add: matmul, weakly
    return "bias"
  own = [fr for fr in stack if "/flax/" not in fr[0]]
  if own and own[0][0].endswith(os.path.join("vitjax", "attention.py")):
    return "attention"
  if op in ("tanh", "erf", "logistic") or (own and (own[0][1] in ACT_FUNCTIONS or _ACT_LINE.search(_line(own[0])))):
    return "activations"
  return "other"


def hlo_op_category(hlo: Hlo, name: str, depth: int = 0) -> str:
  """An executed op (an instruction of the entry computation, or of a loop's body) -> its category. An op that XLA
  made (no metadata, e.g. the first half of a reduction it split) takes the category of its first user."""
  cat = _op_category(hlo, name)
  if cat == "other" and depth < 4 and name in hlo.instrs:
    if not any(i["op_name"] or i["frame"] or i["source"] for i in hlo.fused(name) if i["opcode"] != "parameter"):
      users = hlo.users.get(name)
      if users:
        return hlo_op_category(hlo, users[0], depth + 1)
  return cat


def _op_category(hlo: Hlo, name: str) -> str:
  if name not in hlo.instrs:  # not in the text: by its name alone
    if re.search(r"dot|conv|matmul", name):
      return "matmul"
    return "copies" if re.match(r"(copy|transpose|wrapped_transpose|wrapped_copy)", name) else "other"
  ins = hlo.instrs[name]
  if ins["opcode"] != "fusion":
    cat = _instr_category(hlo, ins)
    return "matmul" if cat == "bias" else cat
  inner = [i for i in hlo.fused(name) if i["opcode"] not in ("parameter", "constant", "get-tuple-element", "tuple")]
  cats = [_instr_category(hlo, i) for i in inner]
  if "matmul" in cats:
    return "matmul"  # a fusion containing a dot (or a convolution)
  # a vote of the instructions fused; glue (broadcasts, reshapes, converts) votes only where nothing else does
  votes = collections.Counter(c for c, i in zip(cats, inner) if i["opcode"] not in GLUE_OPS)
  votes = votes or collections.Counter(cats)
  specific = [c for c in PRIORITY if votes[c]]
  if specific:
    return max(specific, key=lambda c: (votes[c], -PRIORITY.index(c)))
  best = max(("bias", "copies", "other"), key=lambda c: votes[c])  # ties: in this order
  return "copies" if not votes[best] else "matmul" if best == "bias" else best


def _attention_core(hlo: Hlo, name: str) -> bool:
  """Whether a matmul op is one of attention's own (QK^T, AV; not the projections, which flax's Dense traced)."""
  for ins in hlo.fused(name):
    stack = hlo.stack(ins) if ins["opcode"] in MATMUL_OPS else []
    if stack and stack[0][0].endswith(os.path.join("vitjax", "attention.py")):
      return True
  return False


def _dims(text: str, key: str) -> tuple[int, ...]:
  m = re.search(key + r"=\{([\d,]*)\}", text)
  return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


def matmul_signature(hlo: Hlo, ins: dict) -> tuple[str, float]:
  """(a label of a dot / convolution's operand shapes and dimensions, its FLOPs: 2 x outputs x contracted size)."""
  shapes = [ins["shape"]] + [hlo.instrs.get(o, {}).get("shape") for o in ins["operands"][:2]]
  if len(shapes) < 3 or None in shapes:
    return "?", 0.0
  arrays = [(t, tuple(int(d) for d in s.split(",") if d)) for t, s in shapes]
  (out_t, out), (lhs_t, lhs), (_, rhs) = arrays[:3]
  size = lambda shape: float(np.prod(shape)) if shape else 1.0
  if ins["opcode"] == "dot":
    lc, rc, lb = (_dims(ins["text"], k) for k in ("lhs_contracting_dims", "rhs_contracting_dims", "lhs_batch_dims"))
    label = f"{lhs_t}[{','.join(map(str, lhs))}] x [{','.join(map(str, rhs))}] c{list(lc)}{list(rc)} b{list(lb)}"
    return f"{label} -> {out_t}", 2 * size(out) * size([lhs[i] for i in lc])
  labels = re.search(r"dim_labels=\w+_(\w+)->", ins["text"])  # convolution: kernel's output-feature dim 'o'
  o = labels.group(1).index("o") if labels and "o" in labels.group(1) else len(rhs) - 1
  label = f"conv {lhs_t}[{','.join(map(str, lhs))}] * [{','.join(map(str, rhs))}]"
  return f"{label} -> {out_t}", 2 * size(out) * size(rhs) / max(rhs[o], 1)


def matmul_table(hlo: Hlo, per_op: dict) -> list[dict]:
  """The step's dots and convolutions grouped by signature: count, ms per step, GFLOP per step and GFLOP/s. An op's
  time is shared among the dots it fuses in proportion to their FLOPs (the fusion's other work goes with them)."""
  groups = collections.defaultdict(lambda: {"n": 0, "ms": 0.0, "gflop": 0.0})
  for name, ms in per_op.items():
    if name not in hlo.instrs:
      continue
    dots = [matmul_signature(hlo, i) for i in hlo.fused(name) if i["opcode"] in MATMUL_OPS]
    total = sum(f for _, f in dots)
    for sig, flops in dots:
      g = groups[sig]
      g["n"] += 1
      g["ms"] += ms * (flops / total if total else 1 / len(dots))
      g["gflop"] += flops / 1e9
  rows = [
    {"signature": k, **v, "gflops_per_s": v["gflop"] / v["ms"] * 1e3 if v["ms"] else 0.0} for k, v in groups.items()
  ]
  return sorted(rows, key=lambda r: -r["ms"])


def describe(hlo: Hlo, name: str) -> str:
  """A short label for an XLA op: its name and the end of its op_name (module path / primitive)."""
  ins = hlo.instrs.get(name)
  if not ins or not ins["op_name"]:
    return name
  parts = [p for p in ins["op_name"].split("/") if not p.startswith("jit(")]
  return f"{name} ({'/'.join(parts[-3:])})"


# -- vitjax: trace the compiled step


# Lines a profiler derives from a device's kernels (xprof adds them when it converts a trace): not kernels themselves.
DERIVED_LINES = {"XLA Modules", "XLA Ops", "XLA TraceMe", "Steps", "Framework Ops", "Framework Name Scope"}
DERIVED_LINES |= {"Source code", "Launch Stats", "Host Offload Ops", "_counters_"}


def trace_step(case, steps: int, logdir: str, warmup: int = 2) -> tuple:
  """bench_train's compiled bare step for `case`, run `warmup` times, then `steps` times under jax.profiler into
  logdir. Returns (compiled, the trace's xplane file, each traced step's wall seconds)."""
  compiled, *args = compiled_step(case)
  once = step_runner(compiled, *args, [])
  for _ in range(warmup):
    once()
  times = []
  jax.profiler.start_trace(logdir)
  try:
    for _ in range(steps):
      t = time.perf_counter()
      once()
      times.append(time.perf_counter() - t)
  finally:
    jax.profiler.stop_trace()
  return compiled, glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))[0], times


def device_events(xplane: str) -> tuple[list[dict], list[str]]:
  """The executed XLA ops in a profiler's xplane, read with jax.profiler.ProfileData (jaxlib's own reader, no
  xprof): a GPU's kernels (planes "/device:GPU:N", less the lines derived from them), else the XLA CPU runtime's
  thunks (the "/host:CPU" events that carry an hlo_op; the host's own events, Python and the runtime, do not).
  Returns (events, the planes read); an event is {start, end (ns), thread (plane and line), op (its hlo_op stat,
  else the kernel's name), module (hlo_module stat, None where absent), run (run_id stat), stats (stat names)}."""
  from jax.profiler import ProfileData

  data = ProfileData.from_file(xplane)
  planes = [p for p in data.planes if p.name.startswith("/device:GPU")] or [
    p for p in data.planes if p.name == "/host:CPU"
  ]
  events = []
  for plane in planes:
    for line in plane.lines:
      if line.name in DERIVED_LINES:
        continue
      for ev in line.events:
        stats = dict(ev.stats)
        if plane.name == "/host:CPU" and "hlo_op" not in stats:
          continue
        start = int(ev.start_ns)
        events.append(
          {
            "start": start,
            "end": start + int(ev.duration_ns),
            "thread": (plane.name, line.name),
            "op": str(stats.get("hlo_op") or ev.name),
            "module": None if stats.get("hlo_module") is None else str(stats["hlo_module"]),
            "run": stats.get("run_id"),
            "stats": tuple(stats),
          }
        )
  return events, [p.name for p in planes]


def op_times(events: list[dict]) -> tuple[collections.Counter, collections.Counter]:
  """Per op, in ns: (wall time, own time). An event's own time is its duration less that of the events nested in
  it on its thread (a call or while thunk and the thunks it runs); its wall time splits each moment equally among
  the ops running then (XLA runs independent thunks concurrently; a GPU, kernels on several streams), so wall times
  sum to the time when any op ran (the device's busy time), and own times to more where ops overlapped."""
  wall, own = collections.Counter(), collections.Counter()
  spans = [(e["start"], e["end"], e["thread"], e["op"]) for e in events]

  def inside(j, i):  # j runs within i on its thread: i (a call or while thunk) waits for j
    (a, b, thread_i, _), (c, d, thread_j, _) = spans[i], spans[j]
    return j != i and thread_i == thread_j and a <= c and d <= b and (d - c < b - a or j > i)

  bounds = sorted({t for a, b, _, _ in spans for t in (a, b)})
  starts = sorted(range(len(spans)), key=lambda i: spans[i][0])
  active, k = [], 0
  for t0, t1 in zip(bounds, bounds[1:]):
    while k < len(starts) and spans[starts[k]][0] <= t0:
      active.append(starts[k])
      k += 1
    active = [i for i in active if spans[i][1] > t0]  # the ops running in [t0, t1]
    leaves = [i for i in active if not any(inside(j, i) for j in active)]
    for i in leaves:
      wall[spans[i][3]] += (t1 - t0) / len(leaves)
      own[spans[i][3]] += t1 - t0
  return wall, own


def profile_vitjax(case, steps: int, archive: str | None = None) -> dict:
  """bench_train's bare step traced (trace_step) and read (device_events) op by op: each op's time per step
  (op_times' wall share) by category, the dots by shape, the device's busy time. `archive`: also write the xplane
  and the compiled HLO text there as a .tar.gz, for a closer reading elsewhere."""
  with tempfile.TemporaryDirectory(prefix="op_profile_") as logdir:
    compiled, xplane, times = trace_step(case, steps, logdir)
    text = compiled.as_text()
    hlo = Hlo(text)
    events, planes = device_events(xplane)
    if archive:
      with tarfile.open(archive, "w:gz") as tar:
        tar.add(xplane, arcname="step.xplane.pb")
        data = text.encode()
        info = tarfile.TarInfo("step.hlo.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
  other_modules = collections.Counter()
  for e in events:
    if e["module"] not in (None, hlo.name):
      other_modules[e["module"]] += (e["end"] - e["start"]) / 1e6 / steps
  events = [e for e in events if e["module"] in (None, hlo.name)]
  runs = {e["run"] for e in events} - {None}
  if runs and len(runs) != steps:
    raise RuntimeError(f"{len(runs)} runs of {hlo.name} in the trace, expected {steps}")
  wall_ns, own_ns = op_times(events)
  per_op = {k: v / 1e6 / steps for k, v in wall_ns.items()}
  calls = collections.Counter(e["op"] for e in events)
  ops, top, attention_matmul = collections.defaultdict(dict), [], 0.0
  for name, ms in per_op.items():
    cat = hlo_op_category(hlo, name)
    ops[cat][describe(hlo, name)] = ms
    top.append({"op": describe(hlo, name), "category": cat, "ms": round(ms, 4), "kernels": calls[name] // steps})
    if cat == "matmul" and name in hlo.instrs and _attention_core(hlo, name):
      attention_matmul += ms
  return {
    "ops": ops,
    "top_ops": sorted(top, key=lambda r: -r["ms"])[:30],
    "matmuls": matmul_table(hlo, per_op),
    "attention_matmul_ms": attention_matmul,
    "step_ms": 1e3 * statistics.mean(times),
    "busy_ms": sum(per_op.values()),
    "ops_own_ms": sum(own_ns.values()) / 1e6 / steps,
    "n_ops": len(per_op),
    "n_in_hlo": sum(n in hlo.instrs for n in per_op),
    "unmatched_ops": sorted(n for n in per_op if n not in hlo.instrs),
    "planes": planes,
    "events": len(events),
    "event_stats": sorted({k for e in events for k in e["stats"]}),
    "other_modules_ms": dict(other_modules.most_common(5)),
    "source": "jax.profiler.trace read with jax.profiler.ProfileData (one event per thunk or kernel, with its HLO op)",
  }


# -- torch: torch.profiler over bench_train.torch_step

_TORCH_RULES = (  # on the op's base name: "aten::native_layer_norm" -> "native_layer_norm", node "GeluBackward0" -> "gelu"
  ("window", re.compile(r"^roll$")),
  ("matmul", re.compile(r"^_?(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|mv|addmv|dot|einsum|_addmm_activation)$")),
  ("matmul", re.compile(r"convolution|(^|_)conv(\d|_transpose|_depthwise|_tbc)|^_?mkldnn_(linear|matmul)")),
  ("attention", re.compile(r"^_?(masked_)?softmax|scaled_dot_product|flash_attention|efficient_attention")),
  ("norms", re.compile(r"(layer|batch|group|rms|instance)_?norm")),
  ("activations", re.compile(r"^(gelu|relu|relu6|threshold|tanh|erf|silu|sigmoid|hardswish|mish|elu|leaky_relu)")),
  (
    "copies",
    re.compile(
      r"^_?(copy_?|clone|contiguous|to|_to_copy|to_copy|t|transpose_?|permute|view|view_as|reshape|_reshape_alias|"
      r"unsafe_view|expand|expand_as|as_strided_?|squeeze_?|unsqueeze_?|flatten|unflatten|select|slice|narrow|split|"
      r"split_with_sizes|unsafe_split|chunk|unbind|cat|stack|constant_pad_nd|pad|repeat|detach_?|alias|movedim|"
      r"swapaxes|numpy_t|lift_fresh|_?unsafe_view)$"
    ),
  ),
)
_BACKWARD = "autograd::engine::evaluate_function: "


def _base_name(name: str) -> str:
  if name.startswith(_BACKWARD):
    name = name[len(_BACKWARD) :]
  if name.startswith("aten::"):
    return name[6:]
  name = re.sub(r"Backward\d*$", "", name.split("::")[-1])
  return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()  # NativeLayerNorm -> native_layer_norm


@functools.cache
def torch_name_category(name: str) -> str | None:
  if name.startswith("op_profile::"):
    return name.split("::", 1)[1]
  base = _base_name(name)
  return next((cat for cat, rule in _TORCH_RULES if rule.search(base)), None)


@contextlib.contextmanager
def _torch_scopes(model):
  """record_function scopes around the attention modules' forward and Swin's window functions (timm), for the
  categories; restores the originals on exit."""
  from torch.autograd.profiler import record_function

  def scoped(fn, label):
    @functools.wraps(fn)
    def inner(*args, **kwargs):
      with record_function(label):
        return fn(*args, **kwargs)

    return inner

  patches = []  # (owner, attribute, original)
  for cls in {type(m) for m in model.modules()}:
    if cls.__name__ in ("Attention", "WindowAttention", "MultiheadAttention"):
      patches.append((cls, "forward", cls.forward))
      cls.forward = scoped(cls.forward, "op_profile::attention")
    if cls.__name__ == "WindowAttention" and hasattr(cls, "_get_rel_pos_bias"):
      patches.append((cls, "_get_rel_pos_bias", cls._get_rel_pos_bias))
      cls._get_rel_pos_bias = scoped(cls._get_rel_pos_bias, "op_profile::window")
  swin = sys.modules.get("timm.models.swin_transformer")
  for fn in ("window_partition", "window_reverse"):
    if swin is not None and hasattr(swin, fn):
      patches.append((swin, fn, getattr(swin, fn)))
      setattr(swin, fn, scoped(getattr(swin, fn), "op_profile::window"))
  try:
    yield
  finally:
    for owner, attr, original in reversed(patches):
      setattr(owner, attr, original)


def _chain(e) -> list:
  out = []
  while e is not None:
    out.append(e)
    e = e.cpu_parent
  return out


def torch_event_category(e, forward_of: dict) -> tuple[str, bool]:
  """(category, whether it is a matmul of attention's own: in an attention module, not in a linear layer)."""
  chain = _chain(e)
  node = next((p for p in chain if p.name.startswith(_BACKWARD)), None)
  if node is not None and node.sequence_nr in forward_of:  # a backward op: the forward op's scopes count too
    chain = chain + _chain(forward_of[node.sequence_nr])
  if any(p.name.startswith("Optimizer.") for p in chain):
    return "optimizer", False
  scope = next((p.name for p in chain if p.name.startswith("op_profile::")), "")
  if scope == "op_profile::window":
    return "window", False
  cat = next(filter(None, (torch_name_category(p.name) for p in chain)), "other")  # own name, else the nearest
  core = cat == "matmul" and scope == "op_profile::attention" and not any(p.name == "aten::linear" for p in chain)
  return cat, core


def profile_torch(case, steps: int, dtype: str, torch) -> dict:
  from torch.profiler import ProfilerActivity, profile

  # bench_train.torch_step runs a first step, a warm-up step, then `steps`: all are recorded, and the ops that start
  # after the end of the warm-up's optimizer step are counted
  with _torch_scopes(case.torch_model), profile(activities=[ProfilerActivity.CPU]) as prof:
    r = torch_step(case, steps, 1e9, dtype, False, torch, torch.device("cpu"))
  events = list(prof.events())
  ends = sorted(e.time_range.end for e in events if e.name.startswith("Optimizer.step"))
  if len(ends) < steps + 1:
    raise RuntimeError(f"{len(ends)} optimizer steps in the torch profile, expected at least {steps + 1}")
  events = [e for e in events if ends[-steps - 1] <= e.time_range.start <= ends[-1]]
  forward_of = {}
  for e in events:
    if e.sequence_nr >= 0 and not any(p.name.startswith(_BACKWARD) for p in _chain(e)):
      forward_of.setdefault(e.sequence_nr, e)
  ops, attention_matmul = collections.defaultdict(collections.Counter), 0.0
  for e in events:
    if getattr(e, "is_user_annotation", False) or e.name.startswith(("ProfilerStep", "Optimizer.", "op_profile::")):
      continue  # scopes: their self time is Python's, not an op's
    cat, core = torch_event_category(e, forward_of)
    ops[cat][e.name] += e.self_cpu_time_total / 1e3 / steps
    attention_matmul += core * e.self_cpu_time_total / 1e3 / steps
  names = {e.name for e in events if not e.name.startswith(("ProfilerStep", "Optimizer.", "op_profile::"))}
  return {
    "ops": {k: dict(v) for k, v in ops.items()},
    "attention_matmul_ms": attention_matmul,
    "step_ms": 1e3 * statistics.mean(r["times_s"][-steps:]),
    "n_ops": len(names),
    "source": "torch.profiler (CPU), self CPU time per op event",
  }


# -- main


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default="swin_t_224_b4", help=f"comma-separated, from {', '.join(MODELS)}")
  ap.add_argument("--steps", type=int, default=3, help="profiled steps, after a first and a warm-up step")
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--batch", type=int, default=0, help="override the models' batch (0: bench_train's)")
  ap.add_argument("--top", type=int, default=3, help="list each category's largest ops (0: none)")
  ap.add_argument("--dots", type=int, default=8, help="list vitjax's slowest dot / convolution shapes (0: none)")
  ap.add_argument("--out", default=RESULTS)
  args = ap.parse_args()
  names, torch, timm = start(ap, args)
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  command = " ".join([os.path.basename(sys.executable)] + sys.argv)
  host, flags, before = host_info(torch, timm), cpu_flags(), machine_state()
  print(
    f"host: {host['cpu']}, {host['cpu_count']} CPUs (affinity {host['affinity']}), avx512_bf16 {flags['avx512_bf16']}"
  )
  print(f"jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads)")
  print(f"before: load {before['loadavg']}, busy: {before['cpu_users']}")
  rows = []
  for name in names:
    kind, batch, size = MODELS[name]
    batch = args.batch or batch
    t0 = time.perf_counter()
    if kind == "transformer_small":
      case = transformer_case(name, batch, size, args.dtype, torch)
    else:
      case = image_case(name, kind, batch, size, args.dtype, torch)
    results = {"vitjax": profile_vitjax(case, args.steps), "torch": profile_torch(case, args.steps, args.dtype, torch)}
    matmuls = _matmul_fields(results)
    _print_model(name, args, batch, results, matmuls, time.perf_counter() - t0)
    for fw, r in results.items():
      total = sum(sum(v.values()) for v in r["ops"].values())
      for cat in CATEGORIES:
        ops = r["ops"].get(cat, {})
        top = sorted(ops.items(), key=lambda kv: -kv[1])[:10]
        rows.append(
          {
            "model": name,
            "framework": fw,
            "category": cat,
            "ms_per_step": round(sum(ops.values()), 4),
            "share_of_ops": round(sum(ops.values()) / total, 4) if total else None,
            "n_ops": len(ops),
            "top_ops_ms": [[k, round(v, 4)] for k, v in top],
            "ops_sum_ms": round(total, 3),
            "step_ms": round(r["step_ms"], 3),
            "dtype": args.dtype,
            "batch": batch,
            "steps": args.steps,
            "source": r["source"],
            **{k: r[k] for k in ("attention_matmul_ms", "ops_own_ms", "unmatched_ops") if k in r},
            **(matmuls if cat == "matmul" and fw == "vitjax" else {}),
          }
        )
  after = machine_state()
  print(f"after: load {after['loadavg']}, busy: {after['cpu_users']}")
  run = {
    "command": command,
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "host": host,
    "cpu_flags": flags,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "git": git_revision(),
    "machine_before": before,
    "machine_after": after,
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "a") as f:
    for row in rows:
      f.write(json.dumps({**row, **run}) + "\n")


def goal_budget(results, goal: float = GOAL) -> dict:
  """What issue 28's float32 goal (torch's step time / vitjax's >= `goal`) leaves vitjax: its step may take at most
  torch's / goal; its matmuls and attention ("matmul + attention", comparable across the frameworks) take what
  they take, and the rest of the step must fit in what is left, against torch's own rest."""
  step = {fw: r["step_ms"] for fw, r in results.items()}
  mm = {fw: sum(sum(r["ops"].get(c, {}).values()) for c in ("matmul", "attention")) for fw, r in results.items()}
  budget = step["torch"] / goal
  return {
    "goal": goal,
    "vitjax_step_budget_ms": round(budget, 2),
    "vitjax_matmul_attention_ms": round(mm["vitjax"], 2),
    "torch_matmul_attention_ms": round(mm["torch"], 2),
    "rest_left_ms": round(budget - mm["vitjax"], 2),
    "vitjax_rest_ms": round(step["vitjax"] - mm["vitjax"], 2),
    "torch_rest_ms": round(step["torch"] - mm["torch"], 2),
  }


def _matmul_fields(results) -> dict:
  """The step's matmul GFLOP (XLA's count over vitjax's dots; the models are the same) and each framework's rate."""
  table = results["vitjax"]["matmuls"]
  gflop = sum(r["gflop"] for r in table)
  ms = {fw: sum(r["ops"].get("matmul", {}).values()) for fw, r in results.items()}
  return {
    "goal_budget": goal_budget(results),
    "matmul_gflop_per_step": round(gflop, 3),
    "matmul_gflops_per_s": {fw: round(gflop / v * 1e3, 1) if v else None for fw, v in ms.items()},
    "vitjax_matmul_table": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in table[:20]],
  }


def _print_model(name, args, batch, results, m, seconds):
  vj, tc = results["vitjax"], results["torch"]
  per = {fw: {c: sum(r["ops"].get(c, {}).values()) for c in CATEGORIES} for fw, r in results.items()}
  print(f"\n{name}: {args.dtype}, batch {batch}, {args.steps} profiled step(s), ms per step (took {seconds:.0f} s)")
  head = f"{'category':26s} {'vitjax ms':>10s} {'torch ms':>10s} {'diff ms':>10s}"
  print(head)
  print("-" * len(head))

  def line(label, a, b):
    print(f"{label:26s} {a:10.2f} {b:10.2f} {a - b:+10.2f}")

  for c in CATEGORIES:
    line(c, per["vitjax"][c], per["torch"][c])
  print("-" * len(head))
  sums = {fw: sum(per[fw].values()) for fw in per}
  line("sum of op times", sums["vitjax"], sums["torch"])
  line("step wall time (mean)", vj["step_ms"], tc["step_ms"])
  line("not in ops (wall - sum)", vj["step_ms"] - sums["vitjax"], tc["step_ms"] - sums["torch"])
  g = m["goal_budget"]
  line("matmul + attention", g["vitjax_matmul_attention_ms"], g["torch_matmul_attention_ms"])
  line("  attention's own matmuls", vj["attention_matmul_ms"], tc["attention_matmul_ms"])
  print(
    f"vitjax: {vj['n_ops']} XLA ops; their own times sum to {vj['ops_own_ms']:.2f} ms/step (concurrent thunks)"
    + (f"; not in the HLO text: {vj['unmatched_ops']}" if vj["unmatched_ops"] else "")
  )
  print(f"torch: {tc['n_ops']} op names")
  print(
    f"x torch >= {g['goal']}: vitjax's step <= {g['vitjax_step_budget_ms']:.1f} ms; its matmul + attention take "
    f"{g['vitjax_matmul_attention_ms']:.1f} (torch's {g['torch_matmul_attention_ms']:.1f}), leaving "
    f"{g['rest_left_ms']:.1f} ms for the rest of the step (vitjax's rest now {g['vitjax_rest_ms']:.1f}, "
    f"torch's {g['torch_rest_ms']:.1f})"
  )
  rate = m["matmul_gflops_per_s"]
  print(
    f"matmuls: {m['matmul_gflop_per_step']:.1f} GFLOP per step (XLA's dots): vitjax {rate['vitjax']} GFLOP/s, "
    f"torch {rate['torch']} GFLOP/s (its matmul time over the same FLOPs)"
  )
  if args.dots:
    print("  vitjax's dots by time (ms per step; a fusion's time split among its dots by FLOPs):")
    for r in vj["matmuls"][: args.dots]:
      print(
        f"    {r['ms']:8.2f} ms {r['gflop']:7.2f} GFLOP {r['gflops_per_s']:6.0f} GFLOP/s  "
        f"x{r['n']:<3d} {r['signature']}"
      )
  if args.top:
    for fw, r in results.items():
      for c in CATEGORIES:
        top = sorted(r["ops"].get(c, {}).items(), key=lambda kv: -kv[1])[: args.top]
        if top:
          print(f"  {fw:6s} {c:11s} " + "; ".join(f"{k[:70]} {v:.2f}" for k, v in top))


if __name__ == "__main__":
  main()
