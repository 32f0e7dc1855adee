"""Translation through the one trainer: a tiny run on a synthetic TSV corpus, its metrics, evaluation of the
checkpoint, vitjax.load(...).translate without the data, and the translate command's handling of bad input."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import train_helpers as th

import vitjax
from vitjax import tasks, train
from vitjax.config import translation_config
from vitjax.data import text

# one worker builds this module's fixture once (pytest -n with --dist loadgroup, as the README runs it)
pytestmark = pytest.mark.xdist_group("translation")

WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]


@pytest.fixture(scope="session")  # not "module": xdist may interleave modules, and a module fixture is rebuilt
def run(tmp_path_factory):
  """A 40-step run on 'x y z' -> 'Z Y X' pairs; returns (config, workdir)."""
  root = tmp_path_factory.mktemp("tr")
  rng = np.random.RandomState(0)
  with open(root / "pairs.tsv", "w") as f:
    for _ in range(600):
      words = list(rng.choice(WORDS, rng.randint(2, 6)))
      f.write(" ".join(words) + "\t" + " ".join(w.upper() for w in reversed(words)) + "\n")
  c = translation_config(f"tsv:{root / 'pairs.tsv'}", "xx", "yy", size="tiny")
  c.model.max_len = 32  # the task overrides it with data.max_len
  c.data.update(
    dict(
      vocab_size=40,
      tokenizer_sentences=2000,
      max_len=32,
      tokens_per_batch=512,
      num_valid=40,
      num_test=40,
      eval_batch_size=8,
    )
  )
  c.evals.eval.examples = 24
  c.update(dict(total_steps=40, log_every=10, eval_every=20, checkpoint_every=20))
  c.schedule.warmup_steps = 10
  c.optim.lr = 3e-3
  workdir = str(root / "wd")
  train.train(c, workdir)
  return c, workdir


def test_training_writes_bleu_chrf_and_the_tokenizer(run):
  config, workdir = run
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  evals = [r for r in rows if "eval/bleu" in r]
  assert [r["step"] for r in evals] == [20, 40]
  for r in evals:
    assert 0.0 <= r["eval/bleu"] <= 100.0 and 0.0 <= r["eval/chrf"] <= 100.0 and r["eval/examples"] == 24
  train_rows = [r for r in rows if "train/loss" in r]
  assert train_rows[-1]["train/loss"] < train_rows[0]["train/loss"]
  assert "train/tokens_per_s" in train_rows[-1]
  assert os.path.exists(os.path.join(workdir, "tokenizer.model"))


def test_evaluating_the_checkpoint_reproduces_the_logged_metrics(run):
  config, workdir = run
  logged = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if "eval/bleu" in line][-1]
  trained = vitjax.load(workdir, "latest")
  assert trained.step == 40 and set(trained.variables) == {"params"}
  from vitjax import evaluators

  ev = evaluators.named(trained.config, trained.task, "eval")
  assert (ev.split, ev.examples, ev.options["method"]) == ("valid", 24, "beam")
  got = ev.run(trained, trained.variables)
  assert got["eval/bleu"] == pytest.approx(logged["eval/bleu"], abs=1e-6)
  assert got["eval/loss"] == pytest.approx(logged["eval/loss"], rel=1e-5)


def test_load_translates_without_the_data_from_a_relative_workdir(run, tmp_path):
  """vitjax.load(...).translate in a fresh process, from another directory, with a relative workdir and the
  training corpus gone: BLEU of its translations of the validation sources is the BLEU the run logged."""
  config, workdir = run
  logged = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if "eval/bleu" in line][-1]
  d = config.data
  pairs = text.split_pairs(
    text.load_pairs(d.source, src_lang=d.src_lang, tgt_lang=d.tgt_lang), d.split_seed, d.num_valid, d.num_test
  )["valid"][: config.evals.eval.examples]
  shutil.copytree(workdir, tmp_path / "runs" / "tr")
  (tmp_path / "lines.json").write_text(json.dumps(pairs))
  corpus = d.source.removeprefix("tsv:")
  os.rename(corpus, corpus + ".hidden")  # the data is gone: prediction must not need it
  try:
    script = textwrap.dedent("""
      import json, sacrebleu, vitjax
      pairs = json.load(open("lines.json"))
      trained = vitjax.load("runs/tr", checkpoint=40)
      hyps = trained.translate([s for s, _ in pairs], batch_size=8)
      refused = []  # mistakes a caller makes: each one line naming it, before anything decodes
      for args, kwargs in ((("one line",), {}), ((["a", None],), {}), ((["a"],), {"beam": 4}), ((["a"], 0), {}),
                           ((["a"],), {"beam_size": 0}), ((["a"],), {"method": "sample", "top_k": 10**6}),
                           ((["a"],), {"temperature": 2.0})):
        try:
          trained.translate(*args, **kwargs)
        except (TypeError, ValueError) as e:
          refused.append(str(e))
      print(json.dumps({"bleu": sacrebleu.corpus_bleu(hyps, [[t for _, t in pairs]]).score, "n": len(hyps),
                        "refused": refused, "vocab": trained.task.tokenizer.vocab_size}))
    """)
    proc = subprocess.run(
      [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=_env(tmp_path)
    )
  finally:
    os.rename(corpus + ".hidden", corpus)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  assert got["n"] == 24
  assert got["refused"] == [
    "translate takes a list of sentences, not one str: translate([line])",
    "translate takes sentences (str); line 1 is NoneType",
    "translate has no option 'beam'; did you mean 'beam_size'? (the options: method, beam_size, alpha, temperature, "
    "top_k, extra_len)",
    "batch_size=0 must be a whole number, at least 1",
    "beam_size=0 must be a whole number, at least 1 (e.g. beam_size=4)",
    f"top_k=1000000 is more than the run's {got['vocab']} tokens (e.g. top_k=40; 0: all)",
    "temperature=2.0 does nothing with method='beam': it is an option of 'sample' decoding; set method='sample' or "
    "leave it out",
  ], got["refused"]
  assert got["bleu"] == pytest.approx(logged["eval/bleu"], abs=1e-6)


def _env(tmp_path):
  """No dataset anywhere: an empty TFDS_DATA_DIR."""
  empty = tmp_path / "no_data"
  empty.mkdir(exist_ok=True)
  return {**os.environ, "TFDS_DATA_DIR": str(empty), "JAX_PLATFORMS": "cpu"}


def test_translate_handles_empty_long_and_unknown_input(run):
  config, workdir = run
  lines = ["alpha beta", "", "gamma ☃ delta", " ".join(["alpha"] * 60), "omega"]
  proc = th.run_module(
    "translate", f"--workdir={workdir}", "--checkpoint=latest", "--method=greedy", stdin="\n".join(lines) + "\n"
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = proc.stdout.split("\n")
  assert out[-1] == "" and len(out) - 1 == len(lines)  # one output line per input line
  assert out[1] == ""  # empty in, empty out
  assert "line 4" in proc.stderr and "truncated" in proc.stderr
  config = config.copy_and_resolve_references()
  tok = tasks.get(config, workdir).tokenizer
  assert 3 in tok.encode("gamma ☃ delta")  # the unknown character maps to the unknown token


def test_translate_refuses_a_classification_workdir(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"task": "classification"}))
  proc = th.run_module("translate", f"--workdir={tmp_path}", timeout=120)
  assert proc.returncode == 2 and "not a translation run" in proc.stderr


def test_command_line_evaluation_of_the_test_split(run, tmp_path):
  import shutil

  config, workdir = run
  copy = str(tmp_path / "wd")
  shutil.copytree(workdir, copy)
  proc = th.run_module("main", "--mode=eval", f"--workdir={copy}", "--split=test", "--checkpoint=latest")
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = [json.loads(line) for line in open(os.path.join(copy, "metrics.jsonl"))]
  row = rows[-1]
  assert row["split"] == "test" and row["step"] == 40 and "eval/bleu" in row and "eval/chrf" in row
  assert row["eval/examples"] == 40  # the whole held-out test split
  assert os.path.exists(os.path.join(copy, "eval_test_40.json"))
  bad = th.run_module("main", "--mode=eval", f"--workdir={copy}", "--split=tset")
  assert bad.returncode == 2 and "split='tset': this task has the splits" in bad.stderr


def test_translate_reads_bytes_that_are_not_utf8_as_unknown_characters(run, tmp_path):
  """README: unknown characters become the unknown token. Undecodable bytes on stdin or in --input translate
  too (as U+FFFD), with a warning naming the lines; a missing --input file is one error line."""
  config, workdir = run
  data = b"alpha beta\n\xff\xfe gamma \xc3\n\nomega\n"  # line 2: invalid UTF-8
  cmd = [sys.executable, "-m", "vitjax.translate", f"--workdir={workdir}", "--checkpoint=latest", "--method=greedy"]
  piped = subprocess.run(cmd, input=data, capture_output=True, timeout=300)
  assert piped.returncode == 0, piped.stderr[-2000:]
  out = piped.stdout.decode("utf-8").split("\n")
  assert len(out) - 1 == 4 and out[2] == ""  # one line out per line in; the empty one stays empty
  assert b"line(s) 2 are not valid UTF-8" in piped.stderr and b"Traceback" not in piped.stderr
  path = tmp_path / "in.txt"
  path.write_bytes(data)
  from_file = subprocess.run([*cmd, f"--input={path}"], capture_output=True, timeout=300)
  assert from_file.returncode == 0 and from_file.stdout == piped.stdout
  missing = subprocess.run([*cmd, f"--input={tmp_path / 'nope.txt'}"], capture_output=True, text=True, timeout=300)
  assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1].startswith("error: --input=")
  assert "No such file" in missing.stderr and "Traceback" not in missing.stderr


CONFIG_FILE = '''"""A tiny translation run for tests: tsv pairs, 20 steps.

    python -m vitjax.main --config=THIS --workdir=W
Expected: nothing in particular (a test fixture).
"""
from vitjax.config import translation_config


def get_config():
  c = translation_config("tsv:PAIRS", "xx", "yy", size="tiny")
  c.data.update(dict(vocab_size=40, tokenizer_sentences=2000, max_len=32, tokens_per_batch=512, num_valid=40,
                     num_test=40, eval_batch_size=8))
  c.evals.eval.examples = 16
  c.update(dict(total_steps=20, log_every=1, eval_every=20, checkpoint_every=5))
  c.schedule.warmup_steps = 5
  c.optim.lr = 3e-3
  return c
'''


@pytest.mark.slow  # 80 s; the default run resumes classification runs bit for bit (tests/test_faults.py)
def test_sigterm_and_resume_of_a_translation_run_is_bitwise_exact(run, compile_cache, tmp_path):
  """Three runs of one config (whole, cut, resumed) share the session's compilation cache."""
  import re
  import signal

  config, _ = run
  path = tmp_path / "tiny_translation.py"
  path.write_text(CONFIG_FILE.replace("PAIRS", config.data.source.removeprefix("tsv:")))
  whole = str(tmp_path / "whole")
  th.check_ok(th.run_main(whole, config=str(path)))
  cut = str(tmp_path / "cut")
  proc = th.start_main(cut, config=str(path))
  for line in proc.stdout:
    if re.search(r" step 7/20 ", line):
      proc.send_signal(signal.SIGTERM)
      break
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 75, out[-2000:]
  stopped = int(re.search(r"stopped at step (\d+)", out).group(1))
  assert 7 <= stopped < 20
  resumed = th.check_ok(th.run_main(cut, config=str(path)))
  assert f"at step {stopped}" in resumed.stderr
  th.assert_same_state(th.load_state(whole), th.load_state(cut), f"translation, SIGTERM at step {stopped}")


@pytest.mark.parametrize(
  "args, words",
  [
    (["--config.total_steps=0"], "the run has 0 steps"),  # found after the tokenizer is trained
    (["--config.evals.eval.split=nope"], "evals.eval.split='nope'"),
  ],
)
def test_bad_input_leaves_no_tokenizer_behind(run, tmp_path, args, words):
  config, _ = run
  path = tmp_path / "tiny_translation.py"
  path.write_text(CONFIG_FILE.replace("PAIRS", config.data.source.removeprefix("tsv:")))
  new = tmp_path / "new"
  notes = tmp_path / "notes"
  notes.mkdir()
  (notes / "notes.txt").write_text("keep me\n")
  for workdir in (new, notes):
    proc = th.run_main(str(workdir), *args, config=str(path))
    assert proc.returncode == 2 and words in th.error_lines(proc), proc.stderr[-2000:]
  assert not new.exists()
  assert sorted(os.listdir(notes)) == ["notes.txt"]


def test_special_ids_come_from_the_tokenizer_and_a_mismatch_is_one_line(run, tmp_path):
  """The model gets the tokenizer's pad/eos/bos ids; a config id the workdir's tokenizer lacks is a ConfigError
  naming the value to set. A tokenizer trained with bos_id == pad_id (flax's wmt) decodes from pad."""
  from vitjax.errors import ConfigError

  config, workdir = run
  task = tasks.get(config, workdir)
  assert {k: task.model_overrides()[k] for k in ("pad_id", "eos_id", "bos_id")} == {
    "pad_id": 0,
    "eos_id": 1,
    "bos_id": 2,
  }
  wrong = config.copy_and_resolve_references()
  wrong.model.bos_id = 0
  with pytest.raises(ConfigError) as e:
    _ = tasks.get(wrong, workdir).tokenizer
  assert "\n" not in str(e.value) and "--config.model.bos_id=2" in str(e.value)
  # another vocab_size on a resumed run, or on one that starts from this run (init_from): before, recorded as a
  # change and ignored, the run training on the kept tokenizer while its config named the other size
  for other, kept in ((workdir, workdir), (str(tmp_path / "finetune"), workdir)):
    bigger = config.copy_and_resolve_references()
    bigger.data.vocab_size += 200
    bigger.init_from = workdir if other != workdir else None
    with pytest.raises(ConfigError) as e:
      tasks.get(bigger, other).check()
    assert str(e.value) == (
      f"config.data.vocab_size={config.data.vocab_size + 200} but {kept}/tokenizer.model has {config.data.vocab_size} "
      f"pieces: a run keeps its tokenizer (fine-tuning, that of init_from); set --config.data.vocab_size="
      f"{config.data.vocab_size}, or train a new tokenizer in a new workdir"
    )
  tasks.get(config, workdir).check()

  flax_ids = config.copy_and_resolve_references()
  flax_ids.model.pad_id, flax_ids.model.eos_id, flax_ids.model.bos_id = 0, 1, 0
  task = tasks.get(flax_ids, str(tmp_path / "flax_ids"))
  tok = task.tokenizer  # trained now, with no bos piece
  assert tok.special_ids == {"pad_id": 0, "eos_id": 1, "bos_id": 0} and tok.sp.bos_id() == -1
  assert task.model_overrides()["bos_id"] == 0


def test_decode_sweep_chooses_on_valid_writes_the_config_and_resumes(run, tmp_path):
  """python -m vitjax.sweep.decode: every (beam, alpha) point translates valid once (an Optuna study in the
  workdir), the best goes into the run's decode config (config_history.jsonl), and a rerun evaluates nothing."""
  _, src = run
  workdir = str(tmp_path / "w")
  shutil.copytree(src, workdir)
  args = [f"--workdir={workdir}", "--beam_sizes=1,2", "--alphas=0,1", "--limit=16"]
  proc = th.run_module("sweep.decode", *args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "best decoding on valid: beam" in proc.stdout
  assert proc.stderr.count("point ") == 4
  report = open(os.path.join(workdir, "decode_sweep.md")).read()
  assert report.count("**") == 2 and "| 1 |" in report and "| 2 |" in report

  import optuna

  storage = f"sqlite:///{workdir}/decode_sweep.db"
  (summary,) = optuna.get_all_study_summaries(storage)  # one study: this workdir's best checkpoint on valid
  study = optuna.load_study(study_name=summary.study_name, storage=storage)
  values = {(t.user_attrs["beam_size"], t.user_attrs["alpha"]): t.value for t in study.trials}
  assert len(values) == 4
  best = max(values, key=lambda p: (round(values[p], 6), -p[0], -p[1]))
  decode = vitjax.load(workdir).config.evals.eval  # the config as the run reads it now: its evaluator's decoding
  assert (decode.beam_size, decode.alpha) == best
  if best != (4, 0.6):  # the config's point: beam 4, alpha 0.6 (outside this grid)
    history = [json.loads(line) for line in open(os.path.join(workdir, "config_history.jsonl"))]
    assert "evals.eval.beam_size" in history[-1]["changes"]

  again = th.run_module("sweep.decode", *args)
  assert again.returncode == 0 and "point " not in again.stderr  # the four points are done: nothing to evaluate
  wider = th.run_module("sweep.decode", *args, "--alphas=0,1,2", "--nowrite")
  assert wider.returncode == 0 and wider.stderr.count("point ") == 2, wider.stderr[-2000:]  # only alpha 2 is new
  bad = th.run_module("sweep.decode", args[0], "--beam_sizes=0", timeout=120)
  assert bad.returncode == 2 and "--beam_sizes=0 must be a whole number, at least 1" in bad.stderr


def test_decode_sweep_grid_is_sorted_and_checked_and_ties_go_to_the_cheaper_point(tmp_path):
  """The decode sweep's grid: each beam size and alpha once, in order, numbers checked as the config's are; of equal
  BLEU (to 6 decimals) the best point is the smaller beam, then the smaller alpha. In a process of its own: the
  module defines absl flags (--workdir) that other command-line modules imported here define too."""
  script = tmp_path / "probe.py"
  script.write_text(
    textwrap.dedent("""
    import json
    from vitjax.errors import ConfigError
    from vitjax.sweep.decode import best_point, grid
    out = {"grid": grid(["4", "1", "4"], ["1.0", "0", "0.0"]), "errors": []}
    out["tie_beam"] = best_point({(4, 0.0): 20.0000001, (1, 1.0): 20.0, (2, 0.2): 19.0})
    out["tie_alpha"] = best_point({(2, 1.0): 20.0, (2, 0.4): 20.0, (1, 0.0): 19.5})
    out["higher"] = best_point({(8, 1.2): 21.0, (1, 0.0): 20.0})
    for bad in ((["x"], ["0"]), ([], ["0"]), (["1"], ["-1"])):
      try:
        grid(*bad)
      except ConfigError as e:
        out["errors"].append(str(e))
    print(json.dumps(out))
    """)
  )
  proc = th.check_ok(th.run_module(str(script), timeout=120))
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["grid"] == [[1, 0.0], [1, 1.0], [4, 0.0], [4, 1.0]]
  assert (out["tie_beam"], out["tie_alpha"], out["higher"]) == ([1, 1.0], [2, 0.4], [8, 1.2])
  assert len(out["errors"]) == 3, out["errors"]
  assert "give numbers" in out["errors"][0] and "a value each at least" in out["errors"][1]
  assert "--alphas" in out["errors"][2]


def test_the_split_says_how_many_repeated_pairs_it_left_out(tmp_path, caplog):
  """Exact duplicates are removed before the split (so no test pair is trained on): the log says how many (19% of
  a file vanished without a word)."""
  caplog.set_level("INFO", logger="absl")
  lines = [f"w{i} x\tX W{i}\n" for i in range(30)] + ["w1 x\tX W1\n"] * 7
  (tmp_path / "p.tsv").write_text("".join(lines))
  c = translation_config(f"tsv:{tmp_path / 'p.tsv'}", "xx", "yy", size="tiny")
  c.data.num_valid, c.data.num_test = 5, 5
  splits = tasks.get(c, str(tmp_path / "w")).splits
  assert [len(v) for v in splits.values()] == [20, 5, 5]
  assert "train 20, valid 5, test 5 pairs (37 read, 7 repeated pairs left out)" in caplog.text


def test_the_evaluation_loss_counts_the_real_target_tokens_only():
  """The teacher-forced loss sums the cross-entropy over target tokens that are neither padding nor in a padding row,
  and counts those tokens."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from vitjax.evaluators.translation import _loss

  class Fixed(nn.Module):  # logits that favour token 3 everywhere
    pad_id: int = 0

    def __call__(self, src, tgt, train=False):
      return jnp.broadcast_to(jnp.log(jnp.array([0.1, 0.1, 0.2, 0.6])), tgt.shape + (4,)), {}

  tgt = np.array([[3, 2, 1, 0], [3, 3, 0, 0], [2, 2, 2, 2]], np.int32)
  batch = {"src": np.ones_like(tgt), "tgt": tgt, "mask": np.array([True, True, False])}  # the last row: padding
  total, n = jax.device_get(_loss(Fixed(), {}, batch))
  assert n == 5 and total == pytest.approx(-np.log([0.6, 0.2, 0.1, 0.6, 0.6]).sum(), rel=1e-5)


FAKE_RUN = '''"""python -m vitjax.translate over a run without a model: read_config says translation, vitjax.load gives a
stand-in whose translate upper-cases each line and appends its call to WORKDIR/calls.jsonl. --full_disk: the
--output file's writing fails (ENOSPC)."""
import errno
import json
import os
import sys

import vitjax
from vitjax import cli, paths, translate


class _Trained:
  task = type("Task", (), {"tokenizer": type("Tokenizer", (), {"vocab_size": 40})()})()

  def __init__(self, path):
    self.path = path

  def translate(self, lines, batch_size, **decode_args):
    with open(os.path.join(self.path, "calls.jsonl"), "a") as f:
      f.write(json.dumps({"lines": lines, "batch_size": batch_size, **decode_args}) + "\\n")
    return [line.upper() for line in lines]


vitjax.load = lambda path, checkpoint: _Trained(path)
translate.read_config = lambda path: {"task": "translation"}  # (the name translate reads the workdir's config by)


def _full_disk(path, text):
  with paths.replacing(path, "w") as f:  # the one writer, whose write fails as on a full disk
    f.flush()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


if "--full_disk" in sys.argv:
  sys.argv.remove("--full_disk")
  paths.write_text = _full_disk
cli.run(translate.main)
'''


def _translate_without_a_model(tmp_path, *args, stdin=""):
  """The translate command over FAKE_RUN's stand-in: (the process, the stand-in's translate calls)."""
  script = tmp_path / "fake_translate.py"
  script.write_text(FAKE_RUN)
  calls = tmp_path / "calls.jsonl"
  calls.unlink(missing_ok=True)
  proc = th.run_module(str(script), f"--workdir={tmp_path}", "--method=greedy", *args, stdin=stdin, timeout=120)
  return proc, [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_a_final_newline_is_not_an_extra_empty_line_and_a_last_line_without_one_is_kept(tmp_path):
  """One line out per line in: a final newline ends the last line; a last line without it still translates, and
  an empty line before the final newline stays a line; no input at all is no line."""
  for stdin, lines in (("a\n\nb", ["a", "", "b"]), ("a\nb\n", ["a", "b"]), ("a\n\n", ["a", ""]), ("", [])):
    proc, calls = _translate_without_a_model(tmp_path, stdin=stdin)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert calls[0]["lines"] == lines and proc.stdout == "".join(s.upper() + "\n" for s in lines), stdin


def test_translate_takes_batch_size_1_and_refuses_top_k_above_the_run_s_vocabulary(tmp_path):
  """--batch_size=1 is a batch size; --top_k above the run's vocabulary (40 tokens) is one error line, found after
  the run is loaded, --top_k=40 decodes."""
  proc, calls = _translate_without_a_model(tmp_path, "--batch_size=1", stdin="a\n")
  assert proc.returncode == 0 and calls[0]["batch_size"] == 1, proc.stderr[-2000:]
  sample = ["--method=sample", "--temperature=1"]
  proc, calls = _translate_without_a_model(tmp_path, *sample, "--top_k=41", stdin="a\n")
  th.assert_refused(proc, ["--top_k=41 is more than the run's 40 tokens"])
  assert calls == []
  proc, calls = _translate_without_a_model(tmp_path, *sample, "--top_k=40", stdin="a\n")
  assert proc.returncode == 0 and calls[0]["top_k"] == 40 and proc.stdout == "A\n", proc.stderr[-2000:]


def test_an_output_that_cannot_be_written_is_one_line_and_removed_if_it_was_new(tmp_path):
  """A --output whose writing fails (the disk full) is one error line naming it and the
  cause; a file the command created is removed, one that was there is left in place."""
  new = tmp_path / "new.txt"
  proc, _ = _translate_without_a_model(tmp_path, f"--output={new}", "--full_disk", stdin="alpha\nbeta\n")
  th.assert_refused(proc, [f"--output={new}: cannot write it (No space left on device)", "another --output"])
  assert not new.exists()
  old = tmp_path / "old.txt"
  old.write_text("x")
  proc, _ = _translate_without_a_model(tmp_path, f"--output={old}", "--full_disk", stdin="alpha\nbeta\n")
  th.assert_refused(proc, [f"--output={old}: cannot write it"])
  assert old.exists()
  proc, _ = _translate_without_a_model(tmp_path, f"--output={old}", stdin="alpha\nbeta\n")
  assert proc.returncode == 0 and old.read_text() == "ALPHA\nBETA\n" and proc.stdout == "", proc.stderr[-2000:]


def test_the_warning_about_bytes_that_are_not_utf8_names_the_first_10_lines(tmp_path):
  """Up to 10 lines with undecodable bytes are named in full; beyond, the first 10 and "..."; each such line
  translates, its bytes as U+FFFD. A U+FFFD that a valid file holds is no such line."""
  path = tmp_path / "in.txt"
  first_10 = ", ".join(map(str, range(2, 12)))
  for count, named in ((10, first_10 + " are"), (11, first_10 + " ...")):
    path.write_bytes(b"ok\n" + b"\xff x\n" * count)
    proc, calls = _translate_without_a_model(tmp_path, f"--input={path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"line(s) {named}" in proc.stderr and calls[0]["lines"] == ["ok"] + ["\ufffd x"] * count, proc.stderr
  path.write_text("ok\n\ufffd is text here\n", encoding="utf-8")  # valid UTF-8 that holds U+FFFD itself
  proc, calls = _translate_without_a_model(tmp_path, f"--input={path}")
  assert proc.returncode == 0 and "not valid UTF-8" not in proc.stderr, proc.stderr[-2000:]
  assert calls[0]["lines"] == ["ok", "\ufffd is text here"]
