"""Training batches made on the devices (data.on_device, vitjax.data.resident).

The crop against PIL's resize of a box (what the host pipeline runs), the boxes against the host's rule, the order
against the host pipeline's, the batches on 1 and 8 devices, a resumed iterator, and runs: bitwise resume after
SIGTERM, the same curve on 8 devices, the refusals and the fallback lines.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
import train_helpers as th

from vitjax import mesh as mesh_lib
from vitjax.data import augment, images, resident

CROP = {"scale": (0.5, 1.0), "ratio": (0.75, 1.33)}


@pytest.mark.parametrize("shape,size", [((8, 8, 1), (8, 8)), ((28, 28, 1), (16, 16)), ((20, 30, 3), (40, 36))])
def test_a_box_resized_on_the_device_is_within_one_level_of_pils_resize(shape, size):
  """The host resizes a crop with PIL's antialiased bilinear filter (augment.resize); the device's scale_and_translate
  differs from it only by PIL's 8-bit fixed-point weights: at most one level, down-, same- and up-scaling."""
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, shape).astype(np.uint8)
  worst = []
  for _ in range(20):
    h, w = int(rng.integers(1, shape[0] + 1)), int(rng.integers(1, shape[1] + 1))
    x0, y0 = int(rng.integers(0, shape[1] - w + 1)), int(rng.integers(0, shape[0] - h + 1))
    ref = augment.resize(image, size, box=(x0, y0, x0 + w, y0 + h)).astype(int)
    got = np.asarray(resident.crop_resize(image, (x0, y0, w, h), size)).astype(int)
    assert got.shape == ref.shape
    worst.append(np.abs(got - ref).max())
  assert max(worst) <= 1, worst


def test_crop_boxes_follow_the_hosts_rule_and_fall_back_to_its_central_crop():
  keys = jax.random.split(jax.random.key(0), 400)
  boxes = np.asarray(jax.vmap(lambda k: jax.numpy.stack(resident.crop_box(k, 20, 30, *CROP.values())))(keys))
  x0, y0, w, h = boxes.T
  assert (x0 >= 0).all() and (y0 >= 0).all() and (x0 + w <= 30).all() and (y0 + h <= 20).all()
  rng = np.random.default_rng(0)
  host = np.array([augment.random_resized_crop_box(rng, 20, 30, *CROP.values()) for _ in range(400)])
  hw, hh = host[:, 2] - host[:, 0], host[:, 3] - host[:, 1]
  for got, want in ((w * h, hw * hh), (w / h, hw / hh), (x0, host[:, 0])):  # area, aspect, offset: the host's law
    assert abs(got.mean() - want.mean()) < 0.05 * want.mean() + 0.1 and abs(got.std() - want.std()) < 0.15 * want.std()
  assert (w * h / 600).min() > 0.45  # scale (0.5, 1), up to rounding
  assert len({tuple(b) for b in boxes}) > 200  # drawn, not fixed (the host: as many)
  # a scale no crop can have: every attempt fails, and the fallback is the host's
  want = augment.random_resized_crop_box(np.random.default_rng(0), 20, 30, (2.0, 3.0), (0.75, 1.33))
  got = [int(v) for v in resident.crop_box(keys[0], 20, 30, (2.0, 3.0), (0.75, 1.33))]
  assert (got[0], got[1], got[0] + got[2], got[1] + got[3]) == want


def _both(data_dir, aug, n=1, seed=3):
  kw = dict(global_batch_size=64, image_size=8, seed=seed, data_dir=data_dir, augment=aug)
  mesh = mesh_lib.Layout(data=n).mesh()
  on, info = resident.make_resident("digits", "train", mesh=mesh, on_device=True, **kw)
  host, host_info = images.make_input("digits", "train", train=True, **kw)
  assert (info.num_examples, info.steps_per_epoch) == (host_info.num_examples, host_info.steps_per_epoch)
  return on, host


def test_the_batches_are_the_host_pipelines_in_its_order_over_epochs(data_dir):
  """Without crops the images are the host's, bitwise, batch for batch across an epoch's end (23 batches of 64 of
  1,497); with flips each is the host's or its mirror; the labels always follow the host's order."""
  on, host = _both(data_dir, {})
  for _ in range(30):
    d, h = next(on), next(host)
    np.testing.assert_array_equal(np.asarray(d["label"]), h["label"])
    np.testing.assert_array_equal(np.asarray(d["image"]), h["image"])
  on, host = _both(data_dir, {"flip": True})
  flipped = 0
  for _ in range(5):
    d, h = next(on), next(host)
    got = np.asarray(d["image"])
    same = (got == h["image"]).all(axis=(1, 2, 3))
    mirror = (got == h["image"][:, :, ::-1]).all(axis=(1, 2, 3))
    assert (same | mirror).all()
    flipped += int((mirror & ~same).sum())
  assert 100 < flipped < 220  # about half of 320


_EIGHT = """
import hashlib, sys
import numpy as np
from vitjax import mesh as mesh_lib
from vitjax.data import resident
mesh = mesh_lib.Layout(data=8).mesh()
it, _ = resident.make_resident("digits", "train", global_batch_size=64, image_size=8, seed=3, data_dir=sys.argv[1],
                               augment={"flip": True, "random_resized_crop": %r}, mesh=mesh, on_device=True)
h = hashlib.sha256()
for _ in range(25):
  b = next(it)
  assert len(b["image"].sharding.device_set) == 8
  h.update(np.asarray(b["image"]).tobytes() + np.asarray(b["label"]).tobytes())
print(h.hexdigest())
"""


def test_crops_and_flips_are_the_same_on_one_and_on_eight_devices_and_after_a_resume(data_dir):
  aug = {"flip": True, "random_resized_crop": CROP}
  on, _ = _both(data_dir, aug)
  batches = [next(on) for _ in range(25)]
  digest = __import__("hashlib").sha256()
  for b in batches:
    digest.update(np.asarray(b["image"]).tobytes() + np.asarray(b["label"]).tobytes())
  proc = subprocess.run(
    [sys.executable, "-c", _EIGHT % (CROP,), data_dir], env=th.env(8), capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split()[-1] == digest.hexdigest()
  # a new iterator put at batch 20 (the checkpoint's position) makes batches 21-25 again, bitwise
  again, _ = _both(data_dir, aug)
  again.set_state(json.loads(json.dumps(on.get_state())) | {"batches": 20})
  for b in batches[20:]:
    np.testing.assert_array_equal(np.asarray(next(again)["image"]), np.asarray(b["image"]))
  # crops differ from image to image and from the uncropped image
  plain, _ = _both(data_dir, {})
  assert not np.array_equal(np.asarray(next(plain)["image"]), np.asarray(batches[0]["image"]))


def test_auto_on_a_cpu_is_the_host_pipeline_and_says_nothing(data_dir, caplog):
  mesh = mesh_lib.Layout(data=1).mesh()
  with caplog.at_level("INFO", logger="absl"):  # (absl's logger: under xdist its level is not the root's)
    assert resident.make_resident("digits", "train", global_batch_size=64, image_size=8, seed=0, mesh=mesh) is None
  assert not [r for r in caplog.records if "on_device" in r.getMessage()]


def test_a_split_over_the_budget_or_with_randaugment_trains_from_the_host_with_a_line(data_dir, caplog, monkeypatch):
  """Auto as on a GPU (the backend's name is all it asks): over the budget, or RandAugment, the host's, in a line."""
  mesh = mesh_lib.Layout(data=1).mesh()
  kw = dict(global_batch_size=64, image_size=8, seed=0, data_dir=data_dir, mesh=mesh)
  monkeypatch.setattr(resident.jax, "default_backend", lambda: "gpu")
  assert resident.make_resident("digits", "train", **kw) is not None  # it fits a quarter of the free memory
  with caplog.at_level("INFO", logger="absl"):  # (absl's logger: under xdist its level is not the root's)
    assert resident.make_resident("digits", "train", max_mb=0.01, **kw) is None
    assert resident.make_resident("digits", "train", augment={"randaugment": True}, **kw) is None
    assert resident.make_resident("digits", "train", on_device=False, **kw) is None
  lines = [r.getMessage() for r in caplog.records if "data.on_device" in r.getMessage()]
  assert len(lines) == 2, lines
  assert re.search(
    r"trains from the host: about [\d.]+ MiB per device, over the 0.01 MiB of data.on_device_max_mb", lines[0]
  )
  assert "RandAugment runs on the host only" in lines[1]
  with pytest.raises(ValueError, match=r"data.on_device=True: digits\[train\] cannot be on the devices: RandAugment"):
    resident.make_resident("digits", "train", augment={"randaugment": True}, on_device=True, **kw)
  it, _ = resident.make_resident("digits", "train", max_mb=0.01, on_device=True, **kw)  # True: whatever the budget
  assert next(it)["image"].shape == (64, 8, 8, 1)


# -- runs


@pytest.fixture(scope="module")
def on_device_run(tmp_path_factory, run_args):
  """The tiny run with its batches made on the devices, to step 30, and its log."""
  workdir = str(tmp_path_factory.mktemp("on_device") / "w")
  proc = th.check_ok(th.run_main(workdir, *run_args, "--config.data.on_device=True"))
  return workdir, proc.stderr


def test_a_run_on_the_devices_says_so_and_has_next_to_no_data_wait(on_device_run):
  workdir, log = on_device_run
  assert re.search(r"data.on_device: 1,347 examples of digits\[train\] on the devices \(0\.1 MiB per device", log)
  waits = [r["train/data_wait"] for r in th.read_metrics(workdir) if "train/data_wait" in r]
  assert len(waits) >= 29 and np.median(waits) < 0.2  # (waiting is a dispatch now, not a batch)


def test_a_run_on_the_devices_resumes_bitwise_after_sigterm_and_follows_its_curve_on_eight_devices(
  on_device_run, run_args, tmp_path
):
  ref_dir, _ = on_device_run
  cut = str(tmp_path / "cut")
  proc = th.start_main(cut, *run_args, "--config.data.on_device=True")
  th.read_until(proc, r" step 13/30 ")
  proc.send_signal(signal.SIGTERM)
  proc.communicate(timeout=120)
  assert proc.returncode == 75
  resumed = th.check_ok(th.run_main(cut, *run_args, "--config.data.on_device=True"))
  assert "resumed from" in resumed.stderr
  th.assert_same_state(th.load_state(ref_dir), th.load_state(cut), "on the devices, stopped and resumed")

  eight = str(tmp_path / "eight")
  th.check_ok(th.run_main(eight, *run_args, "--config.data.on_device=True", devices=8))
  losses = lambda w: [r["train/loss"] for r in th.read_metrics(w) if "train/loss" in r]
  np.testing.assert_allclose(losses(eight), losses(ref_dir), rtol=1e-5)


def test_on_device_true_with_randaugment_is_one_line_and_leaves_no_workdir(run_args, tmp_path):
  workdir = str(tmp_path / "w")
  proc = th.run_main(workdir, *run_args, "--config.data.on_device=True", "--config.data.augment.randaugment=True")
  th.assert_refused(proc, ["data.on_device=True", "RandAugment runs on the host only", "use None (auto) or False"])
  assert not os.path.exists(workdir)


def test_two_processes_of_two_devices_follow_the_one_process_curve_on_the_devices(on_device_run, run_args, tmp_path):
  """Each process puts its share of the rows on its devices; the batches, and so the curve, are the one process's."""
  import test_multiprocess as mp  # (a module, not its tests: pytest collects names that start with test_)

  ref_dir, _ = on_device_run
  workdir = str(tmp_path / "two")
  outs = mp._run(workdir, 2, 2, [*run_args, "--config.data.on_device=True"])
  assert "on the devices (0.0 MiB per device" in outs[0]  # 1,347 examples over 4 devices
  np.testing.assert_allclose(mp._losses(workdir), mp._losses(ref_dir), rtol=1e-5)


def test_a_position_of_the_other_mode_resumes_the_same_order_with_a_line(data_dir, caplog):
  on, host = _both(data_dir, {})
  with caplog.at_level("INFO", logger="absl"):  # (absl's logger: under xdist its level is not the root's)
    on.set_state(json.loads(json.dumps(host.get_state())) | {"batches": 7})
    host.set_state(on.get_state())
  said = [r.getMessage() for r in caplog.records if "data.on_device" in r.getMessage()]
  assert said == [
    "data.on_device: the checkpoint's batches were made on the host; same order, other crop draws",
    "data.on_device: the checkpoint's batches were made on the devices; same order, other crop draws",
  ]
  np.testing.assert_array_equal(np.asarray(next(on)["image"]), next(host)["image"])  # batch 8 both ways
