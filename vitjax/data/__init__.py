"""vitjax data: image tfds builders (array_record, no TensorFlow) and grain
input pipelines.

Prepare a dataset with ``python -m vitjax.data.prepare --dataset=NAME
--data_dir=DIR`` (or ``from vitjax.data.prepare import prepare``), then read it
with :func:`make_input`.
"""

from vitjax.data.builders import BUILDERS, default_data_dir, get_builder, resolve_name
from vitjax.data.images import Augment, DatasetInfo, DatasetNotPreparedError, make_input, open_split, parse_augment

__all__ = [
  "Augment",
  "BUILDERS",
  "DatasetInfo",
  "DatasetNotPreparedError",
  "default_data_dir",
  "get_builder",
  "make_input",
  "open_split",
  "parse_augment",
  "resolve_name",
]
