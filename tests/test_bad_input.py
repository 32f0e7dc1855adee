"""Bad input through the command lines: each case exits with status 2 and one "error:" line naming the fix (its
key words asserted), without a traceback, and leaves the workdir as it was (file contents and mtimes), or absent
if it was absent."""

import os
import shutil
import subprocess

import numpy as np
import pytest
import train_helpers as th

# one worker builds this module's fixture once (pytest -n with --dist loadgroup, as the README runs it)
pytestmark = pytest.mark.xdist_group("bad_input")


def _cases():
  """(id, workdir kind, arguments, key words of the error); kinds: new (absent), notes (a folder with a file),
  finished (a finished tiny run), file (a path that is a file), readonly (an immutable folder)."""
  c = []
  add = lambda cid, kind, args, *words: c.append(pytest.param(kind, args, words, id=cid))
  # the trainer's settings
  add("checkpoint_every=0", "new", ["--config.checkpoint_every=0"], "checkpoint_every=0 must be at least 1")
  add("log_every=0", "notes", ["--config.log_every=0"], "log_every=0 must be at least 1")
  add("eval_every<0", "new", ["--config.eval_every=-5"], "eval_every=-5 must be at least 1")
  add(
    "keep_checkpoints=0",
    "new",
    ["--config.keep_checkpoints=0"],
    "keep_checkpoints=0 must be at least 1 (e.g. --config.keep_checkpoints=3)",
  )
  add("total_steps<0", "new", ["--config.total_steps=-5"], "total_steps=-5 must be at least 1")  # not '0 or more'
  add(
    "an override without its file",
    "finished",
    ["--config=", "--config.total_steps=40"],
    "--config.total_steps changes a field of a config file",
  )
  add("total_steps=0", "new", ["--config.total_steps=0"], "the run has 0 steps", "--config.total_steps")
  add("max_train_minutes<0", "new", ["--config.max_train_minutes=-1"], "max_train_minutes=-1", "positive")
  add("profile_steps reversed", "new", ["--config.profile_steps=(4, 3)"], "profile_steps=(4, 3)", "first <= last")
  add("on_nonfinite", "new", ["--config.on_nonfinite=ignore"], "on_nonfinite='ignore'", "'stop' or 'skip'")
  add("unknown tracker", "new", ["--config.trackers=('tensorbord',)"], "unknown tracker 'tensorbord'", "wandb")
  # batches and the optimizer
  add("batch_size=0", "notes", ["--config.batch_size=0"], "batch_size=0 must be positive")
  add("batch_size=abc", "new", ["--config.batch_size=abc"], "--config.batch_size", "abc")
  add("eval_batch_size=0", "new", ["--config.data.eval_batch_size=0"], "data.eval_batch_size=0 must be positive")
  add("negative lr", "notes", ["--config.optim.lr=-0.001"], "optim.lr=-0.001 must be positive")
  add("negative weight decay", "new", ["--config.optim.weight_decay=-1"], "optim.weight_decay=-1.0 must be 0 or more")
  add("unknown kwarg", "new", ["--config.optim.kwargs={'b3': 0.9}"], "optax.adamw takes no 'b3'", "b1, b2, eps")
  add("optim.b2", "new", ["--config.optim.b2=0.95"], "optim.b2 is now an argument", "--config.optim.kwargs=")
  add(
    "lr_mults no match",
    "new",
    ["--config.lr_mults=(('pos_embeding', 0.1),)"],
    "'pos_embeding' decides",
    "pos_embedding",
  )
  add("label_smoothing=1.5", "new", ["--config.label_smoothing=1.5"], "label_smoothing=1.5 must be in [0, 1)")
  add("accum_steps=0", "new", ["--config.optim.accum_steps=0"], "optim.accum_steps=0 must be at least 1")
  add(
    "unknown optimizer", "new", ["--config.optim.name=adamm"], "optim.name='adamm' is not an optax optimizer", "adamw"
  )
  add("unknown decay", "new", ["--config.schedule.decay=exp"], "unknown schedule.decay 'exp'", "cosine")
  add("kwarg of a wrong type", "notes", ["--config.optim.kwargs={'b1': 'x'}"], "optax.adamw cannot step", "'b1': 'x'")
  add(
    "compute_dtype", "new", ["--config.compute_dtype=float16"], "compute_dtype must be 'float32', 'bfloat16' or 'auto'"
  )
  # the model and the data
  add("unknown model", "new", ["--config.model.name=vit_x99"], "config.model", "unknown model 'vit_x99'")
  add("num_classes", "new", ["--config.model.num_classes=7"], "has 10 classes", "--config.model.num_classes=10")
  add("image size vs patch", "new", ["--config.data.image_size=9"], "not divisible by the patch size", "image_size")
  add("image_size=0", "new", ["--config.data.image_size=0"], "data.image_size=0 must be", "--config.data.image_size=")
  add("heads vs width", "new", ["--config.model.num_heads=3"], "num_heads=3", "--config.model.*")
  add(
    "dropout 1.5", "new", ["--config.model.dropout_rate=1.5"], "config.model: ViT: dropout_rate=1.5 must be in [0, 1)"
  )
  add("worker_count<0", "new", ["--config.data.worker_count=-1"], "data.worker_count=-1 must be 0")
  add("evaluator every<0", "new", ["--config.evals.eval.every=-5"], "evals.eval.every=-5 must be at least 1 step")
  add("best", "new", ["--config.best=eval/acuracy"], "best='eval/acuracy' is not reported", "'eval/accuracy'")
  add("evaluator type", "new", ["--config.evals.eval.type=clasification"], "no evaluator type 'clasification'")
  add(
    "evaluator option",
    "new",
    ["--config.evals={'eval': {'type': 'classification', 'topk': 3}}"],
    "did you mean 'top_k'",
  )
  add("evaluator shift", "new", ["--config.evals.eval.shift=rotate"], "shift='rotate': give one of rotate:X")
  add("valid_fraction", "new", ["--config.data.valid_fraction=1.5"], "data.valid_fraction=1.5 must be in [0, 1)")
  add("unknown dataset", "new", ["--config.data.name=nosuchset"], "nosuchset", "tfds build nosuchset")
  add(
    "no valid split", "new", ["--config.data.valid_fraction=0"], "evals.eval.split='valid' but data.valid_fraction is 0"
  )
  add("unknown eval split", "notes", ["--config.evals.eval.split=tset"], "evals.eval.split='tset'", "tset")
  add("unknown train split", "new", ["--config.data.train_split=trian"], "train_split='trian'", "trian")
  add("not prepared", "notes", ["--config.data.data_dir=EMPTY"], "python -m vitjax.data.prepare --dataset=digits")
  add("misspelt key", "notes", ["--config.optim.lrr=1"], "optim has no field 'lrr'", "--config.optim.lr ")
  # files and flags
  add("no config file", "new", ["--config=/nonexistent/c.py"], "no such file /nonexistent/c.py")
  add("config syntax error", "new", ["--config=SYNTAX"], "line 1: SyntaxError")
  add("config argument", "new", ["--config=configs/vit.py:varaint=S/16"], "unknown argument 'varaint'")
  add("config raises", "new", ["--config=RAISES"], "the config file failed: ModuleNotFoundError", "nosuchmodule")
  add("config without get_config", "new", ["--config=NOGETCFG"], "defines no get_config()")  # 'module config_config'
  add("config folder", "new", ["--config=configs"], "configs is a folder; give a config file in it")
  add("config arguments it does not take", "new", ["--config=configs/vit_digits.py:foo=1"], "takes no arguments: le")
  add("config not a config", "new", ["--config=DICTCFG"], "get_config() returned dict, not a config")
  add("config file typo", "new", ["--config=TYPOCFG"], "get_config() sets optim.weight_decy, which vitjax does not read;"
      " did you mean optim.weight_decay? (and schedule.warmup)")  # fmt: skip
  add("seed<0", "new", ["--config.seed=-1"], "seed=-1 must be a whole number, 0 or more")
  add("train without config", "new", ["--config="], "training needs --config", "has no config.json")
  add("unknown mode", "new", ["--mode=evaluate"], "--mode", "one of <train|eval>")
  add("workdir is a file", "file", [], "is a file, not a folder")
  add("its checkpoints/ is a file", "checkpoints_file", [], "checkpoints is a file", "move it away")
  add("read-only workdir", "readonly", [], "is not writable", "another --workdir")
  # weights to start from
  add("init_from missing dir", "new", ["--config.init_from=/nonexistent/run"], "no checkpoints/ there")
  add("init_from garbage", "new", ["--config.init_from=timm:vit_tiny_patch16_224:GARBAGE"], "not a readable")
  add("init_from truncated", "new", ["--config.init_from=timm:vit_tiny_patch16_224:TRUNCATED"], "not a readable")
  add("init_from other family", "new", ["--config.init_from=timm:swin_tiny_patch4_window7_224:VITFILE"], "model family")
  add("init_from no file", "new", ["--config.init_from=npz:Ti/16:/nonexistent.npz"], "no such file")
  add("init_from not an npz", "new", ["--config.init_from=npz:SYNTAX"], "is not an .npz file")
  add("init_from shapes", "notes", ["--config.model.width=24", "--config.init_from=FINISHED"], "do not match the model")
  # a finished run: its config and checkpoints
  add("other model", "finished", ["--config.model.width=24"], "model.width: 16 there, 24 now", "--workdir")
  add("changed lr", "finished", ["--config.optim.lr=1e-3"], "optim.lr: 0.002 there, 0.001 now", "--allow_config_change")
  add("num_epochs=0 on a run", "finished", ["--config.num_epochs=0"], "num_epochs: 80.0 there, 0.0 now")
  add(
    "allowed model change",
    "finished",
    ["--config.model.width=24", "--allow_config_change"],
    "was written by another config: its arrays have other shapes",
    "Use the config it was written with",
  )
  add(
    "allowed change of the optimizer's rules",
    "finished",
    ["--config.total_steps=40", "--config.frozen=('^embedding/',)", "--allow_config_change"],
    "The parameters fit, the optimizer's state does not",  # a dump of every optimizer path before
    "--config.init_from=",
  )
  add("total not beyond", "finished", ["--config.total_steps=20", "--allow_config_change"], "is not beyond it")
  add("eval checkpoint=abc", "finished", ["--mode=eval", "--checkpoint=abc", "--config="], "'best', 'latest', a step")
  add(
    "eval of no average",
    "finished",
    ["--mode=eval", "--checkpoint=averaged", "--config="],
    "no averaged checkpoint",
    "--last=3",  # what the run keeps: the hint said --last=5, which then failed
  )
  add("eval step missing", "finished", ["--mode=eval", "--checkpoint=7", "--config="], "no checkpoint for step 7")
  add("eval split", "finished", ["--mode=eval", "--split=validation", "--config="], "validation", "split")
  add("eval without a run", "notes", ["--mode=eval", "--config="], "config.json not found")
  add("eval of a read-only run", "readonly_run", ["--mode=eval", "--config="], "is not writable", "cp -r")
  add("average of a read-only run", "readonly_run", ["AVERAGE", "--last=2"], "is not writable", "an average records")
  # flags that the mode would ignore: an evaluation's, given to a training, trained (or resumed) the run instead
  add("eval flags in training", "finished", ["--split=test", "--checkpoint=latest"], "--checkpoint, --split are for -")
  add("multihost flags alone", "new", ["--num_processes=2", "--process_id=1"], "are for --multihost only")
  # a translation run's data (a 60-pair TSV: 20 to train on)
  tsv = ["--config=TRANSLATION", "--config.data.source=tsv:PAIRS", "--config.data.num_valid=20"]
  tsv += ["--config.data.num_test=20", "--config.data.tokenizer_sentences=100"]
  add("max_len=0", "new", [*tsv, "--config.data.max_len=0"], "data.max_len=0 must be at least 2")
  add("too_long", "new", [*tsv, "--config.data.too_long=cut"], "data.too_long='cut'", "'truncate'")
  add("model.dtype", "new", ["--config=DTYPECFG"], "config.model.dtype='bfloat16'", "--config.compute_dtype")
  add("rsqrt_timescale with cosine", "new", ["--config.schedule.rsqrt_timescale=100"], "does nothing with schedule.de")
  add("mae label smoothing", "new", ["--config=MAECFG", "--config.label_smoothing=0.1"], "label_smoothing=0.1 does no")
  add("mae mixup", "new", ["--config=MAECFG", "--config.data.augment.mixup_alpha=0.8"], "mixup_alpha=0.8 does nothing")
  add("translation batch_size", "new", [*tsv, "--config.batch_size=8"], "config.batch_size=8 does nothing in a trans")
  add("tokens_per_batch=0", "new", [*tsv, "--config.data.tokens_per_batch=0"], "data.tokens_per_batch=0 must hold")
  add("vocabulary too large", "notes", tsv, "config.data.vocab_size=8000 is more pieces", "--config.data.vocab_size")
  add("decoding alpha<0", "new", [*tsv, "--config.data.vocab_size=40", "--config.evals.eval.alpha=-1"], "alpha=-1")
  add(
    "decoding option of another method",
    "new",
    [*tsv, "--config.data.vocab_size=40", "--config.evals.eval.method=greedy", "--config.evals.eval.beam_size=8"],
    "--config.evals.eval.beam_size=8 does nothing with --config.evals.eval.method='greedy'",
  )
  add(
    "decoding top_k>vocab",
    "new",
    [*tsv, "--config.data.vocab_size=40", "--config.evals.eval.method=sample", "--config.evals.eval.top_k=50"],
    "--config.evals.eval.top_k=50 is more than the run's 40 tokens",
  )
  add("eval across tasks", "translation_run", ["--mode=eval"], "is a translation run and --config's task is")
  # vitjax.translate
  add("translate: no run", "notes", ["TRANSLATE"], "config.json not found")
  add("translate: a classifier", "finished", ["TRANSLATE"], "is a classification run, not a translation run")
  return c


@pytest.fixture(scope="session")  # not "module": xdist may interleave modules, and a module fixture is rebuilt
def places(tmp_path_factory, finished_run):
  """Files the cases refer to, and one copy of the finished run shared by the cases (each leaves it untouched)."""
  root = tmp_path_factory.mktemp("bad")
  from safetensors.numpy import save_file

  vit = {"patch_embed.proj.weight": np.zeros((192, 3, 16, 16), np.float32), "cls_token": np.zeros((1, 1, 192))}
  save_file({k: v.astype(np.float32) for k, v in vit.items()}, str(root / "vit.safetensors"))
  (root / "garbage.safetensors").write_bytes(os.urandom(4096))
  data = (root / "vit.safetensors").read_bytes()
  (root / "truncated.safetensors").write_bytes(data[: len(data) // 2])
  (root / "syntax.py").write_text("def get_config(:\n")
  (root / "raises.py").write_text("def get_config():\n  import nosuchmodule\n")
  (root / "dict_cfg.py").write_text("def get_config():\n  return {'optim': {'lr': 1e-3}}\n")
  (root / "noget_cfg.py").write_text("from vitjax.config import default_config\nconfig = default_config()\n")
  typo = "from vitjax.config import default_config\ndef get_config():\n  c = default_config()\n"
  (root / "typo_cfg.py").write_text(typo + "  c.optim.weight_decy = 0.1\n  c.schedule.warmup = 5\n  return c\n")
  (root / "dtype_cfg.py").write_text(typo + "  c.model.dtype = 'bfloat16'\n  return c\n")
  (root / "empty").mkdir()
  words = "the a of to and in that is was he for it with as his on be at by".split()
  pairs = [" ".join(words[(i + k) % len(words)] for k in range(3 + i % 4)) for i in range(60)]
  (root / "pairs.tsv").write_text("".join(f"{p}\t{p.upper()}\n" for p in pairs))
  finished = str(root / "finished")
  shutil.copytree(finished_run, finished)
  return {
    "GARBAGE": str(root / "garbage.safetensors"),
    "TRUNCATED": str(root / "truncated.safetensors"),
    "VITFILE": str(root / "vit.safetensors"),
    "SYNTAX": str(root / "syntax.py"),
    "RAISES": str(root / "raises.py"),
    "DICTCFG": str(root / "dict_cfg.py"),
    "NOGETCFG": str(root / "noget_cfg.py"),
    "TYPOCFG": str(root / "typo_cfg.py"),
    "DTYPECFG": str(root / "dtype_cfg.py"),
    "TRANSLATION": os.path.join(th.ROOT, "configs", "transformer_bible_en_es.py"),
    "MAECFG": os.path.join(th.ROOT, "configs", "mae_digits.py"),
    "PAIRS": str(root / "pairs.tsv"),
    "EMPTY": str(root / "empty"),
    "FINISHED": finished_run,
    "finished": finished,
  }


def _workdir(kind, tmp_path, places):
  if kind == "new":
    return str(tmp_path / "absent" / "w")
  if kind == "finished":
    return places["finished"]
  path = tmp_path / "w"
  if kind == "readonly_run":  # a copy of the finished run, made immutable
    shutil.copytree(places["finished"], path)
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
      pytest.skip("cannot make a folder read-only here (chattr +i failed)")
    return str(path)
  if kind == "file":
    path.write_text("not a folder\n")
    return str(path)
  path.mkdir()
  (path / "notes.txt").write_text("keep me\n")
  if kind == "translation_run":  # as much of one as evaluation reads before it meets the image config
    (path / "config.json").write_text('{"task": "translation"}\n')
    (path / "task.json").write_text('{"task": "translation"}\n')
  if kind == "checkpoints_file":
    (path / "checkpoints").write_text("not a folder\n")
  if kind == "readonly":
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
      pytest.skip("cannot make a folder read-only here (chattr +i failed)")
  return str(path)


def _state(path):
  if not os.path.exists(path):
    return None
  return th.snapshot(path) if os.path.isdir(path) else open(path, "rb").read()


@pytest.mark.parametrize("kind, args, words", _cases())
def test_bad_input_is_one_line_exit_2_and_leaves_the_workdir_alone(kind, args, words, tmp_path, places, run_args):
  workdir = _workdir(kind, tmp_path, places)
  before = _state(workdir)
  for key, value in places.items():
    args = [a.replace(key, value) if key.isupper() else a for a in args]
  try:
    if args and args[0] == "TRANSLATE":
      proc = th.run_module("translate", f"--workdir={workdir}", *args[1:], stdin="hello\n")
    elif args and args[0] == "AVERAGE":
      proc = th.run_module("average", f"--workdir={workdir}", *args[1:])
    else:
      # "--config=" alone: no config file (and none of the tiny run's --config.* overrides)
      config = None if "--config=" in args else next((a[9:] for a in args if a.startswith("--config=")), th.CONFIG)
      rest = [a for a in args if not a.startswith("--config=")]
      proc = th.run_main(workdir, *(run_args if config == th.CONFIG else []), *rest, config=config)
    after = _state(workdir)
    created = _state(os.path.dirname(workdir)) if kind == "new" else None  # a new workdir's parent is new too
  finally:
    if kind.startswith("readonly"):
      subprocess.run(["chattr", "-i", workdir])
  th.assert_refused(proc, words)
  assert after == before, "the workdir changed"
  assert created is None, "the workdir's new parent folder was left behind"


def test_the_command_lines_run_forked_from_the_import_server():
  """train_helpers.run_module takes its fast path (tests/forkserver.py) in a test that left the environment alone."""
  proc = th.run_module("main", "--mode=evaluate")
  assert proc.returncode == 2 and "--mode" in th.error_lines(proc), proc.stderr[-2000:]
  server = th._servers[th._import_time(th.env())]
  assert server.proc.poll() is None and server.env.get("JAX_COMPILATION_CACHE_DIR") == th.CACHE_DIR


@pytest.mark.parametrize(
  "module, args",
  [
    ("main", [f"--config={th.CONFIG}", "--workdir="]),
    ("main", [f"--config={th.CONFIG}", "--workdir= "]),
    ("main", ["--mode=eval", "--workdir="]),
    ("export", ["--workdir=", "--format=npz", "--out=m.npz"]),
    ("plot", ["--workdir=", "--out=curves.png"]),
  ],
)
def test_an_empty_path_flag_is_refused_rather_taken_as_the_current_folder(module, args, tmp_path):
  """`--workdir=$WORKDIR` with the variable unset trained a run into the current folder (or evaluated it)."""
  proc = th.run_module(module, *args, cwd=str(tmp_path))
  th.assert_refused(proc, ["--workdir is empty: give a path"])
  assert os.listdir(tmp_path) == []


def test_help_is_not_an_error():
  """absl exits 1 after printing the help, as for a failure: a script checking `--help` saw one."""
  proc = th.run_module("main", "--help")
  assert proc.returncode == 0 and "--workdir" in proc.stdout + proc.stderr, proc.stderr[-2000:]


def test_a_config_file_given_after_a_space_is_checked_as_one_given_with_an_equals_sign(tmp_path):
  proc = th.run_module("main", "--config", "/nonexistent/c.py", f"--workdir={tmp_path / 'w'}")
  th.assert_refused(proc, ["no such file /nonexistent/c.py"])
  assert os.listdir(tmp_path) == []


def test_an_ended_fork_server_leaves_nothing_in_the_temporary_directory(tmp_path):
  """The server's files for its children's standard streams go when its test worker ends it (its stdin closes)."""
  from forkserver import ForkServer

  script = tmp_path / "hello.py"
  script.write_text("print('hello')\n")
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  env = {**th.env(), "TMPDIR": str(scratch)}
  server = ForkServer(env, th.ROOT)
  proc = server.run(str(script), [], env)
  assert (proc.returncode, proc.stdout) == (0, "hello\n"), proc.stderr[-2000:]
  assert len(os.listdir(scratch)) == 1  # the server's, while it runs
  server.proc.stdin.close()
  assert server.proc.wait(timeout=60) == 0
  assert os.listdir(scratch) == []
