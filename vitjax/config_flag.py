"""--config for the command lines that train: a config file, its evaluator entries completed, then locked.

main and the sweep define it; the other command lines read a workdir's config instead.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags
from ml_collections.config_flags.config_flags import ConfigFileFlagParser


def define(help_string: str) -> None:
  """Defines --config: a config file, its evaluator entries completed (vitjax.evaluators.complete), then locked.

  So that an override sets any option of an entry's type (--config.evals.eval.top_k=1) where get_config() gave only
  the entry's type and common fields (vitjax.config.evaluator); a misspelt field is still refused, as the config is
  locked before the overrides are applied.
  """

  class Parser(ConfigFileFlagParser):
    def parse(self, path):
      config = super().parse(path)  # (lock_config=False: locked below, once complete)
      if hasattr(config, "lock") and hasattr(config, "get") and config.get("evals") is not None:
        from vitjax import evaluators  # pylint: disable=g-import-not-at-top  (jax: once a config file is given)

        evaluators.complete(config)
      if hasattr(config, "lock"):
        config.lock()
      return config

  config_flags.DEFINE_config_file("config", None, help_string, lock_config=False)
  flags.FLAGS["config"].parser = Parser("config", lock_config=False)
