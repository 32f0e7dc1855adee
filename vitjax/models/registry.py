"""The model registry: every model family states here, through `register`, what the rest of vitjax needs to know.

So that nothing outside the family's own files names its parameters.

A family is a Linen module class decorated with `@register(...)` in its own module (vitjax/models/vit.py,
swin.py, transformer.py, mae.py). It gives::

  parse_name   config name -> the class's keyword arguments ("vit_s16" -> width, depth, ...), None if not its name
  examples     names to suggest in an error
  no_decay     parameter leaf names, beyond every family's `bias` and `scale`, that weight decay leaves alone
  tp_rules     Megatron-style tensor-parallel rules, (regex on 'a/b/kernel' paths, axis per dimension, aligned
               right), used by the 'tp' and 'fsdp_tp' sharding presets (vitjax.mesh)
  adapters     how loaded weights fit a model of other shapes (vitjax.models.adapt): new resolution, window, length
  formats      format -> the module that converts the family's weights from and to it (beside the family:
               vitjax/models/vit_timm.py, ...), imported when first used; vitjax.convert dispatches through it
  overrides    a function that normalises create()'s keyword overrides (e.g. an int patch size -> a pair)

A family's layer index (layer-wise learning-rate decay) is the model's own `layer_index` method.

`create(name, **overrides)` builds a model from any registered family's name.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import re
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import flax.errors

BASE_NO_DECAY = ("bias", "scale")


@dataclasses.dataclass(frozen=True)
class Family:
  """A registered model family: its Linen class and the fields `register` takes (see the module docstring)."""

  cls: type
  parse_name: Callable[[str], dict | None]
  examples: tuple[str, ...] = ()
  no_decay: tuple[str, ...] = ()
  tp_rules: tuple[tuple[str, tuple], ...] = ()
  adapters: tuple[Callable, ...] = ()
  formats: Mapping[str, str] = dataclasses.field(default_factory=dict)
  overrides: Callable[[dict], dict] = dict

  @property
  def name(self) -> str:
    """The family's name: its class's name ("ViT", "Swin", ...)."""
    return self.cls.__name__

  def converter(self, fmt: str) -> ModuleType:
    """The module converting this family's weights from / to `fmt` ('timm', 'npz', ...); ValueError if none."""
    if fmt not in self.formats:
      known = sorted(f.name for f in FAMILIES if fmt in f.formats)
      raise ValueError(f"no {fmt} conversion for a {self.name} (there is one for: {', '.join(known) or 'none'})")
    return importlib.import_module(self.formats[fmt])


FAMILIES: list[Family] = []


def register(parse_name: Callable[[str], dict | None], **fields) -> Callable[[type], type]:
  """Class decorator: registers the class as a model family (fields as in `Family`)."""

  def wrap(cls: type) -> type:
    FAMILIES.append(Family(cls=cls, parse_name=parse_name, **fields))
    return cls

  return wrap


def family_of(model_or_cls: Any) -> Family:
  """The family of a model (instance or class); ValueError if its class was never registered."""
  cls = model_or_cls if isinstance(model_or_cls, type) else type(model_or_cls)
  for klass in cls.__mro__:  # the most specific: a family built on another (HybridViT on ViT) is its own
    for f in FAMILIES:
      if f.cls is klass:
        return f
  raise ValueError(f"{cls.__name__} is not a registered model family (see vitjax/models/registry.py)")


def families_with(fmt: str) -> list[Family]:
  """The families with a converter for format `fmt` ('timm', 'npz', 'hf', ...), in registration order."""
  return [f for f in FAMILIES if fmt in f.formats]


def no_decay_pattern(model: Any = None) -> re.Pattern:
  """Leaf names weight decay skips: every family's when `model` is None, else the model's family's."""
  names = set(BASE_NO_DECAY)
  for f in [family_of(model)] if model is not None else FAMILIES:
    names.update(f.no_decay)
  return re.compile(r"(" + "|".join(sorted(names)) + r")$")


def tp_rules(model: Any = None) -> tuple[tuple[str, tuple], ...]:
  """Tensor-parallel rules: the model's family's, or every family's (in registration order) when None."""
  if model is not None:
    return family_of(model).tp_rules
  return tuple(dict.fromkeys(rule for f in FAMILIES for rule in f.tp_rules))


def adapters(model: Any = None) -> tuple[Callable, ...]:
  """How loaded weights are fitted to a model of other shapes: the model's family's adapters.

  With `model` None, every family's, without repeats, in registration order.
  """
  if model is not None:
    return family_of(model).adapters
  return tuple(dict.fromkeys(a for f in FAMILIES for a in f.adapters))


def example_names() -> list[str]:
  """Every family's example model names, for error messages."""
  return [n for f in FAMILIES for n in f.examples]


def _resolve(name: str) -> tuple[Family, dict]:
  for f in FAMILIES:
    kwargs = f.parse_name(name)
    if kwargs is not None:
      return f, kwargs
  near = difflib.get_close_matches(name, example_names(), n=1)
  hint = f" Did you mean {near[0]!r}?" if near else ""
  raise ValueError(
    f"unknown model {name!r}.{hint} Known: {', '.join(example_names())}, vit_SIZEPATCH "
    "(e.g. vit_b32) or a ViT variant string like 'S/16'."
  )


def options(name: str) -> tuple[Family, set[str]]:
  """(the family of model `name`, the attributes create() accepts for it); ValueError for an unknown name."""
  family, _ = _resolve(name)
  return family, set(family.cls.__dataclass_fields__) - {"parent", "name"}


def create(name: str, **overrides):
  """Builds a model by name; keyword overrides replace any attribute (num_classes, drop_path_rate, ...)."""
  family, kwargs = _resolve(name)
  fields = options(name)[1]
  unknown = set(overrides) - fields
  if unknown:
    bad = sorted(unknown)[0]
    near = difflib.get_close_matches(bad, sorted(fields), n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ValueError(f"{family.name} has no option {bad!r}.{hint} Options: {', '.join(sorted(fields))}")
  fields_ = {**kwargs, **family.overrides(dict(overrides))}
  check_values(family.name, fields_)
  return family.cls(**fields_)


# Field names shared across families and the values they take; check_values refuses the rest, which would otherwise
# build a model that fails deep inside jax or, worse, runs (a 3-d patch gave a batch of 0, dropout 1.5 trained).
SIZES = {"width", "mlp_dim", "num_heads", "embed_dim", "window_size", "d_model", "d_ff", "max_len", "vocab_size",
         "tgt_vocab_size", "decoder_width", "decoder_heads", "decoder_mlp_dim", "resnet_width", "representation_size",
         "channels", "patch_size"}  # fmt: skip
COUNTS = {
  "depth",
  "depths",
  "num_layers",
  "decoder_depth",
  "num_classes",
  "stem_depth",
  "resnet_layers",
  "num_registers",
}
PAIRS = {"patch_size", "window_size"}  # an int or an (h, w) pair
LAYERS = {"depth", "depths", "num_layers", "decoder_depth", "stem_depth", "resnet_layers"}
MAX_LAYERS = 1000  # (ViT-22B has 48): a deeper model takes hours to trace before its size could be checked


def check_values(family: str, fields: dict) -> None:
  """ValueError of one line for a size, count or rate a model cannot be built with.

  Sizes (widths, heads, patch, vocabulary) are whole numbers >= 1; counts (depths, classes) >= 0; a patch or window
  is one or a pair; rates (`*_rate`, mask_ratio) are in [0, 1). None leaves a field at its default.
  """
  for key, value in fields.items():
    if value is None:
      continue
    if key == "init_values":  # LayerScale's initial scale
      if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{family}: {key}={value!r} must be a number > 0 (e.g. {key}=1e-5), or None for no LayerScale")
    elif key.endswith("_rate") or key == "mask_ratio":
      if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
        raise ValueError(f"{family}: {key}={value!r} must be in [0, 1) (e.g. {key}=0.1)")
    elif key in SIZES or key in COUNTS:
      low = 1 if key in SIZES else 0
      items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
      if key in PAIRS and len(items) not in (1, 2):
        raise ValueError(f"{family}: {key}={value!r} must be one size or an (height, width) pair")
      if (not items and key in SIZES) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= low for v in items
      ):
        raise ValueError(f"{family}: {key}={value!r} must be {'whole numbers' if len(items) > 1 else 'a whole number'}"
                         f" >= {low}")  # fmt: skip
      if key in LAYERS and sum(items) > MAX_LAYERS:
        raise ValueError(f"{family}: {key}={value!r} is more than {MAX_LAYERS} layers; give a depth a model can have")


_SHAPE_ERROR = re.compile(
  r'parameter "([^"]+)" in "([^"]*)", the given initializer is expected to generate shape (\([^)]*\)), but the '
  r"existing parameter it received has shape (\([^)]*\))"
)


def fits_weights(call: Callable) -> Callable:
  """Wraps a model's __call__ so that inputs its weights do not fit get one line.

  Flax's ScopeParamShapeError (inputs of another size or channels than the weights were made for) becomes a
  ValueError that names the inputs, the parameter and what to do.
  """

  @functools.wraps(call)
  def wrapped(self, inputs, *args, **kwargs):
    try:
      return call(self, inputs, *args, **kwargs)
    except flax.errors.ScopeParamShapeError as e:
      m = _SHAPE_ERROR.search(str(e))
      if m is None:  # (another wording of flax's: its own message)
        raise
      param, scope, want, have = m.groups()
      raise ValueError(
        f"{type(self).__name__}: inputs {list(inputs.shape)} do not fit its weights: {scope.strip('/')}/{param} is "
        f"{have}, these inputs need {want}. Give it inputs of the size and channels it was made for, or adapt the "
        "weights to the new ones with vitjax.models.adapt.adapt_params (as config.init_from does)"
      ) from None

  return wrapped
