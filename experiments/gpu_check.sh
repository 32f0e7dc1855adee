#!/usr/bin/env bash
# One command that proves vitjax on a GPU (issue 44): environment, bring-up tests, attention, the training step
# side by side with PyTorch, a profile of ViT-B/16's step, that step under XLA's GPU options, and real runs. Each
# step runs under its own time limit, and a failing step is written down and the next one runs. JSON lines go to
# OUT/gpu_check.jsonl (bench_train's rows to OUT/bench_train_*.jsonl), the profile's trace to OUT/profile_*.tar.gz,
# the whole log to OUT/gpu_check.log, and a summary table ends the output. At most 8 minutes on an H100: a global
# budget (GPU_CHECK_BUDGET_S, 450 s) caps every step's limit and skips what would not fit.
#
#   bash experiments/gpu_check.sh [--out DIR]   # on the GPU machine (OUT: $OUT, else experiments/results/gpu_check)
#   bash experiments/gpu_check.sh --dry         # every step on this CPU at toy sizes (87 s on the 2-core EPYC)
#                                               # (tests/test_gpu_check.py runs it)
#   bash experiments/gpu_check.sh --pack        # fills .gpucheck/ (git-ignored), what the GPU call carries
#
# The lent machine has Python 3.12, jax 0.11.2 with the CUDA 13 plugin, flax, optax, orbax, torch + timm, pytest and
# pytest-xdist, but not ml-collections, grain, array-record, tensorflow-datasets or simplejpeg. `--pack` (here, with
# the package registry) downloads those as Python 3.12 wheels into .gpucheck/whl and copies Debian's Fashion-MNIST
# (apt-get install dataset-fashion-mnist) into .gpucheck/fashion-mnist. Measured on 2026-11-26 (du -b):
#   .gpucheck/whl            16 wheels, 11.1 MB: array_record-0.8.6 (3.8 MB), dm_tree-0.1.10, docstring_parser-0.18.0,
#                            googleapis_common_protos-1.76.0, grain-0.2.18 (0.6 MB), immutabledict-4.3.1,
#                            importlib_resources-7.1.0, ml_collections-1.1.0, portpicker-1.6.0, promise-2.3 (built
#                            here: PyPI has no wheel), simple_parsing-0.1.9, simplejpeg-1.9.0 (0.4 MB),
#                            tensorflow_datasets-4.9.10 (5.3 MB), tensorflow_metadata-1.21.0, termcolor-3.3.0,
#                            toml-0.10.2
#   .gpucheck/fashion-mnist  the four IDX files, 30.9 MB
#   the checkout itself      about 6 MB; in all about 48 MB of the 64 MiB a call may carry
# Then, through the device tool, one call (carry [".gpucheck"], timeout_s 600):
#   bash experiments/gpu_check.sh
# The wheels go to /tmp/vitjax-site (pip --target, no dependencies): the image's jax, flax and torch stay as they
# are, and vitjax runs from the checkout on PYTHONPATH (no install). Results: experiments/README.md, "On a GPU".
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DRY=0
PACK=0
OUTDIR=${OUT:-}
STEPS=""  # --steps=env,attention,...: only these steps (a second try that fills in what the first one missed)
NO_COMPILE=""
ATTENTION_ARGS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry) DRY=1 ;;
    --pack) PACK=1 ;;
    --out) OUTDIR=$2; shift ;;
    --out=*) OUTDIR=${1#--out=} ;;
    --steps=*) STEPS=,${1#--steps=}, ;;
    --no_compile) NO_COMPILE=--no_compile ;;
    --attention=*) ATTENTION_ARGS=${1#--attention=} ;;
    *) echo "gpu_check: unknown argument $1 (use --dry, --pack, --out DIR, --steps=A,B, --no_compile," \
      "--attention='--cases=vit --dtypes=bfloat16')"; exit 2 ;;
  esac
  shift
done
CARRY=.gpucheck

if [ "$PACK" = 1 ]; then
  mkdir -p "$CARRY/whl" "$CARRY/fashion-mnist"
  platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64"
  platforms="$platforms --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
    -d "$CARRY/whl" ml-collections==1.1.0 grain==0.2.18 array-record==0.8.6 tensorflow-datasets==4.9.10 \
    simplejpeg==1.9.0 tensorflow-metadata==1.21.0 portpicker==1.6.0 dm-tree==0.1.10 immutabledict==4.3.1 \
    simple-parsing==0.1.9 docstring-parser==0.18.0 googleapis-common-protos==1.76.0 termcolor==3.3.0 toml==0.10.2 \
    importlib-resources==7.1.0 || exit 1
  python3 -m pip wheel -q --no-deps -w "$CARRY/whl" promise==2.3 || exit 1  # an sdist only: built here, pure Python
  cp /usr/share/datasets/fashion-mnist/*.gz "$CARRY/fashion-mnist/" || echo "gpu_check: no Fashion-MNIST (apt-get install dataset-fashion-mnist): that run will be skipped"
  du -sb "$CARRY"/* && ls -l "$CARRY/whl" && du -sb --exclude=.git --exclude=.venv --exclude="$CARRY" .
  exit 0
fi

if [ -z "$OUTDIR" ]; then OUTDIR=$([ "$DRY" = 1 ] && mktemp -d /tmp/gpu_check_dry.XXXXXX || echo experiments/results/gpu_check); fi
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
rm -f "$OUTDIR/gpu_check.jsonl" "$OUTDIR"/bench_train_*.jsonl
exec > >(tee "$OUTDIR/gpu_check.log") 2>&1
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-$([ "$DRY" = 1 ] && echo 300 || echo 450)}
PY=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
echo "gpu_check: $(date -u +%FT%TZ), git $(git describe --always --dirty 2>/dev/null || echo '?'), dry=$DRY, out $OUTDIR, work $WORK"

if [ "$DRY" = 0 ] && [ -d "$CARRY/whl" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vitjax-site \
    "$CARRY"/whl/*.whl || echo "gpu_check: installing the carried wheels failed; going on"
  export PYTHONPATH=/tmp/vitjax-site:$ROOT
else
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
export JAX_COMPILATION_CACHE_DIR=/tmp/vitjax-jax-cache  # a second try on the same machine compiles less
[ "$DRY" = 1 ] && export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_optimization_level=0"  # toy sizes: compile fast
FASHION=/usr/share/datasets/fashion-mnist
[ -d "$CARRY/fashion-mnist" ] && FASHION=$ROOT/$CARRY/fashion-mnist

# step NAME LIMIT_S COMMAND...: runs COMMAND under min(LIMIT_S, what is left of the budget) and records how it ended
step() {
  local name=$1 limit=$2 left rc t0 status
  shift 2
  if [ -n "$STEPS" ] && [[ "$STEPS" != *",$name,"* ]]; then return 1; fi
  left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 10 ]; then
    echo "== $name: skipped, the ${BUDGET}s budget is spent"
    "$PY" experiments/gpu_check.py status --out "$OUTDIR" --name "$name" --status skipped --note "budget spent"
    return 1
  fi
  # the limits are the GPU's; a dry run's steps share its budget alone (a loaded CI machine is slow at compiling)
  { [ "$limit" -gt "$left" ] || [ "$DRY" = 1 ]; } && limit=$left
  echo "== $name (limit ${limit}s): $*"
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  case $rc in 0) status=ok ;; 124|137) status=timeout ;; *) status=failed ;; esac
  echo "== $name: $status (exit $rc) in $(($(date +%s) - t0))s"
  "$PY" experiments/gpu_check.py status --out "$OUTDIR" --name "$name" --status $status \
    --seconds $(($(date +%s) - t0)) --note "exit $rc"
  [ $rc = 0 ]
}

# (a) the environment
step env 60 "$PY" experiments/gpu_check.py env --out "$OUTDIR"
[ "$DRY" = 0 ] && nvidia-smi

# Then the steps in the order of what they are worth, and the budget cuts the tail: on the H100 (2026-11-26) env,
# attention, ViT-B/16 and the two runs need about 7.5 minutes, so Swin-T, the Transformer and the bring-up tests need a
# second call; the summary prints it (--steps=...).

# (c) attention: "fast" (cuDNN where it applies) against "reference", against torch's SDPA
XLA_PYTHON_CLIENT_PREALLOCATE=false step attention 100 "$PY" experiments/gpu_check.py attention --out "$OUTDIR" \
  $([ "$DRY" = 1 ] && echo --dry) $ATTENTION_ARGS

# (d) the training step, vitjax against torch eager (AMP) and torch.compile, bf16, MFU at the device's dense bf16
# peak (H100 SXM and H200: 989.4 TFLOP/s; H100 PCIe: 756). JAX keeps under half the GPU's memory, torch the rest.
# ViT-B/16 here; Swin-T and the Transformer after the real runs.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$gpu" in *PCIe*) peak=756 ;; *H100*|*H200*) peak=989.4 ;; *) peak=0 ;; esac
bench() {  # bench NAME LIMIT ARGS...
  local name=$1 limit=$2
  shift 2
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 step "$name" "$limit" "$PY" experiments/bench_train.py --dtype=bfloat16 \
    --peak_tflops=$peak --no_trainer $NO_COMPILE --out "$OUTDIR/bench_train_$name.jsonl" "$@"
}
measured() { grep -q '"framework": "vitjax", .*"step_s": [0-9]' "$OUTDIR/bench_train_$1.jsonl" 2>/dev/null; }
if [ "$DRY" = 1 ]; then
  # a ViT and the Transformer (Swin's bench code is the ViT's; its conversion is tests/test_formats.py's)
  bench bench_dry 90 --torch_device=cpu --models=vit_s16_224_b2,transformer_small --size=32 --batch=2 --layers=1 \
    --repeats=1 --peak_s=0.05 --no_compile --max_row_s=2
else
  bench bench_vit_b16 150 --torch_device=cuda --models=vit_b16_224_b8 --batch=256 --repeats=10
  measured bench_vit_b16 || bench bench_vit_b16_b128 100 --torch_device=cuda --models=vit_b16_224_b8 --batch=128 \
    --repeats=10
fi

# where ViT-B/16's step spends its time: per-op device time by category from a jax.profiler trace, with the trace
# and the compiled HLO in OUT/profile_*.tar.gz (issue 44's MFU goal: read it here at no device cost); once with the
# default attention (cuDNN's kernels, padded to an even length) and once with XLA's own, to weigh the two
XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 step profile 120 "$PY" experiments/gpu_check.py profile --out "$OUTDIR" \
  $([ "$DRY" = 1 ] && echo --dry)

# the same step (batch 256, as bench_vit_b16) compiled under XLA's GPU options one at a time, then those that beat
# the default together (gpu_check.py's VARIANTS): which flags, which attention or a larger batch move the MFU. Its
# torch twin stays on the CPU, so JAX may take most of the GPU's memory (batch 512)
XLA_PYTHON_CLIENT_MEM_FRACTION=0.85 step variants 180 "$PY" experiments/gpu_check.py variants --out "$OUTDIR" \
  --batch=256 --peak_tflops=$peak $([ "$DRY" = 1 ] && echo --dry)

# (e) real runs: the README's main job (digits), and Fashion-MNIST for one epoch beside its CPU curve
if [ "$DRY" = 1 ]; then main_len="--config.total_steps=10 --config.log_every=5"; fm_len="--config.total_steps=6"
else main_len=""; fm_len="--config.num_epochs=1"; fi
export TFDS_DATA_DIR=$WORK/tfds PY OUTDIR WORK FASHION DRY main_len fm_len
# each run's bash waits for its process on a SIGTERM (a trap defers to the command in flight), so that a time limit
# lets vitjax stop with its checkpoint, and nothing outlives its step
main_job() {
  trap 'exit 143' TERM
  "$PY" -m vitjax.data.prepare --dataset=digits &&
    "$PY" -m vitjax.main --config=configs/vit_digits.py --workdir="$WORK/vit_digits" $main_len &&
    "$PY" -m vitjax.main --mode=eval --workdir="$WORK/vit_digits" --split=test &&
    "$PY" experiments/gpu_check.py run --out "$OUTDIR" --workdir "$WORK/vit_digits" --name main_job_digits
}
fashion() {
  trap 'exit 143' TERM
  [ -f "$FASHION/train-images-idx3-ubyte.gz" ] || { echo "no Fashion-MNIST in $FASHION"; return 1; }
  local source=$FASHION
  if [ "$DRY" = 1 ]; then  # its first 2,000 images: the same code, not 70,000 PNGs to encode
    source=$WORK/fashion-mnist-2000
    "$PY" experiments/gpu_check.py subset --out "$OUTDIR" --src "$FASHION" --dst "$source" --n 2000 || return 1
  fi
  "$PY" -m vitjax.data.prepare --dataset=fashion_mnist --manual_dir="$source" &&
    "$PY" -m vitjax.main --config=configs/vit_fashion_mnist.py --workdir="$WORK/fmnist" --config.log_every=50 $fm_len &&
    "$PY" experiments/gpu_check.py run --out "$OUTDIR" --workdir "$WORK/fmnist" --name fashion_mnist_1_epoch \
      --curve experiments/results/gpu_check_cpu_curve_fashion_mnist.json
}
export -f main_job fashion
step main_job 100 bash -c main_job
step fashion_mnist 100 bash -c fashion

# (d), the rest
if [ "$DRY" = 0 ]; then
  bench bench_swin_t 150 --torch_device=cuda --models=swin_t_224_b4 --batch=128 --repeats=10
  bench bench_transformer_base 120 --torch_device=cuda --models=transformer_base --batch=256 --repeats=10
  # optional, only when named (--steps=bench_backbones): DINOv2-S/14 with registers and EVA-02-S (rotary positions,
  # SwiGLU) beside timm's VisionTransformer and Eva, bf16 at batch 256 (issue 75)
  if [[ "$STEPS" == *",bench_backbones,"* ]]; then
    bench bench_backbones 150 --torch_device=cuda --models=dinov2_s14_reg4_224_b8,eva02_s14_224_b8 --batch=256 \
      --repeats=10
  fi
fi

# (b) bring-up: the in-process test modules that need no dataset, on the default backend (the GPU), at float32's
# full matmul precision (the tests' tolerances are float32's; TF32 is the GPU's default)
if [ "$DRY" = 1 ]; then tests="tests/test_posenc.py"; workers=0; else
  tests="tests/test_attention.py tests/test_layers.py tests/test_posenc.py tests/test_models.py"; workers=4; fi
JAX_DEFAULT_MATMUL_PRECISION=float32 XLA_PYTHON_CLIENT_PREALLOCATE=false \
  step bringup 120 "$PY" -m pytest -v -rfE --tb=line -p no:cacheprovider -p no:benchmark -n $workers $tests \
  --junitxml="$OUTDIR/bringup.xml"

"$PY" experiments/gpu_check.py summary --out "$OUTDIR" --command "bash experiments/gpu_check.sh$([ "$DRY" = 1 ] && echo ' --dry')"
echo "gpu_check: $(($(date +%s) - START)) s in all; rows in $OUTDIR"
rm -rf "$WORK"
