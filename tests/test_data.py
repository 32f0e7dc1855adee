"""Tests of vitjax.data: tfds builders (no TF), prepare CLI, grain pipeline."""

import itertools
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
import train_helpers as th

from vitjax.data import DatasetNotPreparedError, augment, builders, device_ops, make_input, parse_augment
from vitjax.data import prepare as prepare_lib

AUG = dict(
  random_resized_crop={"scale": (0.5, 1.0)},
  flip=True,
  randaugment={"num_layers": 2, "magnitude": 9},
  mixup_alpha=0.2,
  cutmix_alpha=1.0,
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """A data dir with digits prepared through the command line."""
  path = str(tmp_path_factory.mktemp("tfds"))
  _prepare_command("--dataset=digits", f"--data_dir={path}")
  return path


def _prepare_command(*args: str) -> subprocess.CompletedProcess:
  return th.check_ok(th.run_module("data.prepare", *args, timeout=120))


def _input(data_dir, split="train", **kw):
  kw = {
    "global_batch_size": 32,
    "image_size": 8,
    "train": split == "train",
    "process_index": 0,
    "process_count": 1,
    "read_threads": 0,
    **kw,
  }
  return make_input("digits", split, data_dir=data_dir, **kw)


def _take(it, n):
  return [next(it) for _ in range(n)]


def _all_equal(batches_a, batches_b):
  return all(
    a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    for a, b in zip(batches_a, batches_b, strict=True)
  )


def test_digits_prepared_counts_and_disjoint_splits(data_dir):
  from sklearn.datasets import load_digits

  digits = load_digits()
  expected = np.round(digits.images * 255 / 16).astype(np.uint8)
  by_bytes = {img.tobytes(): i for i, img in enumerate(expected)}  # All unique.
  ids = {}
  for split, n in [("train", 1497), ("test", 300)]:
    source = tfds.data_source("digits", split=split, data_dir=data_dir)
    assert len(source) == n
    ids[split] = set()
    for example in source:
      image = example["image"]
      assert image.shape == (8, 8, 1) and image.dtype == np.uint8
      i = by_bytes[image[..., 0].tobytes()]
      assert example["label"] == digits.target[i]
      ids[split].add(i)
  assert not ids["train"] & ids["test"]
  assert ids["train"] | ids["test"] == set(range(1797))
  assert ids["test"] == set(builders.digits_split_indices()["test"].tolist())


def test_a_second_prepare_says_the_dataset_is_already_there(data_dir):
  log = _prepare_command("--dataset=digits", f"--data_dir={data_dir}").stderr
  assert "digits (digits) is already prepared in" in log and "prepared digits" not in log, log


def test_name_resolution():
  assert builders.resolve_name("digits") == "digits"
  assert builders.resolve_name("fashion_mnist") == "fashion_mnist_deb"
  assert builders.resolve_name("cifar10") == "cifar10"


def test_train_batch_shapes_and_info(data_dir):
  it, info = _input(data_dir, image_size=(12, 16))
  assert (info.num_classes, info.num_examples, info.image_shape) == (10, 1497, (12, 16, 1))
  assert (info.local_batch_size, info.steps_per_epoch) == (32, 1497 // 32)
  batch = next(it)
  assert batch["image"].shape == (32, 12, 16, 1)
  assert batch["image"].dtype == np.uint8  # normalised on the device (device_ops.to_float)
  assert batch["image"].min() < batch["image"].max()
  x = np.asarray(device_ops.to_float(batch["image"]))
  assert x.dtype == np.float32 and -1.0 <= x.min() < x.max() <= 1.0
  assert batch["label"].shape == (32,) and batch["label"].dtype == np.int32
  assert batch["mask"].dtype == np.bool_ and batch["mask"].all()


def test_default_process_sharding_uses_jax(data_dir):
  it, info = make_input("digits", "test", data_dir=data_dir, global_batch_size=100, image_size=8, train=False)
  assert info.local_batch_size == 100 and info.steps_per_epoch == 3
  assert sum(int(b["mask"].sum()) for b in it) == 300


def test_batch_size_must_divide_over_processes(data_dir):
  with pytest.raises(ValueError, match="multiple of process_count=2"):
    _input(data_dir, global_batch_size=33, process_index=0, process_count=2)


def test_arguments_of_the_wrong_kind_are_one_line(data_dir):
  """Before: image_size="8" unpacked into ('8',), split=None read as a missing dataset, name=None a TypeError."""
  for kw, says in (
    ({"image_size": "8"}, "image_size='8': give one whole number >= 1"),
    ({"image_size": (8, 8, 8)}, r"image_size=\(8, 8, 8\): give one whole number >= 1 .* or an \(H, W\) pair"),
    ({"image_size": 0}, "image_size=0"),
    ({"split": None}, "split=None: give the dataset's split as a str"),
    ({"name": None}, "name=None: give the dataset's name as a str"),
    ({"global_batch_size": 2.5}, "global_batch_size=2.5 must be a positive multiple"),
  ):
    args = dict(name="digits", split="test", data_dir=data_dir, global_batch_size=100, image_size=8, train=False)
    with pytest.raises(ValueError, match=says):
      make_input(**{**args, **kw})
  it, info = make_input("digits", "test", data_dir=data_dir, global_batch_size=100, image_size=[8, 6], train=False)
  assert info.image_shape[:2] == (8, 6) and next(iter(it))["image"].shape[1:3] == (8, 6)


def test_two_processes_read_disjoint_shards(data_dir):
  # Eval: disjoint shards covering the split, same number of batches each.
  seen, lengths = [], []
  for index in range(2):
    it, info = _input(data_dir, "test", global_batch_size=64, process_index=index, process_count=2)
    batches = list(it)
    lengths.append(len(batches))
    assert len(batches) == info.steps_per_epoch
    seen.append([i for b in batches for i in b["index"][b["mask"]]])
  assert lengths[0] == lengths[1]
  assert not set(seen[0]) & set(seen[1])
  assert sorted(seen[0] + seen[1]) == list(range(300))
  # Train: one epoch on each process, disjoint.
  train = []
  for index in range(2):
    it, info = _input(data_dir, global_batch_size=32, process_index=index, process_count=2)
    train.append({int(i) for b in _take(it, info.steps_per_epoch) for i in b["index"]})
    assert len(train[-1]) == info.steps_per_epoch * 16
  assert not train[0] & train[1]


def test_seeded_shuffling(data_dir):
  first = _take(_input(data_dir, seed=1, augment=AUG)[0], 3)
  again = _take(_input(data_dir, seed=1, augment=AUG)[0], 3)
  other = _take(_input(data_dir, seed=2, augment=AUG)[0], 3)
  assert _all_equal(first, again)
  assert not np.array_equal(first[0]["index"], other[0]["index"])
  assert not np.array_equal(first[0]["image"], other[0]["image"])


def test_each_epoch_reshuffles(data_dir):
  it, info = _input(data_dir, global_batch_size=32 * 4)
  epochs = [np.concatenate([b["index"] for b in _take(it, info.steps_per_epoch)]) for _ in range(2)]
  assert not np.array_equal(epochs[0], epochs[1])
  assert len(set(epochs[0])) == len(epochs[0])


def test_iterator_state_restores_exactly(data_dir):
  it, _ = _input(data_dir, seed=3, augment=AUG)
  _take(it, 5)
  state = it.get_state()
  expected = _take(it, 3)
  fresh, _ = _input(data_dir, seed=3, augment=AUG)
  fresh.set_state(state)
  assert _all_equal(_take(fresh, 3), expected)


@pytest.mark.parametrize(
  "mix", [dict(mixup_alpha=0.4), dict(cutmix_alpha=1.0), dict(mixup_alpha=0.2, cutmix_alpha=1.0)]
)
def test_mixing_on_the_device_gives_soft_labels_of_the_pixels_it_mixed(data_dir, mix):
  """Mixup/CutMix in the jitted step: a row is a blend of itself and its neighbour (2k <-> 2k + 1) and its label
  weights are the blend's shares: Mixup's lam everywhere, or for CutMix the fraction of pixels outside one box."""
  batch = next(_input(data_dir, augment=mix)[0])
  assert batch["label"].shape == (32,) and batch["image"].dtype == np.uint8  # the host does not mix
  aug = parse_augment(mix)
  step = jax.jit(lambda x, y, key: device_ops.mix_batch(x, y, 10, aug, key))
  r = np.random.RandomState(0)
  x = r.randn(32, 8, 6, 3).astype(np.float32)  # distinct pixels: the CutMix box can be read off the result
  y = r.randint(0, 10, 32)
  partner = np.arange(32) ^ 1
  kinds = set()
  for i in range(12):
    images, soft = map(np.asarray, step(x, y, jax.random.key(i)))
    assert soft.shape == (32, 10) and soft.dtype == np.float32 and soft.min() >= 0
    np.testing.assert_allclose(soft.sum(-1), 1.0, rtol=1e-6)
    own = (y != y[partner]).nonzero()[0]
    lam = soft[own, y[own]]
    np.testing.assert_allclose(lam, lam[0], rtol=1e-6)  # one draw per batch
    np.testing.assert_allclose(soft[own, y[partner][own]], 1 - lam, rtol=1e-5, atol=1e-6)
    lam = lam[0]
    if lam == 1:
      kinds.add("none")
      np.testing.assert_array_equal(images, x)
    elif ((images == x) | (images == x[partner])).all():
      kinds.add("cutmix")
      box = (images != x).any(axis=(0, 3))  # [H, W]
      rows, cols = box.any(1), box.any(0)
      np.testing.assert_array_equal(box, rows[:, None] & cols[None, :])  # one rectangle
      np.testing.assert_allclose(lam, 1 - box.mean(), rtol=1e-6)
    else:
      kinds.add("mixup")
      np.testing.assert_allclose(images, lam * x + (1 - lam) * x[partner], rtol=1e-5, atol=1e-6)
  want = {"mixup"} if not aug.cutmix_alpha else {"cutmix"} if not aug.mixup_alpha else {"mixup", "cutmix"}
  assert want <= kinds, kinds


MIX_ON_DEVICES = """
import json, jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from vitjax.data import augment, device_ops
aug = augment.parse_augment(dict(mixup_alpha=0.4, cutmix_alpha=1.0))
f = jax.jit(lambda x, y, key: device_ops.mix_batch(device_ops.to_float(x), y, 10, aug, key))
mesh = Mesh(np.array(jax.devices()), ("data",))
r = np.random.RandomState(0)
diff = 0.0
for b in (8, 16):  # 1 row per device (every pair split over two devices) and 2
  x, y = r.randint(0, 256, (b, 8, 8, 3)).astype(np.uint8), r.randint(0, 10, b).astype(np.int32)
  for i in range(6):
    one = f(x, y, jax.random.key(i))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("data")))
    many = f(put(x), put(y), jax.random.key(i))
    diff = max(diff, *(float(np.abs(np.asarray(u) - np.asarray(v)).max()) for u, v in zip(one, many)))
print(json.dumps({"devices": jax.device_count(), "diff": diff}))
"""


def test_device_mixing_does_not_depend_on_how_many_devices_hold_the_batch():
  """The same pairs, draw and weights on 1 and 8 devices. Not bitwise: XLA compiles the per-device shapes with
  other vector loops, and on some CPUs (AVX-512) one contracts w * a + (1 - w) * b into a fused multiply-add, which
  moves a pixel in [-1, 1] by one float32 ulp (5.96e-8); a wrong pair or draw moves it by up to 2."""
  proc = subprocess.run(
    [sys.executable, "-c", MIX_ON_DEVICES], env=th.env(devices=8), capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  assert got["devices"] == 8 and got["diff"] <= 4 * 2.0**-23, got  # a few ulps of 1.0


def test_eval_padding_counts_each_example_once(data_dir):
  it, info = _input(data_dir, "test", global_batch_size=64)
  batches = list(it)
  assert len(batches) == info.steps_per_epoch == 5  # ceil(300 / 64)
  assert all(b["image"].shape == (64, 8, 8, 1) for b in batches)
  mask = np.concatenate([b["mask"] for b in batches])
  index = np.concatenate([b["index"] for b in batches])
  assert mask.sum() == 300 and (index[~mask] == -1).all()
  assert sorted(index[mask]) == list(range(300))


def test_eval_ignores_augment_and_is_deterministic(data_dir):
  a = list(_input(data_dir, "test", augment=AUG, seed=0)[0])
  b = list(_input(data_dir, "test", seed=5)[0])
  assert _all_equal(a, b)
  assert a[0]["label"].dtype == np.int32


def test_unprepared_dataset_error_names_the_command(tmp_path):
  empty = str(tmp_path / "empty")
  with pytest.raises(DatasetNotPreparedError) as err:
    _input(empty)
  assert isinstance(err.value, FileNotFoundError)
  assert f"python -m vitjax.data.prepare --dataset=digits --data_dir={empty}" in str(err.value)
  with pytest.raises(DatasetNotPreparedError, match="tfds build cifar10 --file_format=array_record"):
    make_input(
      "cifar10",
      "test",
      data_dir=empty,
      global_batch_size=8,
      image_size=32,
      train=False,
      process_index=0,
      process_count=1,
    )


def test_vitjaxs_builders_leave_nothing_in_the_temporary_directory(tmp_path, monkeypatch):
  """tfds looks an unprepared dataset's info up in its GCS bucket, first making a temporary directory it never
  removes: every run or prepare of a new dataset left one. vitjax's own builders skip the lookup."""
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  monkeypatch.setattr("tempfile.tempdir", str(scratch))
  images = tmp_path / "images"
  for label in ("a", "b"):
    (images / label).mkdir(parents=True)
  for name in ("digits", "fashion_mnist", f"folder:{images}"):
    builder = builders.get_builder(name, data_dir=str(tmp_path / "data"))
    assert not builder.is_prepared()
  assert os.listdir(scratch) == []


def test_unknown_augment_keys_are_rejected():
  with pytest.raises(ValueError, match="'flip'.*'mixup_alpha'"):
    parse_augment({"fliplr": True})
  with pytest.raises(ValueError, match="valid keys: \\['magnitude', 'num_layers'\\]"):
    parse_augment({"randaugment": {"layers": 2}})
  assert parse_augment({"random_resized_crop": True}).random_resized_crop == ((0.08, 1.0), (0.75, 4 / 3))
  # ranges that failed at the first batch (reversed, a zero ratio) or silently crop nothing (percent)
  for options, says in (
    ({"scale": (1.0, 0.35)}, r"scale=\(1, 0.35\): give 0 < lo <= hi <= 1"),
    ({"scale": (8, 100)}, r"scale=\(8, 100\)"),
    ({"ratio": (0.0, 1.0)}, r"ratio=\(0, 1\): give 0 < lo <= hi"),
  ):
    with pytest.raises(ValueError, match=says):
      parse_augment({"random_resized_crop": options})


def test_eval_preprocessing_crops_to_a_non_square_size_and_refuses_other_arrays():
  """With a crop_fraction a square image could not be cropped to (224, 320); float or CHW arrays failed in PIL."""
  from vitjax.data.augment import Preprocess, preprocess_eval

  pre = Preprocess(crop_fraction=0.875)
  for hw in ((500, 500), (300, 500), (500, 200)):
    for size in ((224, 320), (320, 224), (224, 224)):
      assert preprocess_eval(np.zeros((*hw, 3), np.uint8), size, pre).shape == (*size, 3)
  for bad in (np.zeros((8, 8, 3)), np.zeros((3, 8, 8), np.uint8), np.zeros((2, 8, 8, 3), np.uint8)):
    with pytest.raises(ValueError, match=r"takes one uint8 image \[H, W, C\]"):
      preprocess_eval(bad, (8, 8))


def test_normalisation_in_the_wrong_units_is_refused():
  """ImageNet's mean and std in 0..255 units made every image a constant; a std of 0 made it inf."""
  from vitjax.data.augment import Preprocess

  with pytest.raises(ValueError, match=r"in 0..255 units\? divide by 255: \(0.485, 0.456, 0.406\)"):
    Preprocess(mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375))
  with pytest.raises(ValueError, match=r"std in \(0, 1\]"):
    Preprocess(mean=(0.5,), std=(0.0,))
  assert Preprocess(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)).std == (0.229, 0.224, 0.225)


@pytest.mark.parametrize("channels", [1, 3])
def test_randaugment_ops_keep_shape(channels):
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, (10, 12, channels), dtype=np.uint8)
  for name, op in augment.RANDAUGMENT_OPS.items():
    for level in (-1.0, 0.5):
      out = augment._from_pil(op(augment._to_pil(image), level))
      assert out.shape == image.shape and out.dtype == np.uint8, name
  out = augment.randaugment(image, rng, num_layers=3, magnitude=10)
  assert out.shape == image.shape


def test_random_resized_crop_box_is_inside():
  rng = np.random.default_rng(0)
  for _ in range(50):
    x0, y0, x1, y1 = augment.random_resized_crop_box(rng, 20, 30, scale=(0.08, 1.0), ratio=(0.75, 4 / 3))
    assert 0 <= x0 < x1 <= 30 and 0 <= y0 < y1 <= 20


def test_fashion_mnist_missing_files_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
    prepare_lib.prepare("fashion_mnist", str(tmp_path / "d"), manual_dir=str(tmp_path))


def _write_idx(path, array):
  """An unsigned-byte IDX file (gzipped if the path ends .gz): 0, 0, 0x08, ndim, the big-endian dims, the bytes."""
  import gzip

  header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
  with (gzip.open if path.endswith(".gz") else open)(path, "wb") as f:
    f.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_prepares_from_idx_files_plain_or_gzipped(tmp_path):
  """Without Debian's package: four small IDX files (two gzipped) in a manual_dir prepare into the two splits, each
  image and label as written, the ten class names; a file that is not unsigned-byte IDX, or three of the four files,
  is refused."""
  rng = np.random.default_rng(0)
  made = {}
  files = {"train": builders._FASHION_FILES["train"], "test": [f + ".gz" for f in builders._FASHION_FILES["test"]]}
  for (split, (images, labels)), n in zip(files.items(), (7, 3)):
    made[split] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)
    _write_idx(str(tmp_path / images), made[split][0])
    _write_idx(str(tmp_path / labels), made[split][1])
  assert builders.fashion_mnist_available(str(tmp_path))
  np.testing.assert_array_equal(builders.read_idx(str(tmp_path / "t10k-images-idx3-ubyte.gz")), made["test"][0])
  data_dir = str(tmp_path / "data")
  builder = prepare_lib.prepare("fashion_mnist", data_dir, manual_dir=str(tmp_path))
  assert {k: v.num_examples for k, v in builder.info.splits.items()} == {"train": 7, "test": 3}
  assert builder.info.features["label"].names[0] == "T-shirt/top" and builder.info.features["label"].num_classes == 10
  for split, (images, labels) in made.items():
    source = tfds.data_source("fashion_mnist_deb", split=split, data_dir=data_dir)
    got = sorted((int(x["label"]), x["image"][..., 0].tobytes()) for x in source)  # (tfds reorders examples)
    assert got == sorted((int(y), x.tobytes()) for x, y in zip(images, labels)), split
  (tmp_path / "wide").write_bytes(bytes([0, 0, 0x0B, 1]) + (2).to_bytes(4, "big") + bytes(4))  # int16 data
  with pytest.raises(ValueError, match="not an unsigned-byte IDX file"):
    builders.read_idx(str(tmp_path / "wide"))
  os.remove(tmp_path / "t10k-labels-idx1-ubyte.gz")
  assert not builders.fashion_mnist_available(str(tmp_path))


@pytest.mark.skipif(
  not builders.fashion_mnist_available(), reason="Debian package missing: apt-get install dataset-fashion-mnist"
)
def test_fashion_mnist_prepares_and_reads(tmp_path):
  data_dir = str(tmp_path)
  builder = prepare_lib.prepare("fashion_mnist", data_dir)  # ~11 s on 2 cores.
  assert {k: v.num_examples for k, v in builder.info.splits.items()} == {"train": 60000, "test": 10000}
  it, info = make_input(
    "fashion_mnist",
    "test",
    data_dir=data_dir,
    global_batch_size=128,
    image_size=28,
    train=False,
    process_index=0,
    process_count=1,
    read_threads=0,
  )
  assert (info.num_classes, info.num_examples, info.image_shape) == (10, 10000, (28, 28, 1))
  batch = next(it)
  assert batch["image"].shape == (128, 28, 28, 1)
  assert 0 <= batch["label"].min() and batch["label"].max() < 10
  raw = builders.read_idx(f"{builders.DEBIAN_FASHION_MNIST_DIR}/t10k-images-idx3-ubyte.gz")
  stored = tfds.data_source("fashion_mnist_deb", split="test", data_dir=data_dir)[0]["image"][..., 0]
  assert (raw == stored).all(axis=(1, 2)).any()  # tfds reorders examples.


def test_the_global_batches_do_not_depend_on_the_process_count_and_resume_on_any(data_dir):
  """One sequence of global batches (augmentations included; Mixup/CutMix is the device's, tested above): P processes
  each read their rows of it; a position saved by one process count resumes on another."""
  aug = {
    "flip": True,
    "random_resized_crop": True,
    "randaugment": {"num_layers": 2, "magnitude": 9},
    "mixup_alpha": 0.8,
    "cutmix_alpha": 1.0,
  }

  def run(processes, steps, start=None):
    its = [
      _input(data_dir, global_batch_size=32, process_index=p, process_count=processes, augment=aug)[0]
      for p in range(processes)
    ]
    if start is not None:
      for it in its:
        it.set_state(start)
    out = []
    for _ in range(steps):
      parts = [next(it) for it in its]
      out.append([np.concatenate([b[k] for b in parts]) for k in ("image", "label")])
    return out, [it.get_state() for it in its]

  one, _ = run(1, 6)
  for processes in (2, 4):
    got, states = run(processes, 3)
    assert all(np.array_equal(a, b) for x, y in zip(one, got) for a, b in zip(x, y)), processes
    assert states == [{"batches": 3}] * processes  # the same position on every process
    resumed, _ = run(4 // processes, 3, start=states[0])  # 2 -> 2 processes, 4 -> 1
    assert all(np.array_equal(a, b) for x, y in zip(one[3:], resumed) for a, b in zip(x, y)), processes


def test_the_batches_do_not_depend_on_the_grain_workers_and_resume_with_any(data_dir):
  """grain's W workers each take every W-th record key and batch them: GlobalOrder gives worker w the rows of batches
  w, w + W, ..., so 3 workers yield the batches of reading in the process (across epochs, augmentations included),
  a finite pass ends at the same batch, and a position saved with one count resumes with another."""
  from vitjax.data.images import GlobalOrder

  def read(workers, steps, start=None, num_epochs=None):
    aug = {"flip": True, "random_resized_crop": True}
    it = _input(data_dir, global_batch_size=128, augment=aug, worker_count=workers, num_epochs=num_epochs)[0]
    if start is not None:
      it.set_state(start)
    return [{k: b[k] for k in ("image", "label", "index")} for b in itertools.islice(it, steps)], it.get_state()

  one, _ = read(0, 24)  # 11 batches an epoch
  two_epochs, state = read(3, 100, num_epochs=2)
  assert len(two_epochs) == 22 and _all_equal(one[:22], two_epochs)
  assert state == {"batches": 22}  # not the 24 of the 3 workers' last round
  resumed, state = read(2, 9, start={"batches": 15})
  assert _all_equal(one[15:], resumed) and state == {"batches": 24}
  order = GlobalOrder(100, 8, 0, 1, seed=0, num_epochs=1, workers=5)  # 12 batches: 3 rounds of 5, the last cut short
  assert order.batches() == 12 and len(order) == 15 * 8


def test_worker_count_none_is_0_on_a_cpu_and_the_cores_less_one_on_an_accelerator(monkeypatch, caplog):
  """data.worker_count=None (the default): no workers on a CPU backend (the step uses its cores); on a GPU or TPU the
  cores this process may use less one, at most 8, said in the log. A number is taken as it is."""
  from vitjax.tasks import classification

  caplog.set_level("INFO", logger="absl")
  assert classification.worker_count(None) == 0 and classification.worker_count(3) == 3
  monkeypatch.setattr(classification.jax, "default_backend", lambda: "gpu")
  for cores, workers in ((16, 8), (4, 3), (1, 0)):
    monkeypatch.setattr(classification.image_files, "default_workers", lambda n=cores: n)
    assert classification.worker_count(None) == workers, cores
    assert f"data.worker_count=None: {workers} grain worker processes ({cores} cores for this process)" in caplog.text
  assert classification.worker_count(0) == 0


# ----------------------------------------------------------------------------
# Encoded images: JPEGs through simplejpeg, crops decoded at a reduced DCT scale.


def _photo(rng, height, width, channels=3):
  """A smooth random image with some noise: compresses like a photo."""
  import PIL.Image

  small = rng.integers(0, 256, (max(height // 16, 2), max(width // 16, 2), channels), dtype=np.uint8)
  pil = PIL.Image.fromarray(small[..., 0] if channels == 1 else small).resize((width, height), PIL.Image.BICUBIC)
  photo = np.asarray(pil).astype(float) + rng.normal(0, 6, (height, width) if channels == 1 else (height, width, 3))
  return np.clip(photo, 0, 255).astype(np.uint8)


def _encode(image, fmt="JPEG"):
  import io

  import PIL.Image

  buf = io.BytesIO()
  PIL.Image.fromarray(image).save(buf, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}))
  return buf.getvalue()


def _pil_decode(data, mode):
  import io

  import PIL.Image

  array = np.asarray(PIL.Image.open(io.BytesIO(data)).convert(mode))
  return array[..., None] if array.ndim == 2 else array


@pytest.mark.parametrize("channels", [1, 3])
def test_decode_is_pils_pixels_and_a_large_crop_decodes_at_a_reduced_scale(channels):
  rng = np.random.default_rng(0)
  photo = _photo(rng, 300, 400, channels)
  jpeg, png = _encode(photo), _encode(photo, "PNG")
  mode = "L" if channels == 1 else "RGB"
  assert augment.encoded_shape(jpeg) == augment.encoded_shape(png) == (300, 400)

  image, box = augment.decode(jpeg, channels)  # no target size: full resolution, bitwise PIL's decode
  assert box is None and np.array_equal(image, _pil_decode(jpeg, mode))
  image, box = augment.decode(png, channels, (10, 20, 310, 260), (32, 32))  # PNG: PIL at full size, box unchanged
  assert box == (10, 20, 310, 260) and np.array_equal(image, photo.reshape(image.shape))

  # A 300x240 crop going to 32x32: libjpeg's 1/4 scale (100x75) still gives the crop 75x60 >= 32 pixels.
  crop = (40, 30, 340, 270)
  image, box = augment.decode(jpeg, channels, crop, (32, 32))
  assert image.shape == (75, 100, channels)
  assert box == pytest.approx((10, 7.5, 85, 67.5))
  assert box[2] - box[0] >= 32 and box[3] - box[1] >= 32
  fast = augment.resize(image, (32, 32), box=box).astype(float)
  full = augment.resize(_pil_decode(jpeg, mode), (32, 32), box=crop).astype(float)
  assert fast.shape == full.shape == (32, 32, channels)
  assert np.abs(fast - full).mean() < 2.0, np.abs(fast - full).mean()  # of 255: the same picture
  # A crop as small as its target: no scaling.
  image, box = augment.decode(jpeg, channels, (0, 0, 48, 40), (40, 48))
  assert image.shape[:2] == (300, 400) and box == (0, 0, 48, 40)


class _JpegToy(builders.LocalBuilder, skip_registration=True):
  """12 JPEG photos of 120x160 (two classes), as the stock ImageNet-like tfds datasets store them."""

  name = "jpeg_toy"
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      features=tfds.features.FeaturesDict(
        {
          "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
          "label": tfds.features.ClassLabel(num_classes=2),
        }
      ),
      supervised_keys=("image", "label"),
    )

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    rng = np.random.default_rng(1)
    for i in range(12):
      yield i, {"image": _encode(_photo(rng, 120, 160)), "label": i % 2}


@pytest.fixture(scope="module")
def jpeg_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("jpeg"))
  builders.BUILDERS["jpeg_toy"] = _JpegToy
  try:
    prepare_lib.prepare("jpeg_toy", path)
    yield path
  finally:
    del builders.BUILDERS["jpeg_toy"]


def test_a_jpeg_dataset_reads_through_the_pipeline(jpeg_dir):
  common = dict(data_dir=jpeg_dir, global_batch_size=4, image_size=(24, 32), process_index=0, process_count=1)
  common["read_threads"] = 0
  batches = list(make_input("jpeg_toy", "train", train=False, **common)[0])
  assert len(batches) == 3 and all(b["image"].shape == (4, 24, 32, 3) and b["image"].dtype == np.uint8 for b in batches)
  # Evaluation: the full-resolution decode, resized as before.
  from vitjax.data.splits import open_split

  source, _ = open_split("jpeg_toy", "train", jpeg_dir)
  expected = augment.preprocess_eval(np.asarray(source[5]["image"]), (24, 32))
  assert np.array_equal(batches[1]["image"][1], expected)
  # Training: crops from the header's size, decoded at reduced scale where they are large (a 120x160 photo going
  # to 24x32 decodes at 1/4 unless the crop is small); the stream is seeded.
  aug = {"random_resized_crop": {"scale": (0.5, 1.0)}, "flip": True}
  a = _take(make_input("jpeg_toy", "train", train=True, seed=3, augment=aug, **common)[0], 4)
  b = _take(make_input("jpeg_toy", "train", train=True, seed=3, augment=aug, **common)[0], 4)
  assert _all_equal(a, b) and a[0]["image"].shape == (4, 24, 32, 3)
  assert len({x["image"].tobytes() for x in a}) == 4


def test_the_cache_gives_the_same_batches_and_holds_pngs_decoded_and_jpegs_encoded(data_dir, jpeg_dir, monkeypatch):
  from vitjax.data import images

  made = []
  monkeypatch.setattr(images, "_cache", lambda *a: made.append(images._InMemory(*a)) or made[-1])
  crops = {"random_resized_crop": {"scale": (0.5, 1.0)}, "flip": True, "randaugment": True}
  for name, path, size, subset in (
    ("digits", data_dir, 8, np.arange(0, 1400, 2)),  # training beside a validation split reads a subset
    ("jpeg_toy", jpeg_dir, (24, 32), None),
  ):
    for train, batch, process in ((True, 4, (1, 2)), (False, 6, (1, 2)), (False, 5, (0, 1))):
      kw = dict(data_dir=path, image_size=size, process_index=process[0], process_count=process[1], read_threads=0)
      kw.update(global_batch_size=batch, train=train, seed=5, augment=crops, subset=subset)
      plain, _ = make_input(name, "train", **kw)
      cached, _ = make_input(name, "train", cache=True, **kw)
      a, b = (_take(it, 6) if train else list(it) for it in (plain, cached))  # eval: a padded last batch
      assert _all_equal(a, b), (name, train, batch)
      image = made[-1][int(np.flatnonzero(made[-1]._rows >= 0)[-1])]["image"]
      assert isinstance(image, bytes if name == "jpeg_toy" else np.ndarray), (name, type(image))
    # The flag may change on resume: a cached iterator set to a plain one's state goes on with the same batches.
    kw = dict(data_dir=path, image_size=size, process_index=0, process_count=1, read_threads=0, subset=subset)
    kw.update(global_batch_size=4, train=True, seed=5, augment=crops)
    plain, _ = make_input(name, "train", **kw)
    _take(plain, 3)
    cached, _ = make_input(name, "train", cache=True, **kw)
    cached.set_state(plain.get_state())
    assert _all_equal(_take(plain, 4), _take(cached, 4)), name
  assert made[0]._images.shape == (700, 8, 8, 1) and isinstance(made[4]._images, list)  # PNGs of one shape: stacked
  # cache=None (the config's default): small data is cached, unless its copies (1 + worker_count) pass the limit
  made.clear()
  _input(data_dir, cache=None)  # 1,497 digits
  assert len(made) == 1 and made[0].count == 1497
  _, builder = images.open_split("digits", "train", data_dir)
  mib = images.memory_estimate(builder, "image", 1497) / 2**20
  assert 1497 * 64 <= mib * 2**20 <= made[0].nbytes * 4  # at least the decoded pixels, and near what it holds
  _input(data_dir, cache=None, cache_max_mb=3 * mib, worker_count=2)  # 3 copies: exactly the limit
  assert len(made) == 2
  _input(data_dir, cache=None, cache_max_mb=mib * (1 - 1e-6))  # a little too much
  _input(data_dir, cache=False)
  assert len(made) == 2
  with pytest.raises(ValueError, match="uint8"):  # a decoded image of the wrong layout is refused
    augment.decode(np.zeros((8, 8, 3), np.uint8), 1)


def test_labelled_subset_is_class_balanced_seeded_and_what_training_and_the_probe_read(data_dir):
  from vitjax import tasks
  from vitjax.config import default_config
  from vitjax.data import labelled_subset, split_labels
  from vitjax.errors import ConfigError

  labels = split_labels("digits", "train", data_dir)
  reader = _input(data_dir, "train", train=False, global_batch_size=1)[0]
  assert np.array_equal(labels[:64], [int(b["label"][0]) for b in _take(reader, 64)])
  for amount, n in ((0.1, round(0.1 * len(labels))), ("10%", round(0.1 * len(labels))), (50, 50), ("50", 50)):
    chosen = labelled_subset(labels, amount, seed=3)
    counts = np.bincount(labels[chosen], minlength=10)
    assert len(chosen) == n and counts.max() - counts.min() <= 1 and np.all(np.diff(chosen) > 0), (amount, counts)
  assert np.array_equal(labelled_subset(labels, 50, 3), labelled_subset(labels, 50, 3))
  assert not np.array_equal(labelled_subset(labels, 50, 3), labelled_subset(labels, 50, 4))
  for amount, says in (
    (0, "a count must be in"),
    (1.5, "a count must be in"),
    ("abc", "give a fraction"),
    (5, "fewer"),
  ):
    with pytest.raises(ValueError, match=says):
      labelled_subset(labels, amount, 0)

  def task(**data):
    c = default_config()
    c.data.data_dir = data_dir
    c.data.update(data)
    return tasks.get(c, "")

  full = task()
  kept = full.training_positions()  # the training part: the split without the held-out 'valid'
  few = task(labelled=50, labelled_seed=1)
  few.check()
  chosen = few.training_positions()
  assert len(chosen) == 50 and set(chosen) <= set(kept)
  assert np.bincount(labels[chosen], minlength=10).tolist() == [5] * 10
  _, info = few._input("train", False)  # what the probe fits on (and, with train=True, what trains)
  assert info.num_examples == 50
  _, info = few._input("valid", False)  # 'valid' keeps every example
  assert info.num_examples == full._input("valid", False)[1].num_examples
  with pytest.raises(ConfigError, match="data.labelled=5000: a count must be in"):
    task(labelled=5000).check()


def test_holdout_split_holds_out_the_rounded_fraction_and_never_every_example():
  """round(fraction * N) positions are held out, the rest kept, both sorted; a fraction that rounds to all of them is
  refused (training would read nothing)."""
  from vitjax.data import holdout_split

  kept, held = holdout_split(10, 0.3, seed=1)
  assert len(held) == 3 and len(kept) == 7 and sorted([*kept, *held]) == list(range(10))
  assert np.all(np.diff(kept) > 0) and np.all(np.diff(held) > 0)
  assert len(holdout_split(10, 0.0, seed=1)[1]) == 0
  with pytest.raises(ValueError, match="cannot hold out 0.96 of 10 examples"):
    holdout_split(10, 0.96, seed=1)  # valid_fraction < 1, but it rounds to all 10


def test_labelled_counts_at_the_edges():
  """A fraction of 1.0 is every example (not a count of 1), a tiny fraction keeps one, and as many examples as
  classes is one of each."""
  from vitjax.data import labelled_subset
  from vitjax.data.splits import labelled_count

  assert labelled_count(1.0, 40) == 40 and labelled_count("100%", 40) == 40
  assert labelled_count(0.001, 40) == 1 and labelled_count("0.1%", 40) == 1
  labels = np.repeat(np.arange(4), 5)
  chosen = labelled_subset(labels, 4, seed=0)
  assert sorted(labels[chosen].tolist()) == [0, 1, 2, 3]
  with pytest.raises(ValueError, match="keeps 3 examples, fewer than the 4 classes"):
    labelled_subset(labels, 3, seed=0)


def test_a_stock_dataset_with_manual_files_names_the_manual_dir_in_its_command():
  """A tfds dataset whose files are downloaded by hand: the command takes --manual_dir and the message says what goes
  there."""
  import types

  from vitjax.data.splits import not_prepared_message

  builder = types.SimpleNamespace(MANUAL_DOWNLOAD_INSTRUCTIONS="\n  put ILSVRC2012_img_train.tar in it\n")
  message = not_prepared_message("imagenet2012", "/data", builder)
  assert "tfds build imagenet2012 --file_format=array_record --data_dir=/data --manual_dir=DIR\n" in message
  assert "(this dataset needs manually downloaded files in DIR: put ILSVRC2012_img_train.tar in it)" in message
  assert "--manual_dir" not in not_prepared_message("cifar10", "/data", types.SimpleNamespace())


def test_positions_outside_the_split_and_a_limit_of_nothing_are_refused(data_dir):
  """A subset position past the split's end, a limit of 0 and a process index outside the processes: one ValueError
  each, before anything is read."""
  with pytest.raises(ValueError, match=r"subset positions must lie in \[0, 300\)"):
    _input(data_dir, "test", train=False, subset=np.array([0, 300]))
  _input(data_dir, "test", train=False, subset=np.array([0, 299]))  # the last example is inside
  with pytest.raises(ValueError, match="limit=0 must be a whole number, at least 1"):
    _input(data_dir, "test", train=False, limit=0)
  with pytest.raises(ValueError, match=r"process_index=2 not in \[0, process_count=2\)"):
    _input(data_dir, "test", train=False, process_index=2, process_count=2)


def test_global_order_ends_after_its_epochs_and_an_old_data_position_is_refused(data_dir):
  """GlobalOrder with num_epochs has exactly epochs x full batches of records (an IndexError past them, which ends
  grain's reading); a checkpoint's data position without 'batches' (per-process grain state) names the fix."""
  from vitjax.data.images import GlobalOrder

  order = GlobalOrder(10, 4, 0, 1, seed=0, num_epochs=1)  # 2 full batches of 4 a pass
  assert len(order) == 8 and {order[k].record_key for k in range(8)} <= set(range(10))
  with pytest.raises(IndexError):
    order[8]
  assert len(GlobalOrder(10, 4, 0, 1, seed=0, start=5, num_epochs=1)) == 0  # resumed past its end
  it, _ = _input(data_dir)
  with pytest.raises(ValueError, match="written by an older vitjax"):
    it.set_state({"iterator": "..."})


def test_shifts_take_their_ranges_and_shift_each_image_on_its_own():
  """shift=: contrast in (0, 1] and noise / blur >= 0, whose edges change nothing; rotate:90 turns counter-clockwise
  (PIL's sense, np.rot90's); the noise of an image is drawn from its own bytes: another image gets other noise, the
  same image the same noise in any batch."""
  from vitjax.data import shifts

  images = np.random.default_rng(0).integers(0, 256, (3, 6, 6, 3), np.uint8)
  for spec in ("contrast:1", "noise:0", "blur:0"):
    assert np.array_equal(shifts.parse(spec)(images), images), spec
  for spec, says in (
    ("contrast:0", r"a contrast factor is in \(0, 1\]"),
    ("contrast:1.5", r"a contrast factor is in \(0, 1\]"),
    ("noise:-0.1", "the amount must be >= 0"),
    ("blur:-1", "the amount must be >= 0"),
    ("rotate", "give one of rotate:X, noise:X, contrast:X, blur:X"),
  ):
    with pytest.raises(ValueError, match=says):
      shifts.parse(spec)
  for channels in (3, 1):
    x = images[..., :channels]
    assert np.array_equal(shifts.parse("rotate:90")(x), np.rot90(x, axes=(1, 2))), channels
  noise = shifts.parse("noise:0.1")
  gray = np.full((2, 6, 6, 3), 128, np.uint8)
  gray[1, 0, 0, 0] = 129  # two images a byte apart
  out = noise(gray).astype(int) - gray
  assert not np.array_equal(out[0, 1:], out[1, 1:])
  assert np.array_equal(noise(gray[1:]), noise(gray)[1:]) and noise(images[:0]).shape == (0, 6, 6, 3)


def test_a_process_with_no_examples_reads_a_masked_batch_with_and_without_the_cache(data_dir):
  """limit=1 over 2 processes: process 0's share is empty, its one batch all padding (a copy of example 0, masked),
  read into memory first (cache=True) or not."""
  for cache in (False, True):
    it, info = _input(data_dir, "test", train=False, limit=1, process_index=0, process_count=2, cache=cache)
    (batch,) = list(it)
    assert info.steps_per_epoch == 1 and not batch["mask"].any() and (batch["index"] == -1).all(), cache


def test_the_default_data_dir_is_tfds_data_dir_or_the_home_folder_s_expanded(monkeypatch, tmp_path):
  """$TFDS_DATA_DIR when set ("~" expanded), else ~/tensorflow_datasets with the home folder written out."""
  from vitjax.data import local

  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
  assert local.default_data_dir() == str(tmp_path / "tensorflow_datasets")
  monkeypatch.setenv("TFDS_DATA_DIR", "~/elsewhere")
  assert local.default_data_dir() == str(tmp_path / "elsewhere")


def test_encode_png_round_trips_1_3_and_4_channels_and_refuses_other_arrays():
  """A uint8 [H, W, C] image encodes to a PNG that decodes to the same pixels (one channel: a grayscale PNG); a
  float image or one without its channel axis is a ValueError naming dtype and shape."""
  import io

  import PIL.Image

  from vitjax.data import local

  rng = np.random.default_rng(0)
  for channels, mode in ((1, "L"), (3, "RGB"), (4, "RGBA")):
    image = rng.integers(0, 256, (5, 7, channels), np.uint8)
    png = local.encode_png(image)
    assert png[:8] == b"\x89PNG\r\n\x1a\n", channels
    decoded = PIL.Image.open(io.BytesIO(png))
    assert decoded.mode == mode and np.array_equal(np.asarray(decoded).reshape(image.shape), image), channels
  for bad in (np.zeros((5, 7, 3), np.float32), np.zeros((5, 7), np.uint8)):  # the dtype, the shape
    with pytest.raises(ValueError, match=re.escape(f"Expected uint8 [H, W, C], got {bad.dtype} {bad.shape}")):
      local.encode_png(bad)


def test_local_features_are_a_uint8_image_and_a_class_label_by_names_or_count():
  """features(shape, names) labels by name; features(shape, num_classes=N) by count; the image is uint8 `shape`."""
  from vitjax.data import local

  named = local.features((8, 6, 3), names=["cat", "dog"])
  assert named["image"].shape == (8, 6, 3) and named["image"].np_dtype == np.uint8
  assert named["label"].names == ["cat", "dog"] and named["label"].num_classes == 2
  counted = local.features((4, 4, 1), num_classes=10)
  assert counted["image"].shape == (4, 4, 1) and counted["label"].num_classes == 10


def test_a_local_builder_s_code_path_is_the_file_that_defines_it():
  """code_path, on the class and on an instance's type, is the builder's own file (tfds' default may not import)."""
  from vitjax.data import local

  assert str(builders.Digits.code_path) == os.path.abspath(builders.__file__)
  assert str(builders.FashionMnistDeb.code_path) == os.path.abspath(builders.__file__)
  assert str(local._ThisFile().__get__(object.__new__(builders.Digits))) == os.path.abspath(builders.__file__)
