"""Pretrained models from the Hugging Face hub by name, for `config.init_from` and `vitjax.load`.

Names: 'hf:ORG/NAME' or 'hf:ORG/NAME@REVISION' (a branch, tag or commit).

Files come through `huggingface_hub` (hf_hub_download), so its cache, HF_HOME / HF_HUB_CACHE, HF_TOKEN and
HF_HUB_OFFLINE apply: a repository downloaded once loads offline. Where the hub's host does not answer (no network, and
no proxy set) the cache alone is read, at once: huggingface_hub would retry for about 20 s first. Two layouts are read, told apart by config.json:

  timm          (hf:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k, ...): config.json's `architecture`,
                `num_classes`, `label_names` and `pretrained_cfg` (mean, std, crop_pct, interpolation,
                input_size); the weights in timm's layout (vitjax.models.vit_timm, swin_timm)
  transformers  (hf:google/vit-base-patch16-224, hf:microsoft/swin-tiny-patch4-window7-224): config.json's
                `model_type` "vit" or "swin" and the architecture, `id2label`; preprocessor_config.json's
                image_mean, image_std, size, resample, crop; weights in vitjax.models.vit_hf / swin_hf's layout

Weights are model.safetensors, else pytorch_model.bin (read with torch). Every problem (not cached while offline,
no such repository or revision, another kind of model) is a vitjax.errors.ConfigError of one line.

    repo = hub.open_repo("hf:google/vit-base-patch16-224")   # config.json (+ preprocessor_config.json)
    repo.preprocess(), repo.image_size(), repo.class_names(), repo.weights_file()
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import socket
import urllib.parse
from collections.abc import Mapping
from typing import Any

from absl import logging

from vitjax.errors import ConfigError
from vitjax.models import registry

PREFIX = "hf:"
FORM = "hf:ORG/NAME or hf:ORG/NAME@REVISION"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
# PIL's resampling codes in preprocessor_config.json's `resample`
_RESAMPLE = {2: "bilinear", 3: "bicubic"}
_PIL_NAMES = {0: "nearest", 1: "lanczos", 4: "box", 5: "hamming"}
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def parse(spec: str) -> tuple[str, str | None]:
  """'hf:ORG/NAME[@REVISION]' -> (repository id, revision or None for the default branch)."""
  rest = spec[len(PREFIX) :] if spec.startswith(PREFIX) else spec
  repo_id, _, revision = rest.partition("@")
  if not repo_id or (revision == "" and "@" in rest):
    raise ConfigError(f"{spec!r}: give a repository, {FORM}")
  return repo_id, revision or None


def timm_pretrained_preprocess(cfg: Mapping[str, Any]) -> dict:
  """{"mean", "std", "crop_fraction", "interpolation"} of a timm pretrained config.

  The config: timm's PretrainedCfg as a dict, or config.json's `pretrained_cfg`. An interpolation vitjax lacks becomes
  bicubic, timm's default.
  """
  interpolation = cfg.get("interpolation")
  out = {
    "mean": tuple(float(m) for m in cfg["mean"]) if cfg.get("mean") is not None else None,
    "std": tuple(float(s) for s in cfg["std"]) if cfg.get("std") is not None else None,
    "crop_fraction": float(cfg["crop_pct"]) if cfg.get("crop_pct") is not None else None,
    "interpolation": interpolation if interpolation in ("bilinear", "bicubic") else "bicubic",
  }
  return out


@dataclasses.dataclass(frozen=True)
class Repo:
  """A hub repository's configuration: where it is, which layout, and what it says about its model."""

  spec: str  # "hf:ORG/NAME[@REVISION]"
  repo_id: str
  revision: str | None  # as asked for (None: the default branch)
  commit: str | None  # the snapshot the files come from (None if the cache layout does not say)
  layout: str  # "timm" | "transformers"
  config: dict  # config.json
  preprocessor: dict | None = None  # preprocessor_config.json (transformers), None if the repository has none

  @property
  def timm_name(self) -> str:
    """The timm model name with its pretrained tag ("vit_base_patch16_224.augreg2_in21k_ft_in1k")."""
    tag = (self.config.get("pretrained_cfg") or {}).get("tag")
    return f"{self.config['architecture']}.{tag}" if tag else self.config["architecture"]

  @property
  def model_type(self) -> str:
    """The model type: "timm" for a timm repository, else config.json's model_type ("vit", "swin", ...; or "")."""
    return "timm" if self.layout == "timm" else self.config.get("model_type", "")

  def weights_file(self) -> str:
    """The local path of the weights (model.safetensors, else pytorch_model.bin), downloaded if need be."""
    cached_only = False
    for name in WEIGHTS:
      try:
        return _download(self, name)
      except _Missing as m:
        cached_only |= m.cached_only
    if cached_only:
      raise _not_cached(self.spec, WEIGHTS[0])
    raise ConfigError(f"{self.spec}: the repository has neither {' nor '.join(WEIGHTS)} (sharded weights are not read)")

  def preprocess(self) -> dict:
    """{"mean", "std", "crop_fraction", "interpolation"} the model was trained with (augment.Preprocess's fields).

    A transformers repository's also has "crop_offset": "floor", where its image processors start the centre crop.
    """
    if self.layout == "timm":
      return timm_pretrained_preprocess(self.config.get("pretrained_cfg") or {})
    return self._transformers_input()[0]

  def image_size(self) -> tuple[int, int]:
    """The input (height, width) the model was trained at."""
    if self.layout == "timm":
      size = (self.config.get("pretrained_cfg") or {}).get("input_size") or (3, 224, 224)
      return int(size[1]), int(size[2])
    return self._transformers_input()[1]

  def class_names(self, num_classes: int) -> list[str] | None:
    """The classes' names when config.json has them for all `num_classes`; else None.

    From timm's label_names or transformers' id2label; transformers' placeholders LABEL_0, LABEL_1, ... are no names.
    """
    c = self.config
    names = c.get("label_names") or (c.get("pretrained_cfg") or {}).get("label_names") or c.get("id2label")
    if isinstance(names, Mapping):
      try:
        names = [names.get(str(i), names.get(i)) for i in range(num_classes)]
      except TypeError:
        return None
    if not isinstance(names, list | tuple) or len(names) != num_classes or any(n is None for n in names):
      return None
    names = [str(n) for n in names]
    return None if names == [f"LABEL_{i}" for i in range(num_classes)] else names

  def _transformers_input(self) -> tuple[dict, tuple[int, int]]:
    """From preprocessor_config.json: (preprocess fields, the model's input size).

    Without one, transformers' ViTImageProcessor defaults. `size` {height, width} (or an int) resizes the whole image;
    {shortest_edge} with a centre crop (crop_size, or crop_pct) resizes the shorter side and crops, as vitjax's
    crop_fraction does.
    """
    pre, c = self.preprocessor or {}, self.config
    channels = int(c.get("num_channels", 3))
    mean, std = pre.get("image_mean", [0.5] * channels), pre.get("image_std", [0.5] * channels)
    if not pre.get("do_normalize", True):
      mean, std = [0.0] * channels, [1.0] * channels
    mean = [float(mean)] * channels if isinstance(mean, int | float) else mean
    std = [float(std)] * channels if isinstance(std, int | float) else std
    resample = pre.get("resample", 2)
    interpolation = _RESAMPLE.get(resample)
    if interpolation is None:
      logging.warning(
        "%s: preprocessor_config.json resamples with PIL's %s, which vitjax does not have: bicubic is used",
        self.spec,
        _PIL_NAMES.get(resample, resample),
      )
      interpolation = "bicubic"
    size = pre.get("size", c.get("image_size", 224))
    crop = pre.get("crop_size") if pre.get("do_center_crop") else None
    crop_fraction = None
    if isinstance(size, int) and crop is None:
      hw = (size, size)
    elif isinstance(size, Mapping) and "height" in size and crop is None:
      hw = (int(size["height"]), int(size["width"]))
    else:  # the shorter side to `shortest`, then a centre crop
      shortest = size if isinstance(size, int) else size.get("shortest_edge") or min(size.values())
      if crop is not None:
        hw = (crop, crop) if isinstance(crop, int) else (int(crop["height"]), int(crop["width"]))
        crop_fraction = min(hw) / shortest
      elif pre.get("crop_pct"):  # ConvNeXt's: the shorter side to shortest / crop_pct, crop shortest
        hw, crop_fraction = (shortest, shortest), float(pre["crop_pct"])
      else:
        hw, crop_fraction = (shortest, shortest), 1.0
    fields = {
      "mean": tuple(float(m) for m in mean),
      "std": tuple(float(s) for s in std),
      "crop_fraction": crop_fraction,
      "interpolation": interpolation,
      "crop_offset": "floor",  # transformers' centre crop starts at (resized - size) // 2
    }
    return fields, hw


def open_repo(spec: str) -> Repo:
  """The repository `spec` names ('hf:ORG/NAME[@REVISION]'), from the hub or its cache.

  Its config.json, and for the transformers layout its preprocessor_config.json. ConfigError (one line) for a repository
  vitjax cannot read, or one that is not cached while HF_HUB_OFFLINE is set.
  """
  repo_id, revision = parse(spec)
  probe = Repo(spec, repo_id, revision, None, "", {})
  try:
    path = _download(probe, "config.json")
  except _Missing as m:
    if m.cached_only:
      raise _not_cached(spec, "config.json") from None
    raise ConfigError(f"{spec}: the repository has no config.json: {_KNOWN}") from None
  commit = path.replace("\\", "/").split("/")[-2]
  commit = commit if _COMMIT.match(commit) else None
  try:
    with open(path, encoding="utf-8") as f:
      config = json.load(f)
    if not isinstance(config, dict):
      raise ValueError("not a JSON object")
  except (OSError, ValueError) as e:
    raise ConfigError(f"{spec}: config.json is not readable ({type(e).__name__}: {str(e)[:200]})") from None
  model_types = supported_model_types()
  if isinstance(config.get("architecture"), str):
    layout = "timm"
  elif config.get("model_type") in model_types:
    layout = "transformers"
  else:
    what = f"model_type {config['model_type']!r}" if "model_type" in config else "no 'architecture' or 'model_type'"
    raise ConfigError(f"{spec}: an unknown hub layout (config.json has {what}): {_KNOWN}")
  repo = Repo(spec, repo_id, revision, commit, layout, config)
  if layout == "transformers":
    try:
      pre_path = _download(repo, "preprocessor_config.json")
      with open(pre_path, encoding="utf-8") as f:
        repo = dataclasses.replace(repo, preprocessor=json.load(f))
    except _Missing as m:
      if m.cached_only:
        logging.warning(
          "%s: preprocessor_config.json is not in the hub cache (offline): transformers' defaults are used",
          spec,
        )
    except (OSError, ValueError) as e:
      raise ConfigError(f"{spec}: preprocessor_config.json is not readable ({type(e).__name__})") from None
  return repo


def supported_model_types() -> dict[str, str]:
  """Map from transformers' model_type to the vitjax family that reads it (the families' "hf" converters)."""
  return {t: f.name for f in registry.families_with("hf") for t in f.converter("hf").MODEL_TYPES}


_KNOWN = (
  "vitjax reads timm's ViT and Swin repositories (config.json with 'architecture') and transformers' ViT, DINOv2, "
  "SigLIP's image tower and Swin (model_type 'vit', 'dinov2', 'dinov2_with_registers', 'siglip_vision_model', "
  "'siglip', 'swin')"
)


class _Missing(Exception):
  """A file the repository does not have, or (cached_only) one that is not in the cache and cannot be fetched."""

  def __init__(self, filename: str, cached_only: bool):
    super().__init__(filename)
    self.cached_only = cached_only


def _hub():
  try:
    import huggingface_hub
  except ImportError:
    raise ConfigError("hf: weights need huggingface_hub (pip install huggingface_hub)") from None
  return huggingface_hub


def cache_dir() -> str:
  """huggingface_hub's cache folder (HF_HUB_CACHE, or HF_HOME/hub)."""
  return _hub().constants.HF_HUB_CACHE


def offline() -> bool:
  """Whether huggingface_hub is in offline mode (HF_HUB_OFFLINE set): nothing is downloaded."""
  return bool(_hub().constants.is_offline_mode())


def _not_cached(spec: str, filename: str) -> ConfigError:
  if offline():
    return ConfigError(
      f"{spec}: {filename} is not in the hub cache {cache_dir()} and HF_HUB_OFFLINE is set: download it once "
      "with HF_HUB_OFFLINE unset, or point HF_HOME (or HF_HUB_CACHE) at a cache that has it"
    )
  return ConfigError(
    f"{spec}: the hub cannot be reached and {filename} is not in the hub cache {cache_dir()}: check the "
    "connection (or HF_ENDPOINT), or set HF_HUB_OFFLINE=1 with HF_HOME pointing at a cache that has it"
  )


REACH_TIMEOUT_S = 3.0


@functools.cache
def reachable() -> bool:
  """Whether the hub's host (HF_ENDPOINT's) takes a TCP connection within REACH_TIMEOUT_S; asked once a process.

  True where a proxy is set (the proxy decides) or the question cannot be put; False logs one warning.
  """
  if any(
    os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
  ):
    return True
  url = urllib.parse.urlparse(_hub().constants.ENDPOINT)
  if not url.hostname:
    return True
  try:
    socket.create_connection((url.hostname, url.port or (80 if url.scheme == "http" else 443)), REACH_TIMEOUT_S).close()
    return True
  except OSError as e:
    logging.warning("the hub %s cannot be reached (%s): reading the hub cache only", url.netloc, e.strerror or e)
    return False


def _download(repo: Repo, filename: str) -> str:
  """The local path of `filename` at the repository's commit (or asked-for revision).

  _Missing if the repository does not have it or it cannot be had; ConfigError for a bad repository, revision or access.
  """
  hub = _hub()
  from huggingface_hub import errors

  spec = repo.spec
  try:
    return hub.hf_hub_download(
      repo.repo_id,
      filename,
      revision=repo.commit or repo.revision,
      library_name="vitjax",
      local_files_only=offline() or not reachable(),
    )
  except errors.HFValidationError as e:
    raise ConfigError(f"{spec}: {str(e).strip().splitlines()[0]} (the form is {FORM})") from None
  except errors.RevisionNotFoundError:
    raise ConfigError(f"{spec}: the repository has no revision {repo.revision!r}") from None
  except errors.RepositoryNotFoundError:  # GatedRepoError too
    raise ConfigError(
      f"{spec}: no such repository on the hub, or it is private or gated (log in with `hf auth login` or set HF_TOKEN)"
    ) from None
  except errors.LocalEntryNotFoundError:  # offline, or the hub unreachable, and not in the cache
    raise _Missing(filename, cached_only=True) from None
  except errors.EntryNotFoundError:  # the repository has no such file
    raise _Missing(filename, cached_only=False) from None
  except (errors.HfHubHTTPError, OSError) as e:
    line = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    raise ConfigError(f"{spec}: fetching {filename} failed ({type(e).__name__}: {line})") from None
