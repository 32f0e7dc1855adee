"""experiments/gpu_check.sh --dry: every step of the GPU check, on this CPU at toy sizes (issue 44), so that the
command a lent GPU runs cannot rot between the rare days one is lent."""

import importlib.util
import json
import os
import subprocess
import sys
import tarfile

import pytest
import train_helpers as th

FASHION = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def _dry_run(tmp_path, steps: str) -> tuple[str, list[dict], dict]:
  """`gpu_check.sh --dry --steps=STEPS`: (its log, its gpu_check.jsonl rows, {step: status}); it must succeed."""
  missing = [m for m in ("torch", "timm") if importlib.util.find_spec(m) is None]
  if missing:  # the check compares with torch and timm (the README's test install has them)
    pytest.skip(f"{', '.join(missing)} not installed")
  out = tmp_path / "out"
  env = {**th.env(), "PYTHON": sys.executable, "GPU_CHECK_BUDGET_S": "900"}  # no budget cuts on a loaded CI machine
  env.pop("OUT", None)
  proc = subprocess.run(
    ["bash", "experiments/gpu_check.sh", "--dry", "--out", str(out), f"--steps={steps}"],
    cwd=th.ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=1200,
  )
  log = proc.stdout + proc.stderr
  assert proc.returncode == 0, log[-3000:]
  assert "steps failed: none" in log and "== gpu_check summary ==" in log
  assert (out / "gpu_check.log").stat().st_size > 0
  rows = [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()]
  status = {r["name"]: r["status"] for r in rows if r["step"] == "status"}
  return log, rows, status


# The steps that test the script's own machinery (its budget, its jsonl rows, the summary) with the library's attention
# and the README's main job here; the benchmark (vitjax and torch) and the Fashion-MNIST run (40 s of the 65) in the
# slow test below.
def test_dry_run_does_every_step(tmp_path):
  log, rows, status = _dry_run(tmp_path, "env,attention,main_job,bringup")
  assert status == {n: "ok" for n in ("env", "attention", "main_job", "bringup")}, log[-3000:]

  env_row = next(r for r in rows if r["step"] == "env")
  assert env_row["jax_backend"] == "cpu" and env_row["versions"]["jax"]

  attention = [r for r in rows if r["step"] == "attention"]
  assert {(r["case"], r["dtype"]) for r in attention} == {
    (c, d) for c in ("vit", "swin", "causal", "decode") for d in ("bfloat16", "float32")
  }
  for r in attention:  # on a CPU "fast" is the explicit path; it and XLA's must match the reference
    assert r["ok"] and r["path_fwd"] == "explicit" and r["vitjax_fwd_ms"] > 0, r
    if r["case"] != "decode":  # (a decode step is one module's call: "fast" only)
      assert r["xla_fwd_bwd_ms"] > 0 and r["xla_bwd_max_rel"] <= max(2 * r["reference_bwd_max_rel"], 1e-2), r

  main = next(r for r in rows if r["step"] == "run" and r["name"] == "main_job_digits")
  assert main["steps"] == 10 and main["steps_per_s_median"] > 0 and "eval/accuracy" in main["test"]


@pytest.mark.slow
def test_dry_run_benchmarks_beside_torch_profiles_and_follows_the_fashion_mnist_cpu_curve(tmp_path):
  if not os.path.exists(FASHION):
    pytest.skip("apt-get install dataset-fashion-mnist")
  log, rows, status = _dry_run(tmp_path, "env,bench_dry,profile,variants,fashion_mnist")
  assert status == {s: "ok" for s in ("env", "bench_dry", "profile", "variants", "fashion_mnist")}, log[-3000:]
  bench = [json.loads(line) for line in (tmp_path / "out" / "bench_train_bench_dry.jsonl").read_text().splitlines()]
  timed = {(r["model"], r["framework"]) for r in bench if r.get("step_s")}
  for model in ("vit_s16_224_b2", "transformer_small"):
    assert {(model, "vitjax"), (model, "torch")} <= timed, timed
  # the first step's loss is the CPU curve's (the same data, initialisation and batch)
  fashion = next(r for r in rows if r["step"] == "run" and r["name"] == "fashion_mnist_1_epoch")
  assert fashion["cpu_loss"] == {"1": 2.3026} and fashion["max_abs_loss_diff"] < 1e-3, fashion

  # the profile: every executed op of the step found in its HLO and categorised, the trace and HLO to bring back
  profiles = [r for r in rows if r["step"] == "profile"]
  assert [r["implementation"] for r in profiles] == ["fast", "xla"] and profiles[1]["archive"] is None, profiles
  profile = profiles[0]
  assert profile["planes"] == ["/host:CPU"] and profile["ops"] == profile["ops_in_hlo"] > 50, profile
  assert profile["categories_ms"]["matmul"] > 0 and profile["categories_ms"]["optimizer"] > 0, profile
  assert 0 < profile["busy_ms"] <= profile["kernel_ms"] and profile["busy_ms"] < 1.5 * profile["step_ms"], profile
  assert any("fc1" in m["op"] for m in profile["top_ops"]) and profile["matmuls"][0]["gflops_per_s"] > 0
  with tarfile.open(tmp_path / "out" / profile["archive"]) as tar:
    assert sorted(tar.getnames()) == ["step.hlo.txt", "step.xplane.pb"]
  assert "profile vit_b16_224_b8 batch 2" in log

  # the variants: each of the CPU's compiled into the same step, timed, the same first loss as the default's
  variants = {r["variant"]: r for r in rows if r["step"] == "variants"}
  assert list(variants)[:4] == ["default", "attention_xla", "no_fusion_emitters", "batch_4"], variants
  for name in ("attention_xla", "no_fusion_emitters"):
    r = variants[name]
    assert r["step_ms"] > 0 and r["x_default"] > 0 and r["loss_diff"] < 1e-2, r
  # twice the batch: twice the FLOPs, compared per example, and no loss difference (other images)
  r, d = variants["batch_4"], variants["default"]
  assert r["batch"] == 4 and r["analytic_tflop"] == pytest.approx(2 * d["analytic_tflop"]) and "loss_diff" not in r
  assert r["x_default"] == pytest.approx(d["step_ms"] / 2 / (r["step_ms"] / 4)), r
  assert "variants of vit_b16_224_b8's bf16 step, batch 2" in log


def test_a_gpu_steps_library_calls_are_categorised():
  """The profile step reads a GPU's compiled HLO, which this CPU cannot make: cuDNN's fused attention and cuBLAS's
  GEMM are custom calls there, and must land in "attention" and "matmul", not in "other"."""
  sys.path.insert(0, os.path.join(th.ROOT, "experiments"))
  from op_profile import Hlo, hlo_op_category

  hlo = Hlo(
    "HloModule jit_step\n\nENTRY %main (p0: bf16[2,198,12,64]) -> bf16[2,198,12,64] {\n"
    "  %p0 = bf16[2,198,12,64]{3,2,1,0} parameter(0)\n"
    '  %custom-call.3 = (bf16[2,198,12,64]{3,2,1,0}, u8[0]{0}) custom-call(%p0, %p0, %p0), custom_call_target="__cudnn'
    '$fmhaSoftmaxBackward", metadata={op_name="jit(step)/transpose(jvp(attn))/dot_product_attention"}\n'
    '  %gemm.1 = (bf16[396,768]{1,0}, s8[4]{0}) custom-call(%p0, %p0), custom_call_target="__cublas$gemm", '
    'metadata={op_name="jit(step)/mlp/fc1/dot_general"}\n'
    "  ROOT %gte = bf16[2,198,12,64]{3,2,1,0} get-tuple-element(%custom-call.3), index=0\n}\n"
  )
  assert [hlo_op_category(hlo, n) for n in ("custom-call.3", "gemm.1")] == ["attention", "matmul"]


def test_the_variants_step_combines_the_options_that_beat_the_default():
  """gpu_check.py variants times the union of the options of the variants faster than the default, where two or
  more are: a GPU-only path this CPU never takes in the dry run."""
  sys.path.insert(0, os.path.join(th.ROOT, "experiments"))
  from gpu_check import combined_options

  row = lambda ms, per=8, **options: {"step_ms": ms, "options": options, "x_default": 100 / 8 / (ms / per)}
  rows = [row(100.0), row(90.0, a=1), row(99.0, b=2), row(95.0, c=3, a=0), {"options": {"d": 4}, "error": "no"}]
  assert combined_options(rows) == {"a": 1, "c": 3}  # b: under 2% faster; a: the faster variant's value
  assert combined_options(rows[:3]) is None  # one faster variant is its own row
  # a larger batch wins per example, not per step: 190 ms for twice the images is faster than 100 ms for 8
  rows[2] = row(190.0, per=16, batch=16)
  assert combined_options(rows) == {"a": 1, "c": 3, "batch": 16}
  rows[2] = row(210.0, per=16, batch=16)
  assert combined_options(rows) == {"a": 1, "c": 3}
