"""The ViT in timm's layouts (VisionTransformer: patch_embed.proj, blocks.N.attn.qkv, ...; Eva's), both ways.

read(name, state_dict) -> (module, variables); write(module, params, image_size) -> (state_dict, timm config).
The name (or num_heads) gives the heads, the weights the rest; activation: exact GELU, as timm builds these models
(but SigLIP 2's so400m/16, giantopt, B/32 and L/16 at 512 px: the tanh form, GELU_TANH).
timm's Eva (EVA-02) is a ViT with other names for a few parameters (q_bias and v_bias, or q_proj, k_proj and v_proj;
gamma_1, gamma_2; the sub-LayerNorms mlp.norm, attn.norm): read here too; its rotary embedding the name gives. A ViT
that timm's VisionTransformer cannot build (SwiGLU, rotary positions, sub-LayerNorms) is written as an Eva
(vitjax.models.vit_timm_eva).
"""

from __future__ import annotations

import math
import re

import numpy as np

from vitjax import posenc
from vitjax.models import convert_util as u
from vitjax.models import vit as vit_lib

# timm's names of the ViTs read here: vit_SIZE_patchP_[clip_|gap_|siglip_|regN_]IMAGE (AugReg, CLIP, SigLIP, timm's
# register ViTs), deit_SIZE_[distilled_]patchP_IMAGE (DeiT, with its distillation token), deit3_SIZE_patchP_IMAGE (DeiT III), vit_SIZE_patch14_[reg4_]dinov2 (DINOv2: its weights give the size),
# eva02_SIZE_patchP_[clip_]IMAGE (EVA-02, timm's Eva: 2-D rotary positions over a 16 x 16 reference grid); SigLIP 2's
# image towers are timm's vit_*_siglip_* too (their .v2_webli weights), with the sizes so400m and giantopt
NAMES = re.compile(
  r"^(?:vit|deit3?|(?P<eva02>eva02))_(?P<size>tiny|small|small_plus|medium|base|large|huge|huge_plus|giant|so400m|giantopt)"
  r"(?:_distilled)?_patch(?P<patch>\d+)_(?:(?:clip|gap|siglip|reg\d+)_)*(?:(?P<image>\d+)|dinov2|(?P<dinov3>dinov3))"
)
EVA02_ROPE = dict(rope="axial", rope_grid=(16, 16))  # every EVA-02's (timm's ref_feat_shape: 224 px / 14)
_SIZES = {"tiny": "Ti", "small": "S", "medium": "M", "base": "B", "large": "L", "huge": "H"}
# heads of the sizes VARIANTS lacks: DINOv2's giant (1536 wide; not the ViT-g of Zhai et al.), SigLIP's so400m (1152)
# and SigLIP 2's giantopt (1536)
_HEADS = {"giant": 24, "so400m": 16, "giantopt": 16, "small_plus": 6, "huge_plus": 20}  # (and DINOv3's S+, H+)
# DINOv3 (timm's Eva): its rotary embedding alone gives positions; LayerNorm's epsilon 1e-5; timm averages the patches
DINOV3 = dict(
  rope="dinov3", rope_temperature=100.0, posemb="none", layernorm_eps=1e-5, pool_type="gap", class_token=True
)
# the SigLIP towers timm builds with the tanh GELU (SigLIP 2's new shapes); every other ViT here: exact GELU
GELU_TANH = re.compile(
  r"^vit_(base_patch32_siglip|giantopt_patch16_siglip|large_patch16_siglip(_gap)?_512|so400m_patch16)"
)
LAYOUTS = {"timm-vit": "timm ViT or Eva (patch_embed.proj, blocks.N.attn.qkv or .q_proj, ...)"}
READS = ("timm-vit",)  # the layouts read() takes


def detect(keys: set[str]) -> str | None:
  """The layout "timm-vit" if the state dict's keys are those of timm's VisionTransformer or Eva, else None.

  A hybrid's (a ResNet backbone under patch_embed) is vitjax.models.vit_hybrid_timm's.
  """
  if any(k.startswith("patch_embed.backbone.") for k in keys):
    return None
  return "timm-vit" if {"blocks.0.attn.qkv.weight", "blocks.0.attn.q_proj.weight"} & keys else None


def read(state_dict, layout: str, timm_name: str, num_heads: int | None = None):
  """(module, variables) of timm ViT `timm_name` ("vit_base_patch16_224") from its (unwrapped) state dict.

  The heads: `num_heads`, or the name's.
  """
  del layout
  m = NAMES.match(timm_name.split(".")[0])
  r = u.Reader(state_dict)
  module, flat, hw = _read(m, r, num_heads)
  r.check_all_used(timm_name, u.TIMM_BUFFERS)
  return u.finish(module, flat, hw)


def _timm_attention_pool(r: u.Reader, heads: int, out: dict) -> None:
  """A timm AttentionPoolLatent (latent, q, fused kv, proj, norm, mlp) -> vitjax's MAPHead."""
  out["map_head/probe"] = r("attn_pool.latent")
  w, b = r("attn_pool.kv.weight"), r("attn_pool.kv.bias")
  d = w.shape[1]
  q_w, q_b = r("attn_pool.q.weight"), r("attn_pool.q.bias")
  for name, (wi, bi) in {"query": (q_w, q_b), "key": (w[:d], b[:d]), "value": (w[d:], b[d:])}.items():
    out[f"map_head/attn/{name}/kernel"] = u.split_heads(wi, heads)
    out[f"map_head/attn/{name}/bias"] = bi.reshape(heads, d // heads)
  out["map_head/attn/out/kernel"] = r("attn_pool.proj.weight").T.reshape(heads, d // heads, d)
  out["map_head/attn/out/bias"] = r("attn_pool.proj.bias")
  u.norm(r, "attn_pool.norm", "map_head/norm", out)
  u.timm_mlp(r, "attn_pool.mlp", "map_head/mlp", out)


def _read(m: re.Match, r: u.Reader, num_heads: int | None):
  grid = int(m["image"]) // int(m["patch"]) if m["image"] else None
  heads = _HEADS.get(m["size"]) or vit_lib.VARIANTS[_SIZES[m["size"]]][3]
  cfg, out = read_vit(r, num_heads or heads, grid)
  if GELU_TANH.match(m[0]):
    cfg["act"] = "gelu_tanh"
  if m["eva02"]:
    cfg.update(EVA02_ROPE)
  if m["dinov3"]:  # any image size (timm builds it with dynamic_img_size); 224 px, its pretrained configs'
    return vit_lib.ViT(**(cfg | DINOV3)), out, (224, 224)
  if m["image"]:  # the name's image size, as timm builds it
    return vit_lib.ViT(**cfg), out, (int(m["image"]),) * 2
  rows = out["posembed/pos_embedding"].shape[1]  # DINOv2's names give none: its table's grid does (518 px)
  tokens = int("cls_token" in r) + int("dist_token" in r) + cfg.get("num_registers", 0)
  prefix = tokens if cfg.get("class_posemb", True) else 0
  side = math.isqrt(rows - prefix) * cfg["patch_size"][0]
  return vit_lib.ViT(**cfg), out, (side, side)


def read_vit(r: u.Reader, heads: int, grid: int | None = None) -> tuple[dict, dict[str, np.ndarray]]:
  """The ViT part of a timm VisionTransformer state dict: (ViT keyword arguments, flax-named parameters).

  Long: timm's layout read key by key, in the order of timm's module, and every option the keys show.

  What read() and the hybrid's reader (vitjax.models.vit_hybrid_timm) share; heads: from the model's name or the
  caller; grid: the patch grid's side the name gives (None: the position table's). Raises ValueError when the heads
  do not divide the weights' width (timm's weights do not hold the head count).
  """
  kernel = r.arrays["patch_embed.proj.weight"]  # [D, C, p, p]
  if kernel.shape[0] % heads:
    raise ValueError(
      f"{heads} heads do not divide the weights' width {kernel.shape[0]}: the weights do not say how many heads "
      "they were trained with; give the number (from_timm's num_heads=, or the .json vitjax's export writes beside "
      "the file)"
    )
  variant = dict(num_heads=heads, width=kernel.shape[0], patch_size=tuple(kernel.shape[2:]))
  ffn = _ffn_layout(r)
  variant["mlp_dim"] = r.arrays["blocks.0.mlp.fc2.weight"].shape[1]
  depth = len({k.split(".")[1] for k in r.arrays if k.startswith("blocks.")})
  pool = "map" if "attn_pool.latent" in r else "tok" if "cls_token" in r else "gap"
  if (
    "blocks.0.attn.q_bias" in r or "blocks.0.attn.q_proj.weight" in r
  ):  # timm's Eva: fc_norm means the patches' average
    pool = "gap" if pool == "tok" and "fc_norm.weight" in r else pool
  cfg = dict(
    variant,
    **({"class_token": True} if pool != "tok" and "cls_token" in r else {}),
    depth=depth,
    pool_type=pool,
    fc_norm="fc_norm.weight" in r,
    num_classes=r.arrays["head.weight"].shape[0] if "head.weight" in r else 0,
    qkv_bias=bool({"blocks.0.attn.qkv.bias", "blocks.0.attn.q_bias", "blocks.0.attn.q_proj.bias"} & set(r.arrays)),
    act="silu" if ffn else "gelu",
    **({"ffn": "swiglu"} if ffn else {}),
    **({"ffn_norm": True} if "blocks.0.mlp.norm.weight" in r else {}),
    **({"attn_norm": True} if "blocks.0.attn.norm.weight" in r else {}),
    **({"key_bias": False} if {"blocks.0.attn.q_bias", "blocks.0.attn.q_proj.bias"} & set(r.arrays) else {}),
  )
  if "pre_logits.fc.weight" in r:
    cfg["representation_size"] = r.arrays["pre_logits.fc.weight"].shape[0]
  _read_tokens(r, cfg, grid)
  out: dict[str, np.ndarray] = {}
  u.conv(r, "patch_embed.proj", "embedding", out)
  if "cls_token" in r:
    out["cls"] = r("cls_token")
  if "dist_token" in r:  # DeiT's distillation token, and its head below
    out["dist"] = r("dist_token")
  if "reg_token" in r:
    out["registers"] = r("reg_token")
  if "pos_embed" in r:  # (DINOv3 has none)
    out["posembed/pos_embedding"] = r("pos_embed")
  for i in range(depth):
    _read_block(r, f"blocks.{i}", f"encoder/block_{i}", heads, cfg, ffn, out)
  u.norm(r, "fc_norm" if cfg["fc_norm"] else "norm", "fc_norm" if cfg["fc_norm"] else "encoder/final_norm", out)
  if pool == "map":
    _timm_attention_pool(r, heads, out)
  if "representation_size" in cfg:
    u.linear(r, "pre_logits.fc", "pre_logits", out)
  if cfg["num_classes"]:
    u.linear(r, "head", "head", out)
    if "dist_token" in r:
      u.linear(r, "head_dist", "head_dist", out)
  return cfg, out


def _read_block(r: u.Reader, s: str, d: str, heads: int, cfg: dict, ffn: str | None, out: dict) -> None:
  """The timm block `s` (norms, attention, feed-forward, LayerScale, QK-norm as cfg has them) into vitjax's `d`."""
  u.norm(r, f"{s}.norm1", f"{d}/norm1", out)
  _read_attention(r, f"{s}.attn", f"{d}/attn", heads, out)
  u.norm(r, f"{s}.norm2", f"{d}/norm2", out)
  if ffn == "packed":
    u.packed_swiglu(r, f"{s}.mlp.fc1", f"{s}.mlp.fc2", f"{d}/mlp", out)
  elif ffn == "split":
    for name in ("fc1_g", "fc1_x", "fc2"):
      u.linear(r, f"{s}.mlp.{name}", f"{d}/mlp/{name}", out)
  else:
    u.timm_mlp(r, f"{s}.mlp", f"{d}/mlp", out)
  for i, ls in enumerate(("ls1", "ls2") if "init_values" in cfg else (), 1):
    out[f"{d}/{ls}/scale"] = r(f"{s}.{ls}.gamma" if f"{s}.{ls}.gamma" in r else f"{s}.gamma_{i}")  # ViT's, Eva's
  for qk in ("q_norm", "k_norm") if "qk_norm" in cfg else ():
    u.norm(r, f"{s}.attn.{qk}", f"{d}/attn/{qk}", out)
  for sub in ("mlp.norm", "attn.norm"):
    if cfg.get({"mlp.norm": "ffn_norm", "attn.norm": "attn_norm"}[sub]):
      u.norm(r, f"{s}.{sub}", f"{d}/{sub.replace('.', '/')}", out)


def _read_attention(r: u.Reader, s: str, d: str, heads: int, out: dict) -> None:
  """The attention of timm: VisionTransformer's fused qkv (its bias fused too), or Eva's, q_bias and v_bias beside it.

  Or Eva's q_proj, k_proj and v_proj. Eva's keys have no bias (the ViT's key_bias=False).
  """
  if f"{s}.q_proj.weight" in r:
    names = {"query": f"{s}.q_proj", "key": f"{s}.k_proj", "value": f"{s}.v_proj", "out": f"{s}.proj"}
    u.separate_attention(r, names, d, heads, out)
  else:
    u.timm_attention(r, s, d, heads, out)
    if f"{s}.q_bias" in r:
      out[f"{d}/query/bias"], out[f"{d}/value/bias"] = (r(f"{s}.{n}_bias").reshape(heads, -1) for n in "qv")


def _ffn_layout(r: u.Reader) -> str | None:
  """The blocks' SwiGLU as timm stores it, or None for the two-layer Mlp.

  "split": SwiGLU's fc1_g and fc1_x; "packed": GluMlp's fc1 twice as wide as fc2's input (DINOv2-g). Its activation
  is SiLU (timm's SwiGLU and SwiGLUPacked).
  """
  if "blocks.0.mlp.fc1_g.weight" in r:
    return "split"
  fc1, fc2 = r.arrays.get("blocks.0.mlp.fc1.weight"), r.arrays["blocks.0.mlp.fc2.weight"]
  return "packed" if fc1 is not None and fc1.shape[0] == 2 * fc2.shape[1] else None


def _read_tokens(r: u.Reader, cfg: dict, grid: int | None) -> None:
  """Registers, LayerScale and where the position table's rows are, from the weights, into `cfg`.

  The table covers the class token and registers too (timm's default) unless it has as many rows as the patches
  (no_embed_class): grid x grid, or, without a grid, a square number that is not one plus the other tokens.
  LayerScale's initial value is not in the weights: DINOv2's 1e-5 (it matters only to a new model).
  """
  prefix = int("cls_token" in r)
  if "dist_token" in r:
    cfg["distill_token"] = True
    prefix += 1
  if "reg_token" in r:
    cfg["num_registers"] = int(r.arrays["reg_token"].shape[1])
    prefix += cfg["num_registers"]
  if "blocks.0.ls1.gamma" in r or "blocks.0.gamma_1" in r:
    cfg["init_values"] = 1e-5
  if "blocks.0.attn.q_norm.weight" in r:  # timm's qk_norm: its blocks' LayerNorm on each head's queries and keys
    cfg["qk_norm"] = "layernorm"
  if "pos_embed" not in r:
    return
  rows = r.arrays["pos_embed"].shape[1]
  square = lambda n: n >= 0 and math.isqrt(n) ** 2 == n
  patches_only = rows == grid * grid if grid else square(rows) and not square(rows - prefix)
  if prefix and patches_only:
    cfg["class_posemb"] = False


def write(module, p: dict, image_size) -> tuple[dict, dict]:
  """A vitjax ViT's parameters in timm's VisionTransformer layout.

  Long: timm's layout written key by key, in the order of timm's module.

  A fixed sin-cos position table (posemb "sincos2d") is written as timm's (learned) pos_embed, its values
  computed at `image_size`, with a zero row for the class token if there is one.

  Args:
    module: the ViT (patch stem, pre-norm, no representation layer, not scanned, no embedding norm or relative
      position bias; pool_type "tok", "gap" or "map").
    p: its parameters, flat {"a/b/kernel": numpy array} (`convert_util.flat_params`).
    image_size: (H, W) the timm model is built for.

  Returns:
    tuple: (state dict {timm key: numpy array}, {"model": "vit", "kwargs": timm's VisionTransformer arguments}); a
    ViT with SwiGLU, rotary positions or sub-LayerNorms: {"model": "eva", "kwargs": timm's Eva arguments}; with DeiT's
    distillation token: {"model": "deit_distilled", ...} (timm's VisionTransformerDistilled, the same arguments).

  Raises:
    ValueError: an option timm's VisionTransformer (or Eva) does not have.
  """
  eva = bool(module.rope or module.ffn != "mlp" or module.ffn_norm or module.attn_norm)
  u.unsupported(
    module,
    "timm's Eva" if eva else "timm's VisionTransformer",
    stem=("patch",),
    representation_size=(None, 0),
    scan=(False,),
    pool_type=("tok", "gap") if eva and module.ffn == "swiglu" else ("tok", "gap", "map"),
    norm=("pre",),
    embed_norm=(False,),
    rel_pos_bias=(False,),
    **(dict(distill_token=(False,)) if eva else {}),
    layernorm_eps=(1e-6,),  # timm's LayerNorm; its arguments hold no other
    qk_norm=(None, "layernorm"),  # timm's is its blocks' LayerNorm
    **(dict(act=("silu",) if module.ffn == "swiglu" else ("gelu",)) if eva else {}),  # Eva's are fixed
    posemb=("learn", "sincos2d"),  # (DINOv3's positions are its rotary embedding's alone: timm's Eva from arguments
    # vitjax does not write, with LayerNorm's epsilon 1e-5, which timm's arguments cannot hold)
    **(dict(rope=(None, "axial")) if eva else {}),
    # Eva's keys have no bias, which with rope or qk_norm matters (Eva's attention pool's MLP is GELU's, whatever the
    # blocks' feed-forward)
    **(dict(key_bias=(False,)) if eva and (module.rope or module.qk_norm) and module.qkv_bias else {}),
  )
  out: dict[str, np.ndarray] = {}
  k = p["embedding/kernel"]  # [p, p, C, D]
  out["patch_embed.proj.weight"], out["patch_embed.proj.bias"] = k.transpose(3, 2, 0, 1), p["embedding/bias"]
  grid = (image_size[0] // k.shape[0], image_size[1] // k.shape[1])
  if "cls" in p:
    out["cls_token"] = p["cls"]
  if "dist" in p:
    out["dist_token"] = p["dist"]
  if "registers" in p:
    out["reg_token"] = p["registers"]
  tokens = int("cls" in p) + int("dist" in p) + module.num_registers
  prefix = tokens if module.class_posemb else 0  # the table's rows before the patches
  if module.posemb == "learn":
    out["pos_embed"] = p["posembed/pos_embedding"]
  else:  # a fixed sin-cos table becomes timm's (learned) table: same values, same logits
    pe = posenc.sincos_2d(*grid, k.shape[-1])[None]
    out["pos_embed"] = np.concatenate([np.zeros((1, prefix, pe.shape[-1]), pe.dtype), pe], 1)
  for i in range(module.depth):
    _put_block(module, p, f"encoder/block_{i}", f"blocks.{i}", eva, out)
  if module.fc_norm:
    u.put_norm(p, "fc_norm", "fc_norm", out)
  else:
    u.put_norm(p, "encoder/final_norm", "norm", out)
  if module.pool_type == "map":
    _put_map_head(p, out)
  if "head/kernel" in p:
    u.put_linear(p, "head", "head", out)
  if "head_dist/kernel" in p:
    u.put_linear(p, "head_dist", "head_dist", out)
  args = _timm_args(module, p, out, image_size, prefix)
  if eva:
    return out, {"model": "eva", "kwargs": _eva_args(module, args)}
  return out, {"model": "deit_distilled" if module.distill_token else "vit", "kwargs": args}


def _put_block(module, p: dict, s: str, d: str, eva: bool, out: dict) -> None:
  """Block `s` into timm's `d`: VisionTransformer's names or (eva) Eva's (q_bias and v_bias, gamma_1, mlp.norm ...)."""
  u.put_norm(p, f"{s}/norm1", f"{d}.norm1", out)
  u.put_attention(p, f"{s}/attn", f"{d}.attn", out)
  if eva and f"{d}.attn.qkv.bias" in out:  # Eva's keys have none; a key bias shifts a query's logits alike (write())
    out[f"{d}.attn.q_bias"], _, out[f"{d}.attn.v_bias"] = np.split(out.pop(f"{d}.attn.qkv.bias"), 3)
  u.put_norm(p, f"{s}/norm2", f"{d}.norm2", out)
  if module.ffn == "swiglu" and not module.ffn_norm:  # Eva's packed GluMlp: the gate's rows first
    out[f"{d}.mlp.fc1.weight"] = np.concatenate([p[f"{s}/mlp/fc1_{n}/kernel"].T for n in "gx"])
    out[f"{d}.mlp.fc1.bias"] = np.concatenate([p[f"{s}/mlp/fc1_{n}/bias"] for n in "gx"])
    u.put_linear(p, f"{s}/mlp/fc2", f"{d}.mlp.fc2", out)
  else:
    for name in ("fc1_g", "fc1_x", "fc2") if module.ffn == "swiglu" else ("fc1", "fc2"):
      u.put_linear(p, f"{s}/mlp/{name}", f"{d}.mlp.{name}", out)
  for i, ls in enumerate(("ls1", "ls2") if module.init_values is not None else (), 1):
    out[f"{d}.gamma_{i}" if eva else f"{d}.{ls}.gamma"] = p[f"{s}/{ls}/scale"]
  for sub in ("attn/q_norm", "attn/k_norm", "mlp/norm", "attn/norm"):
    if f"{s}/{sub}/scale" in p:
      u.put_norm(p, f"{s}/{sub}", f"{d}.{sub.replace('/', '.')}", out)


def _eva_args(module, args: dict) -> dict:
  """The arguments of timm's Eva for the ViT whose VisionTransformer arguments are `args` (see write)."""
  width, hidden = args["embed_dim"], module.mlp_dim or 4 * args["embed_dim"]
  ratio = next(r for r in (hidden / width, (hidden + 0.5) / width) if int(width * r) == hidden)  # timm's int(D * r)
  keep = ("img_size", "in_chans", "patch_size", "embed_dim", "depth", "num_heads", "qkv_bias", "dynamic_img_size")
  eva = {k: args[k] for k in keep if k in args}
  if module.patch_dropout:
    eva["patch_drop_rate"] = module.patch_dropout
  eva.update(
    num_classes=args["num_classes"],
    global_pool=args["global_pool"],
    class_token=args["class_token"],
    num_reg_tokens=module.num_registers,
    no_embed_class=bool(args.get("no_embed_class")),
    mlp_ratio=ratio,
    swiglu_mlp=module.ffn == "swiglu",
    scale_mlp=bool(module.ffn_norm),
    scale_attn_inner=bool(module.attn_norm),
    qk_norm=bool(module.qk_norm),
    init_values=module.init_values,
    use_fc_norm=bool(module.fc_norm),
    use_post_transformer_norm=not module.fc_norm,
    use_rot_pos_emb=module.rope is not None,
    rope_temperature=module.rope_temperature,
    ref_feat_shape=None if module.rope_grid is None else tuple(module.rope_grid),
    attn_pool_mlp_ratio=ratio,
  )
  return eva


def _timm_args(module, p: dict, out: dict, image_size, prefix: int) -> dict:
  """The arguments of timm's VisionTransformer for the exported ViT.

  out: its state dict; prefix: the position table's rows before the patches'.
  """
  k = p["embedding/kernel"]  # [p, p, C, D]
  width = k.shape[-1]
  args = dict(
    img_size=tuple(image_size),
    in_chans=k.shape[2],
    patch_size=tuple(k.shape[:2]),
    embed_dim=width,
    depth=module.depth,
    num_heads=module.num_heads,
    mlp_ratio=(module.mlp_dim or 4 * width) / width,
    qkv_bias=module.qkv_bias,
    class_token="cls" in p,
    global_pool={"tok": "token", "gap": "avg", "map": "map"}[module.pool_type],
    fc_norm=bool(module.fc_norm),
    num_classes=int(out["head.weight"].shape[0]) if "head.weight" in out else 0,
    act_layer=module.act,
  )
  if module.num_registers:
    args["reg_tokens"] = module.num_registers
  if prefix == 0 and ("cls" in p or module.num_registers):
    args["no_embed_class"] = True
  if module.init_values is not None:
    args["init_values"] = module.init_values
  if module.qk_norm:
    args["qk_norm"] = True
  if module.posemb_grid is not None:  # the table's own grid, resampled to any input's: timm's dynamic_img_size
    args.update(
      dynamic_img_size=True, img_size=tuple(int(g) * p for g, p in zip(module.posemb_grid, args["patch_size"]))
    )
  if module.patch_dropout:
    args["patch_drop_rate"] = module.patch_dropout
  return args


def _put_map_head(p: dict, out: dict) -> None:
  """The attention-pooling head (pool_type "map") in timm's attn_pool layout, written into `out`."""
  out["attn_pool.latent"] = p["map_head/probe"]
  out["attn_pool.q.weight"] = u.merge_heads(p["map_head/attn/query/kernel"])
  out["attn_pool.q.bias"] = p["map_head/attn/query/bias"].reshape(-1)
  out["attn_pool.kv.weight"] = np.concatenate([u.merge_heads(p[f"map_head/attn/{n}/kernel"]) for n in ("key", "value")])
  out["attn_pool.kv.bias"] = np.concatenate([p[f"map_head/attn/{n}/bias"].reshape(-1) for n in ("key", "value")])
  w = p["map_head/attn/out/kernel"]
  out["attn_pool.proj.weight"], out["attn_pool.proj.bias"] = w.reshape(-1, w.shape[-1]).T, p["map_head/attn/out/bias"]
  u.put_norm(p, "map_head/norm", "attn_pool.norm", out)
  u.put_mlp(p, "map_head/mlp", "attn_pool.mlp", out)
