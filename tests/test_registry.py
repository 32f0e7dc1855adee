"""The registry (vitjax.models.registry): names and their errors, and a new family as one registration that
creation, weight decay, sharding, adapters and the config's checks follow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vitjax import models
from vitjax.models.adapt import adapt_params


def test_registry_names_and_errors():
  assert models.create("vit_b32").patch_size == (32, 32)
  assert models.create("swin_b").embed_dim == 128
  assert models.create("S/16", num_classes=10).num_classes == 10
  with pytest.raises(ValueError, match="Did you mean 'vit_b16'"):
    models.create("vit_bb16")
  with pytest.raises(ValueError, match="Did you mean 'num_classes'"):
    models.create("vit_s16", num_clases=10)
  with pytest.raises(ValueError, match="unknown ViT variant"):
    models.create("Q/16")
  # values a model cannot be built with: one line each (a 3-d patch gave a batch of 0; dropout 1.5 trained)
  for name, kw, says in (
    ("vit_ti16", {"patch_size": (4, 4, 4)}, r"ViT: patch_size=\(4, 4, 4\) must be one size or an \(height, width\)"),
    ("vit_ti16", {"dropout_rate": 1.5}, r"ViT: dropout_rate=1.5 must be in \[0, 1\)"),
    ("vit_ti16", {"num_heads": 0}, "ViT: num_heads=0 must be a whole number >= 1"),
    ("vit_ti16", {"width": 19.5}, "ViT: width=19.5 must be a whole number >= 1"),
    ("swin_t", {"num_heads": (3, 6, 0, 24)}, r"Swin: num_heads=\(3, 6, 0, 24\) must be whole numbers >= 1"),
    ("transformer_tiny", {"vocab_size": 0}, "Transformer: vocab_size=0 must be a whole number >= 1"),
    ("mae", {"mask_ratio": 1.0}, r"MAE: mask_ratio=1.0 must be in \[0, 1\)"),
  ):
    with pytest.raises(ValueError, match=says):
      models.create(name, **kw)
  assert models.create("vit_ti16", depth=0, num_classes=0).depth == 0  # counts may be 0


def test_a_new_family_is_one_registration_that_creation_decay_sharding_and_adapters_follow():
  import flax.linen as nn
  import ml_collections

  from vitjax import convert, mesh
  from vitjax.config import default_config
  from vitjax.errors import ConfigError
  from vitjax.models import network, registry
  from vitjax.tasks.classification import ImageClassification
  from vitjax.train import optim

  def grow(k, v, t):  # an adapter of the family's own: a longer 'table' keeps its first rows
    return (np.asarray(t), f"grew {k}") if k.endswith("table") else None

  @registry.register(
    lambda name: {"features": 4} if name == "toy_mlp" else None,
    examples=("toy_mlp",),
    no_decay=("table",),
    tp_rules=((r"dense/kernel$", (None, "tensor")),),
    adapters=(grow,),
  )
  class Toy(nn.Module):
    features: int = 2
    rows: int = 3

    @nn.compact
    def __call__(self, x, train=False):
      table = self.param("table", nn.initializers.ones, (self.rows, x.shape[-1]))
      return nn.Dense(self.features, name="dense")(x @ table.T @ table), {}

  try:
    model = models.create("toy_mlp", rows=5)
    assert (model.features, model.rows) == (4, 5)
    with pytest.raises(ValueError, match="Toy has no option 'featurs'. Did you mean 'features'"):
      models.create("toy_mlp", featurs=3)
    params = model.init(jax.random.key(0), jnp.ones((1, 8)))["params"]
    mask = optim.decay_mask(params, model)
    assert mask == {"table": False, "dense": {"kernel": True, "bias": False}}
    assert not optim.decay_mask(params)["table"]  # without a model: every family's names
    specs = mesh.param_specs(params, {"data": 1, "fsdp": 1, "tensor": 2}, "tp", tp_rules=registry.tp_rules(model))
    assert tuple(specs["dense"]["kernel"]) == (None, "tensor") and "tensor" not in tuple(specs["table"])
    small = Toy(features=4, rows=3).init(jax.random.key(1), jnp.ones((1, 8)))["params"]
    _, changes = adapt_params(small, params, model)
    assert changes == ["grew table"]
    with pytest.raises(ValueError, match="to_timm converts a ViT or a Swin or a HybridViT, not a Toy"):
      convert.to_timm(model, {"params": params}, 8)
    # what the recipe asks beyond the registration, each one line when missing (before: a KeyError traceback from
    # the probe evaluators, and "Toy has no option 'dtype'" blaming the config)
    with pytest.raises(ConfigError, match=r"^Toy returns no intermediates\['pre_logits'\] \(the pooled features"):
      model.apply({"params": params}, jnp.ones((1, 8)), method=ImageClassification.representation)
    config = default_config()
    config.model = ml_collections.ConfigDict(dict(name="toy_mlp"))
    config.compute_dtype = "bfloat16"
    with pytest.raises(ConfigError, match="computes in bfloat16, but Toy has no `dtype` attribute to compute in"):
      network.build_model(config)
    config.compute_dtype = "float32"
    assert isinstance(network.build_model(config), Toy)
  finally:
    registry.FAMILIES.remove(registry.family_of(Toy))
  with pytest.raises(ValueError, match="unknown model 'toy_mlp'"):
    models.create("toy_mlp")
