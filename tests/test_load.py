"""vitjax.load: a trained classification run loaded from a relative workdir, in a fresh process, with no dataset
anywhere and no module of the trainer; its .predict reproduces the validation accuracy the run logged. (Translation:
test_translation.py.)"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import train_helpers as th

import vitjax
from vitjax import data as data_lib

# one worker builds this module's fixture once (pytest -n with --dist loadgroup, as the README runs it)
pytestmark = pytest.mark.xdist_group("load")


@pytest.fixture(scope="session")  # not "module": xdist may interleave modules, and a module fixture is rebuilt
def run_without_data(tmp_path_factory, data_dir):
  """A tiny digits run trained on a private copy of the dataset, which is then deleted; returns (root, workdir,
  the validation images and labels read before the deletion)."""
  root = tmp_path_factory.mktemp("load")
  private = str(root / "tfds")
  shutil.copytree(data_dir, private)
  workdir = str(root / "runs" / "digits")
  th.check_ok(th.run_main(workdir, *th.TINY, f"--config.data.data_dir={private}"))
  source, _ = data_lib.open_split("digits", "train", private)
  _, held_out = data_lib.holdout_split(len(source), 0.1, 0)
  images = np.stack([np.asarray(source[int(i)]["image"]) for i in held_out])
  labels = np.asarray([int(source[int(i)]["label"]) for i in held_out])
  shutil.rmtree(private)
  return root, workdir, images, labels


def _logged(workdir):
  return [r for r in th.read_metrics(workdir) if "eval/accuracy" in r and "source" not in r]


def test_predict_reproduces_the_logged_accuracy_without_data(run_without_data):
  root, workdir, images, labels = run_without_data
  assert images.dtype == np.uint8 and images.shape == (150, 8, 8, 1)  # as the dataset stores them
  np.save(root / "images.npy", images)
  empty = root / "empty_tfds"
  empty.mkdir(exist_ok=True)
  script = textwrap.dedent("""
    import json, sys, numpy as np, vitjax
    trained = vitjax.load("runs/digits")            # relative to the current directory; checkpoint="best"
    probs = trained.predict(np.load("images.npy"))
    feats = trained.features(np.load("images.npy")[:5])
    print(json.dumps({"step": trained.step, "shape": list(probs.shape), "sums": float(np.abs(probs.sum(1) - 1).max()),
                      "pred": probs.argmax(1).tolist(), "keys": sorted(trained.variables),
                      "num_classes": trained.config.model.num_classes, "model": type(trained.model).__name__,
                      "trainer": sorted(m for m in sys.modules if m.startswith("vitjax.train.")),
                      "features": {k: list(v.shape) for k, v in feats.items()}}))
  """)
  env = {**th.env(), "TFDS_DATA_DIR": str(empty)}
  proc = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  evals = _logged(workdir)
  best = max(evals, key=lambda r: (r["eval/accuracy"], r["step"]))  # ties: orbax keeps the later step as best
  assert got["step"] == best["step"]
  assert got["shape"] == [150, 10] and got["sums"] < 1e-5 and got["num_classes"] == 10 and got["model"] == "ViT"
  assert got["keys"] == ["params"]
  assert got["features"] == {"pooled": [5, 16], "patches": [5, 4, 4, 16]}  # width 16, 8 px images in 2 px patches
  assert got["trainer"] == []  # loading and predicting are the models' and the task's (issue 74): no vitjax.train
  accuracy = float(np.mean(np.asarray(got["pred"]) == labels))
  assert accuracy == pytest.approx(best["eval/accuracy"], abs=1e-6)
  assert not os.path.exists(root / "tfds")  # it really ran without the dataset


def test_load_in_process_latest_and_a_step(run_without_data, caplog):
  _, workdir, images, labels = run_without_data
  caplog.set_level("INFO", logger="absl")
  latest = vitjax.load(workdir, "latest")
  assert "read only" not in caplog.text  # orbax's warning about the read-only manager vitjax opens: noise
  assert latest.step == 30 and latest.config.total_steps == 30
  kept = th.finished_steps(workdir)  # the latest 3 (checkpoint_every=5) and the best evaluated step
  assert kept[-3:] == [20, 25, 30] and len(kept) <= 4
  at_20 = vitjax.load(workdir, 20)
  assert at_20.step == 20
  assert re.fullmatch(r"Trained\(ViT, classification, step 20, [\d,]+ parameters, workdir='.*'\)", repr(at_20))
  acc = lambda t: float(np.mean(t.predict(images).argmax(1) == labels))
  logged = {r["step"]: r["eval/accuracy"] for r in _logged(workdir)}
  assert acc(latest) == pytest.approx(logged[30], abs=1e-6) and acc(at_20) == pytest.approx(logged[20], abs=1e-6)
  with pytest.raises(TypeError, match=r"classification run: use .predict"):
    latest.translate(["hello"])
  for size in (0, -1):  # (-1 gave an empty result)
    with pytest.raises(ValueError, match=f"batch_size={size} must be a whole number, at least 1"):
      latest.predict(images, batch_size=size)
  np.testing.assert_array_equal(latest.predict(images, batch_size=np.int64(7)), latest.predict(images, batch_size=7))
  # the input contract: uint8 [N, H, W, C] (or [N, H, W] for one channel), 0..255; anything else is one line
  assert np.array_equal(latest.predict(images[..., 0]), latest.predict(images.astype(np.int64)))
  digits16 = images.astype(np.float32) * 16 / 255  # sklearn's digits as they come: floats 0..16
  for bad, said in [
    (digits16, r"got float32 with values 0\.\.16: convert them"),
    (images / 255.0, r"got float64 with values 0\.\.1: convert them, e\.g\. np\.round\(x \* 255\)"),
    (images.astype(np.int32) * 2, r"got int32 with values 0\.\.510$"),
    (images[0], r"got shape \[8, 8, 1\], one image\? Pass a batch of one: images\[None\]"),
    (
      np.repeat(images, 3, axis=-1),
      r"uint8 images \[N, H, W, 1\] with values 0\.\.255.*got shape \[150, 8, 8, 3\], "
      r"images of 3 channel\(s\): convert them, e\.g\. PIL\.Image\.open\(f\)\.convert\('L'\)",
    ),
    (np.repeat(images[0], 3, axis=-1), r"got shape \[8, 8, 3\], one colour image\? Make it grey"),  # (was 8 images)
    (images[:, :, :, :, None], r"got shape \[150, 8, 8, 1, 1\]$"),
  ]:
    with pytest.raises(ValueError, match=said) as err:
      latest.predict(bad)
    assert "\n" not in str(err.value)
  with pytest.raises(vitjax.errors.ConfigError, match=r"no checkpoint for step 7 .* there are \[.*20, 25, 30\]"):
    vitjax.load(workdir, 7)
  with pytest.raises(vitjax.errors.ConfigError, match="config.json not found"):
    vitjax.load(os.path.dirname(workdir))


# ------------------------------------------------------------------ Trained's own checks, on a stand-in task


class _Classifier:
  """A stand-in classification task: fixed probabilities, and class names when given."""

  def __init__(self, names=None):
    self.names, self.calls = names, []

  def describe(self):
    return {"num_classes": 3, **({"class_names": self.names} if self.names else {})}

  def predict(self, model, variables, images, sharding, batch_size):
    self.calls.append(batch_size)
    return np.asarray([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.0, 0.1, 0.9]], np.float32)[: len(images)]


class _Translator:
  """A stand-in translation task: echoes the lines with the options it was given."""

  def translate(self, model, variables, lines, sharding, batch_size, **decode_args):
    return [f"{line}|{batch_size}|{sorted(decode_args.items())}" for line in lines]


def _trained(task, kind="classification"):
  import jax
  import ml_collections as mlc

  from vitjax.trained import Trained

  mesh = jax.make_mesh((1,), ("data",))
  params = {"a": np.zeros((2, 3)), "b": {"c": np.zeros(4)}}
  return Trained(None, {"params": params}, mlc.ConfigDict({"task": kind}), 7, "/w", mesh, None, task)


def test_classify_names_the_most_probable_class_or_gives_its_index():
  task = _Classifier(["cat", "dog", "eel"])
  trained = _trained(task)
  assert trained.class_names == ["cat", "dog", "eel"]
  assert trained.classify(np.zeros((3, 2, 2, 1), np.uint8), batch_size=1) == ["dog", "cat", "eel"]
  assert task.calls == [1]
  unnamed = _trained(_Classifier())
  assert unnamed.class_names is None and unnamed.classify(np.zeros((2, 2, 2, 1), np.uint8)) == ["1", "0"]
  assert _trained(_Translator(), "translation").class_names is None  # a task that describes nothing
  assert repr(trained) == "Trained(NoneType, classification, step 7, 10 parameters, workdir='/w')"


def test_batch_size_is_a_whole_number_at_least_one():
  """batch_size: 1 and more; 0, a negative, a float or a bool (an int in Python) is one line naming it."""
  trained = _trained(_Classifier())
  images = np.zeros((3, 2, 2, 1), np.uint8)
  assert trained.predict(images, batch_size=1).shape == (3, 3)
  for bad in (0, -2, 2.0, True):
    with pytest.raises(ValueError, match=re.escape(f"batch_size={bad!r} must be a whole number, at least 1")):
      trained.predict(images, batch_size=bad)
    with pytest.raises(ValueError, match="must be a whole number"):
      _trained(_Translator(), "translation").translate(["a"], batch_size=bad)


def test_translate_refuses_what_is_not_a_list_of_sentences_or_an_option():
  """One line for each mistake, before anything decodes: one str, a line that is not a str, an option translation
  has not (the nearest one named where there is one); the options go through to the task as given."""
  trained = _trained(_Translator(), "translation")
  greedy = trained.translate(("a", "b"), batch_size=2, method="greedy")
  assert greedy == ["a|2|[('method', 'greedy')]", "b|2|[('method', 'greedy')]"]
  assert trained.translate(iter(["x"])) == ["x|32|[]"]  # any iterable of lines; the default batch
  with pytest.raises(TypeError, match=re.escape("translate takes a list of sentences, not one str: translate([line])")):
    trained.translate("a line")
  with pytest.raises(TypeError, match=re.escape("translate takes sentences (str); line 2 is bytes")):
    trained.translate(["a", "b", b"c"])
  with pytest.raises(TypeError, match=re.escape("translate takes sentences (str); line 0 is NoneType")):
    trained.translate([None, "b"])
  with pytest.raises(TypeError, match=re.escape("translate has no option 'topk'; did you mean 'top_k'? (the options:")):
    trained.translate(["a"], topk=5, zzz=1)
  with pytest.raises(TypeError, match=r"translate has no option 'zzz' \(the options: method, beam_size, "):
    trained.translate(["a"], zzz=1)
  with pytest.raises(TypeError, match=re.escape("/w is a translation run: use .translate(lines)")):
    trained.predict(np.zeros((1, 2, 2, 1), np.uint8))
  with pytest.raises(TypeError, match=re.escape("/w is a classification run: use .predict(images)")):
    _trained(_Classifier()).translate(["a"])


def test_a_hub_repository_has_one_checkpoint_and_one_set_of_weights():
  """vitjax.load("hf:...") with a step, or weights="ema": one line, before the hub is read."""
  for checkpoint, weights in ((5, "params"), ("5", "params"), ("best", "ema"), ("latest", "ema")):
    with pytest.raises(vitjax.errors.ConfigError, match="a hub repository has one set of weights"):
      vitjax.load("hf:nobody/nothing", checkpoint, weights)
