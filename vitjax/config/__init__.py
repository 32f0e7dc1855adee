"""The experiment config, as data: its schema with the defaults (schema.py), old versions (migrate.py), files.

Config files (configs/NAME.py) are read by files.py; a workdir's config.json of an older version is brought to
today's by migrate.py.

    from vitjax.config import default_config, evaluator
    c = default_config()                              # digits classified by a ViT-Ti/16 at 8 px
    c.evals.test = evaluator("classification", split="test")
"""

from vitjax.config.files import (
  config_source,
  effective_config,
  history,
  load_module,
  read_config,
  read_json,
  read_record,
  read_task,
)
from vitjax.config.migrate import migrate
from vitjax.config.schema import (
  BOOKKEEPING,
  CONFIG_VERSION,
  ENTRY,
  OPEN,
  WHOLE,
  check,
  default_config,
  evaluator,
  flatten,
  is_bookkeeping,
  translation_config,
  unknown_fields,
)

__all__ = [
  "BOOKKEEPING",
  "CONFIG_VERSION",
  "ENTRY",
  "OPEN",
  "WHOLE",
  "check",
  "default_config",
  "evaluator",
  "flatten",
  "history",
  "is_bookkeeping",
  "config_source",
  "effective_config",
  "load_module",
  "read_config",
  "read_json",
  "read_record",
  "read_task",
  "migrate",
  "translation_config",
  "unknown_fields",
]
