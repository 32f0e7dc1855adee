"""The paths a command writes: checked before it writes anything, and what a failed write made, removed.

Every command line refuses a path it cannot write with one line naming its flag (vitjax.errors.ConfigError), before
it creates a file or a folder: a workdir, an export's file, the attention maps' folder, a data_dir, translations.
"""

import os
import tempfile

from vitjax.errors import ConfigError


def missing_folders(path: str) -> list[str]:
  """`path` and those of its parents that do not exist, innermost first (what os.makedirs(path) would create)."""
  missing, path = [], os.path.abspath(path)
  while not os.path.exists(path):
    missing.append(path)
    path = os.path.dirname(path)
  return missing


def remove_empty(folders: list[str]) -> None:
  """Removes these folders in order (innermost first), stopping at the first that is not empty or not there."""
  for path in folders:
    try:
      os.rmdir(path)
    except OSError:
      break


def check_writable(path: str, flag: str, *, folder: bool, make_parents: bool = True, fix: str = "") -> None:
  """ConfigError naming --FLAG unless `path` can be written.

  `path` is a folder (`folder`) or a file, where it is or in the folders os.makedirs would make (`make_parents`;
  otherwise its folder must exist). It creates nothing: it probes the nearest existing folder with a temporary file (root passes os.access on
  read-only and immutable folders; a real write does not). `fix`: what the message says to do about an unwritable
  folder (default: fix its permissions or give another --FLAG).
  """
  given, path = path, os.path.abspath(path)
  where = f"--{flag}={given}"
  if folder and os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(f"{where} is a file, not a folder; give a folder path")
  if not folder and os.path.isdir(path):
    raise ConfigError(f"{where} is a folder; give a file path, or move the folder away")
  home = path if folder else os.path.dirname(path)
  missing = missing_folders(home)
  existing = os.path.dirname(missing[-1]) if missing else home
  if not os.path.isdir(existing):
    raise ConfigError(f"{where}: {existing} is a file, not a folder; give another --{flag}")
  if missing and not make_parents:
    raise ConfigError(f"{where}: there is no folder {home}; create it (mkdir -p {home}) or give another --{flag}")
  try:
    fd, probe = tempfile.mkstemp(prefix=".vitjax-write-test-", dir=existing)
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    raise ConfigError(
      f"{where}: {existing} is not writable ({e.strerror}); {fix or f'fix its permissions or give another --{flag}'}"
    ) from None
