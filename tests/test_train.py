"""Tests of the trainer (vitjax/train.py) and its command line (python -m vitjax.main).

Command-line, resume and multi-device behaviour is tested on subprocesses running a deliberately tiny ViT
(width 16, one block) for 30 steps on the digits dataset; trainer pieces are tested in-process.
"""

import json
import math
import os
import re
import shutil
import signal

import flax
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
import optax
import pytest

try:
  import train_helpers as th  # tests/ is on sys.path (pytest's default import mode)
except ImportError:
  from tests import train_helpers as th
from vitjax import config as config_lib
from vitjax import models, posenc, tasks, train
from vitjax.config import default_config
from vitjax.models.adapt import adapt_params


def _copy(src, tmp_path, name="w"):
  dst = str(tmp_path / name)
  shutil.copytree(src, dst)
  return dst


def _train_rows(workdir):
  return [r for r in th.read_metrics(workdir) if "train/loss" in r]


def _eval_rows(workdir):
  return [r for r in th.read_metrics(workdir) if "eval/accuracy" in r and "source" not in r]


# ------------------------------------------------------------------------------------ exact resume


def test_grain_workers_train_on_the_same_batches_and_may_change_on_a_resume(finished_run, run_args, tmp_path):
  """data.worker_count=2: grain worker processes read the batches, the same ones: the run ends in the state of the
  run that read them in its own process, bitwise. The count is bookkeeping: a workdir resumes with another."""
  workdir = str(tmp_path / "workers")
  th.check_ok(th.run_main(workdir, *run_args, "--config.data.worker_count=2"))
  th.assert_same_state(th.load_state(finished_run), th.load_state(workdir), "2 grain workers")
  copy = _copy(finished_run, tmp_path)
  again = th.check_ok(th.run_main(copy, *run_args, "--config.data.worker_count=3"))
  assert "is complete (step 30 of 30)" in again.stderr, again.stderr[-2000:]


def test_resume_after_sigkill_is_bitwise_exact(finished_run, run_args, tmp_path):
  workdir = str(tmp_path / "killed")
  proc = th.start_main(workdir, *run_args)
  killed_at = None
  try:
    for line in proc.stdout:
      m = re.search(r" step (\d+)/30 ", line)
      if m and int(m.group(1)) >= 13 and 10 in th.finished_steps(workdir):
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = int(m.group(1))
        break
  finally:
    if proc.poll() is None and killed_at is None:
      proc.kill()
    proc.wait(timeout=60)
    proc.stdout.close()
  assert killed_at is not None, "the run finished before it could be killed"
  assert proc.returncode == -signal.SIGKILL
  survived = th.finished_steps(workdir)
  assert 10 in survived and max(survived) < 30, survived

  resumed = th.check_ok(th.run_main(workdir, *run_args))  # the same command
  m = re.search(r"resumed from .* at step (\d+)", resumed.stderr)
  assert m and 10 <= int(m.group(1)) < 30, resumed.stderr[-2000:]

  ref, got = th.load_state(finished_run), th.load_state(workdir)
  assert int(got["step"]) == int(ref["step"]) == 30
  ref_leaves = jax.tree_util.tree_leaves_with_path(ref)
  got_leaves = jax.tree_util.tree_leaves_with_path(got)
  assert [p for p, _ in ref_leaves] == [p for p, _ in got_leaves]
  differ = [
    jax.tree_util.keystr(p)
    for (p, a), (_, b) in zip(ref_leaves, got_leaves)
    if a.dtype != b.dtype or a.tobytes() != b.tobytes()
  ]
  assert not differ, f"killed at step {killed_at}, resumed at {m.group(1)}: these differ: {differ[:10]}"
  # The last logged training loss is the same float too.
  last = lambda w: [r for r in _train_rows(w) if r["step"] == 30][-1]["train/loss"]
  assert last(workdir) == last(finished_run)
  # TensorBoard's own reader shows each step once: the killed run's events past the resume step are purged.
  resumed_curve, whole_curve = (
    _tensorboard_scalars(workdir, "train/loss"),
    _tensorboard_scalars(finished_run, "train/loss"),
  )
  assert [s for s, _ in resumed_curve] == list(range(1, 31))
  np.testing.assert_allclose([v for _, v in resumed_curve], [v for _, v in whole_curve], rtol=1e-6)


def _tensorboard_scalars(workdir: str, tag: str) -> list[tuple[int, float]]:
  """(step, value) of one scalar as TensorBoard reads it from WORKDIR/tb."""
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

  acc = EventAccumulator(os.path.join(workdir, "tb"))
  acc.Reload()
  return [(e.step, e.value) for e in acc.Scalars(tag)]


# ------------------------------------------------------------------------------------ 1 vs 8 devices


def test_one_and_eight_devices_give_the_same_losses(finished_run, run_args, tmp_path):
  """The finished 1-device run, repeated on 8 simulated devices (batch 32: 4 examples per device).

  Dropout stays on (0.1): jax's partitionable threefry draws the same masks whatever the sharding, so the
  losses agree with dropout too (a stronger check than the dropout-0 one).
  """
  w8 = str(tmp_path / "d8")
  # (sharding=fsdp on the default mesh, all data: nothing to split over, which the log says; the same losses)
  out8 = th.check_ok(th.run_main(w8, *run_args, "--config.sharding=fsdp", devices=8)).stderr
  assert "| 8 devices" in out8
  assert "sharding=fsdp splits over the mesh axis fsdp, which has size 1 in config.mesh=(('data', -1),)" in out8
  l1 = {r["step"]: r["train/loss"] for r in _train_rows(finished_run)}
  l8 = {r["step"]: r["train/loss"] for r in _train_rows(w8)}
  assert sorted(l1) == sorted(l8) == list(range(1, 31))
  steps = sorted(l1)
  np.testing.assert_allclose([l8[s] for s in steps], [l1[s] for s in steps], rtol=1e-4)
  assert max(l1.values()) - min(l1.values()) > 1e-2  # the parameters did move: the comparison means something
  e1, e8 = _eval_rows(finished_run), _eval_rows(w8)
  assert [r["step"] for r in e1] == [r["step"] for r in e8] == [10, 20, 30]
  for a, b in zip(e1, e8):
    assert a["eval/examples"] == b["eval/examples"] == 150  # the validation split
    np.testing.assert_allclose(b["eval/loss"], a["eval/loss"], rtol=1e-4)


# -------------------------------------------------------------------------------------- bad input


def _assert_failed_cleanly(proc, *needles):
  err = th.error_lines(proc)
  assert proc.returncode != 0, proc.stdout[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  for needle in needles:
    assert needle in err, f"{needle!r} not in stderr:\n{err[-3000:]}"
  return err


def _existing_workdir(tmp_path):
  """A workdir holding something (a file) that a failed run must leave alone."""
  workdir = tmp_path / "existing"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("keep me\n")
  return str(workdir)


def test_unknown_config_key_names_the_nearest_one(run_args, tmp_path):
  workdir = _existing_workdir(tmp_path)
  before = th.snapshot(workdir)
  proc = th.run_main(workdir, *run_args, "--config.optim.lrr=1")
  err = _assert_failed_cleanly(proc, "lrr", "--config.optim.lr ")
  assert "did you mean" in err.lower()
  assert th.snapshot(workdir) == before


def test_batch_not_divisible_by_devices_says_which_sizes_work(finished_run, run_args, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  before = th.snapshot(workdir)
  proc = th.run_main(workdir, *run_args, "--config.batch_size=12", devices=8)
  _assert_failed_cleanly(proc, "batch_size=12", "8 devices", "--config.batch_size=16", "or 8")
  assert th.snapshot(workdir) == before


def test_dataset_not_prepared_gives_the_prepare_command(finished_run, run_args, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  empty = tmp_path / "empty_data"
  empty.mkdir()
  before = th.snapshot(workdir)
  proc = th.run_main(workdir, *run_args, f"--config.data.data_dir={empty}")
  _assert_failed_cleanly(proc, "python -m vitjax.data.prepare --dataset=digits", str(empty))
  assert th.snapshot(workdir) == before


def test_init_from_with_other_shapes_lists_the_mismatches(finished_run, run_args, tmp_path):
  workdir = _existing_workdir(tmp_path)
  before, source_before = th.snapshot(workdir), th.snapshot(finished_run)
  proc = th.run_main(workdir, *run_args, "--config.model.width=24", f"--config.init_from={finished_run}")
  _assert_failed_cleanly(
    proc, "do not match the model", "encoder/block_0/mlp/fc1/kernel: model (24, 32), checkpoint (16, 32)"
  )
  assert th.snapshot(workdir) == before  # nothing written: no config.json, no checkpoints/
  assert th.snapshot(finished_run) == source_before


def test_workdir_of_another_experiment_is_refused(finished_run, run_args, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  before = th.snapshot(workdir)
  proc = th.run_main(workdir, *run_args, "--config.model.width=24")
  _assert_failed_cleanly(proc, "another config", "model.width: 16 there, 24 now", "--workdir")
  assert th.snapshot(workdir) == before  # checkpoints, config.json, metrics: untouched


# ------------------------------------------------------------------------------ eval equals training


def test_eval_mode_reproduces_training_eval(finished_run, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  train_evals = _eval_rows(workdir)
  assert [r["step"] for r in train_evals] == [10, 20, 30]
  # Training evaluates on the validation split: 150 of digits' 1,497 training scans, held out by a seed.
  assert all(r["eval/examples"] == 150 for r in train_evals)

  # The config comes from WORKDIR/config.json; the split defaults to the config's (valid). The result is stdout's
  # one line (the log is stderr's), or with --json one JSON object: the row written to eval_SPLIT_STEP.json.
  proc = th.check_ok(th.run_main(workdir, "--mode=eval", "--checkpoint=latest", config=None))
  result = th.read_metrics(workdir)[-1]
  assert result["step"] == 30 and result["split"] == "valid" and result["source"] == "evaluate"
  assert re.fullmatch(
    r"checkpoint latest \(step 30\) \| eval/loss [\d.]+, eval/accuracy [\d.]+, eval/top5 [\d.]+ \(valid, 150 examples\)\n",
    proc.stdout,
  )
  assert "checkpoint latest (step 30)" not in proc.stderr
  as_json = th.check_ok(th.run_main(workdir, "--mode=eval", "--checkpoint=latest", "--json", config=None))
  with open(os.path.join(workdir, "eval_valid_30.json")) as f:
    assert json.loads(as_json.stdout) == json.load(f) == {k: v for k, v in result.items() if k != "source"}
  assert result["eval/accuracy"] == pytest.approx(train_evals[-1]["eval/accuracy"], abs=1e-6)
  assert result["eval/loss"] == pytest.approx(train_evals[-1]["eval/loss"], rel=1e-5)
  assert os.path.exists(os.path.join(workdir, "eval_valid_30.json"))

  # best (the default): the kept step with the highest validation accuracy, reported on the test split.
  best_acc = max(r["eval/accuracy"] for r in train_evals)
  proc = th.check_ok(th.run_main(workdir, "--mode=eval", "--split=test", config=None))
  row = th.read_metrics(workdir)[-1]
  best_step = row["step"]
  assert [r["eval/accuracy"] for r in train_evals if r["step"] == best_step] == [best_acc], (row, train_evals)
  assert row["split"] == "test" and row["eval/examples"] == 300 and row["checkpoint"] == "best"
  path = os.path.join(workdir, f"eval_test_{best_step}.json")
  assert os.path.exists(path), (os.listdir(workdir), proc.stderr[-2000:])
  with open(path) as f:
    assert json.load(f)["eval/accuracy"] == row["eval/accuracy"]

  # A rerun of the finished training needs no --config either (config.json); it trains nothing and prints the
  # run's result: the best step and its validation metrics.
  again = th.check_ok(th.run_main(workdir, config=None))
  assert "is complete (step 30 of 30): nothing to train" in again.stderr
  best = [r for r in train_evals if r["step"] == best_step][0]
  assert again.stdout.startswith(f"checkpoint best (step {best_step}) | eval/loss {best['eval/loss']:.4f}, ")
  new = th.run_main(str(tmp_path / "new"), config=None)
  assert new.returncode == 2 and th.error_lines(new).startswith("error: training needs --config=configs/NAME.py")
  assert not os.path.exists(tmp_path / "new")


FAKE_MAIN = r'''"""python -m vitjax.main without a model: train.train and train.evaluate append the config's seed they
are given to WORKDIR/calls.jsonl and return RESULT; --process=N: the process is process N of several."""
import json
import os
import sys

import jax

from vitjax import cli, main, train

RESULT = {"checkpoint": "best", "step": 7, "weights": "params", "split": "valid", "eval/accuracy": 0.5}


def _record(mode, config, workdir):
  with open(os.path.join(workdir, "calls.jsonl"), "a") as f:
    f.write(json.dumps([mode, config.get("seed")]) + "\n")
  return dict(RESULT)


train.train = lambda config, workdir, allow_config_change: _record("train", config, workdir)
train.evaluate = lambda config, workdir, *args: _record("eval", config, workdir)
for arg in [a for a in sys.argv if a.startswith("--process=")]:
  sys.argv.remove(arg)
  jax.process_index = lambda: int(arg[10:])
cli.run(main.main)
'''


def _main_without_a_model(tmp_path, workdir, *args):
  """`python -m vitjax.main ARGS` over FAKE_MAIN's stand-ins: (the process, the [mode, config seed] calls)."""
  script = tmp_path / "fake_main.py"
  script.write_text(FAKE_MAIN)
  calls = os.path.join(workdir, "calls.jsonl")
  if os.path.exists(calls):
    os.remove(calls)
  proc = th.run_module(str(script), f"--workdir={workdir}", *args, timeout=120)
  return proc, [json.loads(line) for line in open(calls)] if os.path.exists(calls) else []


def test_main_takes_the_config_flag_over_the_workdir_s_and_the_workdir_s_without_it(tmp_path):
  """--config, when given, is the run's config in train and eval mode alike; without it a workdir's config.json
  (with its history) is; a new workdir without --config is one error line, and nothing runs."""
  config = "from vitjax.config import default_config\n\n\ndef get_config():\n  c = default_config()\n  c.seed = 11\n  return c\n"
  (tmp_path / "flag.py").write_text(config)
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({"seed": 22}))
  (workdir / "config_history.jsonl").write_text(json.dumps({"changes": {"seed": [22, 33]}}) + "\n")
  for mode in ("train", "eval"):
    proc, calls = _main_without_a_model(tmp_path, workdir, f"--mode={mode}", f"--config={tmp_path / 'flag.py'}")
    assert proc.returncode == 0 and calls == [[mode, 11]], (mode, proc.stderr[-2000:])
    proc, calls = _main_without_a_model(tmp_path, workdir, f"--mode={mode}")
    assert proc.returncode == 0 and calls == [[mode, 33]], (mode, proc.stderr[-2000:])
  new = tmp_path / "new"
  new.mkdir()
  proc, calls = _main_without_a_model(tmp_path, new)
  th.assert_refused(proc, ["training needs --config=configs/NAME.py", f"({new} has no config.json to take it from)"])
  assert calls == []
  proc, calls = _main_without_a_model(tmp_path, new, "--mode=eval")
  th.assert_refused(proc, [f"{new / 'config.json'} not found"])


def test_main_prints_the_result_as_a_line_or_json_from_process_0_only(tmp_path):
  """The result, of training and of an evaluation alike, is stdout's one line, or with --json one JSON object; the
  other processes of a multihost run print nothing (their result is process 0's)."""
  (tmp_path / "config.json").write_text(json.dumps({"seed": 22}))
  for mode in ("train", "eval"):
    proc, _ = _main_without_a_model(tmp_path, tmp_path, f"--mode={mode}")
    assert proc.returncode == 0 and proc.stdout == "checkpoint best (step 7) | eval/accuracy 0.5000 (valid)\n", proc
  proc, _ = _main_without_a_model(tmp_path, tmp_path, "--mode=eval", "--json")
  assert proc.returncode == 0 and proc.stdout.endswith("\n"), proc
  assert json.loads(proc.stdout) == {"checkpoint": "best", "step": 7, "weights": "params", "split": "valid", "eval/accuracy": 0.5}  # fmt: skip
  for args in ((), ("--json",)):
    proc, calls = _main_without_a_model(tmp_path, tmp_path, "--mode=eval", "--process=1", *args)
    assert proc.returncode == 0 and calls == [["eval", 22]] and proc.stdout == "", proc


# ---------------------------------------------------------------------------------------- metrics


def test_metrics_config_and_tensorboard_are_written(finished_run):
  rows = th.read_metrics(finished_run)
  assert rows and all(isinstance(r.get("step"), int) for r in rows)
  keys = set().union(*rows)
  assert {"train/loss", "train/accuracy", "train/lr", "train/steps_per_s", "eval/accuracy", "eval/loss"} <= keys
  train_rows = _train_rows(finished_run)
  # total_steps=30 takes precedence over the config file's num_epochs=60 (2760 steps).
  assert [r["step"] for r in train_rows] == list(range(1, 31))
  assert all(math.isfinite(r["train/loss"]) for r in train_rows)
  assert all("train/steps_per_s" in r for r in train_rows[1:])
  with open(os.path.join(finished_run, "config.json")) as f:
    saved = json.load(f)
  assert saved["model"]["width"] == 16 and saved["total_steps"] == 30
  events = [n for n in os.listdir(os.path.join(finished_run, "tb")) if n.startswith("events.out.tfevents")]
  assert len(events) == 1
  # TensorBoard reads the same scalars the metrics file holds (float32 in the event file)
  for key in ("train/loss", "eval/accuracy"):
    logged = [(r["step"], r[key]) for r in rows if key in r]
    shown = _tensorboard_scalars(finished_run, key)
    assert [s for s, _ in shown] == [s for s, _ in logged], key
    np.testing.assert_allclose([v for _, v in shown], [v for _, v in logged], rtol=1e-6)


# ------------------------------------------------------------------------------ trainer pieces (unit)


def _random_like(shapes, seed=0):
  """Random float32 arrays of the given shapes (params without compiling an init)."""
  rng = np.random.RandomState(seed)
  return jax.tree.map(lambda a: (0.2 * rng.randn(*a.shape)).astype(np.float32), shapes)


def _tiny_vit(image_size=8, seed=0, **kw):
  """A tiny ViT on 1-channel images and random parameters of its shapes (from eval_shape: nothing compiles)."""
  model = models.create("Ti/2", **{**dict(width=16, depth=1, num_heads=2, mlp_dim=32, num_classes=10), **kw})
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, image_size, image_size, 1)))["params"]
  return model, _random_like(flax.core.unfreeze(shapes), seed)


def test_the_trainers_own_settings_are_checked_before_anything_runs():
  """check_config: profile_steps from step 1, a budget above 0 minutes, at least one skip, no model.dtype."""
  from vitjax.config import default_config
  from vitjax.errors import ConfigError
  from vitjax.train import loop

  bad = {
    "profile_steps": ((0, 2), r"profile_steps=\(0, 2\): give \(first, last\) steps, 1 <= first <= last"),
    "max_train_minutes": (0.0, "max_train_minutes=0.0 must be positive"),
    "max_nonfinite_skips": (0, "max_nonfinite_skips=0 must be at least 1"),
  }
  for key, (value, says) in bad.items():
    config = default_config()
    config[key] = value
    with pytest.raises(ConfigError, match=says):
      loop.check_config(config)
  config = default_config()
  config.model.dtype = "bfloat16"
  with pytest.raises(ConfigError, match="remove model.dtype and set --config.compute_dtype"):
    loop.check_config(config)
  config = default_config()
  config.profile_steps, config.max_train_minutes, config.max_nonfinite_skips = (1, 1), 0.5, 1
  loop.check_config(config)


def test_settings_the_run_never_reads_are_named_and_the_ones_it_reads_are_not(tmp_path):
  """config.wandb set without 'wandb' in config.trackers, max_nonfinite_skips without on_nonfinite='skip': one line
  each. Not with wandb tracked, with 'skip', for a sweep's name and group, or for a config read back from config.json
  (its tags a list)."""
  from vitjax.train import notes
  from vitjax.train import workdir as workdir_lib

  workdir_lib.start_fresh(str(tmp_path), default_config())
  c = config_lib.read_config(str(tmp_path))
  assert list(c.wandb.tags) == [] and notes.unread_settings(c) == ""  # (config.json gives the tags back as a list)
  c.wandb.name, c.wandb.group = "trial_0003", "sweep"
  assert notes.unread_settings(c) == ""
  c.wandb.entity, c.max_nonfinite_skips = "me", 4
  assert notes.unread_settings(c) == (
    "config.wandb.entity is set but 'wandb' is not in config.trackers=('tensorboard',): nothing goes to W&B; add it, "
    "e.g. --config.trackers=\"('tensorboard', 'wandb')\"; max_nonfinite_skips=4 is read only with "
    "on_nonfinite='skip' (this run stops at the first non-finite step); add --config.on_nonfinite=skip"
  )
  c.trackers, c.on_nonfinite = ("tensorboard", "wandb"), "skip"
  assert notes.unread_settings(c) == ""


def test_the_label_smoothing_note_gives_the_smoothed_losss_floor_where_the_classes_are_known():
  import types

  from vitjax.train import notes

  floor = lambda eps, k: -((1 - eps + eps / k) * math.log(1 - eps + eps / k) + (k - 1) * eps / k * math.log(eps / k))
  note = notes.smoothing(0.1, types.SimpleNamespace(tgt_vocab_size=8000))
  assert f"(at least {floor(0.1, 8000):.3f} with 8000 classes)" in note and note.startswith("label_smoothing=0.1: ")
  assert "(at least 0.500 with 10 classes)" in notes.smoothing(0.1, types.SimpleNamespace(num_classes=10))
  assert notes.smoothing(0.2, types.SimpleNamespace()) == (
    "label_smoothing=0.2: train/loss is the smoothed objective, eval/loss the plain cross-entropy: train/loss above "
    "eval/loss is not a generalisation gap"
  )


def test_the_evaluation_line_says_best_so_far_or_a_tie_by_the_best_metrics_direction():
  """The best evaluator's line: "best ... so far" for a better value (higher, or lower for a loss), "ties" for an
  equal one (orbax keeps the later step as best, and the trackers' summary follows); a NaN is never best."""
  import types

  from vitjax.train import evaluations

  def notes(best, sign, values):
    ev = object.__new__(evaluations.Evaluations)
    ev.run_ = types.SimpleNamespace(config=types.SimpleNamespace(best=best))
    ev.best_value, ev.sign = None, sign
    return [ev._note({best: v}) for v in values]

  nan = float("nan")
  assert notes("eval/accuracy", 1, [nan, 0.5, 0.4, 0.5, 0.6]) == [
    "",
    " | best eval/accuracy so far",
    "",
    " | ties the best eval/accuracy: this later step becomes best",
    " | best eval/accuracy so far",
  ]
  assert notes("eval/loss", -1, [0.3, 0.4, 0.2]) == [" | best eval/loss so far", "", " | best eval/loss so far"]


def test_decay_mask_excludes_biases_norms_positions_tables_and_cls():
  _, params = _tiny_vit()
  params = flax.core.unfreeze(params)
  params["swin_attn"] = {"relative_position_bias_table": jnp.zeros((9, 2)), "qkv": {"kernel": jnp.zeros((4, 12))}}
  flat = flax.traverse_util.flatten_dict(train.decay_mask(params), sep="/")
  no_decay = sorted(k for k, v in flat.items() if not v)
  for k, v in flat.items():
    last = k.split("/")[-1]
    expected = last in ("kernel",)
    assert v == expected, (k, v)
  assert "cls" in no_decay and "posembed/pos_embedding" in no_decay
  assert "swin_attn/relative_position_bias_table" in no_decay
  assert "encoder/block_0/norm1/scale" in no_decay and "encoder/final_norm/scale" in no_decay
  assert "head/bias" in no_decay and "embedding/bias" in no_decay
  assert flat["embedding/kernel"] and flat["head/kernel"] and flat["swin_attn/qkv/kernel"]


def _schedule_config(decay, warmup_steps=10, warmup_epochs=None, end=0.0, lr=1.0):
  c = default_config()
  c.optim.lr = lr
  c.schedule.decay = decay
  c.schedule.warmup_steps = warmup_steps
  c.schedule.warmup_epochs = warmup_epochs
  c.schedule.end_lr_factor = end
  return c


@pytest.mark.parametrize(
  "decay, expected",
  [
    (
      "cosine",
      {
        60: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)),
        85: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.75)),
        110: 0.1,
      },
    ),
    ("linear", {60: 0.55, 85: 1.0 - 0.9 * 0.75, 110: 0.1}),
    ("rsqrt", {40: 0.5, 90: 1 / 3, 110: math.sqrt(10 / 110)}),  # sqrt(warmup / step)
    ("constant", {60: 1.0, 110: 1.0}),
  ],
)
def test_schedule_warms_up_then_decays(decay, expected):
  for cfg in (_schedule_config(decay, end=0.1), _schedule_config(decay, None, warmup_epochs=2, end=0.1)):
    s = train.make_schedule(cfg, total_steps=110, steps_per_epoch=5)  # warm-up: 10 steps either way
    for step, want in {0: 0.0, 5: 0.5, 10: 1.0, **expected}.items():
      assert float(s(step)) == pytest.approx(want, rel=1e-5, abs=1e-7), (decay, step)


def test_rsqrt_schedule_decays_over_its_own_timescale():
  """schedule.rsqrt_timescale replaces the warm-up as the inverse square root's timescale: lr * sqrt(t0 / (t0 + steps
  after the warm-up))."""
  cfg = _schedule_config("rsqrt")
  cfg.schedule.rsqrt_timescale = 40
  s = train.make_schedule(cfg, total_steps=200, steps_per_epoch=5)  # warm-up: 10 steps
  for step, want in {5: 0.5, 10: 1.0, 50: math.sqrt(40 / 80), 130: 0.5}.items():
    assert float(s(step)) == pytest.approx(want, rel=1e-5), step


def test_schedule_rejects_unknown_decay():
  with pytest.raises(train.ConfigError, match="cosine"):
    train.make_schedule(_schedule_config("exp"), 100, 10)


def test_cross_entropy_with_label_smoothing_matches_hand_computation():
  rng = np.random.RandomState(0)
  logits, labels, k, eps = rng.randn(4, 5).astype(np.float32), np.array([0, 3, 4, 1]), 5, 0.1
  want = []
  for row, y in zip(logits.astype(np.float64), labels):
    logp = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
    target = np.full(k, eps / k)
    target[y] += 1 - eps
    want.append(-(target * logp).sum())
  got = tasks.cross_entropy(jnp.asarray(logits), jnp.asarray(labels), k, smoothing=eps)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
  # Unsmoothed: -log p(label); soft labels: the same formula with the given targets.
  plain = tasks.cross_entropy(jnp.asarray(logits), jnp.asarray(labels), k)
  np.testing.assert_allclose(
    np.asarray(plain), -np.asarray(jax.nn.log_softmax(logits))[np.arange(4), labels], rtol=1e-6
  )
  soft = np.eye(k, dtype=np.float32)[labels] * (1 - eps) + eps / k
  np.testing.assert_allclose(
    np.asarray(tasks.cross_entropy(jnp.asarray(logits), jnp.asarray(soft), k)), want, rtol=1e-6
  )


def _step_config(accum):
  c = default_config()
  c.model = mlc.ConfigDict(
    dict(name="Ti/2", width=16, depth=1, num_heads=2, mlp_dim=32, num_classes=10, dropout_rate=0.0)
  )
  c.optim.name, c.optim.lr, c.optim.kwargs, c.optim.grad_clip_norm = "sgd", 0.5, {}, 0.0
  c.optim.accum_steps = accum
  c.schedule.warmup_steps, c.schedule.decay = 0, "constant"
  return c


def _image_batch(seed, n=16):
  """n random 8x8 grey images in [-1, 1] and their labels of 10 classes."""
  rng = np.random.RandomState(seed)
  return {
    "image": jnp.asarray(rng.uniform(-1, 1, (n, 8, 8, 1)).astype(np.float32)),
    "label": jnp.asarray(rng.randint(0, 10, n).astype(np.int32)),
  }


def _vit_step(cfg):
  """cfg's (_step_config's) tiny ViT: (its jitted train step, the initial TrainState, the model)."""
  model, schedule = train.build_model(cfg), train.make_schedule(cfg, 10, 1)
  tx = train.make_optimizer(cfg, schedule)
  _, params = _tiny_vit(dropout_rate=cfg.model.dropout_rate)
  state = train.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), {})
  return jax.jit(train.make_train_step(model, tx, schedule, cfg, tasks.ImageClassification(cfg, ""))), state, model


def test_gradient_accumulation_matches_one_big_batch():
  batch = _image_batch(1)
  results = []
  for accum in (1, 2):
    step, state, _ = _vit_step(_step_config(accum))
    new_state, metrics = step(state, batch)
    results.append((state.params, new_state, jax.device_get(metrics)))
  (p0, s1, m1), (_, s2, m2) = results
  assert int(s1.step) == int(s2.step) == 1
  moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(p0)))
  assert moved > 1e-3
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-5)
  for key in ("train/loss", "train/accuracy", "train/grad_norm"):
    np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5)


def test_gradient_accumulation_of_a_per_token_loss_matches_one_big_batch():
  """Translation's loss is a mean over target tokens: micro-batches holding unequal numbers of them are weighted by
  those numbers, so that the step is the full batch's (equal weights moved the update by 1-9%)."""
  from types import SimpleNamespace

  from vitjax.tasks.translation import Translation

  class Task:  # the translation task's batch handling and loss, without its data
    tokenizer = SimpleNamespace(PAD=0)
    device_batch = lambda self, batch, key: batch
    model_inputs = lambda self, batch: (batch["src"], batch["tgt"])
    loss = Translation.loss

  rng = np.random.RandomState(0)
  lengths = np.array([9, 2, 8, 1, 9, 3, 7, 2])  # micro-batch 0 (rows 0, 2, ...) holds 33 target tokens, 1 holds 8
  tgt = np.where(np.arange(10)[None] < lengths[:, None], rng.randint(4, 20, (8, 10)), 0).astype(np.int32)
  batch = {"src": jnp.asarray(rng.randint(4, 20, (8, 6)).astype(np.int32)), "tgt": jnp.asarray(tgt)}
  results = []
  for accum in (1, 2):
    cfg = _step_config(accum)
    cfg.model = mlc.ConfigDict(dict(name="transformer_tiny", vocab_size=20, d_model=16, num_heads=2, d_ff=32,
                                    num_layers=1, dropout_rate=0.0, max_len=16))  # fmt: skip
    cfg.label_smoothing = 0.1
    task = Task()
    task.config = cfg
    model = train.build_model(cfg)
    schedule = train.make_schedule(cfg, 10, 1)
    tx = train.make_optimizer(cfg, schedule)
    params = jax.jit(model.init)(jax.random.key(0), batch["src"], batch["tgt"])["params"]
    state = train.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), {})
    new_state, metrics = jax.jit(train.make_train_step(model, tx, schedule, cfg, task))(state, batch)
    results.append((new_state, jax.device_get(metrics)))
  (s1, m1), (s2, m2) = results
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-5)
  for key in ("train/loss", "train/accuracy", "train/grad_norm"):
    np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5)
  assert m1["train/tokens"] == m2["train/tokens"] == lengths.sum()


@pytest.mark.parametrize("frozen", [None, ("^(?!head/).*",)])
def test_the_logged_gradient_norm_is_the_gradients_not_the_updates(frozen):
  """train/grad_norm is the global norm of the loss's gradient (before the learning rate, the decay and clipping);
  no gradient flows to frozen parameters, so with a frozen backbone it is the head's alone."""
  cfg = _step_config(1)
  cfg.optim.weight_decay, cfg.frozen = 0.0, frozen  # plain sgd at a constant learning rate: the update is -lr * grad
  step, state, model = _vit_step(cfg)
  params, batch = state.params, _image_batch(2, 8)
  new, metrics = step(state, batch)
  grads = jax.grad(
    lambda p: tasks.cross_entropy(model.apply({"params": p}, batch["image"])[0], batch["label"], 10).mean()
  )(params)
  if frozen:
    grads = {k: g if k == "head" else jax.tree.map(jnp.zeros_like, g) for k, g in grads.items()}
  want = float(jnp.sqrt(sum(jnp.sum(g.astype(jnp.float32) ** 2) for g in jax.tree.leaves(grads))))
  assert float(metrics["train/grad_norm"]) == pytest.approx(want, rel=1e-4)
  moved = np.sqrt(
    sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(params)))
  )
  assert moved == pytest.approx(0.5 * want, rel=1e-3)  # (the update's norm is lr times it)


def test_a_per_token_loss_and_accuracy_leave_out_the_padding():
  """Translation's loss and token accuracy are means over the target tokens: PAD positions neither score nor count,
  whatever the model predicts there (predicting PAD after the end is not a correct token)."""
  from types import SimpleNamespace

  from vitjax.tasks.translation import Translation

  task = SimpleNamespace(tokenizer=SimpleNamespace(PAD=0), config=SimpleNamespace(label_smoothing=0.0))
  tgt = np.array([[5, 6, 7, 0], [8, 0, 0, 0]], np.int32)  # 4 tokens, 4 padding positions
  pred = np.array([[5, 9, 7, 0], [3, 0, 0, 0]])  # right at 2 of the 4 tokens, and PAD at every padding position
  logits = 4.0 * np.eye(10, dtype=np.float32)[pred] + np.random.RandomState(0).randn(2, 4, 10).astype(np.float32)
  loss, metrics = Translation.loss(task, jnp.asarray(logits), {"tgt": jnp.asarray(tgt)})
  logp = np.asarray(jax.nn.log_softmax(logits))
  rows, cols = np.nonzero(tgt)
  np.testing.assert_allclose(float(loss), -logp[rows, cols, tgt[rows, cols]].mean(), rtol=1e-5)
  assert (logits.argmax(-1) == pred).all()
  assert float(metrics["accuracy"]) == pytest.approx(0.5) and float(metrics["tokens"]) == 4.0


def test_each_micro_batch_draws_its_own_dropout():
  """A batch of two identical micro-batches gives the step of one of them without dropout, and not with it: each
  micro-batch draws its own dropout masks (the same masks for all would correlate them)."""
  half = _image_batch(3, 8)
  twice = {k: jnp.repeat(v, 2, axis=0) for k, v in half.items()}  # micro-batch i holds rows i, i + 2, ...: `half`
  for dropout in (0.0, 0.3):
    losses = []
    for accum, batch in ((1, half), (2, twice)):
      cfg = _step_config(accum)
      cfg.model.dropout_rate = dropout
      step, state, _ = _vit_step(cfg)
      losses.append(float(step(state, batch)[1]["train/loss"]))
    if dropout:
      assert abs(losses[1] - losses[0]) > 1e-4, losses
    else:
      assert losses[1] == pytest.approx(losses[0], rel=1e-5)


def test_a_skipped_step_keeps_the_parameters_but_the_schedule_goes_on_with_the_step():
  """A non-finite step is not applied, but it counts as a step: the next one applies the logged train/lr =
  schedule(step) (it applied schedule(step - skips), and the schedule never reached its end)."""
  cfg = _step_config(1)
  cfg.schedule.decay, cfg.optim.weight_decay = "linear", 0.0  # plain sgd: an update is -lr * gradient
  step, fresh, _ = _vit_step(cfg)
  params, good = fresh.params, _image_batch(1)
  bad = {**good, "image": jnp.full((16, 8, 8, 1), jnp.nan)}
  after_bad, m_bad = step(fresh, bad)
  assert float(m_bad["train/nonfinite"]) == 1.0 and int(after_bad.step) == 1
  for a, b in zip(jax.tree.leaves(after_bad.params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  first, m0 = step(fresh, good)  # schedule(0) = lr
  second, m1 = step(after_bad, good)  # the same gradient, at step 1: schedule(1) = 0.9 lr
  assert float(m0["train/lr"]) == pytest.approx(0.5) and float(m1["train/lr"]) == pytest.approx(0.45)
  moved = lambda s: np.concatenate(
    [np.ravel(a - b) for a, b in zip(jax.tree.leaves(s.params), jax.tree.leaves(params))]
  )
  np.testing.assert_allclose(moved(second), moved(first) * 0.9, rtol=1e-4, atol=1e-7)  # (p + u) - p rounds


def test_a_skipped_step_leaves_adams_moments_as_they_were():
  """A non-finite step's gradient never reaches the optimizer's state: Adam's moments and its count stay as they were
  (a NaN there would make every later step non-finite), and the next finite step trains."""
  cfg = _step_config(1)
  cfg.optim.name, cfg.optim.weight_decay = "adamw", 0.0
  step, fresh, _ = _vit_step(cfg)
  params, good = fresh.params, _image_batch(1)
  after_bad, m_bad = step(fresh, {**good, "image": jnp.full((16, 8, 8, 1), jnp.nan)})
  assert float(m_bad["train/nonfinite"]) == 1.0
  adam = lambda s: [x for x in jax.tree.leaves(s, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
                    if isinstance(x, optax.ScaleByAdamState)][0]  # fmt: skip
  for a, b in zip(jax.tree.leaves(adam(after_bad.opt_state)), jax.tree.leaves(adam(fresh.opt_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  after_good, m_good = step(after_bad, good)
  assert float(m_good["train/nonfinite"]) == 0.0
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(after_good))
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after_good.params), jax.tree.leaves(params)))


def test_a_step_that_would_overflow_the_parameters_is_not_applied():
  """The divergence guard checks the new parameters too: a step whose loss and gradient are finite but whose update
  takes the parameters' norm past float32's range (a parameter past 1e19) is skipped, as a non-finite loss is."""
  cfg = _step_config(1)
  cfg.optim.lr, cfg.optim.weight_decay = 1e30, 0.0  # plain sgd: the update is -1e30 * gradient, each still finite
  step, state, _ = _vit_step(cfg)
  params = state.params
  new, m = step(state, _image_batch(1))
  assert np.isfinite(float(m["train/loss"])) and 0 < float(m["train/grad_norm"]) < 1e3
  assert float(m["train/nonfinite"]) == 1.0 and int(new.step) == 1
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_adapt_params_resamples_positions_and_replaces_head():
  _, loaded = _tiny_vit()  # 8x8 images: 1 + 4x4 tokens, 10 classes
  _, target = _tiny_vit(image_size=16, seed=1, num_classes=5)  # 1 + 8x8 tokens, 5 classes
  out, logs = adapt_params(loaded, target)
  pos_l, pos_o = np.asarray(loaded["posembed"]["pos_embedding"]), out["posembed"]["pos_embedding"]
  assert pos_l.shape == (1, 17, 16) and pos_o.shape == (1, 65, 16)
  np.testing.assert_array_equal(pos_o[:, :1], pos_l[:, :1])  # the class token's embedding is kept
  want = posenc.resample_posemb(pos_l, (8, 8), num_prefix_tokens=1, method="bicubic_aa")
  np.testing.assert_allclose(pos_o, want, rtol=1e-6)
  for name in ("kernel", "bias"):
    np.testing.assert_array_equal(out["head"][name], np.asarray(target["head"][name]))  # new head: its init
  np.testing.assert_array_equal(
    out["encoder"]["block_0"]["mlp"]["fc1"]["kernel"], np.asarray(loaded["encoder"]["block_0"]["mlp"]["fc1"]["kernel"])
  )
  assert any("resampled posembed/pos_embedding" in s for s in logs) and any("new head" in s for s in logs)


def test_adapt_params_lists_every_mismatch():
  _, loaded = _tiny_vit()
  _, target = _tiny_vit(mlp_dim=48)
  with pytest.raises(train.ConfigError) as e:
    adapt_params(loaded, target)
  msg = str(e.value)
  assert "encoder/block_0/mlp/fc1/kernel: model (16, 48), checkpoint (16, 32)" in msg
  assert "encoder/block_0/mlp/fc1/bias: model (48,), checkpoint (32,)" in msg
  assert "encoder/block_0/mlp/fc2/kernel: model (48, 16), checkpoint (32, 16)" in msg
  assert "attn" not in msg  # only the parameters that differ
  _, same = _tiny_vit()
  same["encoder"]["extra"] = {"kernel": np.zeros((2, 2), np.float32)}
  with pytest.raises(train.ConfigError) as e:
    adapt_params(loaded, same)
  assert "encoder/extra/kernel: missing from the checkpoint (model (2, 2))" in str(e.value)
  assert "mlp" not in str(e.value)


def test_adapt_params_says_what_it_leaves_out_and_names_a_class_token_mismatch():
  """A checkpoint deeper than the model, or with options it lacks, was cut without a word; a class token on one
  side only was reported as 'a non-square grid of 15 tokens'."""
  _, loaded = _tiny_vit(depth=4)
  _, target = _tiny_vit(depth=2)
  out, logs = adapt_params(loaded, target)
  assert logs == ["left out 32 of the checkpoint's parameters that the model does not have: encoder/block_2/*, "
                  "encoder/block_3/*"]  # fmt: skip
  assert set(out["encoder"]) == set(target["encoder"])
  _, gap = _tiny_vit(pool_type="gap")
  for a, b, says in ((loaded, gap, "has a class token's row, the model's (1, 16, 16) no class token's row: set "
                      "config.model.pool_type to the checkpoint's (tok)"), (gap, target, "(gap or map)")):  # fmt: skip
    with pytest.raises(train.ConfigError, match=re.escape(says)):
      adapt_params(a, b)


def test_adapt_params_truncates_or_extends_a_learned_position_table():
  """A learned [max_len, D] table (the Transformer) keeps its first rows; rows past the checkpoint's come from the
  target's initialisation."""
  table = np.arange(20, dtype=np.float32).reshape(5, 4)
  longer = np.full((8, 4), -1.0, np.float32)
  out, logs = adapt_params({"enc": {"pos_embedding": table}}, {"enc": {"pos_embedding": longer}})
  np.testing.assert_array_equal(out["enc"]["pos_embedding"], np.concatenate([table, longer[5:]]))
  assert logs == ["enc/pos_embedding (5, 4) -> (8, 4) (truncated, or extended with its initialisation)"]
  out, _ = adapt_params({"enc": {"pos_embedding": table}}, {"enc": {"pos_embedding": np.zeros((3, 4), np.float32)}})
  np.testing.assert_array_equal(out["enc"]["pos_embedding"], table[:3])


def test_adapt_params_stacks_and_unstacks_layers_in_numeric_order():
  """block_10 sorts before block_2 as text: a checkpoint of 12 layers is stacked and unstacked by layer number."""
  layers = {f"block_{i}": {"dense": {"kernel": np.full((2, 3), i, np.float32)}} for i in sorted(range(12), key=str)}
  plain = {"encoder": layers}
  scanned = {"encoder": {"blocks": {"block": {"dense": {"kernel": np.zeros((12, 2, 3), np.float32)}}}}}
  stacked, _ = adapt_params(plain, scanned)
  np.testing.assert_array_equal(stacked["encoder"]["blocks"]["block"]["dense"]["kernel"][:, 0, 0], np.arange(12))
  unstacked, _ = adapt_params(stacked, plain)
  for i in range(12):
    np.testing.assert_array_equal(unstacked["encoder"][f"block_{i}"]["dense"]["kernel"], np.full((2, 3), i))


def test_max_train_minutes_stops_with_a_final_eval_and_checkpoint(tmp_path, run_args):
  workdir = str(tmp_path / "w")
  # kept, but no evaluator reads it; W&B's project without the wandb tracker; skips with on_nonfinite=stop: each said
  run_args = [*run_args, "--config.ema_decay=0.9", "--config.wandb.project=p", "--config.max_nonfinite_skips=4"]
  proc = th.check_ok(th.run_main(workdir, *run_args, "--config.total_steps=100000", "--config.max_train_minutes=0.001"))
  assert "max_train_minutes=0.001 reached" in proc.stdout + proc.stderr
  assert "ema_decay=0.9: the moving average is kept" in proc.stderr and "no evaluator reads it" in proc.stderr
  assert "config.wandb.project is set but 'wandb' is not in config.trackers=('tensorboard',)" in proc.stderr
  assert "max_nonfinite_skips=4 is read only with on_nonfinite='skip'" in proc.stderr
  assert "label_smoothing=0.1: train/loss is the smoothed objective (at least 0.500 with 10 classes)" in proc.stderr
  rows = th.read_metrics(workdir)
  last = max(r["step"] for r in rows)
  assert last < 100000 and any("eval/accuracy" in r and r["step"] == last for r in rows)
  assert th.finished_steps(workdir) and max(th.finished_steps(workdir)) == last
  spent = max(r["train/elapsed_s"] for r in rows if "train/elapsed_s" in r)
  assert spent > 0.06  # the budget's 0.06 s and the compilation before it

  # the budget counts earlier sessions: the same command again trains nothing, a larger budget goes on from there
  again = th.check_ok(
    th.run_main(workdir, *run_args, "--config.total_steps=100000", "--config.max_train_minutes=0.001")
  )
  assert "has spent its max_train_minutes=0.001" in again.stderr and max(th.finished_steps(workdir)) == last
  more = f"--config.max_train_minutes={(spent + 5) / 60}"
  other = f"--config.init_from={workdir}"  # read only at a fresh start: a resume says it does not use it
  longer = th.check_ok(th.run_main(workdir, *run_args, "--config.total_steps=100000", more, other))
  assert f"resumed from {workdir}/checkpoints at step {last}" in longer.stderr, longer.stderr[-2000:]
  assert f"config.init_from='{workdir}' is new, but the run resumes its own checkpoint of step {last}" in longer.stderr
  rows = [r for r in th.read_metrics(workdir) if "train/elapsed_s" in r]
  assert max(th.finished_steps(workdir)) > last and spent + 3 < rows[-1]["train/elapsed_s"] < spent + 26


def test_compute_dtype_auto_is_bfloat16_on_cpus_with_bfloat16_instructions_only(monkeypatch):
  # On AVX512-BF16 the bfloat16 step is 1.20-1.59x float32's speed for every bench_train model (issue 28).
  from vitjax.config import default_config
  from vitjax.models import network as state

  c = default_config()
  c.compute_dtype = "auto"
  assert "fpu" in state.cpu_flags()  # read from /proc/cpuinfo
  for flags, want in (
    ({"avx2", "avx512f"}, "float32"),
    ({"avx512f", "avx512_bf16"}, "bfloat16"),
    ({"amx_bf16"}, "bfloat16"),
  ):
    monkeypatch.setattr(state, "cpu_flags", lambda f=flags: f)
    state._auto_dtype.cache_clear()  # decided once per process: each pretend CPU is a new process
    assert state.compute_dtype("auto") == want and state.compute_dtype("float32") == "float32"
    assert state.build_model(c).dtype == (jnp.bfloat16 if want == "bfloat16" else None)
  monkeypatch.undo()
  state._auto_dtype.cache_clear()  # this process's own answer for the tests after this one


def test_bfloat16_is_fast_on_gpus_of_compute_capability_8_and_up(monkeypatch):
  """An A100 (8.0) and later multiply bfloat16 faster; a V100 (7.0) or a GPU that reports no capability does not."""
  from vitjax.models import network as state

  monkeypatch.setattr(state.jax, "default_backend", lambda: "gpu")
  for capability, want in (("7.5", False), ("8.0", True), ("9.0", True), (None, False)):
    device = type("Gpu", (), {"compute_capability": capability})()
    monkeypatch.setattr(state.jax, "local_devices", lambda d=device: [d])
    assert state.bfloat16_is_fast() is want, capability


def test_bfloat16_compute_keeps_float32_parameters(tmp_path, run_args):
  workdir = str(tmp_path / "w")
  th.check_ok(
    th.run_main(
      workdir, *run_args, "--config.compute_dtype=bfloat16", "--config.total_steps=5", "--config.eval_every=5"
    )
  )
  rows = th.read_metrics(workdir)
  assert all(np.isfinite(r["train/loss"]) for r in rows if "train/loss" in r)
  assert any("eval/accuracy" in r for r in rows)
  state = th.load_state(workdir)
  assert {np.asarray(x).dtype for x in jax.tree.leaves(state["params"])} == {np.dtype("float32")}
