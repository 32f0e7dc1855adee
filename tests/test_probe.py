"""Representation evaluation (vitjax.probe, vitjax.evaluators.probe): the closed-form ridge against a direct solve,
the weighted k-NN against a loop written from its definition, few-shot draws, and --eval=probe / the 'probe'
evaluator on the tiny digits run, with its bad input."""

import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import train_helpers as th

from vitjax import models, probe
from vitjax.tasks.classification import ImageClassification
from vitjax.tasks.mae import MaskedImageModeling


def _clusters(n, d=6, classes=3, seed=0, spread=1.0):
  centres = np.random.default_rng(100).normal(size=(classes, d)) * 3  # the same classes in every sample
  rng = np.random.default_rng(seed)
  y = rng.integers(0, classes, n)
  return centres[y] + spread * rng.normal(size=(n, d)), y


@pytest.mark.parametrize("n", [40, 4])  # N >= D (eigh of x^T x) and N < D (of x x^T)
def test_ridge_is_the_regularised_least_squares_solution(n):
  x, y = _clusters(n)
  ridge = probe.Ridge(x, y, 3)
  xs = (x - x.mean(0)) / (x.std(0) + 1e-6)
  t = 2.0 * np.eye(3)[y] - 1.0
  for l2 in (0.1, 10.0):
    w = np.linalg.solve(xs.T @ xs + l2 * np.eye(x.shape[1]), xs.T @ (t - t.mean(0)))
    test, _ = _clusters(7, seed=1)
    want = np.argmax((test - x.mean(0)) / (x.std(0) + 1e-6) @ w + t.mean(0), axis=1)
    np.testing.assert_array_equal(ridge.predict(test, l2), want)


def test_linear_probe_chooses_the_regulariser_on_the_selection_split():
  fit, select, test = _clusters(300, seed=0), _clusters(100, seed=1), _clusters(100, seed=2)
  out = probe.linear_probe(fit, select, {"test": test}, 3)
  ridge = probe.Ridge(*fit, 3)
  best = max(probe.LINEAR_L2, key=lambda a: (ridge.accuracy(*select, a * 300), -a))
  assert out["l2"] == best * 300 and out["test"] > 0.9
  # unlearnable labels: chance, not more
  noise = (fit[0], np.random.default_rng(5).integers(0, 3, 300))
  assert probe.linear_probe(noise, select, {"test": test}, 3)["test"] < 0.6


def test_knn_votes_with_dino_weights():
  rng = np.random.default_rng(0)
  bank, bank_y = rng.normal(size=(50, 4)), rng.integers(0, 3, 50)
  x, y = rng.normal(size=(9, 4)), rng.integers(0, 3, 9)
  opts = probe.Options(knn_k=5, knn_temperature=0.1)
  unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)
  correct = 0
  for xi, yi in zip(unit(x), y, strict=True):
    sims = unit(bank) @ xi
    votes = np.zeros(3)
    for j in np.argsort(-sims)[:5]:
      votes[bank_y[j]] += np.exp(sims[j] / 0.1)
    correct += votes.argmax() == yi
  assert probe.knn((bank, bank_y), x, y, 3, opts, chunk=4) == correct / 9


def test_few_shot_draws_are_fixed_and_spread():
  fit, test = _clusters(300, spread=3.0), _clusters(200, seed=3, spread=3.0)
  opts = probe.Options(shots=(1, 10), draws=4)
  a, b = probe.few_shot(fit, {"test": test}, 3, opts), probe.few_shot(fit, {"test": test}, 3, opts)
  assert a == b  # the same draws every time (options.seed), so runs are compared on the same shots
  assert a[1]["test"][1] > 0  # draws differ
  assert a[10]["test"][0] > a[1]["test"][0]
  from vitjax.config import evaluator

  entry = evaluator("probe", seed=7)  # the evaluator's seed reaches the draws: another seed, other shots
  assert probe.Options.of(entry).seed == 7
  assert probe.few_shot(fit, {"test": test}, 3, probe.Options.of(entry))[1] != a[1]


def test_few_shot_past_the_smallest_class_says_so(caplog):
  """25shot on classes of 19 examples took the same 19 in every draw (a spread of 0) without a word."""
  caplog.set_level("INFO", logger="absl")
  x, y = _clusters(300, spread=3.0)
  small = np.concatenate([np.flatnonzero(y == c)[:19] for c in range(3)])
  got = probe.few_shot((x[small], y[small]), {"test": _clusters(60, seed=3)}, 3, probe.Options(shots=(5, 25), draws=3))
  assert got[25]["test"][1] == 0.0  # the same 19 in every draw
  said = [r.getMessage() for r in caplog.records if "shot" in r.getMessage()]
  assert said == [
    "25shot: the smallest class has 19 examples to fit on: each draw takes those 19, not 25; give shots of 19 or "
    "fewer, or more examples (fit_examples=None)"
  ], said


def test_probe_options_are_checked_and_a_small_bank_votes_with_all_its_examples():
  """Options.of refuses what the probes cannot use (one line naming the evaluator), takes one shot size as a tuple;
  k-NN over fewer fitting examples than k votes with all of them; evaluate() reports every split but the fitting one."""
  assert probe.Options.of({"shots": 5, "draws": 2, "type": "probe"}) == probe.Options(shots=(5,), draws=2)
  for bad, says in [
    ({"shots": (1, 0)}, "ev: shots=(1, 0): give examples per class"),
    ({"shots": ()}, "ev: shots=(): give examples per class"),
    ({"draws": 0}, "ev: draws=0 must be an integer >= 1"),
    ({"seed": -1}, "ev: seed=-1 must be an integer >= 0"),
    ({"knn_temperature": 0.0}, "ev: knn_temperature=0.0 must be positive"),
  ]:
    with pytest.raises(ValueError, match=re.escape(says)):
      probe.Options.of(bad, "ev")
  bank, bank_y = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]), np.array([0, 0, 1])
  x, y = np.array([[0.1, 1.0], [1.0, 0.2]]), np.array([1, 0])
  # k=20 > 3 examples: all three vote, and the two of class 0 outweigh the nearer one of class 1 only if T is large
  assert probe.knn((bank, bank_y), x, y, 2, probe.Options(knn_temperature=0.07)) == 1.0
  assert probe.knn((bank, bank_y), x, y, 2, probe.Options(knn_temperature=100.0)) == 0.5
  features = {"train": _clusters(60), "valid": _clusters(30, seed=1), "test": _clusters(30, seed=2)}
  out = probe.evaluate(features, 3, probe.Options(shots=(2,), draws=2))
  assert set(out) == {"valid", "test", "linear_l2"}
  assert set(out["test"]) == {"linear", "knn", "2shot", "2shot_std"} and out["test"]["knn"] > 0.9


def test_mae_features_are_its_encoders_over_all_patches():
  """MAE's representation is the encoder's (no masking), exactly the ViT that fine-tuning would start from."""
  encoder = dict(name="Ti/2", width=16, depth=1, num_heads=2, mlp_dim=32)
  mae = models.create("mae", encoder=encoder, decoder_width=8, decoder_depth=1, decoder_heads=2, channels=1)
  images = jax.random.normal(jax.random.key(1), (3, 8, 8, 1))
  variables = mae.init(jax.random.key(0), images, jnp.zeros((3, 16)))
  got = mae.apply(variables, images, method=MaskedImageModeling.representation)
  vit = models.create("Ti/2", **{k: v for k, v in encoder.items() if k != "name"}, num_classes=None)
  params = {k: v for k, v in variables["params"].items() if not k.startswith(("decoder", "mask_token"))}
  want = vit.apply({"params": params}, images, method=ImageClassification.representation)
  assert got.shape == (3, 16)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------ command line


def test_eval_probe_writes_the_three_evaluations(finished_run, tmp_path):
  """--eval=probe on a run that configured no probe: the type by name, with its default options."""
  workdir = str(tmp_path / "w")
  shutil.copytree(finished_run, workdir)
  for split in ("valid", "test"):
    proc = th.check_ok(th.run_module("main", "--mode=eval", "--eval=probe", f"--split={split}", f"--workdir={workdir}"))
    assert proc.stdout.startswith("checkpoint best (step 30) | probe/linear ")
    row = json.load(open(os.path.join(workdir, f"probe_{split}_30.json")))
    assert row["split"] == split and row["checkpoint"] == "best" and row["step"] == 30
    for key in ("linear", "knn", "1shot", "5shot", "10shot", "25shot", "10shot_std"):
      assert 0.0 <= row[f"probe/{key}"] <= 1.0, key
    assert row["probe/linear"] > 0.2  # 10 classes: a trained encoder's features beat chance (0.1)


def test_an_mae_run_reports_its_encoders_probe_at_each_evaluation(data_dir, tmp_path):
  """The 'probe' evaluator in config.evals: an MAE run, which has no accuracy of its own, reports probe/knn, ..."""
  workdir = str(tmp_path / "w")
  args = [f"--config.data.data_dir={data_dir}", "--config.total_steps=6", "--config.eval_every=3"]
  args += ["--config.checkpoint_every=3", "--config.model.encoder.depth=1", "--config.model.decoder_depth=1"]
  args += [
    "--config.evals={'eval': {'type': 'mae'}, 'probe': {'type': 'probe', 'split': 'test', 'shots': (1, 2), 'draws': 2}}"
  ]
  th.check_ok(th.run_main(workdir, *args, config=os.path.join(th.ROOT, "configs", "mae_digits.py")))
  rows = [r for r in th.read_metrics(workdir) if "probe/knn" in r]
  assert [r["step"] for r in rows] == [3, 6]
  assert {"probe/linear", "probe/1shot", "probe/2shot_std"} <= set(rows[-1]) and "probe/10shot" not in rows[-1]
  assert rows[-1]["probe/linear"] > 0.2  # 10 classes: even an MAE encoder's features after 6 steps beat chance


@pytest.mark.parametrize(
  "args, says",
  [
    (["--split=train"], "the split the probes are fitted on"),
    (["--checkpoint=best"], "has no checkpoints: train first"),
    (
      ["--config.evals={'probe': {'type': 'probe', 'knn_k': 0}}"],
      "config.evals.probe: knn_k=0 must be an integer >= 1",
    ),
    (["--config.data.valid_fraction=0"], "data.valid_fraction is 0"),  # the linear probe chooses on valid
  ],
)
def test_probe_bad_input_is_one_line_and_leaves_the_workdir(run_args, tmp_path, args, says):
  workdir = str(tmp_path / "w")
  proc = th.run_module(
    "main", "--mode=eval", "--eval=probe", f"--workdir={workdir}", f"--config={th.CONFIG}", *run_args, *args
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert says in th.error_lines(proc) and len(th.error_lines(proc).splitlines()) == 1
  assert not os.path.exists(workdir)


def test_a_probe_evaluator_that_cannot_run_stops_the_run_before_it_writes(run_args, tmp_path):
  """Checked with the task before the first step (it used to fail at the first evaluation, mid-run)."""
  workdir = str(tmp_path / "w")
  proc = th.run_main(
    workdir,
    *run_args,
    "--config.evals={'eval': {'type': 'classification'}, 'probe': {'type': 'probe', 'split': 'train'}}",
  )
  assert proc.returncode == 2 and "the split the probes are fitted on" in th.error_lines(proc), proc.stderr[-1500:]
  assert not os.path.exists(workdir)
