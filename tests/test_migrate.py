"""Old workdirs load, evaluate and resume: tests/golden/workdir_v1 holds two runs in config version 1's layout
(before optim.kwargs, lr_mults, wd_mults, frozen), written by an older vitjax with what it evaluated and resumed
them to (expected.json). vitjax.config.migrate is the one place that reads their old names."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import train_helpers as th

from vitjax import config as config_lib
from vitjax.errors import ConfigError
from vitjax.train import workdir as workdir_lib

GOLDEN = os.path.join(th.ROOT, "tests", "golden", "workdir_v1")
EXPECTED = json.load(open(os.path.join(GOLDEN, "expected.json")))
# what a resume with today's names gives the command line (the old --config.optim.b2=0.95 is optim.kwargs now)
RESUME_NOW = {
  "adamw": [
    "--config.ema_decay=0.9",
    "--config.optim.layer_decay=0.75",
    "--config.optim.kwargs={'b2': 0.95}",
    # the moving average's evaluation is an evaluator of its own since version 3
    "--config.evals={'eval': {'type': 'classification'}, 'eval_ema': {'type': 'classification', 'weights': 'ema'}}",
  ],
  "sgd": [
    "--config.optim.name=sgd",
    "--config.optim.lr=0.1",
    "--config.optim.kwargs={'momentum': 0.9, 'nesterov': True}",
  ],
}


def test_version_1_configs_migrate_to_todays_names_and_defaults():
  adamw = config_lib.read_config(os.path.join(GOLDEN, "adamw"))
  sgd = config_lib.read_config(os.path.join(GOLDEN, "sgd"))
  # optax's defaults are dropped (adamw's b1 0.9, eps 1e-8; sgd's nesterov False), the rest kept
  assert adamw.optim.kwargs.to_dict() == {"b2": 0.95} and "b1" not in adamw.optim
  assert sgd.optim.kwargs.to_dict() == {"momentum": 0.9, "nesterov": True}
  for c in (adamw, sgd):
    assert c.config_version == config_lib.CONFIG_VERSION
    assert tuple(c.lr_mults) == () and c.wd_mults is None and tuple(c.frozen) == ()
  # version 3: the primary evaluation and the moving average's are named evaluators, best_metric is best
  assert adamw.evals.to_dict() == {
    "eval": {"type": "classification", "split": "valid"},
    "eval_ema": {"type": "classification", "split": "valid", "weights": "ema"},
  }
  assert sgd.evals.to_dict() == {"eval": {"type": "classification", "split": "valid"}}
  assert adamw.best == sgd.best == "eval/accuracy" and "best_metric" not in adamw and "probe" not in adamw
  # a migrated config is today's: migrating again changes nothing, and the file's own fields are kept
  flat = config_lib.flatten(config_lib.effective_config(os.path.join(GOLDEN, "adamw")))
  assert config_lib.migrate(flat) == flat
  assert flat["optim.layer_decay"] == 0.75 and flat["ema_decay"] == 0.9 and flat["model.width"] == 16


def test_a_config_from_a_newer_vitjax_is_one_error():
  with pytest.raises(ConfigError, match="newer than this vitjax's"):
    config_lib.migrate({"config_version": config_lib.CONFIG_VERSION + 1})


def _run(workdir, data_dir, *args):
  env = {**th.env(), "TFDS_DATA_DIR": data_dir}
  proc = subprocess.run(
    [sys.executable, "-m", "vitjax.main", f"--workdir={workdir}", "--json", *args],
    cwd=th.ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  return json.loads(th.check_ok(proc).stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_a_version_1_workdir_evaluates_and_resumes_as_it_did(name, data_dir, tmp_path):
  """Evaluation of the kept checkpoint gives the old numbers; a resume to step 6 restores the optimizer state
  (adamw with EMA and layer decay, sgd with Nesterov momentum: the same optax chains as before) and lands where
  the old code did. Tolerance: the tests compile with XLA's optimisations off, the old numbers were not."""
  want = EXPECTED[name]
  workdir = str(tmp_path / name)
  shutil.copytree(os.path.join(GOLDEN, name), workdir)
  got = _run(workdir, data_dir, "--mode=eval", "--split=test")
  assert got["step"] == 4
  np.testing.assert_allclose(got["eval/loss"], want["eval_test"]["eval/loss"], rtol=1e-5)
  if name == "adamw":
    ema = _run(workdir, data_dir, "--mode=eval", "--split=test", "--weights=ema")
    np.testing.assert_allclose(ema["eval/loss"], want["eval_test_ema"]["eval/loss"], rtol=1e-5)
  common = EXPECTED["common"].split()
  resumed = _run(workdir, data_dir, *common, *RESUME_NOW[name], "--config.total_steps=6", "--allow_config_change")
  assert resumed["step"] == {"adamw": 6, "sgd": 4}[name]  # the best by accuracy (sgd's step 6 is worse)
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  step6 = {k: v for r in rows if r.get("step") == 6 for k, v in r.items()}
  for key, value in want["resumed_to_6_valid"].items():
    np.testing.assert_allclose(step6[key], value, rtol=1e-5)
  np.testing.assert_allclose(step6["train/loss"], want["resumed_to_6_train_loss"], rtol=1e-5)
  # the change of total_steps is recorded in today's names; the workdir still reads as today's version
  history = [json.loads(line) for line in open(os.path.join(workdir, "config_history.jsonl"))]
  assert "total_steps" in history[-1]["changes"] and not any(k.startswith("optim.b") for k in history[-1]["changes"])
  assert config_lib.read_config(workdir).total_steps == 6


def test_optim_kwargs_is_compared_and_recorded_whole(tmp_path):
  """A resume that changes optim.kwargs records the dict as one change, and the workdir reads back with it (field by
  field, a new key beside an empty dict could not be read back)."""
  from vitjax.config import default_config

  workdir = str(tmp_path / "w")
  shutil.copytree(os.path.join(GOLDEN, "adamw"), workdir)
  config = default_config()
  config.update_from_flattened_dict(
    {
      k: v
      for k, v in config_lib.flatten(config_lib.effective_config(workdir)).items()
      if k in config_lib.flatten(workdir_lib.as_dict(config))
    }
  )
  config.optim.kwargs = {"b2": 0.9, "eps": 1e-6}
  changes = workdir_lib.config_changes(workdir, config)
  assert changes["optim.kwargs"] == ({"b2": 0.95}, {"b2": 0.9, "eps": 1e-6})
  assert not any(k.startswith("optim.kwargs.") for k in changes)
  workdir_lib.record_config_change(workdir, 4, changes)
  assert config_lib.read_config(workdir).optim.kwargs.to_dict() == {"b2": 0.9, "eps": 1e-6}


def test_version_2_evaluations_become_named_evaluators_with_their_options():
  """Version 2 -> 3: the primary evaluation (data.eval_split, data.eval_examples), its moving average's twin, the
  (name, split, kind, every) entries of config.evals (a probe with the probe block's options), best_metric as best
  (an MAE run's default: eval/loss), a translation run's decode block as its evaluator's options."""
  flat = config_lib.migrate(
    {
      "config_version": 2,
      "task": "classification",
      "data.eval_split": "test",
      "data.eval_examples": 100,
      "ema_decay": 0.99,
      "evals": [["probe_valid", "valid", "probe", 500], ["ema_valid", "valid", "ema", None]],
      "probe.knn_k": 10,
      "probe.shots": [1, 5],
      "best_metric": "probe_valid/linear",
      "best_mode": "max",
    }
  )
  evals = {k: v for k, v in flat.items() if k.startswith("evals.")}
  assert evals == {
    "evals.eval.type": "classification",
    "evals.eval.split": "test",
    "evals.eval.examples": 100,
    "evals.eval_ema.type": "classification",
    "evals.eval_ema.split": "test",
    "evals.eval_ema.examples": 100,
    "evals.eval_ema.weights": "ema",
    "evals.probe_valid.type": "probe",
    "evals.probe_valid.split": "valid",
    "evals.probe_valid.every": 500,
    "evals.probe_valid.knn_k": 10,
    "evals.probe_valid.shots": [1, 5],
    "evals.ema_valid.type": "classification",
    "evals.ema_valid.split": "valid",
    "evals.ema_valid.examples": 100,
    "evals.ema_valid.weights": "ema",
  }, evals
  assert flat["best"] == "probe_valid/linear" and flat["config_version"] == config_lib.CONFIG_VERSION
  assert not any(k.startswith(("probe.", "data.eval_")) or k in ("best_metric", "best_mode") for k in flat), flat
  assert config_lib.migrate({"config_version": 2, "task": "mae"})["best"] == "eval/loss"
  assert config_lib.migrate({"config_version": 2})["best"] == "eval/accuracy"
  translation = config_lib.migrate({"config_version": 2, "task": "translation", "decode.beam_size": 2})
  assert translation["evals.eval.beam_size"] == 2 and translation["evals.eval.type"] == "translation"
  assert "decode.beam_size" not in translation
