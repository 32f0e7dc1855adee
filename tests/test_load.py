"""vitjax.load: a trained classification run loaded from a relative workdir, in a fresh process, with no dataset
anywhere; its .predict reproduces the validation accuracy the run logged. (Translation: test_translation.py.)"""

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
    import json, numpy as np, vitjax
    trained = vitjax.load("runs/digits")            # relative to the current directory; checkpoint="best"
    probs = trained.predict(np.load("images.npy"))
    print(json.dumps({"step": trained.step, "shape": list(probs.shape), "sums": float(np.abs(probs.sum(1) - 1).max()),
                      "pred": probs.argmax(1).tolist(), "keys": sorted(trained.variables),
                      "num_classes": trained.config.model.num_classes, "model": type(trained.model).__name__}))
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
