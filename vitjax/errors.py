"""The errors a user can fix. The command line prints each as one line starting with "error:" and exits with 2.

Anything else that escapes is a bug in vitjax and keeps its traceback.
"""


class ConfigError(ValueError):
  """A problem with the experiment's config, workdir or checkpoints; the message says how to fix it."""


class DatasetNotPreparedError(FileNotFoundError):
  """A dataset or text source is not installed or not prepared; the message gives the command that fixes it."""


USER_ERRORS = (ConfigError, DatasetNotPreparedError)
