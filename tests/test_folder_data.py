"""A user's own images (vitjax.data.folder): `folder:PATH` and `csv:FILE` prepared as array_record, what is kept,
converted or skipped, the names in tfds, bad input through the command line, and a tiny training run whose
`vitjax.load` names the classes. Every image is generated here (PIL), a few dozen small ones."""

import io
import json
import os
import shlex
import subprocess
import sys

import numpy as np
import PIL.Image
import PIL.ImageOps
import pytest
import train_helpers as th

from vitjax.data import DatasetNotPreparedError, augment, builders, folder, has_split, make_input, split_info
from vitjax.data import prepare as prepare_lib
from vitjax.data.splits import open_split
from vitjax.errors import ConfigError


def _picture(h, w, seed=0):
  """A smooth RGB picture (JPEG keeps it close), uint8 [h, w, 3]."""
  rng = np.random.default_rng(seed)
  coarse = rng.integers(0, 256, (3, 3, 3), np.uint8)
  return np.asarray(PIL.Image.fromarray(coarse).resize((w, h), PIL.Image.BILINEAR))


def _save(path, pil, fmt, **kw):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  pil.save(path, format=fmt, **kw)


def _encoded(pil, fmt, **kw):
  buf = io.BytesIO()
  pil.save(buf, format=fmt, **kw)
  return buf.getvalue()


def _prepare_cli(*args, cwd=th.ROOT):
  return subprocess.run(
    [sys.executable, "-m", "vitjax.data.prepare", *args],
    cwd=cwd,
    env=th.env(),
    capture_output=True,
    text=True,
    timeout=120,
  )


def _stored(name, split, data_dir):
  """{(height, width) of the stored image: its bytes} (each test image has a size of its own)."""
  source, _ = open_split(name, split, data_dir, encoded_images=True)
  out = {}
  for i in range(len(source)):
    data = bytes(source[i]["image"])
    out[augment.encoded_shape(data)] = (data, int(source[i]["label"]))
  assert len(out) == len(source)
  return out


# ------------------------------------------------------------------ what is kept, converted and skipped


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
  """One folder with every kind of file (each image of a size of its own), prepared in-process by 2 workers."""
  root = tmp_path_factory.mktemp("kinds")
  src, data_dir = str(root / "photos"), str(root / "tfds")
  rgb = lambda h, w: PIL.Image.fromarray(_picture(h, w, h * 1000 + w))
  files = {}  # name -> (class, expected stored (h, w), what happens)

  def add(name, cls, pil, fmt, shape, what, **kw):
    _save(os.path.join(src, cls, name), pil, fmt, **kw)
    files[name] = (cls, shape, what)

  add("rgb.jpg", "cat", rgb(20, 30), "JPEG", (20, 30), "kept", quality=90)
  add("gray.jpg", "cat", rgb(21, 31).convert("L"), "JPEG", (21, 31), "kept")
  add("rgb.png", "cat", rgb(22, 32), "PNG", (22, 32), "kept")
  add("gray.png", "dog", rgb(23, 33).convert("L"), "PNG", (23, 33), "kept")
  add("rgba.png", "dog", rgb(24, 34).convert("RGBA"), "PNG", (24, 34), "converted")
  add("palette.png", "dog", rgb(25, 35).convert("P"), "PNG", (25, 35), "converted")
  add("cmyk.jpg", "dog", rgb(26, 36).convert("CMYK"), "JPEG", (26, 36), "converted")
  exif = PIL.Image.Exif()
  exif[0x0112] = 6  # rotate 90 degrees clockwise to display: 10 high, 40 wide on file -> 40 high, 10 wide
  add("rotated.jpg", "fish", rgb(10, 40), "JPEG", (40, 10), "converted", exif=exif.tobytes(), quality=95)
  ramp = (np.arange(27 * 37, dtype=np.uint32).reshape(27, 37) * 60).astype(np.uint16)
  add("deep.png", "fish", PIL.Image.fromarray(ramp), "PNG", (27, 37), "converted")
  add("image.bmp", "fish", rgb(28, 38), "BMP", (28, 38), "converted")
  add("image.gif", "fish", rgb(29, 39), "GIF", (29, 39), "converted")
  add("image.tiff", "fish", rgb(30, 40), "TIFF", (30, 40), "converted")
  add("image.webp", "fish", rgb(31, 41), "WEBP", (31, 41), "converted")
  add("nested/deeper.jpg", "fish", rgb(32, 42), "JPEG", (32, 42), "kept")
  jpeg = _encoded(rgb(60, 80), "JPEG")
  (root / "photos" / "cat" / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
  png = _encoded(rgb(60, 81), "PNG")
  (root / "photos" / "cat" / "truncated.png").write_bytes(png[: len(png) // 2])
  (root / "photos" / "dog" / "notes.txt").write_text("not an image\n")
  (root / "photos" / "dog" / ".DS_Store").write_bytes(b"\0\0")  # hidden: not even listed
  (root / "photos" / "README.md").write_text("files beside the class folders are ignored\n")
  name = f"folder:{src}"
  builder = prepare_lib.prepare(name, data_dir, workers=2)
  return {"name": name, "src": src, "data_dir": data_dir, "files": files, "builder": builder}


def test_images_the_pipeline_reads_are_kept_and_others_converted_once(kinds):
  stored = _stored(kinds["name"], "train", kinds["data_dir"])
  src, classes = kinds["src"], ["cat", "dog", "fish"]
  assert sorted(stored) == sorted(shape for _, shape, _ in kinds["files"].values())
  for name, (cls, shape, what) in kinds["files"].items():
    data, label = stored[shape]
    assert label == classes.index(cls), name
    original = open(os.path.join(src, cls, name), "rb").read()
    assert (data == original) == (what == "kept"), name
    image, _ = augment.decode(data, 3)
    assert image.shape == (*shape, 3) and image.dtype == np.uint8, name
    if what == "converted":
      with PIL.Image.open(io.BytesIO(data)) as pil:
        assert pil.mode == "RGB" and pil.format == ("JPEG" if name.endswith(".jpg") else "PNG"), name
  # upright: the stored image is the original turned by its EXIF orientation (JPEG twice: close, not equal)
  with PIL.Image.open(os.path.join(src, "fish", "rotated.jpg")) as pil:
    upright = np.asarray(PIL.ImageOps.exif_transpose(pil).convert("RGB"), np.float64)
  rotated, _ = augment.decode(stored[(40, 10)][0], 3)
  assert np.abs(rotated - upright).mean() < 3
  # 16 bits: levels scaled to 8 bits, gray in 3 channels
  deep, _ = augment.decode(stored[(27, 37)][0], 3)
  ramp = (np.arange(27 * 37).reshape(27, 37) * 60).astype(np.uint16)
  assert np.array_equal(deep[..., 0], np.round(ramp / 257).astype(np.uint8)) and (deep == deep[..., :1]).all()
  # alpha dropped, as PIL's convert("RGB") does
  with PIL.Image.open(os.path.join(src, "dog", "rgba.png")) as pil:
    assert np.array_equal(augment.decode(stored[(24, 34)][0], 3)[0], np.asarray(pil.convert("RGB")))


def test_sixteen_bit_levels_map_to_the_same_eight_bit_levels_in_every_image():
  """One scale for every 16-bit image: before, an image whose levels all stayed below 256 kept them (a dim all-200
  image became 200, bright) while one with a level of 300 was divided by 257 (200 became 1)."""
  from vitjax.data import image_files

  dim = np.full((4, 4), 200, np.uint16)
  other = dim.copy()
  other[:, 0] = 300
  got = [np.asarray(image_files._to_rgb(PIL.Image.fromarray(a), upright=True)) for a in (dim, other)]
  assert PIL.Image.fromarray(dim).mode == "I;16" and got[0][0, 1, 0] == got[1][0, 1, 0] == 1, got


def test_unreadable_files_are_skipped_and_listed_beside_the_dataset(kinds):
  builder = kinds["builder"]
  with open(os.path.join(builder.data_dir, folder.SKIPPED_FILE)) as f:
    skipped = dict(line.rstrip("\n").split("\t") for line in f)
  assert sorted(skipped) == ["cat/truncated.jpg", "cat/truncated.png", "dog/notes.txt"]
  assert "truncated" in skipped["cat/truncated.png"] and skipped["dog/notes.txt"] == "not an image PIL knows"
  assert builder.counts["kept"] == 5 and sum(builder.counts.values()) == 14


def test_class_names_and_mixed_sizes_reach_training_batches(kinds):
  info = split_info(kinds["name"], "train", kinds["data_dir"])
  assert info == {"num_examples": 14, "num_classes": 3, "class_names": ["cat", "dog", "fish"], "channels": 3}
  assert not has_split(kinds["name"], "valid", kinds["data_dir"]) and has_split(
    kinds["name"], "train", kinds["data_dir"]
  )
  common = dict(data_dir=kinds["data_dir"], image_size=(16, 12), process_index=0, process_count=1, read_threads=0)
  aug = {"random_resized_crop": True, "flip": True}
  it, info = make_input(kinds["name"], "train", global_batch_size=4, train=True, augment=aug, **common)
  batch = next(it)
  assert batch["image"].shape == (4, 16, 12, 3) and batch["image"].dtype == np.uint8
  batches = list(make_input(kinds["name"], "train", global_batch_size=8, train=False, cache=True, **common)[0])
  assert sum(int(b["mask"].sum()) for b in batches) == 14
  assert sorted(np.concatenate([b["label"][b["mask"]] for b in batches]).tolist()) == [0] * 3 + [1] * 4 + [2] * 7


# ------------------------------------------------------------------ names, splits, CSV


def test_sources_map_to_one_tfds_config_each(tmp_path, monkeypatch):
  (tmp_path / "a" / "imgs").mkdir(parents=True)
  (tmp_path / "b" / "imgs").mkdir(parents=True)
  one, two = builders.resolve_name(f"folder:{tmp_path}/a/imgs"), builders.resolve_name(f"folder:{tmp_path}/b/imgs")
  assert one != two and one.startswith("image_folder/imgs_") and two.startswith("image_folder/imgs_")
  assert builders.resolve_name(f"csv:{tmp_path}/a/imgs").startswith("image_folder/imgs_csv_")
  monkeypatch.chdir(tmp_path / "a")  # a relative path is resolved against the current directory
  assert builders.resolve_name("folder:imgs") == one and builders.resolve_name("folder:./imgs/") == one
  assert builders.is_local("folder:imgs") and builders.is_local("csv:x.csv") and not builders.is_local("cifar10")
  b1, b2 = builders.get_builder(f"folder:{tmp_path}/a/imgs", str(tmp_path)), builders.get_builder("folder:imgs", "/d")
  assert type(b1) is type(b2) and b1.builder_config.name == one.split("/")[1]
  assert b1.data_dir.startswith(os.path.join(str(tmp_path), "image_folder", one.split("/")[1]))


def test_not_prepared_gives_the_exact_command_that_prepares_it(tmp_path, monkeypatch):
  """A relative name, not prepared: the message's command (with the absolute path) prepares it from anywhere."""
  for cls, n in (("b", 2), ("a", 3)):
    for i in range(n):
      _save(str(tmp_path / "work" / "shots" / cls / f"{i}.png"), PIL.Image.fromarray(_picture(8 + i, 9)), "PNG")
  data_dir = str(tmp_path / "tfds")
  monkeypatch.chdir(tmp_path / "work")
  with pytest.raises(DatasetNotPreparedError) as e:
    split_info("folder:shots", "train", data_dir)
  command = str(e.value).splitlines()[-1].strip()
  shots = str(tmp_path / "work" / "shots")
  assert command == f"python -m vitjax.data.prepare --dataset=folder:{shots} --data_dir={data_dir}"
  th.check_ok(_prepare_cli(*shlex.split(command)[3:]))  # from the repository root, not from work/
  assert split_info("folder:shots", "train", data_dir)["class_names"] == ["a", "b"]


def test_split_folders_are_the_splits_and_the_log_says_what_was_skipped(tmp_path):
  src = tmp_path / "pets"
  sizes = iter(range(8, 100))
  for split, n in (("train", 3), ("val", 2), ("test", 1)):
    for cls in ("dog", "cat"):
      for i in range(n):
        s = next(sizes)
        _save(str(src / split / cls / f"{i}.jpg"), PIL.Image.fromarray(_picture(s, s)), "JPEG")
  (src / "test" / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
  proc = th.check_ok(_prepare_cli(f"--dataset=folder:{src}", f"--data_dir={tmp_path / 'tfds'}", "--workers=1"))
  skipped = [line for line in proc.stderr.splitlines() if "skipped" in line]
  assert len(skipped) == 1 and "skipped 1 of 13 files" in skipped[0] and "test/cat/broken.jpg" in skipped[0]
  assert "{'train': 6, 'valid': 4, 'test': 2}" in proc.stderr
  name, data_dir = f"folder:{src}", str(tmp_path / "tfds")
  assert has_split(name, "valid", data_dir)
  assert split_info(name, "valid", data_dir)["class_names"] == ["cat", "dog"]
  assert [split_info(name, s, data_dir)["num_examples"] for s in ("train", "valid", "test")] == [6, 4, 2]
  again = th.check_ok(_prepare_cli(f"--dataset=folder:{src}", f"--data_dir={data_dir}"))
  assert "is already prepared" in again.stderr


def test_a_csv_names_files_labels_and_splits(tmp_path):
  (tmp_path / "lists").mkdir()
  rows = ["path,label,split"]
  for i in range(9):
    label = ("2", "10", "7")[i % 3]
    _save(str(tmp_path / "img" / f"{i}.png"), PIL.Image.fromarray(_picture(10 + i, 12)), "PNG")
    rows.append(f"../img/{i}.png,{label},{'valid' if i >= 6 else ''}")
  rows.append(f"{tmp_path / 'img' / '0.png'},7,test")  # absolute, and listed twice
  (tmp_path / "lists" / "labels.csv").write_text("\n".join(rows) + "\n\n")
  name, data_dir = f"csv:{tmp_path / 'lists' / 'labels.csv'}", str(tmp_path / "tfds")
  with pytest.raises(ConfigError, match="line 2: '../img/0.png' is outside the CSV file's folder"):
    prepare_lib.prepare(name, data_dir, workers=1)  # ../img/ and the absolute path: outside lists/
  prepare_lib.prepare(name, data_dir, workers=1, allow_outside_root=True)
  info = split_info(name, "train", data_dir)
  assert info["class_names"] == ["2", "7", "10"] and info["num_examples"] == 6  # numeric labels: numeric order
  assert split_info(name, "valid", data_dir)["num_examples"] == 3 and split_info(name, "test", data_dir)["num_examples"]
  stored = _stored(name, "train", data_dir)
  assert stored[(13, 12)][1] == 0 and stored[(14, 12)][1] == 2  # image 3 has label '2', image 4 '10'
  with pytest.raises(ConfigError, match="names no file"):
    builders.get_builder("csv:", data_dir)


def _touch(root, *parts):
  path = root.joinpath(*parts)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(b"x")  # scan lists files without reading them


def test_scan_leaves_out_hidden_folders_and_refuses_ambiguous_splits(tmp_path):
  """Files in a hidden folder inside a class (.thumbs/) are not images of it; val/ beside valid/, and split folders
  without train/, are one error each (scan, before anything is read)."""
  _touch(tmp_path, "flat", "cat", "a.png")
  _touch(tmp_path, "flat", "cat", ".thumbs", "a.png")
  _touch(tmp_path, "flat", "dog", "sub", "b.png")
  scanned = folder.scan(folder.parse(f"folder:{tmp_path / 'flat'}"))
  assert scanned.class_names == ["cat", "dog"]
  assert [(key, label) for key, _, label in scanned.splits["train"]] == [("cat/a.png", 0), ("dog/sub/b.png", 1)]
  for split in ("train", "val", "valid"):
    _touch(tmp_path, "twice", split, "cat", "a.png")
  with pytest.raises(ConfigError, match="folders val, valid all name the 'valid' split: keep one"):
    folder.scan(folder.parse(f"folder:{tmp_path / 'twice'}"))
  for split in ("valid", "test"):
    _touch(tmp_path, "notrain", split, "cat", "a.png")
  with pytest.raises(ConfigError, match="has test/, valid/ but no train/"):
    folder.scan(folder.parse(f"folder:{tmp_path / 'notrain'}"))


def test_scan_refuses_csv_rows_of_more_columns_and_a_csv_without_train_rows(tmp_path):
  """A fourth column is not read as the split's; a CSV whose rows are all held out has nothing to train on."""
  _touch(tmp_path, "img", "a.png")
  for name, content, says in (
    ("four.csv", "img/a.png,cat,train,x\n", "line 1: 'img/a.png,cat,train,x' is not path,label\\[,split\\]"),
    ("held.csv", "img/a.png,cat,valid\nimg/a.png,dog,test\n", "has no train rows"),
  ):
    (tmp_path / name).write_text(content)
    with pytest.raises(ConfigError, match=says):
      folder.scan(folder.parse(f"csv:{tmp_path / name}"))
  assert folder.parse("folder") is None and folder.parse("csv") is None  # a tfds name, not a source without a path
  assert builders.resolve_name("csv") == "csv" and not builders.is_local("folder")


def test_a_source_that_fails_to_prepare_leaves_the_data_dir_as_it_was(tmp_path):
  """No file of the folder is an image: ConfigError, and what tfds made on the way is removed (a new data_dir too);
  what was there stays."""
  (tmp_path / "junk" / "cat").mkdir(parents=True)
  (tmp_path / "junk" / "cat" / "a.txt").write_text("not an image\n")
  (tmp_path / "old").mkdir()
  (tmp_path / "old" / "keep.txt").write_text("another dataset\n")
  for data_dir, left in ((tmp_path / "new", None), (tmp_path / "old", ["keep.txt"])):
    with pytest.raises(ConfigError, match="none of the 1 files"):
      prepare_lib.prepare(f"folder:{tmp_path / 'junk'}", str(data_dir), workers=1)
    assert (sorted(os.listdir(data_dir)) if data_dir.exists() else None) == left


def test_every_exif_orientation_is_turned_upright(tmp_path):
  """EXIF orientations 2-8 (mirrored, rotated) are stored as the image the viewer shows, 1 as it is."""
  from vitjax.data import image_files

  picture = PIL.Image.fromarray(_picture(10, 40))
  for orientation in range(1, 9):
    exif = PIL.Image.Exif()
    exif[0x0112] = orientation
    path = str(tmp_path / f"{orientation}.jpg")
    _save(path, picture, "JPEG", exif=exif.tobytes(), quality=95)
    data, note = image_files.read_image(path)
    assert note == ("kept" if orientation == 1 else f"converted: EXIF orientation {orientation}"), note
    with PIL.Image.open(path) as pil:
      shown = np.asarray(PIL.ImageOps.exif_transpose(pil).convert("RGB"), np.float64)
    stored = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"), np.float64)
    assert stored.shape == shown.shape and np.abs(stored - shown).mean() < 8, (orientation, stored.shape)  # flips: > 40


# ------------------------------------------------------------------ bad input through the command line


def _bad_sources(root):
  (root / "noclasses").mkdir()
  _save(str(root / "noclasses" / "a.png"), PIL.Image.new("RGB", (4, 4)), "PNG")
  _save(str(root / "oneempty" / "cat" / "a.png"), PIL.Image.new("RGB", (4, 4)), "PNG")
  (root / "oneempty" / "dog").mkdir()
  _save(str(root / "mixed" / "train" / "cat" / "a.png"), PIL.Image.new("RGB", (4, 4)), "PNG")
  _save(str(root / "mixed" / "dog" / "a.png"), PIL.Image.new("RGB", (4, 4)), "PNG")
  _save(str(root / "img" / "a.png"), PIL.Image.new("RGB", (4, 4)), "PNG")
  (root / "missing.csv").write_text("path,label\nimg/a.png,cat\nimg/b.png,dog\n")
  (root / "nolabel.csv").write_text("img/a.png,cat\nimg/a.png\n")
  (root / "badsplit.csv").write_text("img/a.png,cat,training\n")
  (root / "junk" / "cat").mkdir(parents=True)
  (root / "junk" / "cat" / "a.txt").write_text("text\n")
  _save(str(root / "testonly" / "train" / "cat" / "a.png"), PIL.Image.new("RGB", (4, 4)), "PNG")
  _save(str(root / "testonly" / "test" / "Cat" / "a.png"), PIL.Image.new("RGB", (4, 4)), "PNG")
  (root / "testonly.csv").write_text("img/a.png,cat\nimg/a.png,dog,test\n")


BAD = [
  ("folder:nosuchdir", ["no such folder", "nosuchdir"]),
  ("folder:noclasses", ["has no class folders", "CLASS"]),
  ("folder:oneempty", ["class folder dog/ has no files"]),
  ("folder:mixed", ["mixes split folders (train) with other folders (dog)"]),
  ("csv:missing.csv", ["line 3", "no such file 'img/b.png'", "relative to the CSV file's folder"]),
  ("csv:nolabel.csv", ["line 2", "has no label", "path,label"]),
  ("csv:badsplit.csv", ["split 'training' is not train, valid or test"]),
  ("csv:nosuch.csv", ["no such file"]),
  ("folder:missing.csv", ["is a file, not a folder", "--dataset=csv:missing.csv"]),
  ("folder:junk", ["none of the 1 files", "readable image"]),
  ("folder:", ["names no folder", "folder:PATH"]),
  # before: prepared with a class the model never saw in training (scored 0, or capping the probes)
  ("folder:testonly", ["class 'Cat' has no training images, only test ones", "misspelt"]),
  ("csv:testonly.csv", ["class 'dog' has no training images, only test ones"]),
]


@pytest.mark.parametrize("dataset,words", BAD, ids=[b[0] for b in BAD])
def test_bad_sources_are_one_error_line(tmp_path, dataset, words):
  _bad_sources(tmp_path)
  proc = _prepare_cli(f"--dataset={dataset}", f"--data_dir={tmp_path / 'tfds'}", cwd=str(tmp_path))
  errors = th.error_lines(proc).strip().splitlines()
  assert proc.returncode == 2 and len(errors) == 1 and errors[0].startswith("error: "), proc.stderr
  assert "Traceback" not in proc.stderr
  for word in words:
    assert word in errors[0], (word, errors[0])
  # nothing half-prepared is left to be taken for a dataset
  assert not any(name == "dataset_info.json" for _, _, files in os.walk(tmp_path / "tfds") for name in files)


# ------------------------------------------------------------------ training, and the trained model's classes


def test_train_on_a_folder_and_load_names_its_classes(tmp_path):
  src = tmp_path / "shapes"
  rng = np.random.default_rng(0)
  for cls in ("circle", "square", "triangle"):
    for i in range(8):
      h, w = (int(x) for x in rng.integers(10, 30, 2))
      kind = ("JPEG", "PNG")[i % 2]
      _save(str(src / "train" / cls / f"{i}.{kind.lower()}"), PIL.Image.fromarray(_picture(h, w, i)), kind)
    for i in range(2):
      _save(str(src / "valid" / cls / f"{i}.png"), PIL.Image.fromarray(_picture(12, 14, i)), "PNG")
  # formats the pipeline cannot read as they are, and a broken file
  _save(str(src / "train" / "circle" / "x.bmp"), PIL.Image.fromarray(_picture(9, 11, 3)), "BMP")
  _save(str(src / "train" / "square" / "x.png"), PIL.Image.fromarray(_picture(9, 11, 4)).convert("RGBA"), "PNG")
  (src / "train" / "triangle" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a whole JPEG")
  data_dir, workdir = str(tmp_path / "tfds"), str(tmp_path / "run")
  proc = th.check_ok(_prepare_cli(f"--dataset=folder:{src}", f"--data_dir={data_dir}"))
  assert "broken.jpg" in proc.stderr
  args = [*th.TINY, f"--config.data.data_dir={data_dir}", f"--config.data.name=folder:{src}"]
  args += ["--config.model.num_classes=3", "--config.batch_size=8", "--config.data.eval_batch_size=8"]
  args += ["--config.total_steps=3", "--config.eval_every=3", "--config.checkpoint_every=3"]
  th.check_ok(th.run_main(workdir, *args, timeout=120))
  import vitjax

  trained = vitjax.load(workdir)
  assert trained.task.describe()["class_names"] == ["circle", "square", "triangle"]
  probs = trained.predict(np.stack([_picture(8, 8, 1), _picture(8, 8, 2)]))
  assert probs.shape == (2, 3) and np.allclose(probs.sum(-1), 1, atol=1e-5)
  names = trained.classify(np.stack([_picture(8, 8, 1), _picture(8, 8, 2)]))
  assert names == [["circle", "square", "triangle"][i] for i in probs.argmax(-1)]
  ev = th.check_ok(th.run_module("main", "--mode=eval", f"--workdir={workdir}", "--json"))
  assert json.loads(ev.stdout)["eval/examples"] == 6  # the folder's own valid/
  # any evaluator asked for 'test' on a folder without test/: it reports on valid and says so (the probes used to
  # stop: "Unknown split 'test'")
  probe = th.check_ok(
    th.run_module("main", "--mode=eval", "--eval=probe", "--split=test", f"--workdir={workdir}", "--json")
  )
  row = json.loads(probe.stdout.strip().splitlines()[-1])
  assert row["split"] == "valid" and 0 <= row["probe/knn"] <= 1
  assert "has no 'test' split: evaluating 'valid'" in probe.stderr
