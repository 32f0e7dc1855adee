"""vitjax: transformers for vision and translation in JAX/Flax."""

__version__ = "0.1.0"
