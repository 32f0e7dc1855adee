"""vitjax data: image datasets, their input pipelines and augmentations, and parallel text for translation.

Image tfds builders (array_record, no TensorFlow), grain input pipelines and per-image augmentations (`images`,
`augment`), the batch-level work that runs on the devices (`device_ops`: jax), and parallel text for translation
(`vitjax.data.text`).

Prepare a dataset with ``python -m vitjax.data.prepare --dataset=NAME --data_dir=DIR`` (or ``from
vitjax.data.prepare import prepare``), then read it with :func:`make_input`. NAME may be your own images:
``folder:PATH`` (``PATH/CLASS/*``) or ``csv:FILE`` (``path,label`` rows); see `vitjax.data.folder`.
"""

from vitjax.data.augment import Augment, parse_augment
from vitjax.data.builders import BUILDERS, get_builder, resolve_name
from vitjax.data.images import DatasetInfo, make_input
from vitjax.data.local import default_data_dir
from vitjax.data.splits import has_split, holdout_split, labelled_subset, open_split, split_info, split_labels
from vitjax.errors import DatasetNotPreparedError

__all__ = [
  "Augment",
  "BUILDERS",
  "DatasetInfo",
  "DatasetNotPreparedError",
  "default_data_dir",
  "get_builder",
  "has_split",
  "holdout_split",
  "labelled_subset",
  "make_input",
  "open_split",
  "parse_augment",
  "resolve_name",
  "split_info",
  "split_labels",
]
