"""The guides' commands run, as a reader would type them, at toy sizes.

Each page of docs/guides (and docs/getting_started.md) has blocks marked `<!-- test -->` (the marker is an HTML
comment: invisible on the site and on GitHub): a walkthrough that a newcomer follows top to bottom. This test runs a
page's marked blocks in order, in a directory of its own with `configs/` beside it, as if the reader had just run
the README's main job there (`workdirs/vit_digits`, made once by the README's own command at toy size).

What "toy size" changes, and nothing else: a training command (one with `--config=configs/NAME.py`) gets the
arguments TOY[NAME] appended (a tiny network, a few dozen examples), and the datasets are read from a directory
prepared for the test session ($TFDS_DATA_DIR). Every command must exit 0. A `bash` block may hold `python -m
vitjax.X ...` command lines (with `\\` continuations, `&&`, `# comments`, a `VAR=value` prefix and `echo TEXT |`);
a `python` block runs as a script. Anything else in a marked block is an error of the page, not skipped.
"""

import os
import re
import shlex
import shutil
import time

import pytest
import train_helpers as th

DOCS = os.path.join(th.ROOT, "docs")

# A tiny network and a 32-example class-balanced training subset (a step an epoch at batch 32: the main job's 80
# epochs are 80 steps), evaluations and checkpoints every 25 steps (the main job keeps 3 for averaging).
_TINY_VIT = [
  "--config.model.width=16",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=32",
  "--config.data.labelled=32",
  "--config.batch_size=32",
  "--config.data.eval_batch_size=64",
  "--config.eval_every=25",
  "--config.checkpoint_every=25",
]
TOY = {
  "vit_digits.py": _TINY_VIT,
  "backbone_finetune.py": [*_TINY_VIT, "--config.evals.probe.fit_examples=32", "--config.evals.probe.examples=64"],
  "mae_digits.py": [
    "--config.model.encoder.width=16",
    "--config.model.encoder.depth=1",
    "--config.model.encoder.num_heads=2",
    "--config.model.encoder.mlp_dim=32",
    "--config.model.decoder_width=16",
    "--config.model.decoder_depth=1",
    "--config.model.decoder_heads=2",
    "--config.batch_size=32",
    "--config.data.eval_batch_size=64",
    "--config.total_steps=20",
  ],
  "transformer_bible_en_es.py": [
    "--config.model.d_model=32",
    "--config.model.num_heads=2",
    "--config.model.d_ff=64",
    "--config.model.num_layers=1",
    "--config.data.vocab_size=300",
    "--config.data.tokenizer_sentences=3000",
    "--config.data.tokens_per_batch=512",
    "--config.total_steps=2",
    "--config.eval_every=2",
    "--config.evals.eval.examples=4",
    "--config.evals.eval.method=greedy",
    "--config.data.max_len=64",
    "--config.max_train_minutes=5",
  ],
}

# the fields a config's get_sweep() sets, which a sweep's overrides may not
SWEPT = {"vit_digits.py": {"--config.optim.lr", "--config.optim.weight_decay", "--config.model.depth"}}

# What a page's walkthrough leaves behind, beside every command's exit status 0: files (paths relative to the
# reader's directory) and text its commands print on stdout.
EXPECT = {
  "getting_started": ['"split": "test"', "workdirs/vit_digits/curves.png"],
  "guides/checkpoints": ["workdirs/vit_digits/averaged", "workdirs/vit_digits/config_history.jsonl"],
  "guides/distill_lora": ["workdirs/student/checkpoints", "workdirs/lora/checkpoints", "exported/lora.safetensors"],
  "guides/evaluate": ["probe/linear", "(5, 10)"],
  "guides/export": ["exported/vit_digits.safetensors", "exported/vit_digits.json", "largest difference: 0.0"],
  "guides/finetune": [
    "workdirs/vit_digits_from_mae/checkpoints",
    "workdirs/mae_digits/reconstructions",
    "workdirs/dinov2_digits/checkpoints",
    "workdirs/dinov2_digits {'pooled': (2, 16), 'patches': (2, 2, 2, 16)}",
    "lvd142m {'pooled': (2, 16), 'patches': (2, 37, 37, 16)}",
  ],
  "guides/multihost": ["workdirs/fsdp/checkpoints", "workdirs/tp/checkpoints"],
  "guides/own_images": ["my_images/9", "workdirs/my_images/task.json"],
  "guides/precision": ["workdirs/vit_digits_bf16/checkpoints"],
  "guides/sweeps": ["sweeps/vit_digits/report.md", "sweeps/vit_digits/trials.csv"],
  "guides/training": ["workdirs/sgd/checkpoints", "workdirs/head_only/checkpoints", "workdirs/few_labels/checkpoints"],
  "guides/translation": ["workdirs/bible_en_es/tokenizer.model"],
}


def tiny_hub_backbones(cwd) -> dict:
  """The hub repositories a page names, made here at TOY's size (timm's builds, random weights, as timm saves them) in
  a hub cache of the reader's directory; the environment that reads it offline."""
  import test_hub

  timm = test_hub._timm()
  name = "vit_small_patch14_reg4_dinov2.lvd142m"
  args = dict(embed_dim=16, depth=1, num_heads=2, mlp_ratio=2)
  model = test_hub._perturbed(timm.create_model(name, pretrained=False, num_classes=0, **args))
  timm.models.save_for_hf(model, str(cwd / "timm_save"), model_args=args, safe_serialization=True)
  test_hub.cache_repo(str(cwd / "hf_home" / "hub"), f"timm/{name}", test_hub.read_dir(str(cwd / "timm_save")))
  return {"HF_HOME": str(cwd / "hf_home"), "HF_HUB_OFFLINE": "1"}


SETUP = {"guides/finetune": tiny_hub_backbones}  # page: what its walkthrough needs made first -> its environment

PAGES = ["getting_started", *(f"guides/{os.path.splitext(n)[0]}" for n in sorted(os.listdir(f"{DOCS}/guides")))]


def marked_blocks(page: str) -> list[tuple[str, str]]:
  """(language, text) of each block of docs/PAGE.md that follows a `<!-- test -->` line."""
  with open(f"{DOCS}/{page}.md") as f:
    text = f.read()
  return re.findall(r"^<!-- test -->\n```(\w+)\n(.*?)^```", text, re.S | re.M)


def commands(block: str) -> list[tuple[dict, str, list[str]]]:
  """(environment, stdin, argv) of each command line of a bash block."""
  out = []
  for line in block.replace("\\\n", " ").splitlines():
    words = shlex.split(line, comments=True)
    while words:
      cmd, words = (words[: words.index("&&")], words[words.index("&&") + 1 :]) if "&&" in words else (words, [])
      env, stdin = {}, ""
      if cmd[0] == "echo" and "|" in cmd:
        stdin, cmd = " ".join(cmd[1 : cmd.index("|")]) + "\n", cmd[cmd.index("|") + 1 :]
      while re.match(r"[A-Z_]+=", cmd[0]):
        key, value = cmd.pop(0).split("=", 1)
        env[key] = value
      assert cmd[:2] == ["python", "-m"] and cmd[2].startswith("vitjax."), f"not a vitjax command line: {line}"
      out.append((env, stdin, cmd[2:]))
  return out


def toy(module: str, argv: list[str]) -> list[str]:
  """A training command's toy arguments (TOY), after the reader's own; a field the reader sets keeps its value."""
  config = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if config is None or "--mode=eval" in argv:
    return argv
  name = os.path.basename(config.split(":")[0])
  assert name in TOY, f"{name}: add its toy sizes to TOY in tests/test_guides.py"
  given = {a.split("=", 1)[0] for a in argv} | (SWEPT.get(name, set()) if module == "sweep" else set())
  return argv + [a for a in TOY[name] if a.split("=", 1)[0] not in given]


def run_command(cwd: str, data_dir: str, env: dict, stdin: str, argv: list[str]):
  module = argv[0].removeprefix("vitjax.")
  extra = {"TFDS_DATA_DIR": data_dir, **env}
  if "XLA_FLAGS" in env:  # the reader's flags, and the tests' own (train_helpers.XLA_TEST_FLAGS)
    extra["XLA_FLAGS"] = f"{env['XLA_FLAGS']} {th.XLA_TEST_FLAGS}"
  t0 = time.time()
  proc = th.run_module(module, *toy(module, argv[1:]), cwd=cwd, stdin=stdin, extra_env=extra, timeout=600)
  print(f"{time.time() - t0:6.1f} s  {shlex.join(argv)[:120]}")
  assert proc.returncode == 0, (
    f"`{shlex.join(argv)}` in {cwd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
  )
  return proc


def readme_main_job() -> list[list[str]]:
  """The vitjax command lines of the README's main command (its install steps left out)."""
  with open(os.path.join(th.ROOT, "README.md")) as f:
    block = re.search(r"<!-- main-command -->\s*```bash\n(.*?)```", f.read(), re.S).group(1)
  return [argv for _, _, argv in commands_of_vitjax(block)]


def commands_of_vitjax(block: str):
  steps = [s.strip() for s in " ".join(block.replace("\\\n", " ").split()).split("&&")]
  return commands("\n".join(s for s in steps if s.startswith("python -m vitjax.")))


@pytest.fixture(scope="session")
def main_job(tmp_path_factory, data_dir):
  """The README's main job at toy size, run where a reader runs it: returns that directory (workdirs/vit_digits)."""
  cwd = tmp_path_factory.mktemp("main_job")
  os.symlink(os.path.join(th.ROOT, "configs"), cwd / "configs")
  for argv in readme_main_job():
    run_command(str(cwd), data_dir, {}, "", argv)
  return cwd


def test_every_guide_has_a_walkthrough_and_the_main_job_is_three_commands():
  assert [a[0] for a in readme_main_job()] == ["vitjax.data.prepare", "vitjax.main", "vitjax.main"]
  for page in PAGES:
    blocks = marked_blocks(page)
    assert blocks, f"docs/{page}.md has no block marked <!-- test -->"
    assert EXPECT.get(page), f"say in EXPECT what docs/{page}.md's walkthrough leaves behind"
    for lang, block in blocks:
      assert lang in ("bash", "python"), (page, lang)
      if lang == "bash":
        assert commands(block), (page, block)


@pytest.mark.parametrize("page", PAGES)
def test_the_guide_runs(page, main_job, data_dir, tmp_path, compile_cache):
  cwd = tmp_path / "reader"
  shutil.copytree(main_job, cwd, symlinks=True)
  if page == "guides/translation":
    pytest.importorskip("sentencepiece")
  env = SETUP[page](cwd) if page in SETUP else {}
  printed = ""
  for i, (lang, block) in enumerate(marked_blocks(page)):
    if lang == "python":
      script = cwd / f"block_{i}.py"
      script.write_text(block)
      printed += run_command(str(cwd), data_dir, env, "", [str(script)]).stdout
    else:
      for own, stdin, argv in commands(block):
        printed += run_command(str(cwd), data_dir, {**env, **own}, stdin, argv).stdout
  for expected in EXPECT[page]:
    assert (cwd / expected).exists() or expected in printed, f"{page}: {expected} is neither a file nor printed"
