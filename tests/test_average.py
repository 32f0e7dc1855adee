"""Checkpoint averaging (python -m vitjax.average): the mean of two known checkpoints, computed sharded over 8
devices, read back by --checkpoint=averaged and vitjax.load; a corrupt member is refused and nothing is written."""

import json
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import train_helpers as th
from test_faults import _corrupt


def _copy(finished_run, tmp_path):
  workdir = str(tmp_path / "w")
  shutil.copytree(finished_run, workdir)
  return workdir


def _saved_params(path: str) -> dict:
  checkpointer = ocp.PyTreeCheckpointer()
  tree = checkpointer.metadata(path).item_metadata.tree
  as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  return checkpointer.restore(path, restore_args=as_numpy)["params"]


def test_the_average_of_two_checkpoints_is_their_mean_sharded_and_read_back(finished_run, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  # averaged on 8 devices with the attention heads and MLP split over a tensor axis (bookkeeping fields)
  path = os.path.join(workdir, "config.json")
  original = open(path).read()
  config = json.loads(original)
  config.update(sharding="tp", mesh=[["data", 4], ["tensor", 2]])
  json.dump(config, open(path, "w"))
  a, b = th.finished_steps(workdir)[-2:]
  proc = th.check_ok(th.run_module("average", f"--workdir={workdir}", f"--steps={a},{b}", devices=8))
  assert f"averaged steps {a}, {b}" in proc.stdout
  open(path, "w").write(original)  # read back on one device

  want = jax.tree.map(
    lambda x, y: (x + y) / 2, th.load_state(workdir, a)["params"], th.load_state(workdir, b)["params"]
  )
  got = _saved_params(os.path.join(workdir, "averaged", str(b), "state"))
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
  assert not np.allclose(jax.tree.leaves(want)[0], jax.tree.leaves(th.load_state(workdir, b)["params"])[0])

  import vitjax

  trained = vitjax.load(workdir, "averaged")  # one device here: the layout does not matter
  assert trained.step == b
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(trained.variables["params"]), strict=True):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-7)
  ev = th.check_ok(th.run_main(workdir, "--mode=eval", "--checkpoint=averaged", "--json", config=None))
  assert json.loads(ev.stdout.strip().splitlines()[-1])["checkpoint"] == "averaged"
  assert os.path.exists(os.path.join(workdir, "eval_valid_averaged.json"))
  # averaging again replaces the average
  th.check_ok(th.run_module("average", f"--workdir={workdir}", "--last=1"))
  last = _saved_params(os.path.join(workdir, "averaged", str(th.finished_steps(workdir)[-1]), "state"))
  np.testing.assert_array_equal(jax.tree.leaves(last)[0], jax.tree.leaves(th.load_state(workdir)["params"])[0])
  assert sorted(os.listdir(os.path.join(workdir, "averaged"))) == [str(th.finished_steps(workdir)[-1])]


# arrays that read back but are not what was saved; bytes that orbax cannot read
@pytest.mark.parametrize("how", ["checksum", "flip"])
def test_a_corrupt_member_is_refused_and_nothing_is_written(how, finished_run, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  a, b = th.finished_steps(workdir)[-2:]
  _corrupt(os.path.join(workdir, "checkpoints", str(b)), how)
  before = th.snapshot(workdir)
  proc = th.run_module("average", f"--workdir={workdir}", f"--steps={a},{b}")
  errors = th.error_lines(proc).strip().splitlines()
  assert proc.returncode == 2 and len(errors) == 1 and f"checkpoint {b} in" in errors[0], proc.stderr[-2000:]
  assert f"average without step {b}, e.g. --steps={a}" in errors[0]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert th.snapshot(workdir) == before and not os.path.exists(os.path.join(workdir, "averaged"))


def test_averaging_bad_input_is_one_line(finished_run, tmp_path):
  workdir = _copy(finished_run, tmp_path)
  for args, says in (
    (["--last=99"], "--last=99: the workdir keeps"),
    (["--steps=7"], "no checkpoint for step(s) [7]"),
    ([], "give either --last=N"),
  ):
    proc = th.run_module("average", f"--workdir={workdir}", *args)
    assert proc.returncode == 2 and says in th.error_lines(proc), (args, proc.stderr[-1500:])
  proc = th.run_main(workdir, "--mode=eval", "--checkpoint=averaged", config=None)
  assert proc.returncode == 2 and "python -m vitjax.average" in th.error_lines(proc)


def test_choose_takes_the_newest_or_the_given_steps_in_order_and_refuses_the_rest():
  """--last=N takes the N newest (all of them at N = how many are kept); --steps in any order averages in step order,
  so the newest member names the average; --last=0, both flags or neither is an error, not every checkpoint."""
  from vitjax.errors import ConfigError
  from vitjax.train import averaging

  kept = [3, 8, 10]
  assert averaging.choose(kept, last=3) == [3, 8, 10] and averaging.choose(kept, last=1) == [10]
  assert averaging.choose(kept, steps=["10", "8", "3", "8"]) == [3, 8, 10]
  assert averaging.choose([3, 8], steps=["8", "3"]) == [3, 8]
  for last, steps, says in (
    (0, None, "--last=0 must be at least 1"),
    (4, None, "--last=4: the workdir keeps 3"),
    (1, ["8"], "give either"),
    (None, None, "give either"),
    (None, ["9"], r"no checkpoint for step\(s\) \[9\]"),
    (None, ["x"], "give step numbers"),
  ):
    with pytest.raises(ConfigError, match=says):
      averaging.choose(kept, last, steps)


def test_checkpoint_averaged_reads_the_average_or_the_one_a_stopped_averaging_left(tmp_path):
  """--checkpoint=averaged reads WORKDIR/averaged; an averaging that stopped between its two renames left only
  averaged.old, which is read then; it holds parameters only (no moving average), and without one the line says how
  to write it."""
  import jax.numpy as jnp

  from vitjax.config import default_config
  from vitjax.errors import ConfigError
  from vitjax.models.checkpoints import read_variables
  from vitjax.train import checkpoints as ckpt_lib

  workdir, config = str(tmp_path), default_config()
  best = (config.best, "max")
  abstract = jax.eval_shape(lambda: {"params": {"w": jnp.zeros(3)}, "model_state": {}})
  with pytest.raises(ConfigError, match="no averaged checkpoint in .* python -m vitjax.average"):
    read_variables(workdir, "averaged", abstract, "params", *best)
  for subdir, value in (("averaged.old", 1.0), ("averaged", 2.0)):
    with ckpt_lib.Checkpoints(workdir, config.best, "max", keep=1, subdir=subdir) as out:
      out.save(7, {"params": {"w": jnp.full(3, value)}, "model_state": {}}, json.dumps({"averaged_steps": [5, 7]}))
  step, params, _ = read_variables(workdir, "averaged", abstract, "params", *best)
  assert step == 7 and np.asarray(params["w"]).tolist() == [2.0] * 3
  with pytest.raises(ConfigError, match="use --weights=params"):
    read_variables(workdir, "averaged", abstract, "ema", *best)
  shutil.rmtree(os.path.join(workdir, "averaged"))
  step, params, _ = read_variables(workdir, "averaged", abstract, "params", *best)
  assert step == 7 and np.asarray(params["w"]).tolist() == [1.0] * 3
