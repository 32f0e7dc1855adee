"""vitjax data: image tfds builders (array_record, no TensorFlow) and grain
input pipelines.

Prepare a dataset with ``python -m vitjax.data.prepare --dataset=NAME
--data_dir=DIR`` (or ``from vitjax.data.prepare import prepare``), then read it
with :func:`make_input`.
"""

from vitjax.data.builders import BUILDERS
from vitjax.data.builders import default_data_dir
from vitjax.data.builders import get_builder
from vitjax.data.builders import resolve_name
from vitjax.data.images import Augment
from vitjax.data.images import DatasetInfo
from vitjax.data.images import DatasetNotPreparedError
from vitjax.data.images import make_input
from vitjax.data.images import open_split
from vitjax.data.images import parse_augment

__all__ = [
    'Augment', 'BUILDERS', 'DatasetInfo', 'DatasetNotPreparedError',
    'default_data_dir', 'get_builder', 'make_input', 'open_split',
    'parse_augment', 'resolve_name',
]
