"""The newer ViT backbones against timm and transformers: random weights (every one perturbed), two blocks, float32.

    python experiments/parity_backbones.py      # needs torch, timm and transformers (the README's test install)

For each timm model: the options vitjax read from its weights, the relative max error of vitjax's logits against
timm's, and vitjax.export's timm layout read back by timm (load_state_dict strict=True) with its largest difference
from the original. tests/test_parity.py holds the same cases at the 1e-5 bound. Then transformers' DINOv2 classes, from their in-memory
state dict (transformers 5's names) and from save_pretrained's file (the hub's names): the relative max error of
the pooled output (the ...Model classes) or the logits (...ForImageClassification); tests/test_hub.py holds them.
"""

import os
import sys

import jax
import numpy as np

from vitjax import convert

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # torchvision_ops_shim
CASES = [  # timm name, create_model's arguments, image side
  ("vit_small_patch14_dinov2", dict(img_size=56), 56),
  ("vit_small_patch14_dinov2", {}, 518),
  ("vit_small_patch14_reg4_dinov2", dict(img_size=56), 56),
  ("deit3_small_patch16_224", {}, 224),
  ("vit_base_patch16_reg4_gap_256", dict(embed_dim=192, num_heads=3), 256),
  ("vit_small_patch16_224", dict(qk_norm=True), 224),  # QK-norm: timm's option (no pretrained name has it alone)
  ("vit_giant_patch14_reg4_dinov2", dict(img_size=56, embed_dim=96, num_heads=4), 56),  # packed SwiGLU, narrowed
  # EVA-02 (timm's Eva): 2-D rotary positions, SwiGLU packed / split, sub-LayerNorms, no key bias; at 112 px the rotary
  # positions are rescaled to the 16 x 16 reference grid (the name passed to from_timm gives the image size)
  ("eva02_tiny_patch14_224", dict(img_size=112), 112),
  ("eva02_small_patch14_224", {}, 224),
  ("eva02_base_patch14_224", dict(embed_dim=96, num_heads=4), 224),
  ("eva02_base_patch16_clip_224", dict(embed_dim=96, num_heads=4), 224),
  # SigLIP 2's image towers (vit_*_siglip_*.v2_webli), narrowed to 128 wide, 16 heads
  ("vit_so400m_patch16_siglip_256", dict(embed_dim=128), 256),
  ("vit_giantopt_patch16_siglip_256", dict(embed_dim=128), 256),
  ("vit_so400m_patch14_siglip_gap_224", dict(embed_dim=128), 224),
  # DINOv3: rotary positions alone (patch centres in [-1, 1], the half layout), registers, LayerScale, any size
  ("vit_small_patch16_dinov3", {}, 224),
  ("vit_small_patch16_dinov3_qkvb", {}, 160),
  ("vit_small_plus_patch16_dinov3", {}, 224),
]


def main():
  # isort: off
  import torchvision_ops_shim  # noqa: F401  (torchvision's ops on CPU-only torch, before timm)
  import timm
  import torch
  # isort: on

  print(f"timm {timm.__version__}, torch {torch.__version__}, jax {jax.__version__}")
  print("| timm model | px | registers | LayerScale | QK-norm | ffn | rope | act | pool | rel. error | export |")
  print("| --- | ---: | ---: | --- | --- | --- | --- | --- | --- | ---: | --- |")
  for name, kw, hw in CASES:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, depth=2, num_classes=5, **kw).eval()
    with torch.no_grad():
      for p in model.parameters():
        p.add_(0.02 * torch.randn_like(p))
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    timm_name = name if "dinov3" in name else name.replace("_224", f"_{hw}")  # (DINOv3: any size, the name none)
    module, variables = convert.from_timm(timm_name, sd, num_heads=kw.get("num_heads"))
    x = np.random.RandomState(1).randn(2, 3, hw, hw).astype(np.float32)
    with torch.no_grad():
      want = model(torch.from_numpy(x)).numpy()
    got = np.asarray(jax.jit(module.apply)(variables, x.transpose(0, 2, 3, 1))[0])
    rel = np.abs(got - want).max() / np.abs(want).max()
    try:
      state_dict, cfg = convert.to_timm(module, variables, (hw, hw))
    except ValueError as e:  # what timm's arguments cannot hold (DINOv3's)
      exported = f"refused: {e}"
    else:
      back = convert.build_timm(cfg).eval()
      back.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state_dict.items()}, strict=True)
      with torch.no_grad():
        diff = np.abs(back(torch.from_numpy(x)).numpy() - want).max() / np.abs(want).max()
      exported = f"timm's {type(back).__name__}, strict, rel. diff {diff:.1e}"
    ls, rope = module.init_values is not None, module.rope and f"{module.rope} {module.rope_grid or ''}".strip()
    print(
      f"| {name}{' qk_norm' if kw.get('qk_norm') else ''} | {hw} | {module.num_registers} | {ls} | {module.qk_norm} | "
      f"{module.ffn}{' + sub-LN' if module.ffn_norm else ''} | {rope} | {module.act} | {module.pool_type} | {rel:.2e} | "
      f"{exported} |"
    )


def transformers_cases():
  """transformers' DINOv2 classes and SigLIP's image tower, each from memory and from its saved file."""
  import torch
  import transformers as t

  print(f"\ntransformers {t.__version__}: 56 px, patch 14, width 32, two blocks (DINOv2: layerscale_value 0.5)")
  print("| transformers class | registers | ffn | pool | rel. error, in memory | rel. error, saved file |")
  print("| --- | ---: | --- | --- | ---: | ---: |")
  x = np.random.RandomState(1).randn(2, 3, 56, 56).astype(np.float32)
  args = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=14)
  dinov2 = lambda config, **extra: getattr(t, config)(**args, layerscale_value=0.5, **extra)
  vision = t.SiglipVisionConfig(**args, intermediate_size=64)
  for cls, cfg in (
    ("Dinov2Model", dinov2("Dinov2Config")),
    ("Dinov2ForImageClassification", dinov2("Dinov2Config", num_labels=3)),
    ("Dinov2WithRegistersModel", dinov2("Dinov2WithRegistersConfig", num_register_tokens=4)),
    (
      "Dinov2WithRegistersForImageClassification",
      dinov2("Dinov2WithRegistersConfig", num_register_tokens=4, num_labels=3),
    ),
    ("Dinov2Model", dinov2("Dinov2Config", use_swiglu_ffn=True)),  # the giant's SwiGLU
    ("SiglipVisionModel", vision),  # its MAP head
    ("SiglipForImageClassification", t.SiglipConfig(vision_config=vision.to_dict(), num_labels=3)),  # the average
  ):
    torch.manual_seed(0)  # (the initialisation too: the same weights every run)
    module, errors = _transformers_errors(getattr(t, cls)(cfg), cfg, x)
    print(f"| {cls} | {module.num_registers} | {module.ffn} | {module.pool_type} | {errors[0]:.2e} | {errors[1]:.2e} |")


def _transformers_errors(model, cfg, x):
  """(vitjax module, [relative max error from the in-memory state dict, from save_pretrained's file])."""
  import tempfile

  import torch
  from safetensors.numpy import load_file

  model = model.eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.02 * torch.randn_like(p))
    out = model(pixel_values=torch.from_numpy(x))
  want = (out.logits if hasattr(out, "logits") else out.pooler_output).numpy()
  errors = []
  with tempfile.TemporaryDirectory() as d:
    model.save_pretrained(d)
    for sd in ({k: v.numpy() for k, v in model.state_dict().items()}, load_file(os.path.join(d, "model.safetensors"))):
      module, variables = convert.from_hf(sd, cfg.to_dict())
      got = np.asarray(jax.jit(module.apply)(variables, x.transpose(0, 2, 3, 1))[0])
      errors.append(np.abs(got - want).max() / np.abs(want).max())
  return module, errors


if __name__ == "__main__":
  main()
  transformers_cases()
