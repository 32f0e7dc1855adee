"""A pretrained backbone from the hub, fine-tuned on Fashion-MNIST: DINOv2 (with or without registers), DeiT III,
EVA-02 or SigLIP's image tower. The argument after ":" picks it (default dinov2_reg).

Run (from the repository root; the weights download once into the Hugging Face cache):

    python -m vitjax.data.prepare --dataset=fashion_mnist
    python -m vitjax.main --config=configs/backbone_finetune.py:dinov2_reg --workdir=workdirs/dinov2_fmnist
    python -m vitjax.main --mode=eval --workdir=workdirs/dinov2_fmnist --split=test

The recipe of BEiT, MAE and DINOv2's fine-tuning: AdamW at a low learning rate with layer-wise decay 0.75 (the head
learns at lr, the embeddings at lr x 0.75^13), a short warm-up, stochastic depth 0.1. The 28 x 28 grey images are
resized to 224 px and meet the RGB model's first layer summed over its colours (vitjax.models.adapt.grey_input); the
position table is resampled to the patch grid, the head is new. A k-NN and linear probe on the backbone's features
(evaluator "probe") runs beside the classifier's accuracy: what the features give before and as they are fine-tuned.
Sized for a GPU: on a 2-core CPU one step of DINOv2-S/14 at 224 px and batch 64 takes seconds.

Expected: not measured. The real weights come from the hub, which the machines this project is built on cannot
reach (tests/test_guides.py runs the recipe on a tiny random DINOv2 repository made by timm, offline); docs/guides/
finetune.md walks through it on the digits.
"""

import ml_collections as mlc

from vitjax.config import default_config, evaluator
from vitjax.models import vit

# argument: (config.model.name, the hub repository of its weights, the model's fields that differ from the name's)
BACKBONES = {
  "dinov2": ("dinov2_s14", "hf:timm/vit_small_patch14_dinov2.lvd142m", {}),
  "dinov2_reg": ("dinov2_s14_reg4", "hf:timm/vit_small_patch14_reg4_dinov2.lvd142m", {}),
  "deit3": ("deit3_s16", "hf:timm/deit3_small_patch16_224.fb_in22k_ft_in1k", {}),
  "eva02": ("eva02_s14", "hf:timm/eva02_small_patch14_224.mim_in22k", {}),
  "siglip": ("siglip_b16", "hf:timm/vit_base_patch16_siglip_224.webli", dict(act="gelu")),  # timm's exact GELU
}


def get_config(arg: str = "dinov2_reg"):
  if arg not in BACKBONES:
    raise ValueError(f"unknown backbone {arg!r}: use configs/backbone_finetune.py:NAME, NAME one of {list(BACKBONES)}")
  name, weights, fields = BACKBONES[arg]
  c = default_config()
  sizes = {k: v for k, v in vit.parse_name(name).items() if k in ("width", "depth", "num_heads", "mlp_dim")}
  c.model = mlc.ConfigDict(dict(name=name, **sizes, num_classes=10, drop_path_rate=0.1, **fields))  # sizes: to override
  c.init_from = weights
  c.data.name = "fashion_mnist"
  c.data.image_size = 224
  c.data.augment.flip = True
  c.data.eval_batch_size = 256
  c.batch_size = 64
  c.num_epochs = 3
  c.optim.lr = 1e-4
  c.optim.weight_decay = 0.05
  c.optim.layer_decay = 0.75
  c.schedule.warmup_epochs = 0.2
  c.log_every = 50
  c.eval_every = "1 epoch"
  c.checkpoint_every = "1 epoch"
  c.evals.probe = evaluator("probe", shots=(10,), fit_examples=5000, examples=2000)
  return c
