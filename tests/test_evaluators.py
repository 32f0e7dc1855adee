"""vitjax.evaluators: types found by module, entries resolved and checked with one line each, cadences, `best`,
the classification metrics against their definitions, shifts, another dataset, and per_class (the type added as
the example of adding one)."""

import json
import os
import shutil
import sys

import jax
import ml_collections
import numpy as np
import pytest
import train_helpers as th

from vitjax import config as config_lib
from vitjax import evaluators, tasks
from vitjax.config import default_config, evaluator
from vitjax.errors import ConfigError


def _config(data_dir, **evals):
  c = default_config()
  c.data.data_dir = data_dir
  if evals:
    c.evals = evals
  return c


def test_types_are_the_modules_and_an_entry_names_its_mistakes(data_dir):
  assert {"classification", "mae", "per_class", "probe", "translation"} <= set(evaluators.types())
  with pytest.raises(ConfigError, match="no evaluator type 'clasification'; the types are .*classification"):
    evaluators.get("clasification")
  c = _config(data_dir)
  task = tasks.get(c, "")
  with pytest.raises(ConfigError, match="has no option 'topk'"):  # (refused where the entry is resolved)
    evaluators.resolve(c, task, "t", dict(evaluator("classification", topk=3)), None)
  for entry, says in (
    ({"split": "test"}, "give a dict with a type"),
    ({"type": "classification", "topk": 3}, "has no option 'topk'; did you mean 'top_k'"),
    ({"type": "classification", "weights": "ema"}, "needs the moving average of config.ema_decay"),
    ({"type": "classification", "weights": "last"}, "use 'params' or 'ema'"),
    ({"type": "classification", "split": "tset"}, "evals.t.split='tset'"),
    ({"type": "classification", "examples": 0}, "give a count >= 1"),
    ({"type": "classification", "shift": "rotate"}, "give one of rotate:X"),
    ({"type": "classification", "data": {"nmae": "x"}}, "data has no field 'nmae'"),
    ({"type": "mae"}, "evaluates a masked autoencoder, not a 'classification' run"),
    ({"type": "translation"}, "evaluates a translation run"),
    ({"type": "probe", "split": "train"}, "the split the probes are fitted on"),
    ({"type": "probe", "fit_examples": 0}, r"fit_examples=0; give a count >= 1, or None for the whole training split"),
    ({"type": "probe", "fit_examples": 2.5}, r"fit_examples=2.5; give a count >= 1"),
  ):
    with pytest.raises(ConfigError, match=says):
      evaluators.resolve(c, task, "t", entry, None)
  assert evaluators.resolve(c, task, "t", {"type": "probe", "fit_examples": 1}, None).options["fit_examples"] == 1


_MARGIN = """
import numpy as np
OPTIONS = {{}}
def metrics(options):
  return {{"margin": "max"}}
def check(ev):
  pass
def run(ev, net, variables, stop=None, step=None):
  return {{"{name}": 0.5 + 0.01 * np.random.rand()}}
"""


def _new_type(tmp_path, monkeypatch=None, name="margin", text=None):
  """A type of the researcher's own, in a folder of its own that vitjax.evaluators reads as a part of itself."""
  text = _MARGIN.format(name="margin") if text is None else text
  folder = tmp_path / "my_evaluators"
  folder.mkdir(exist_ok=True)
  (folder / f"{name}.py").write_text(text)
  if monkeypatch is not None:
    monkeypatch.setattr(evaluators, "__path__", [*evaluators.__path__, str(folder)])
    monkeypatch.delitem(sys.modules, f"vitjax.evaluators.{name}", raising=False)
  return str(folder)


def test_a_type_missing_a_part_is_one_line_before_anything_runs(tmp_path, monkeypatch):
  """Before, a type without metrics, check or OPTIONS ended in an AttributeError traceback, and one without run()
  trained until its first evaluation, then crashed there with an empty checkpoints/ folder."""
  _new_type(tmp_path, monkeypatch, "lacking", _MARGIN.format(name="margin").split("def check")[0])
  with pytest.raises(ConfigError) as e:
    evaluators.get("lacking")
  assert str(e.value) == (
    "vitjax/evaluators/lacking.py defines no check, run: an evaluator type defines OPTIONS = {...}, metrics(options), "
    "check(ev) and run(ev, net, variables, stop=None, step=None) (vitjax/evaluators/__init__.py)"
  )


def test_a_type_whose_run_leaves_out_the_best_metric_stops_with_its_step_kept(tmp_path, run_args):
  """run() returned 'mrg' where metrics() declares 'margin', which config.best names: before, the run went on to the end with no best step
  ('best: step None') and no warning. Now its first evaluation stops it with one line, exit 2, the step checkpointed;
  once run() is fixed the same command resumes there and evaluates that step first."""
  folder = _new_type(tmp_path, text=_MARGIN.format(name="mrg"))
  script = tmp_path / "main_with_my_types.py"
  script.write_text(
    f"import runpy\nimport vitjax.evaluators\nvitjax.evaluators.__path__.append({folder!r})\n"
    "runpy.run_module('vitjax.main', run_name='__main__')\n"
  )
  config = tmp_path / "cfg.py"
  config.write_text(
    f"import sys\nsys.path.insert(0, {os.path.join(th.ROOT, 'configs')!r})\nfrom vit_digits import get_config as base\n"
    "from vitjax.config import evaluator\ndef get_config():\n  c = base()\n  c.evals.mt = evaluator('margin')\n"
    "  c.best = 'mt/margin'\n  return c\n"
  )
  workdir = str(tmp_path / "w")
  args = [f"--config={config}", f"--workdir={workdir}", *run_args]
  proc = th.run_module(str(script), *args)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert th.error_lines(proc) == (
    "error: step 10: config.best='mt/margin': vitjax/evaluators/margin.py's run() returned ['mrg'], without 'margin', "
    "which its metrics() declares: make the two agree; step 10 is checkpointed: rerun the same command to resume"
  )
  assert th.finished_steps(workdir)[-1] == 10  # (the tiny run checkpoints every 5 steps)
  _new_type(tmp_path)  # fixed
  done = th.check_ok(th.run_module(str(script), *args))
  assert "resumed from" in done.stderr and "(best: step None)" not in done.stderr, done.stderr[-3000:]
  evaluated = [r["step"] for r in th.read_metrics(workdir) if "mt/margin" in r]
  assert evaluated == [10, 20, 30], evaluated


def test_plan_resolves_cadences_and_best_and_refuses_a_best_nobody_reports(data_dir):
  c = _config(
    data_dir,
    eval=evaluator("classification"),
    test=evaluator("classification", split="test", every="2 epochs"),
    probe=evaluator("probe", every=7, shots=(1, 3)),
  )
  c.eval_every = 50
  task = tasks.get(c, "")
  from vitjax import durations

  steps_of = lambda what, every: durations.steps(what, every, 11, None)
  planned = evaluators.plan(c, task, steps_of)
  assert [(e.name, e.type, e.split, e.every) for e in planned] == [
    ("eval", "classification", "valid", 50),
    ("probe", "probe", "valid", 7),
    ("test", "classification", "test", 22),
  ]
  assert [e.name for e in planned if e.due(22, 100)] == ["test"] and all(e.due(100, 100) for e in planned)
  assert evaluators.best_of(c, planned)[0].name == "eval" and evaluators.best_mode(c) == "max"
  for best, mode in (("eval/loss", "min"), ("probe/knn", "max"), ("probe/3shot", "max"), ("test/top5", "max")):
    c.best = best
    assert evaluators.best_of(c, planned)[1] == evaluators.best_mode(c) == mode
  c.best = "probe/10shot"  # not among this probe's shots
  with pytest.raises(ConfigError, match="best='probe/10shot' is not reported by config.evals"):
    evaluators.plan(c, task, steps_of)
  c.best, c.evals.test.every = "eval/accuracy", "2 weeks"
  with pytest.raises(ConfigError, match="config.evals.test.every='2 weeks'"):
    evaluators.plan(c, task, steps_of)
  with pytest.raises(ConfigError, match="this run's are eval, probe, test, and any type by name"):
    evaluators.named(c, task, "tset")
  assert evaluators.named(c, task, "per_class").every is None  # a type by name, for --mode=eval


def _finished(finished_run, data_dir):
  from vitjax import pretrained

  config = config_lib.read_config(finished_run)
  config.data.data_dir = data_dir
  task = tasks.get(config, finished_run, described=config_lib.read_json(finished_run, "task.json"))
  net = tasks.network(config, task)
  _, variables = pretrained.load(finished_run, net, "best", best=(config.best, "max"))
  return config, task, net, variables


def test_classification_metrics_are_their_definitions(finished_run, data_dir):
  """loss, accuracy, top-k and ECE from the logits of every test image, computed here in numpy."""
  config, task, net, variables = _finished(finished_run, data_dir)
  ev = evaluators.resolve(config, task, "t", {"type": "classification", "split": "test", "top_k": 3,
                                               "calibration_bins": 10}, None)  # fmt: skip
  with jax.set_mesh(net.mesh):
    got = ev.run(net, variables)
    logits, labels = [], []
    pre = task.preprocess()
    from vitjax.data import device_ops

    for b in task.eval_batches("test"):
      keep = b["mask"].astype(bool)
      out, _ = net.model.apply(variables, device_ops.to_float(b["image"], pre.mean, pre.std), train=False)
      logits.append(np.asarray(out, np.float64)[keep])
      labels.append(b["label"][keep])
  logits, labels = np.concatenate(logits), np.concatenate(labels)
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  n = len(labels)
  assert got["t/examples"] == n == 300
  np.testing.assert_allclose(got["t/loss"], -np.log(p[np.arange(n), labels]).mean(), rtol=1e-5)
  assert got["t/accuracy"] == pytest.approx((p.argmax(1) == labels).mean(), abs=1e-6)
  label_logit = logits[np.arange(n), labels][:, None]
  rank = (logits > label_logit).sum(1) + ((logits == label_logit) & (np.arange(10) < labels[:, None])).sum(1)
  assert got["t/top3"] == pytest.approx((rank < 3).mean(), abs=1e-6)
  # ties ranked as argmax ranks them: equal logits (an untrained head) hold a label in the top 5 for labels 0-4 only
  from vitjax.evaluators.classification import label_rank

  tied = label_rank(np.zeros((10, 10), np.float32), np.arange(10))
  assert tied.tolist() == list(range(10)) and label_rank(np.eye(3)[[0, 0]], np.array([0, 2])).tolist() == [0, 2]
  conf, hit = p.max(1), p.argmax(1) == labels
  bins = np.minimum((conf * 10).astype(int), 9)
  ece = sum(abs(conf[bins == b].sum() - hit[bins == b].sum()) for b in range(10)) / n
  assert got["t/ece"] == pytest.approx(ece, abs=1e-5)
  # examples= is a cap: the first 100 images exactly, at any batch size (it read whole batches: 128 at 64 a batch)
  config.data.eval_batch_size = 64
  with jax.set_mesh(net.mesh):
    capped = evaluators.resolve(config, task, "t", {"type": "classification", "split": "test", "examples": 100}, None)
    got = capped.run(net, variables)
  assert got["t/examples"] == 100
  np.testing.assert_allclose(got["t/loss"], -np.log(p[np.arange(100), labels[:100]]).mean(), rtol=1e-5)


def test_shifts_and_other_data_reach_the_images(finished_run, data_dir):
  """A shifted copy of the test split scores differently from the clean one and does not depend on the batch
  size (noise is drawn from each image); data= reads another version of the data (a larger held-out part)."""
  config, task, net, variables = _finished(finished_run, data_dir)
  run = lambda **entry: evaluators.resolve(config, task, "t", {"type": "classification", **entry}, None).run(
    net, variables
  )
  with jax.set_mesh(net.mesh):
    clean, rotated = run(split="test"), run(split="test", shift="rotate:90")
    noisy = run(split="test", shift="noise:0.3")
    config.data.eval_batch_size = 64
    assert run(split="test", shift="noise:0.3") == noisy
    assert run(data={"valid_fraction": 0.2})["t/examples"] == 299 and run()["t/examples"] == 150
  assert rotated["t/accuracy"] != clean["t/accuracy"] and rotated["t/loss"] > clean["t/loss"]
  assert noisy["t/loss"] != clean["t/loss"]


def test_another_dataset_of_other_classes_is_refused_or_named(monkeypatch, caplog):
  """data= with another number of classes than the run's model: before, its labels past the model's logits scored
  as a loss of 0 (0.6711 where it was 0.8949) and per_class named the run's classes. Other names: a warning."""
  from vitjax import data as data_lib

  caplog.set_level("INFO", logger="absl")
  run = {"num_classes": 3, "class_names": ["cat", "dog", "emu"]}
  data = ml_collections.ConfigDict(dict(name="folder:other", train_split="train", data_dir=None))
  monkeypatch.setattr(data_lib, "split_info", lambda *a: {"num_classes": 4, "class_names": ["B", "a", "c", "zebra"]})
  with pytest.raises(ConfigError) as e:
    evaluators._check_classes("config.evals.other", data, run)
  assert str(e.value) == (
    "config.evals.other: folder:other has 4 classes, the run's model 3: evaluate a dataset of the run's classes, in "
    "the same order"
  )
  monkeypatch.setattr(data_lib, "split_info", lambda *a: {"num_classes": 3, "class_names": ["dog", "cat", "emu"]})
  evaluators._check_classes("config.evals.other", data, run)
  assert "folder:other's classes (dog, cat, emu) are not the run's (cat, dog, emu)" in caplog.text


def test_an_evaluation_with_other_options_is_kept_beside_the_earlier_one(tmp_path):
  """--mode=eval with beam 1, then beam 4: before, both wrote eval_valid_2.json (beam 4's replacing beam 1's) and
  their metrics.jsonl rows did not say how each decoded; the row now holds the options, and other options a file."""
  from vitjax.train import checkpoint_eval

  beam1, beam4 = {"method": "beam", "beam_size": 1}, {"method": "beam", "beam_size": 4}
  assert checkpoint_eval.result_file(str(tmp_path), "eval_valid_2", beam1) == "eval_valid_2.json"  # nothing there yet
  (tmp_path / "eval_valid_2.json").write_text(json.dumps({"options": beam1, "eval/bleu": 1.0}))
  assert checkpoint_eval.result_file(str(tmp_path), "eval_valid_2", beam1) == "eval_valid_2.json"  # the same: replaced
  other = checkpoint_eval.result_file(str(tmp_path), "eval_valid_2", beam4)
  assert other.startswith("eval_valid_2_") and other.endswith(".json") and len(other) == len("eval_valid_2_.json") + 8


def test_per_class_is_one_file_and_agrees_with_accuracy(finished_run, data_dir, tmp_path):
  """The type added as the example: its balanced accuracy over digits' (nearly balanced) test split is close to
  the accuracy, each class's recall is in [0, 1], and --mode=eval --eval=per_class writes the confusion matrix."""
  config, task, net, variables = _finished(finished_run, data_dir)
  with jax.set_mesh(net.mesh):
    got = evaluators.resolve(config, task, "pc", {"type": "per_class", "split": "test"}, None).run(net, variables)
    acc = evaluators.resolve(config, task, "c", {"type": "classification", "split": "test"}, None).run(net, variables)
  per_class = [v for k, v in got.items() if k.startswith("pc/accuracy_")]
  assert len(per_class) == 10 and all(0 <= v <= 1 for v in per_class)
  assert got["pc/balanced_accuracy"] == pytest.approx(np.mean(per_class))
  assert got["pc/worst_class_accuracy"] == min(per_class)
  assert abs(got["pc/balanced_accuracy"] - acc["c/accuracy"]) < 0.05
  workdir = str(tmp_path / "w")
  shutil.copytree(finished_run, workdir)
  proc = th.check_ok(th.run_module("main", "--mode=eval", "--eval=per_class", "--split=test", f"--workdir={workdir}"))
  assert proc.stdout.startswith("checkpoint best (step 30) | per_class/balanced_accuracy ")
  confusion = json.load(open(os.path.join(workdir, "per_class_confusion_test_30.json")))
  assert np.asarray(confusion["confusion"]).sum() == 300
  # another split, or the initial weights, is a file of its own (the valid split's overwrote the test split's)
  th.check_ok(th.run_module("main", "--mode=eval", "--eval=per_class", "--checkpoint=init", f"--workdir={workdir}"))
  assert json.load(open(os.path.join(workdir, "per_class_confusion_test_30.json")))["split"] == "test"
  assert (
    np.asarray(json.load(open(os.path.join(workdir, "per_class_confusion_valid_init.json")))["confusion"]).sum() == 150
  )


def test_per_class_names_each_class_apart_in_any_script():
  """Before, every non-ASCII letter became '_': 猫, 犬 and 鳥 all wrote per_class/accuracy__, one value of three."""
  from vitjax.evaluators.per_class import metric_name

  taken = {}
  for name in ("猫", "犬", "émeu", "a b", "a_b", "!"):
    taken[f"accuracy_{metric_name(name, taken)}"] = 0.0
  assert list(taken) == ["accuracy_猫", "accuracy_犬", "accuracy_émeu", "accuracy_a_b", "accuracy_a_b_2", "accuracy__"]


def test_per_class_recalls_are_the_confusion_rows_of_the_unmasked_examples(tmp_path):
  """per_class on known predictions: each class's recall is its row of the confusion matrix (true class by row, padding
  rows left out), a class the split lacks is not reported (nor averaged), names become keys, and the matrix goes to
  NAME_confusion_SPLIT_STEP_ema.json for the moving average's weights."""
  from types import SimpleNamespace

  import flax.linen as nn
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from vitjax.evaluators import per_class

  class Logits(nn.Module):  # the "image" is the logits
    def __call__(self, images, train=False):
      return images.reshape(images.shape[0], -1), {}

  true = np.array([0, 0, 2, 2, 2, 3, 0, 2], np.int32)
  pred = np.array([0, 2, 2, 2, 0, 0, 3, 1])
  mask = np.array([1, 1, 1, 1, 1, 1, 0, 0], bool)  # the last two are padding: they would be misses of cat and big dog
  logits = np.eye(4, dtype=np.float32)[pred][:, None, None, :]
  batches = [{"image": logits[k : k + 4], "label": true[k : k + 4], "mask": mask[k : k + 4]} for k in (0, 4)]
  task = SimpleNamespace(
    describe=lambda: {"num_classes": 4, "class_names": ["cat", "fox", "big dog", "eel"]},
    preprocess=lambda: SimpleNamespace(mean=None, std=None),
    eval_batches=lambda split, n: batches,
  )
  ev = SimpleNamespace(name="pc", split="test", examples=None, task=task, options={"shift": None},
                       workdir=str(tmp_path), weights="ema")  # fmt: skip
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  net = SimpleNamespace(model=Logits(), batch_sharding=NamedSharding(mesh, PartitionSpec("data")))
  got = per_class.run(ev, net, {}, step=7)
  recalls = {"accuracy_cat": 0.5, "accuracy_big_dog": 2 / 3, "accuracy_eel": 0.0}  # fox: no example
  assert got == pytest.approx(
    {**recalls, "balanced_accuracy": (0.5 + 2 / 3 + 0.0) / 3, "worst_class_accuracy": 0.0}, rel=1e-6
  )
  saved = json.load(open(tmp_path / "pc_confusion_test_7_ema.json"))
  assert saved["classes"] == ["cat", "fox", "big dog", "eel"] and saved["split"] == "test"
  assert saved["confusion"] == [[1, 0, 1, 0], [0, 0, 0, 0], [1, 0, 2, 0], [1, 0, 0, 0]]  # [true][predicted]
  assert sorted(os.listdir(tmp_path)) == ["pc_confusion_test_7_ema.json"]


def test_a_run_logs_every_evaluator_by_name_and_chooses_best_by_any(run_args, tmp_path):
  """Evaluators with their own cadences in one run: NAME/METRIC rows in metrics.jsonl, one log line each, and best
  by the probe's k-NN accuracy (the step whose probe/knn is highest is what vitjax.load('best') restores)."""
  import vitjax

  workdir = str(tmp_path / "w")
  evals = (
    "--config.evals={'eval': {'type': 'classification'}, 'rotated': {'type': 'classification', 'split': 'test',"
    " 'shift': 'rotate:30', 'every': 15}, 'probe': {'type': 'probe', 'shots': (1, 2), 'draws': 2}}"
  )
  proc = th.check_ok(th.run_main(workdir, *run_args, evals, "--config.best=probe/knn"))
  rows = [r for r in th.read_metrics(workdir) if "source" not in r and "train/loss" not in r]
  by_step = {}
  for r in rows:
    by_step.setdefault(r["step"], set()).update(k.split("/")[0] for k in r if "/" in k)
  assert by_step == {10: {"eval", "probe"}, 15: {"rotated"}, 20: {"eval", "probe"}, 30: {"eval", "rotated", "probe"}}
  assert "step 15 | rotated/loss" in proc.stderr and "| best probe/knn so far" in proc.stderr
  knn = {r["step"]: r["probe/knn"] for r in rows if "probe/knn" in r}
  best = max(knn, key=lambda s: (knn[s], s))  # orbax keeps the later of equal steps
  assert vitjax.load(workdir).step == best


def test_ece_is_the_gap_of_each_confidence_bin_weighted_by_its_share():
  """calibration_bins=4: confidences 0.9 and 0.7 fall in bins [0.75, 1) and [0.5, 0.75), 0.4 and 0.35 in [0.25, 0.5);
  each bin's |confidence - accuracy| counts, weighted by its share of the (unmasked) examples, so that an
  over-confident bin and an under-confident one do not cancel."""
  from types import SimpleNamespace

  import flax.linen as nn
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from vitjax.evaluators import classification

  class Logits(nn.Module):  # the "image" is the log-probabilities
    def __call__(self, images, train=False):
      return images.reshape(images.shape[0], -1), {}

  probs = np.array(
    [
      [0.9, 0.05, 0.03, 0.02],  # label 0: right at 0.9
      [0.7, 0.1, 0.1, 0.1],  # label 1: wrong at 0.7
      [0.1, 0.1, 0.1, 0.7],  # padding (masked out): would be a wrong 0.7
      [0.4, 0.3, 0.2, 0.1],  # label 0: right at 0.4
      [0.35, 0.3, 0.2, 0.15],  # label 2: wrong at 0.35
      [0.1, 0.1, 0.1, 0.7],  # padding
    ],
    np.float32,
  )
  labels, mask = np.array([0, 1, 0, 0, 2, 0], np.int32), np.array([1, 1, 0, 1, 1, 0], bool)
  batches = [
    {"image": np.log(probs[k : k + 3])[:, None, None, :], "label": labels[k : k + 3], "mask": mask[k : k + 3]}
    for k in (0, 3)
  ]
  task = SimpleNamespace(preprocess=lambda: SimpleNamespace(mean=None, std=None), eval_batches=lambda split, n: batches)
  ev = SimpleNamespace(name="t", split="test", examples=None, task=task,
                       options={"top_k": 2, "calibration_bins": 4, "shift": None})  # fmt: skip
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  net = SimpleNamespace(model=Logits(), batch_sharding=NamedSharding(mesh, PartitionSpec("data")))
  got = classification.run(ev, net, {})
  gaps = abs(0.9 - 1) + abs(0.7 - 0) + abs(0.4 + 0.35 - 1)  # bins 3, 2 and 1
  assert got["ece"] == pytest.approx(gaps / 4, abs=1e-5)
  assert got["examples"] == 4 and got["accuracy"] == 0.5 and got["top2"] == 0.75
  assert got["loss"] == pytest.approx(-np.log([0.9, 0.1, 0.4, 0.2]).mean(), rel=1e-5)
