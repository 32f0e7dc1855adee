"""Model families and `create(name, **overrides)`, which builds a model from the short names configs use.

Names: "vit_ti16", "vit_s16", "vit_s32", "vit_b16", "vit_b32", "vit_l16", "vit_h14", ... (vit_SIZE PATCH),
a ViT variant string such as "S/16", "swin_t", "swin_s", "swin_b", "swin_l", and the translation Transformer
"transformer_base", "transformer_big" (the paper's sizes), "transformer_small", "transformer_tiny" (CPU sizes);
every transformer_* name needs vocab_size=.... The hybrid ViT of the original release (a ResNet stem):
"vit_r_ti16", "vit_r26_s32", "vit_r26_b32", "vit_r50_b16", "vit_r50_l32" or the release's "R26+ViT-S_32". "mae": a masked autoencoder around a ViT (encoder={"name": ...}).

Each family registers itself in its own module (vitjax.models.registry says what a family states); importing
this package registers them all.
"""

from __future__ import annotations

from vitjax.models import swin as swin_lib
from vitjax.models import transformer as transformer_lib
from vitjax.models import vit as vit_lib
from vitjax.models import vit_hybrid as vit_hybrid_lib
from vitjax.models.mae import MAE
from vitjax.models.registry import create, family_of
from vitjax.models.swin import Swin
from vitjax.models.transformer import Transformer
from vitjax.models.vit import ViT
from vitjax.models.vit_hybrid import HybridViT

__all__ = [
  "MAE",
  "ViT",
  "HybridViT",
  "Swin",
  "Transformer",
  "create",
  "family_of",
  "swin_lib",
  "transformer_lib",
  "vit_lib",
  "vit_hybrid_lib",
]
