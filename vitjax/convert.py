"""Weights in and out: timm, Microsoft's Swin, `transformers`, the original JAX ViT, big_vision, the Hugging Face hub.

The formats: timm state dicts (ViT and Swin), Microsoft's Swin `.pth`, the `transformers` ViT and Swin, the original JAX
ViT and big_vision `.npz` checkpoints (SigLIP image towers included), and repositories of the Hugging Face hub by name
(vitjax.hub: timm's and transformers' layouts).

Importers return `(module, variables)`; `module.apply(variables, images)` then gives the source's logits.
Images are NHWC for vitjax (timm takes NCHW: transpose (0, 3, 1, 2) to compare). Each importer sets the MLP
activation its source was trained with (timm and Microsoft's Swin: exact GELU; the original ViT and big_vision:
flax's tanh-approximated GELU).

    module, variables = from_timm("vit_base_patch16_224", safetensors.numpy.load_file("model.safetensors"))
    module, variables = from_swin(torch.load("swin_tiny_patch4_window7_224.pth", weights_only=True))   # Microsoft's or timm's
    module, variables = from_vit_npz("ViT-B_16.npz")           # original ViT, big_vision, SigLIP (img tower)
    module, variables = from_hf(load_file("model.safetensors"), json.load(open("config.json")))  # transformers
    module, variables, repo = from_hub("hf:google/vit-base-patch16-224")   # by name, through the hub's cache
    params = load_params("timm:vit_base_patch16_224:model.safetensors")   # what config.init_from takes
    params = load_params("hf:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")

Exporters take `(module, variables)` back out::

    state_dict, timm_cfg = to_timm(module, variables, image_size=224)   # timm.create_model(**timm_cfg)
    save_safetensors("model.safetensors", state_dict)
    np.savez("model.npz", **to_vit_npz(module, variables))             # the original ViT release's layout
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from absl import logging

from vitjax import hub, models, paths
from vitjax.errors import ConfigError
from vitjax.models import convert_util as u
from vitjax.models import lora, registry, vit_hybrid_timm

# Each format's conversions live beside the model family they convert (vitjax/models/vit_timm.py, vit_npz.py,
# vit_hf.py, swin_timm.py, swin_msft.py, swin_hf.py), declared in the family's registration; this module
# dispatches to them.
check_shapes = u.check_shapes
detect_layout = u.detect_layout


def from_timm(timm_name: str, state_dict: Mapping[str, Any], num_heads: int | None = None):
  """(module, variables) for a timm ViT or Swin, e.g. "vit_base_patch16_224", "swin_tiny_patch4_window7_224".

  state_dict: parameter name -> array (numpy or torch), e.g. `safetensors.numpy.load_file(...)` or
  `torch.load(..., weights_only=True)` (a training checkpoint {'model': state_dict, ...} is unwrapped). The pretrained tag after a
  dot ("vit_base_patch16_224.augreg_in21k") is ignored. ViT: `num_heads`, or else the name, gives the heads (the
  weights cannot: pass it for a model whose head count no timm name has, e.g. one vitjax exported: its `.json` holds
  it), the weights the rest. Swin: the weights give everything, in timm's layout or Microsoft's (see from_swin).
  Keys the conversion does not use (other than buffers) are an error, so an unsupported variant never loads
  half-converted.
  Activation: exact GELU, as timm builds these models.
  """
  base = timm_name.split(".")[0]
  state_dict = u.unwrap(state_dict)
  for family in registry.families_with("timm"):
    converter = family.converter("timm")
    if not converter.NAMES.match(base):
      continue
    layout = detect_layout(state_dict)
    if layout not in converter.READS:
      what = f"{timm_name} (a timm {family.name})"
      if layout is None:
        raise u.unknown_layout(state_dict, what)
      raise ValueError(
        f"{timm_name} is a timm {family.name}, but the weights are in the {layout} layout (another model family)"
        + ("; use from_vit_npz / init_from=npz:FILE" if layout == "vit-npz" else "")
      )
    return converter.read(state_dict, layout, timm_name, num_heads=num_heads)
  raise ValueError(
    f"no conversion for timm model {timm_name!r}; supported: vit_{{tiny,small,medium,base,"
    "large,huge}_patchP_SIZE, the hybrids vit_{tiny,small,base,large}_rN_sS[_pP]_SIZE and swin_*"
  )


def from_swin(state_dict: Mapping[str, Any]):
  """(module, variables) for a Swin state dict, Microsoft's official `.pth` or timm's.

  The architecture (embed dim, depths, heads, window, patch, MLP ratio, classes) is read from the weights.

  Microsoft's checkpoints are `{'model': state_dict, ...}` with the patch-merging layer at the end of stages
  1-3; timm's put it at the start of stages 2-4 (as vitjax does). Both use exact GELU.
  """
  state_dict = u.unwrap(state_dict)
  layout = detect_layout(state_dict)
  if layout not in ("timm-swin", "swin-official"):
    raise (
      u.unknown_layout(state_dict, "from_swin")
      if layout is None
      else ValueError(f"a Swin was asked for, but the weights are in the {layout} layout (another model family)")
    )
  return registry.family_of(models.Swin).converter("timm").read(state_dict, layout)


def from_vit_npz(path_or_mapping, variant: str | None = None, act: str = "gelu_tanh"):
  """(module, variables) from an `.npz` of the original JAX ViT release (plain or hybrid) or of big_vision.

  The layout picks the converter: vitjax.models.vit_npz.read (the plain ViT, big_vision) or
  vitjax.models.vit_hybrid_npz.read (the release's ResNet + ViT hybrids). `variant` ("B/16", "R26+ViT-S_32"), if
  given, is checked against the weights.
  """
  flat = registry.family_of(models.ViT).converter("npz").load_npz(path_or_mapping)
  layout = detect_layout(flat)
  for family in registry.families_with("npz"):
    converter = family.converter("npz")
    if layout in converter.LAYOUTS:
      return converter.read(flat, variant, act)
  if layout is None:
    raise u.unknown_layout(flat, "not an original-ViT or big_vision checkpoint")
  raise ValueError(f"from_vit_npz reads the original ViT's .npz, but the weights are in the {layout} layout")


def from_hf(state_dict: Mapping[str, Any], config: Mapping[str, Any]):
  """(module, variables) of a `transformers` ViT or Swin from its state dict and its config.json as a dict.

  Classes: ViTForImageClassification, ViTModel, SwinForImageClassification, SwinModel. The state dict is the hub's
  model.safetensors, or the model's state_dict(); see vitjax.models.vit_hf and swin_hf. Options vitjax's models lack are
  a ValueError naming them; keys the conversion does not use too. Activation: config.json's hidden_act.
  """
  state_dict = u.unwrap(state_dict)
  layout = detect_layout(state_dict)
  model_type = config.get("model_type")
  for family in registry.families_with("hf"):
    converter = family.converter("hf")
    if layout in converter.READS:
      if model_type is not None and model_type not in converter.MODEL_TYPES:
        raise ValueError(
          f"config.json's model_type is {model_type!r}, but the weights are a transformers {family.name}"
        )
      return converter.read(state_dict, layout, dict(config))
  if layout is None:
    raise u.unknown_layout(state_dict, f"a transformers {model_type or 'model'}")
  raise ValueError(f"a transformers model was asked for, but the weights are in the {layout} layout")


# timm architectures of the ViT's kin that vitjax does not build, and what they need (the refusal's words)
_TIMM_NEEDS = (
  (
    r"_rope_",
    "rotary positions without a position table, or in the 'xy' and 'mixed' forms (vitjax: EVA-02's, beside one)",
  ),
  (r"^vit_pe_", "the Perception Encoder's rotary embedding and attention pooling"),
  (r"^naflexvit", "NaFlex's patches of any aspect ratio, packed with masks (issue 78)"),
  (r"^(beit|beitv2)_", "BEiT's layout (timm's Beit: per-block relative position tables, its own LayerScale names)"),
  (r"^(eva_giant|eva02_enormous)", "EVA-01's post-norm blocks without rotary positions (timm's Eva, no rope)"),
)


def from_hub(spec: str):
  """(module, variables, repo) of a Hugging Face hub repository, 'hf:ORG/NAME[@REVISION]'.

  Its layout is timm's (read by from_timm, with config.json's architecture) or transformers' ViT and Swin (from_hf).
  repo (vitjax.hub.Repo) says what the repository's config gives: preprocess(), image_size(), class_names(n). Raises
  ConfigError of one line (vitjax.hub: not cached while offline, another kind of model, ...).
  """
  repo = hub.open_repo(spec)
  arch = repo.config.get("architecture", "")
  if repo.layout == "timm" and not any(f.converter("timm").NAMES.match(arch) for f in registry.families_with("timm")):
    needs = next((why for pattern, why in _TIMM_NEEDS if re.search(pattern, arch)), None)
    raise ConfigError(
      f"{spec}: timm's {arch!r} "
      + (f"needs {needs}, which vitjax does not build" if needs else "is not a model vitjax reads")
      + " (it reads timm's vit_SIZE_patchP_*, deit_* (distilled too), deit3_*, vit_SIZE_patch14_[reg4_]dinov2, vit_SIZE_patch16_dinov3, eva02_SIZE_patchP_* "
      "and swin_*)"
    )
  path = repo.weights_file()
  sd = _read_state_dict(spec, path)
  try:
    if repo.layout == "timm":
      module, variables = from_timm(
        repo.timm_name, sd, num_heads=(repo.config.get("model_args") or {}).get("num_heads")
      )
    else:
      module, variables = from_hf(sd, {"_name_or_path": repo.repo_id, **repo.config})
  except (KeyError, ValueError) as e:  # weights of a variant vitjax does not read
    raise ConfigError(f"{spec}: {str(e).strip(chr(34) + chr(39)).splitlines()[0]}") from None
  return module, variables, repo


def model_config(module) -> dict:
  """The `config.model` fields that build `module` (a ViT or Swin, e.g. one an importer returned).

  The family's name that needs the fewest overrides, and those overrides, e.g. {"name": "vit_b16", "layernorm_eps":
  1e-12}.
  """
  family = registry.family_of(module)
  fields = sorted(set(family.cls.__dataclass_fields__) - {"parent", "name"})
  names = list(family.examples)
  if family.cls is models.ViT and module.patch_hw[0] == module.patch_hw[1]:
    names = [f"vit_{s}{module.patch_hw[0]}" for s in ("ti", "s", "m", "b", "l", "h")] + names
  best = None
  for name in names:
    base = models.create(name)
    diff = {f: getattr(module, f) for f in fields if _plain(getattr(module, f)) != _plain(getattr(base, f))}
    if best is None or len(diff) < len(best[1]):
      best = (name, diff)
  return {"name": best[0], **{k: _plain(v) for k, v in best[1].items()}}


def _plain(v):
  """A model attribute as a config holds it (tuples for sequences)."""
  return tuple(_plain(x) for x in v) if isinstance(v, list | tuple) else v


def to_timm(module, variables, image_size) -> tuple[dict[str, np.ndarray], dict]:
  """(state_dict, config) of timm's ViT or Swin for a vitjax ViT / Swin.

  `image_size` (int or (H, W)) is the resolution the timm model is built for (timm fixes it at construction; vitjax
  reads it from the input). At another size than the weights were made for they are fitted to it as config.init_from
  fits them (a learned position table resampled, bias tables resized; a warning names each change).

  state_dict: numpy float32 arrays that `load_state_dict(..., strict=True)` accepts in the model that
  `build_timm(config)` makes (timm's VisionTransformer or SwinTransformer classes with config["kwargs"]).
  A ViT with a tanh-GELU keeps it (act_layer="gelu_tanh"), so its logits carry over. Options timm has no
  equivalent for (a convolutional stem, a pre-logits layer, a scanned encoder, other norm placements, ...)
  raise ValueError naming them.
  """
  image_size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
  writer = _converter(module, "timm", "to_timm")
  variables = _check_variables(variables, "to_timm")
  return writer.write(module, u.at_image_size(module, u.flat_params(variables["params"]), image_size), image_size)


def to_vit_npz(module, variables) -> dict[str, np.ndarray]:
  """The flat '/'-keyed arrays of the original JAX ViT release's `.npz` (`np.savez(path, **arrays)`).

  For a vitjax ViT with learned positions and a class token or GAP (vitjax.models.vit_npz.write).
  """
  writer = _converter(module, "npz", "to_vit_npz")
  variables = _check_variables(variables, "to_vit_npz")
  return writer.write(module, variables)


def _check_variables(variables, what: str) -> Mapping:
  """The variables, with low-rank adapters (config.lora) folded into their kernels: the plain weights a format holds."""
  if not isinstance(variables, Mapping) or "params" not in variables:
    keys = list(variables)[:4] if isinstance(variables, Mapping) else type(variables).__name__
    raise ValueError(f"{what} takes the variables {{'params': ...}} as module.init returns them; got {keys}")
  if lora.has_adapters(variables["params"]):
    return {**variables, "params": lora.merged(variables["params"])}
  return variables


def _converter(module, fmt: str, what: str):
  try:
    family = registry.family_of(module)
    return family.converter(fmt)
  except ValueError:
    can = " or a ".join(f.name for f in registry.families_with(fmt))
    raise ValueError(f"{what} converts a {can}, not a {type(module).__name__}") from None


def build_timm(config: dict):
  """The timm model (random weights, eval mode) a `to_timm` state dict loads into with strict=True."""
  from timm.models.deit import VisionTransformerDistilled
  from timm.models.eva import Eva
  from timm.models.swin_transformer import SwinTransformer
  from timm.models.vision_transformer import VisionTransformer

  if config["model"] == "vit_hybrid":  # a ResNetV2 backbone inside a HybridEmbed
    return vit_hybrid_timm.build(config)
  classes = {
    "vit": VisionTransformer,
    "deit_distilled": VisionTransformerDistilled,
    "eva": Eva,
    "swin": SwinTransformer,
  }
  cls = classes[config["model"]]
  return cls(**config["kwargs"]).eval()


def save_safetensors(path: str, state_dict: Mapping[str, Any], metadata: dict[str, str] | None = None) -> None:
  """Writes a state dict as `.safetensors` (contiguous float32), atomically: a reader never sees half a file."""
  from safetensors.numpy import save_file

  nested = next((k for k, v in state_dict.items() if isinstance(v, Mapping)), None)
  if nested is not None:
    raise ValueError(
      f"save_safetensors takes a flat state dict {{name: array}}; {nested!r} holds a dict: give to_timm(...)[0], or "
      "flatten parameters with vitjax.models.convert_util.flat_params"
    )
  arrays = {k: np.ascontiguousarray(u.to_numpy(v), dtype=np.float32) for k, v in state_dict.items()}
  with paths.replacing(path, None, suffix=".safetensors") as tmp:
    save_file(arrays, tmp, metadata=metadata)


# --------------------------------------------------------------------------------------------------- init_from


def timm_preprocess(name: str) -> dict | None:
  """The preprocessing timm's pretrained config gives model NAME ("vit_small_patch16_224.augreg_in21k_ft_in1k").

  {"mean", "std", "crop_fraction", "interpolation"}; None when timm is not installed or does not know NAME.
  """
  try:
    from timm.models import get_pretrained_cfg
  except Exception:  # timm missing, or torchvision that cannot load
    logging.warning("timm is not importable: the preprocessing of %s is not known, the config's is used", name)
    return None
  cfg = get_pretrained_cfg(name)
  if cfg is None:
    return None
  return hub.timm_pretrained_preprocess({k: getattr(cfg, k) for k in ("mean", "std", "crop_pct", "interpolation")})


def pretrained_preprocess(source: WeightSource) -> dict | None:
  """The preprocessing imported weights were trained with, {"mean", "std", "crop_fraction", "interpolation"}.

  They are augment.Preprocess's fields, from timm's pretrained config for 'timm:NAME:FILE' (timm_preprocess), the hub
  repository's config for 'hf:...' (timm's pretrained_cfg, or transformers' preprocessor_config.json); None for other
  sources, or a timm model timm does not know. An hf: repository that cannot be read is a ConfigError.
  """
  if source.kind == "timm":
    return timm_preprocess(source.name)
  if source.kind == "hf":
    return hub.open_repo(source.spec).preprocess()
  return None


@dataclasses.dataclass(frozen=True)
class WeightSource:
  """config.init_from, parsed once.

  Nothing (""), a vitjax workdir, 'timm:NAME:FILE', 'npz:[VARIANT:]FILE' or 'hf:ORG/NAME[@REVISION]' (a Hugging Face hub
  repository, vitjax.hub).
  """

  kind: str  # "none" | "workdir" | "timm" | "npz" | "hf"
  path: str = ""
  name: str = ""  # timm's model name, the npz's ViT variant ("B/16"), or the hub repository ("ORG/NAME")
  revision: str = ""  # hf: the branch, tag or commit after "@" ("": the default branch)

  @classmethod
  def parse(cls, spec: str | None) -> WeightSource:
    """Parses config.init_from.

    Args:
      spec: None or "" (no weights), 'timm:NAME:FILE', 'npz:FILE', 'npz:VARIANT:FILE', 'hf:ORG/NAME[@REVISION]', or
        anything else (the path of a vitjax workdir).

    Returns:
      A WeightSource of kind "none", "timm" (path FILE, name NAME), "npz" (path FILE, name VARIANT or ""), "hf" (name
      ORG/NAME, revision REVISION or "") or "workdir" (path `spec`).
    """
    if not spec:
      return cls("none")
    kind, _, rest = spec.partition(":")
    if kind == "hf":
      name, _, revision = rest.partition("@")
      return cls("hf", "", name, revision)
    if kind not in ("timm", "npz"):
      return cls("workdir", spec)
    name, _, path = rest.partition(":")
    return cls(kind, name, "") if kind == "npz" and not path else cls(kind, path, name)

  @property
  def imported(self) -> bool:
    """Weights from another codebase (timm, the original ViT / big_vision, the hub), not a vitjax run."""
    return self.kind in ("timm", "npz", "hf")

  @property
  def spec(self) -> str:
    """An hf: source as written: 'hf:ORG/NAME[@REVISION]'."""
    return f"hf:{self.name}" + (f"@{self.revision}" if self.revision else "")


def load_params(spec: str) -> dict:
  """Parameters from 'timm:NAME:FILE', 'npz:[VARIANT:]FILE' or 'hf:ORG/NAME[@REVISION]'.

  Sources: 'timm:NAME:FILE' (.safetensors, or .pth/.bin with torch; timm's layout or, for Swin, Microsoft's), 'npz:FILE'
  / 'npz:VARIANT:FILE' (the original ViT or big_vision) or 'hf:ORG/NAME[@REVISION]' (a Hugging Face hub repository in
  timm's or transformers' layout, through the hub's cache: from_hub).

  (A vitjax workdir as init_from is read by vitjax.models.checkpoints.load_params.) Raises ConfigError naming the
  problem: a missing or unreadable file, weights of another model family, a hub repository not cached offline.
  """
  source = WeightSource.parse(spec)
  kind, name, path = source.kind, source.name, source.path
  if not source.imported:
    raise ConfigError(f"init_from={spec!r}: use a vitjax workdir, 'timm:NAME:FILE', 'npz:FILE' or 'hf:ORG/NAME'")
  if kind == "hf":
    module, variables, _ = from_hub(spec)
    fields = ", ".join(f"{k}={v!r}" for k, v in model_config(module).items())
    logging.info(
      "init_from %s is %s(%s); config.model with those fields builds the same network (config.model is what trains)",
      spec,
      type(module).__name__,
      fields,
    )
    return variables["params"]
  if not os.path.isfile(path):
    form = "'timm:NAME:FILE'" if kind == "timm" else "'npz:FILE' or 'npz:VARIANT:FILE'"
    raise ConfigError(f"init_from={spec!r}: no such file {path!r} (the form is {form})")
  if kind == "npz":
    try:
      return from_vit_npz(path, name or None)[1]["params"]
    except Exception as e:
      raise _load_error(spec, path, e) from None
  if path.endswith(".npz"):  # timm's files are .safetensors or .pth / .bin; an .npz is the original ViT's layout
    raise ConfigError(f"init_from={spec!r}: {path} is an .npz: the original ViT's or big_vision's weights: npz:{path}")
  sd = _read_state_dict(f"init_from={spec!r}", path)
  try:
    return from_timm(name, sd, num_heads=exported_heads(path))[1]["params"]
  except Exception as e:
    raise _load_error(spec, path, e) from None


def exported_heads(path: str) -> int | None:
  """The ViT's head count in the `.json` beside a timm file that vitjax's export wrote, or None.

  FILE.json for FILE.safetensors; None where there is no such file or it is not a ViT's. The weights cannot give the
  heads, and a timm name gives only its size's.
  """
  json_path = os.path.splitext(path)[0] + ".json"
  try:
    with open(json_path) as f:
      cfg = json.load(f)
    heads = cfg["kwargs"]["num_heads"] if cfg.get("model") in ("vit", "vit_hybrid") else None
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return None
  if heads is not None and (not isinstance(heads, int) or isinstance(heads, bool) or heads < 1):
    raise ConfigError(
      f"{json_path}, beside the weights: num_heads={heads!r} must be a whole number >= 1; export the weights again, "
      "or remove the file (the weights' timm name then gives the heads)"
    )
  if heads is not None:
    logging.info("%d heads, from %s beside the weights", heads, json_path)
  return heads


def _read_state_dict(what: str, path: str) -> dict:
  """A state dict from .safetensors (numpy), or from .pth / .bin with torch; ConfigError if it is not readable."""
  try:
    if path.endswith(".safetensors"):
      from safetensors.numpy import load_file

      return load_file(path)
    try:
      import torch  # a .pth / .bin state dict
    except ImportError:
      raise ConfigError(f"reading {path} needs torch (pip install torch), or convert it to .safetensors") from None
    _check_torch(torch.__version__, path)
    return torch.load(path, map_location="cpu", weights_only=True)
  except ConfigError:
    raise
  except pickle.UnpicklingError:  # torch's weights_only refusal: the pickle names code or objects beyond tensors
    raise ConfigError(
      f"{what}: {path} carries code (its pickle calls functions or builds objects beyond tensors), and vitjax will "
      "not run it; get the weights as .safetensors, or ask who made the file"
    ) from None
  except Exception as e:  # a truncated or garbage file
    raise ConfigError(
      f"{what}: {path} is not a readable {os.path.splitext(path)[1] or 'weights'} file "
      f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
    ) from None


TORCH_SAFE = (2, 6)  # the first torch whose weights_only load runs no code (CVE-2025-32434)


def _check_torch(version: str, path: str) -> None:
  """ConfigError for a torch whose `weights_only` load can still run a pickle's code."""
  have = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
  if have < TORCH_SAFE:
    raise ConfigError(
      f"{path} is a pickle, which can carry code; torch {version} can run it even with weights_only=True "
      "(CVE-2025-32434): install torch>=2.6, or get the weights as .safetensors"
    )


def _load_error(spec: str, path: str, e: Exception) -> Exception:

  if isinstance(e, ConfigError):
    return e
  if isinstance(e, KeyError | ValueError):  # weights of another family or variant
    return ConfigError(f"init_from={spec!r}: {str(e).strip(chr(34) + chr(39)).splitlines()[0]}")
  return ConfigError(  # a truncated or garbage file
    f"init_from={spec!r}: {path} is not a readable {os.path.splitext(path)[1] or 'weights'} file "
    f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
  )
