"""The ViT in the original JAX release's `.npz` layout and big_vision's, both ways.

The original: google-research/vision_transformer, Transformer/encoderblock_N/MultiHeadDotProductAttention_1, ...;
big_vision's: scanned or not, MAP heads, SigLIP's params/img/ image tower.

read(path_or_mapping, variant, act) -> (module, variables); write(module, variables) -> flat arrays for np.savez.
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Mapping
from typing import Any

import flax
import numpy as np

from vitjax.models import convert_util as u
from vitjax.models import vit as vit_lib

LAYOUTS = {
  "vit-npz": "the original JAX ViT .npz (Transformer/encoderblock_N/MultiHeadDotProductAttention_1, ...); "
  "big_vision ViT .npz (pos_embedding, Transformer/encoderblock[_N], MAPHead_0; SigLIP's params/img/...)"
}


def detect(keys: set[str]) -> str | None:
  """The layout "vit-npz" if the keys are those of a ViT .npz, else None.

  The original release's and big_vision's layouts are recognised, SigLIP's image tower (params/img/...) included.
  """
  keys = {k.removeprefix("params/").removeprefix("img/") for k in keys}
  if "conv_root/kernel" in keys:  # a hybrid's ResNet stem: vitjax.models.vit_hybrid_npz
    return None
  if any(k.startswith("Transformer/encoderblock") for k in keys):
    return "vit-npz"
  return None


def load_npz(path_or_mapping) -> dict[str, np.ndarray]:
  """Flat '/'-keyed arrays from an .npz path or a (nested or flat) mapping.

  big_vision's "params/" prefix and SigLIP's two-tower "img/" prefix are taken off (the text tower, "t" and "b" are left
  out).
  """
  if isinstance(path_or_mapping, Mapping):
    flat = dict(path_or_mapping)
  else:
    with open(path_or_mapping, "rb") as f:
      if f.read(4) != b"PK\x03\x04":  # an .npz is a zip archive (np.load would speak of pickled data)
        raise ValueError(f"{path_or_mapping} is not an .npz file (numpy.savez's zip archive of arrays)")
      f.seek(0)
      check_npz(f, os.path.getsize(path_or_mapping), str(path_or_mapping))
      f.seek(0)
      flat = dict(np.load(f, allow_pickle=False))
  if any(isinstance(v, Mapping) for v in flat.values()):  # a nested tree
    flat = flax.traverse_util.flatten_dict(flat, sep="/")
  flat = {k.removeprefix("params/"): v for k, v in flat.items()}
  if any(k.startswith("img/") for k in flat):
    flat = {k[len("img/") :]: v for k, v in flat.items() if k.startswith("img/")}
  # big_vision's scanned encoder: one "encoderblock" subtree stacked along a leading layer axis
  scanned = {k: v for k, v in flat.items() if k.startswith("Transformer/encoderblock/")}
  for k, v in scanned.items():
    del flat[k]
    for i in range(v.shape[0]):
      flat[k.replace("encoderblock/", f"encoderblock_{i}/", 1)] = v[i]
  return flat


MAX_RATIO = 8  # what an .npz may hold per byte of file: np.savez stores arrays as they are, savez_compressed ~1.1x


def check_npz(f, file_bytes: int, name: str) -> None:
  """ValueError, before any array is unpacked, for an .npz whose zip headers claim more than its file can hold.

  Each member's size in the zip directory must be its array header's shape and dtype (a mismatch: a damaged or forged
  file); all of them together at most MAX_RATIO times the file's size (a zip bomb) and the machine's RAM.
  """
  try:
    archive = zipfile.ZipFile(f)  # (its central directory, read once)
    claimed = 0
    for info in archive.infolist():
      with archive.open(info) as m:
        version = np.lib.format.read_magic(m)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(m)
        data = math.prod(shape) * dtype.itemsize
        if info.file_size != m.tell() + data:
          raise ValueError(f"member {info.filename} says {info.file_size} bytes, its array {shape} {dtype} {data}")
      claimed += info.file_size
  except (zipfile.BadZipFile, ValueError, EOFError, OSError) as e:
    raise ValueError(f"{name} is not a readable .npz ({e}); download or export it again") from None
  ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  if claimed > MAX_RATIO * file_bytes + 2**20 or claimed > ram:
    raise ValueError(
      f"{name} claims {claimed / 2**30:.3g} GiB of arrays in a {file_bytes / 2**20:.3g} MiB file (RAM "
      f"{ram / 2**30:.3g} GiB): a zip bomb or a damaged file, not unpacked; download or export it again"
    )


_POSEMB_KEYS = ("Transformer/posembed_input/pos_embedding", "Transformer/pos_embedding", "pos_embedding")


def _check_variant(variant: str, cfg: dict) -> None:
  """ValueError naming what differs when the weights are not the ViT variant ("B/16") the caller asked for."""
  want = vit_lib.parse_variant(variant)
  diff = {k: (want[k], cfg[k]) for k in ("width", "mlp_dim", "num_heads") if want[k] != cfg[k]}
  if tuple(want["patch_size"]) != cfg["patch_size"]:
    diff["patch_size"] = (want["patch_size"], cfg["patch_size"])
  if diff:
    raise ValueError(
      f"the checkpoint is not a {variant}: " + ", ".join(f"{k} {a} != {b}" for k, (a, b) in diff.items())
    )


def read(path_or_mapping, variant: str | None = None, act: str = "gelu_tanh"):
  """(module, variables) from an `.npz` of the original JAX ViT release or of big_vision.

  The original: google-research/vision_transformer. For big_vision: scanned or not; class token, GAP or MAP head;
  learned or sin-cos 2-D positions; SigLIP's `params/img/` image tower, whose head is the projection into the joint
  embedding.

  path_or_mapping: an `.npz` path or a mapping of its keys ("Transformer/encoderblock_0/
  MultiHeadDotProductAttention_1/query/kernel", ...). The architecture (width, depth, heads, MLP size, patch,
  pooling, positions, classes, pre-logits) is read from the weights; `variant` ("B/16"), if given, is checked
  against them. act: both sources trained with flax's `nn.gelu`, the tanh approximation ("gelu_tanh"); the
  exact GELU moves logits by about 1e-4 relative. Without a class token or MAP head, pooling is "gap"
  (big_vision's pool_type "0" and "none" leave no trace in the weights).
  """
  flat = load_npz(path_or_mapping)
  if detect(set(flat)) is None:
    raise u.unknown_layout(flat, "not an original-ViT or big_vision checkpoint")
  r = u.Reader(flat)
  cfg, out, grid = read_vit(r, act, variant and (lambda cfg: _check_variant(variant, cfg)))
  r.check_all_used("from_vit_npz")
  return u.finish(vit_lib.ViT(**cfg), out, (grid * cfg["patch_size"][0], grid * cfg["patch_size"][1]))


def read_vit(r: u.Reader, act: str, check=None) -> tuple[dict, dict[str, np.ndarray], int]:
  """The ViT part of a release or big_vision `.npz`: (ViT keyword arguments, flax-named parameters, the grid's side).

  Long: every key of the release's layout mapped in one place, as the format lists them.

  What read() and the hybrid's reader (vitjax.models.vit_hybrid_npz) share: the patch embedding, class token,
  positions, encoder, pooling, pre-logits and head. check(cfg), if given, runs on the sizes before the rest is read.
  """
  blocks = sorted({int(k.split("/")[1].split("_")[-1]) for k in r.arrays if k.startswith("Transformer/encoderblock_")})
  if not blocks or "embedding/kernel" not in r:
    raise u.unknown_layout(r.arrays, "not an original-ViT or big_vision checkpoint")
  kernel = r.arrays["embedding/kernel"]  # [p, p, C, D]
  first = f"Transformer/encoderblock_{blocks[0]}"
  attn0 = next(k for k in r.arrays if k.startswith(first + "/MultiHeadDotProductAttention_") and "query/kernel" in k)
  dense0 = next(k for k in r.arrays if k.startswith(first + "/MlpBlock_") and k.endswith("Dense_0/kernel"))
  cfg: dict[str, Any] = dict(
    width=kernel.shape[-1],
    depth=len(blocks),
    mlp_dim=r.arrays[dense0].shape[1],
    num_heads=r.arrays[attn0].shape[1],
    patch_size=tuple(kernel.shape[:2]),
    act=act,
  )
  if check is not None:
    check(cfg)
  has_map = any(k.startswith("MAPHead_0/") for k in r.arrays)
  cfg["pool_type"] = "map" if has_map else "tok" if "cls" in r else "gap"
  cfg["num_classes"] = r.arrays["head/kernel"].shape[-1] if "head/kernel" in r else 0
  if "pre_logits/kernel" in r:
    cfg["representation_size"] = r.arrays["pre_logits/kernel"].shape[-1]

  out: dict[str, np.ndarray] = {"embedding/kernel": r("embedding/kernel"), "embedding/bias": r("embedding/bias")}
  if "cls" in r:
    out["cls"] = r("cls")
  pe_key = next((k for k in _POSEMB_KEYS if k in r), None)
  if pe_key is None:
    cfg["posemb"] = "sincos2d"
    grid = 4
  else:
    pe = r(pe_key)
    n = pe.shape[1]
    cls_row = "cls" in r and not u.is_square(n) and u.is_square(n - 1)
    if "cls" in r and not cls_row:  # big_vision adds positions to the patches only: a zero row for the token
      pe = np.concatenate([np.zeros_like(pe[:, :1]), pe], axis=1)
    out["posembed/pos_embedding"] = pe
    grid = math.isqrt(n - cls_row)
  for i in blocks:
    src, dst = f"Transformer/encoderblock_{i}", f"encoder/block_{i}"
    names = sorted({k[len(src) + 1 :].split("/")[0] for k in r.arrays if k.startswith(src + "/")})
    norms = sorted((n for n in names if n.startswith("LayerNorm_")), key=lambda n: int(n.split("_")[1]))
    attn = [n for n in names if n.startswith("MultiHeadDotProductAttention_")]
    mlp = [n for n in names if n.startswith("MlpBlock_")]
    if len(norms) != 2 or len(attn) != 1 or len(mlp) != 1:
      raise ValueError(f"unexpected layout in {src}: {names}")
    for k, name in enumerate(norms):
      u.copy_tree(r, f"{src}/{name}", f"{dst}/norm{k + 1}", out)
    u.copy_tree(r, f"{src}/{attn[0]}", f"{dst}/attn", out, ("query", "key", "value", "out"))
    u.copy_tree(r, f"{src}/{mlp[0]}", f"{dst}/mlp", out, ("Dense_0", "Dense_1"), ("fc1", "fc2"))
  u.copy_tree(r, "Transformer/encoder_norm", "encoder/final_norm", out)
  if has_map:
    out["map_head/probe"] = r("MAPHead_0/probe")
    u.copy_tree(r, "MAPHead_0/MultiHeadDotProductAttention_0", "map_head/attn", out, ("query", "key", "value", "out"))
    u.copy_tree(r, "MAPHead_0/LayerNorm_0", "map_head/norm", out)
    u.copy_tree(r, "MAPHead_0/MlpBlock_0", "map_head/mlp", out, ("Dense_0", "Dense_1"), ("fc1", "fc2"))
  for name in ("pre_logits", "head"):
    if f"{name}/kernel" in r:
      u.copy_tree(r, name, name, out)
  return cfg, out, grid


def write(module, variables) -> dict[str, np.ndarray]:
  """The flat '/'-keyed arrays of the original JAX ViT release's `.npz` (`np.savez(path, **arrays)`).

  For a vitjax ViT with learned positions and a class token or GAP. read() (convert.from_vit_npz) reads it back (pass
  act=module.act: the original ViT code itself uses tanh GELU).
  """
  u.unsupported(
    module,
    "the original ViT",
    stem=("patch",),
    posemb=("learn",),
    pool_type=("tok", "gap"),
    fc_norm=(False,),
    scan=(False,),
    norm=("pre",),
    embed_norm=(False,),
    rel_pos_bias=(False,),
    qkv_bias=(True,),  # the original's attention always has them: its readers need them
    layernorm_eps=(1e-6,),  # the original's LayerNorm; the file holds no other
  )
  p = u.flat_params(variables["params"])
  out = {"embedding/kernel": p["embedding/kernel"], "embedding/bias": p["embedding/bias"]}
  if "cls" in p:
    out["cls"] = p["cls"]
  out["Transformer/posembed_input/pos_embedding"] = p["posembed/pos_embedding"]
  names = {"norm1": "LayerNorm_0", "attn": "MultiHeadDotProductAttention_1", "norm2": "LayerNorm_2"}
  for i in range(module.depth):
    src, dst = f"encoder/block_{i}/", f"Transformer/encoderblock_{i}/"
    for k, v in p.items():
      if k.startswith(src):
        rest = k[len(src) :]
        first, tail = rest.split("/", 1)
        if first == "mlp":
          tail = tail.replace("fc1", "Dense_0").replace("fc2", "Dense_1")
          out[dst + "MlpBlock_3/" + tail] = v
        else:
          out[dst + names[first] + "/" + tail] = v
  for s in ("scale", "bias"):
    out[f"Transformer/encoder_norm/{s}"] = p[f"encoder/final_norm/{s}"]
  for name in ("pre_logits", "head"):
    for s in ("kernel", "bias"):
      if f"{name}/{s}" in p:
        out[f"{name}/{s}"] = p[f"{name}/{s}"]
  return out
