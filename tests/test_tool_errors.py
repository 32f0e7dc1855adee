"""Bad input to the tools beside the trainer (translate, attention_maps, export, data.prepare, data.text): each case
exits with status 2 and one "error:" line that names the flag (its key words asserted), without a traceback, and
leaves the workdir, the output location and the data_dir as they were (absent stays absent). Every case is refused
before a model runs: most before a checkpoint is read."""

import json
import os
import re
import shutil
import subprocess

import pytest
import train_helpers as th

# the worker of tests/test_bad_input.py: its tiny finished run (conftest.finished_run) is built once for both
pytestmark = pytest.mark.xdist_group("bad_input")


@pytest.fixture(scope="session")  # not "module": xdist may interleave modules, and a module fixture is rebuilt
def tool_places(tmp_path_factory):
  """What the cases refer to: a translation workdir (its config.json: every case is refused before a checkpoint is
  read), a plain file, a two-pair TSV, a folder of 'images' that are not, and an empty folder."""
  root = tmp_path_factory.mktemp("tools")
  (root / "tr").mkdir()
  (root / "tr" / "config.json").write_text(json.dumps({"task": "translation"}))
  (root / "afile").write_text("a plain file\n")
  (root / "text").mkdir()
  (root / "text" / "two.tsv").write_text("a b\tc d\ne f\tg h\n")
  (root / "imgs" / "a").mkdir(parents=True)
  (root / "imgs" / "a" / "x.png").write_text("not an image\n")
  (root / "empty").mkdir()
  for name, record in (("nodb", {"study": "s", "storage": f"sqlite:///{root}/sweeps/nodb/study.db"}), ("odd", [1])):
    (root / "sweeps" / name).mkdir(parents=True)
    (root / "sweeps" / name / "sweep.json").write_text(json.dumps(record))
  return {"SWEEPS": str(root / "sweeps"), "TR": str(root / "tr"), "AFILE": str(root / "afile"), "TEXT": str(root / "text"), "IMGS": str(root / "imgs"),
          "EMPTY": str(root / "empty")}  # fmt: skip


@pytest.fixture(scope="session")
def image_run(tmp_path_factory, finished_run):
  """A copy of the tiny finished image-classification run (conftest.finished_run), shared by the cases."""
  run = str(tmp_path_factory.mktemp("tools_run") / "run")
  shutil.copytree(finished_run, run)
  return run


def _state(path):
  if not os.path.lexists(path):
    return None
  return th.snapshot(path) if os.path.isdir(path) else open(path, "rb").read()


def _fill(text, places, tmp_path):
  """The placeholders (the keys of `places`, TMP: the test's tmp_path) in `text` replaced by their paths."""
  paths = {**places, "TMP": str(tmp_path)}
  return re.sub(r"\b(" + "|".join(paths) + r")\b", lambda m: paths[m.group(1)], text)


def _check(module, args, words, watched, places, tmp_path, stdin=""):
  """Runs `python -m vitjax.MODULE ARGS`; asserts exit 2, one error line with `words`, `watched` paths unchanged."""
  args = [_fill(a, places, tmp_path) for a in args]
  watched = [_fill(w, places, tmp_path) for w in watched]
  if "READONLY" in places:
    os.mkdir(places["READONLY"])
    if subprocess.run(["chattr", "+i", places["READONLY"]], capture_output=True).returncode != 0:
      pytest.skip("cannot make a folder read-only here (chattr +i failed)")
  try:
    before = [_state(w) for w in watched]
    proc = th.run_module(module, *args, stdin=stdin, timeout=120)
    after = [_state(w) for w in watched]
  finally:
    if "READONLY" in places:
      subprocess.run(["chattr", "-i", places["READONLY"]])
  th.assert_refused(proc, words)
  for path, b, a in zip(watched, before, after):
    assert a == b, f"{path} changed"


def _case(cid, args, words, watched=()):
  return pytest.param(args, words, watched, id=cid)


@pytest.mark.parametrize(
  "args, words, watched",
  [
    _case("beam_size=0", ["--beam_size=0"], ["--beam_size=0 must be a whole number, at least 1", "--beam_size=4"]),
    _case("top_k<0", ["--method=sample", "--top_k=-3"], ["--top_k=-3 must be a whole number, at least 0"]),
    _case("batch_size=0", ["--batch_size=0"], ["--batch_size=0 must be a whole number, at least 1"]),
    _case("temperature<0", ["--method=sample", "--temperature=-1"], ["--temperature=-1.0 must be 0 or more"]),
    _case("alpha<0", ["--alpha=-1"], ["--alpha=-1.0 must be 0 or more"]),
    _case("temperature with beam", ["--temperature=5"], ["--temperature=5.0 does nothing with --method='beam'"]),
    _case("beam_size with greedy", ["--method=greedy", "--beam_size=8"], ["--beam_size=8 does nothing", "'beam'"]),
    _case("output under a file", ["--output=AFILE/x.txt"], ["--output=", "is a file, not a folder"], ["AFILE"]),
    _case("output folder missing", ["--output=TMP/nodir/x.txt"], ["--output=", "mkdir -p"], ["TMP/nodir"]),
    _case("output is a folder", ["--output=EMPTY"], ["--output=", "is a folder"], ["EMPTY"]),
    _case("output read-only", ["--output=READONLY/x.txt"], ["--output=", "is not writable"], ["READONLY"]),
  ],
)
def test_translate(args, words, watched, tool_places, tmp_path):
  places = {**tool_places, "READONLY": str(tmp_path / "ro")} if any("READONLY" in a for a in args) else tool_places
  _check("translate", ["--workdir=TR", *args], words, ["TR", *watched], places, tmp_path, stdin="a b c\n")


@pytest.mark.parametrize(
  "args, words, watched",
  [
    _case("split=validation", ["--split=validation"], ["--split=validation", "valid, test, train"], ["TMP/out"]),
    _case("out is a file", ["--out=AFILE"], ["--out=", "is a file"], ["AFILE"]),
    _case("translation run", ["--workdir=TR"], ["--workdir=", "image-classification run"], ["TR", "TMP/out"]),
    _case("patch outside", ["--patch=9,9"], ["--patch=9,9 is outside", "4x4"], ["TMP/out"]),
    _case("example<0", ["--example=-1"], ["--example=-1 must be 0 or more"], ["TMP/out"]),
  ],
)
def test_attention_maps(args, words, watched, tool_places, image_run, tmp_path):
  args = ["--workdir=RUN", "--out=TMP/out/maps", "--example=0", *args]
  _check("attention_maps", args, words, ["RUN", *watched], {**tool_places, "RUN": image_run}, tmp_path)


@pytest.mark.parametrize(
  "args, words, watched",
  [
    _case("npz out is a folder", ["--format=npz", "--out=TMP/D.npz"], ["--out=", "is a folder"], ["TMP/D.npz"]),
    _case("timm out a folder", ["--format=timm", "--out=TMP/D.safetensors"], ["--out=", "is a folder"], ["TMP"]),
    _case("read-only folder", ["--format=npz", "--out=READONLY/sub/a.npz"], ["--out=", "not writable"], ["READONLY"]),
    _case("out under a file", ["--format=npz", "--out=AFILE/a.npz"], ["--out=", "is a file"], ["AFILE"]),
    _case(
      "translation run",
      ["--workdir=TR", "--format=npz", "--out=TMP/new/a.npz"],
      ["--workdir=", "translation run"],
      ["TR", "TMP/new"],
    ),
  ],
)
def test_export(args, words, watched, tool_places, image_run, tmp_path):
  (tmp_path / "D.npz").mkdir()
  (tmp_path / "D.safetensors").mkdir()
  places = {**tool_places, "RUN": image_run}
  if any("READONLY" in a for a in args):
    places["READONLY"] = str(tmp_path / "ro")
  args = args if any(a.startswith("--workdir") for a in args) else ["--workdir=RUN", *args]
  _check("export", args, words, ["RUN", *watched], places, tmp_path)


@pytest.mark.parametrize(
  "args, words, watched",
  [
    _case(
      "timm out not .safetensors",
      ["--format=timm", "--out=TMP/new/m.npz"],
      ["--out=", "a --format=timm export is a .safetensors file (e.g. --out=model.safetensors)"],
      ["TMP/new"],
    ),
    _case(
      "npz out not .npz",
      ["--format=npz", "--out=TMP/new/m.safetensors"],
      ["--out=", "a --format=npz export is a .npz file (e.g. --out=model.npz)"],
      ["TMP/new"],
    ),
    _case(
      "timm config beside is a folder",
      ["--format=timm", "--out=TMP/m.safetensors"],
      ["--out=", "m.json, its config beside it, is a folder; move it away or give another --out"],
      ["TMP"],
    ),
  ],
)
def test_export_out_names(args, words, watched, tool_places, tmp_path):
  """--out that does not fit --format, or whose timm config (FILE.json) would go where a folder is: refused before
  the workdir is read (a translation workdir here: its own refusal would come later)."""
  (tmp_path / "m.json").mkdir()
  _check("export", ["--workdir=TR", *args], words, ["TR", *watched], tool_places, tmp_path)


@pytest.mark.parametrize(
  "args, words, watched",
  [
    _case("data_dir is a file", ["--dataset=digits", "--data_dir=AFILE"], ["--data_dir=", "is a file"], ["AFILE"]),
    _case(
      "unknown dataset",
      ["--dataset=nosuchset", "--data_dir=TMP/dd"],
      ["nosuchset", "digits, fashion_mnist", "tfds build nosuchset"],
      ["TMP/dd"],
    ),
    _case(
      "no images, new",
      ["--dataset=folder:IMGS", "--data_dir=TMP/dd", "--workers=1"],
      ["folder:", "readable image"],
      ["TMP/dd"],
    ),
    _case(
      "no images, existing",
      ["--dataset=folder:IMGS", "--data_dir=EMPTY", "--workers=1"],
      ["folder:", "readable image"],
      ["EMPTY", "IMGS"],
    ),
  ],
)
def test_prepare(args, words, watched, tool_places, tmp_path):
  _check("data.prepare", args, words, watched, tool_places, tmp_path)


@pytest.mark.parametrize(
  "args, words, watched",
  [
    _case("unknown source", ["--source=nosuch"], ["--source=nosuch", "tsv:PATH"]),
    _case("too few pairs", ["--source=tsv:TEXT/two.tsv"], ["--source=", "2 distinct pairs", "more than 2000"]),
    _case("vocab=0", ["--source=tsv:TEXT/two.tsv", "--vocab=0"], ["--vocab=0 must be at least 1"]),
    _case("missing tsv", ["--source=tsv:TEXT/none.tsv"], ["no such file", "check --source"]),
  ],
)
def test_text(args, words, watched, tool_places, tmp_path):
  _check("data.text", ["--src=en", "--tgt=es", *args], words, ["TEXT", *watched], tool_places, tmp_path)


@pytest.mark.parametrize(
  "args, words, watched",
  [
    _case(
      "decode: a file",
      ["decode", "--workdir=AFILE"],
      ["config.json not found", "the workdir of a vitjax run"],
      ["AFILE"],
    ),
    _case("report: study gone", ["--mode=report", "--sweep_dir=SWEEPS/nodb"], ["study.db is gone"], ["SWEEPS"]),
    _case("report: odd record", ["--mode=report", "--sweep_dir=SWEEPS/odd"], ["not a sweep's record"], ["SWEEPS"]),
  ],
)
def test_sweeps(args, words, watched, tool_places, tmp_path):
  """The decode sweep on what is not a run, a report of a sweep whose record or study is gone (optuna would make an
  empty study.db)."""
  module = "sweep.decode" if args[0] == "decode" else "sweep"
  _check(module, args[1:] if args[0] == "decode" else args, words, watched, tool_places, tmp_path)


def test_check_writable_names_the_flag_and_what_to_do_and_creates_nothing(tmp_path):
  """vitjax.paths, which every tool's output flag goes through: a file where a folder is wanted (or the reverse), a
  path under a file, a missing folder where none may be made, and a folder that cannot be written are each one line
  naming --FLAG=PATH; a path in folders yet to be made passes, and nothing is created either way. missing_folders is
  innermost first, the order remove_empty takes them, which stops at the first folder that is not empty or not there."""
  from vitjax import paths
  from vitjax.errors import ConfigError

  (tmp_path / "afile").write_text("x")
  (tmp_path / "adir").mkdir()
  a, d = str(tmp_path / "afile"), str(tmp_path / "adir")
  for call, says in (
    (lambda: paths.check_writable(a, "out", folder=True), f"--out={a} is a file, not a folder; give a folder path"),
    (lambda: paths.check_writable(d, "out", folder=False), f"--out={d} is a folder; give a file path"),
    (lambda: paths.check_writable(f"{a}/x/y", "out", folder=True), f"--out={a}/x/y: {a} is a file, not a folder"),
    (
      lambda: paths.check_writable(f"{d}/new/x.txt", "output", folder=False, make_parents=False),
      f"--output={d}/new/x.txt: there is no folder {d}/new; create it (mkdir -p {d}/new) or give another --output",
    ),
    (
      lambda: paths.check_writable("/proc/vitjax-test/x", "out", folder=True),
      "--out=/proc/vitjax-test/x: /proc is not writable (",
    ),
  ):
    with pytest.raises(ConfigError) as e:
      call()
    assert str(e.value).startswith(says), str(e.value)
  paths.check_writable(f"{d}/x.txt", "output", folder=False, make_parents=False)  # its folder exists: enough
  paths.check_writable(f"{d}/p/q/r", "workdir", folder=True)
  paths.check_writable(f"{d}/p/q/r.json", "out", folder=False)
  assert sorted(os.listdir(tmp_path)) == ["adir", "afile"] and os.listdir(d) == []

  missing = paths.missing_folders(f"{d}/p/q/r")
  assert missing == [f"{d}/p/q/r", f"{d}/p/q", f"{d}/p"]
  os.makedirs(missing[0])
  (tmp_path / "adir" / "p" / "keep").write_text("x")
  paths.remove_empty(missing)
  assert os.listdir(f"{d}/p") == ["keep"]
  os.makedirs(f"{d}/e")
  paths.remove_empty([f"{d}/e/gone", f"{d}/e"])  # the first is not there: e stays
  assert os.path.isdir(f"{d}/e")
