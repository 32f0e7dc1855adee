"""vitjax.config: the schema and its defaults, evaluator entries and their completion, config files and their fields."""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
import pytest

try:
  import train_helpers as th  # tests/ is on sys.path (pytest's default import mode)
except ImportError:
  from tests import train_helpers as th
from vitjax import models
from vitjax.config import default_config, load_module


def test_a_config_files_fields_are_checked_against_its_tasks_defaults():
  """unknown_fields: every shipped config reads clean (translation ones against translation_config's fields); a
  misspelt field names the nearest known one, a far-off one none; the open subtrees (a model's own fields, an
  augmentation's options, optax's arguments) are checked where they are read, not here."""
  from vitjax.config import translation_config, unknown_fields

  for name in sorted(os.listdir(os.path.join(th.ROOT, "configs"))):
    if name.endswith(".py"):
      assert unknown_fields(load_module(os.path.join(th.ROOT, "configs", name)).get_config()) == [], name
  c = default_config()
  c.optim.weight_decy = 0.1
  c.zzz = 1
  c.model.mlp_ratio = 4
  c.data.augment.random_resized_crop = {"scale": (0.35, 1)}
  c.optim.kwargs = {"b2": 0.95}
  assert unknown_fields(c) == [("optim.weight_decy", "optim.weight_decay"), ("zzz", None)]
  t = translation_config("bible", "en", "es")
  t.data.vocab_sise = 4000
  assert unknown_fields(t) == [("data.vocab_sise", "data.vocab_size")]


def test_config_arguments_choose_the_variant_and_a_divisible_image_size():
  mod = load_module(os.path.join(th.ROOT, "configs", "vit.py"))
  c = mod.get_config("variant=S/16,dataset=fashion_mnist")
  assert c.model.name == "S/16" and c.data.name == "fashion_mnist" and c.data.image_size == 32
  with pytest.raises(ValueError, match="unknown argument 'varaint'"):
    mod.get_config("varaint=S/16")


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(os.path.join(th.ROOT, "configs")) if f.endswith(".py")))
def test_every_config_documents_its_command_and_builds_its_model(name):
  """Each configs/*.py loads, its docstring gives its run command and expected result, and its model's
  parameter shapes evaluate (abstractly: no data, no memory) at the config's input size."""
  from vitjax.train import build_model

  mod = load_module(os.path.join(th.ROOT, "configs", name))
  assert f"--config=configs/{name}" in mod.__doc__ and "Expected" in mod.__doc__
  c = mod.get_config()
  if c.task == "translation":
    model = build_model(c, {"vocab_size": c.data.vocab_size, "max_len": c.data.max_len})
    inputs = (jnp.ones((1, 8), jnp.int32),) * 2
  elif c.task == "mae":  # images and the masking noise [B, patches]
    model = build_model(c, {"channels": 1})
    encoder = dict(c.model.encoder)
    patch = models.create(encoder.pop("name"), **encoder).patch_size[0]
    inputs = (
      jnp.zeros((1, c.data.image_size, c.data.image_size, 1)),
      jnp.zeros((1, (c.data.image_size // patch) ** 2)),
    )
  else:
    model = build_model(c)
    inputs = (jnp.zeros((1, c.data.image_size, c.data.image_size, 3), jnp.float32),)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))
  assert sum(np.prod(x.shape) for x in jax.tree.leaves(shapes["params"])) > 0
  if hasattr(mod, "get_sweep"):  # its fields exist and take its values
    from vitjax import sweep

    sweep.load(os.path.join(th.ROOT, "configs", name), c)


def test_the_bible_recipe_grid_starts_from_the_config_and_every_point_builds():
  from vitjax import sweep
  from vitjax.train import build_model

  path = os.path.join(th.ROOT, "configs", "transformer_bible_en_es.py")
  mod = load_module(path)
  c = mod.get_config("recipe")
  grid = sweep.load(f"{path}:recipe", c).grid
  sizes = {"vocab_size": 8000, "max_len": 128}
  assert grid[0] == mod.BASE and hash(build_model(c, sizes)) == hash(build_model(mod.get_config(), sizes))
  assert len({tuple(sorted(p.items())) for p in grid}) == len(grid)  # no point repeats another
  for change in mod.RECIPE[1:]:
    assert change and all(mod.BASE[k] != v for k, v in change.items())  # each changes what it names
  for point in grid:
    trial = mod.get_config("recipe")
    for field, value in point.items():
      node, _, leaf = field.rpartition(".")
      (trial[node] if node else trial)[leaf] = value
    model = build_model(trial, {"vocab_size": trial.data.vocab_size, "max_len": 32})
    ids = jnp.ones((1, 8), jnp.int32)
    assert jax.eval_shape(lambda m=model, i=ids: m.init(jax.random.key(0), i, i))["params"]


@pytest.mark.parametrize("name", ["swin_fashion_mnist.py", "vit_fashion_mnist.py", "transformer_bible_en_es.py"])
def test_a_model_built_from_config_json_is_hashable(name):
  """config.json stores tuples as lists (Swin's depths); evaluation and vitjax.load build the model from it, and
  jit takes the model as a static argument, so it must hash."""
  from vitjax.train import build_model

  c = load_module(os.path.join(th.ROOT, "configs", name)).get_config()
  reloaded = mlc.ConfigDict(json.loads(c.to_json_best_effort()))
  overrides = {"vocab_size": 100, "max_len": 32} if c.task == "translation" else {}
  assert hash(build_model(reloaded, overrides)) == hash(build_model(c, overrides))


def test_an_entry_holds_its_common_fields_and_complete_gives_it_its_types_options():
  """config.evaluator builds an entry without importing the evaluators (the config is below them): its type, the
  common fields and the options given; evaluators.complete gives it the rest of its type's OPTIONS with their
  defaults, in place, locked or not, and leaves an entry of no known type to resolve(), which names it."""
  from vitjax import evaluators
  from vitjax.config import ENTRY, evaluator

  entry = evaluator("classification", top_k=3)
  assert dict(entry) == {"type": "classification", **ENTRY, "top_k": 3}
  c = default_config()
  c.evals.eval = entry
  c.evals.other = evaluator("nosuchtype")
  c.lock()
  evaluators.complete(c)
  assert c.is_locked and dict(c.evals.eval) == {"type": "classification", **ENTRY, "top_k": 3, "calibration_bins": 0,
                                                 "shift": None}  # fmt: skip
  assert dict(c.evals.other) == {"type": "nosuchtype", **ENTRY}
  assert set(evaluators.COMMON) == {"type", *ENTRY}


def test_a_command_line_override_sets_an_option_the_config_file_left_to_its_type(tmp_path):
  """--config.evals.NAME.OPTION sets any option of the entry's type, although the config file's entry holds only
  its common fields (the flag completes the entries before it locks the config); a misspelt option is one line."""
  common = [f"--workdir={tmp_path / 'w'}", "--config.total_steps=0", "--config.data.data_dir=/nonexistent"]
  ok = th.run_main(tmp_path / "w", "--config.evals.eval.top_k=3", *common[1:])
  assert "has no field" not in ok.stderr and "top_k" not in th.error_lines(ok), ok.stderr[-2000:]
  bad = th.run_main(tmp_path / "w", "--config.evals.eval.topk=3", *common[1:])
  assert bad.returncode == 2 and "did you mean --config.evals.eval.top_k" in th.error_lines(bad), bad.stderr[-2000:]
