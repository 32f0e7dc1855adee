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
import importlib
import re
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

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


def create(name: str, **overrides):
  """Builds a model by name; keyword overrides replace any attribute (num_classes, drop_path_rate, ...)."""
  family, kwargs = _resolve(name)
  fields = set(family.cls.__dataclass_fields__) - {"parent", "name"}
  unknown = set(overrides) - fields
  if unknown:
    bad = sorted(unknown)[0]
    near = difflib.get_close_matches(bad, sorted(fields), n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    raise ValueError(f"{family.name} has no option {bad!r}.{hint} Options: {', '.join(sorted(fields))}")
  return family.cls(**{**kwargs, **family.overrides(dict(overrides))})
