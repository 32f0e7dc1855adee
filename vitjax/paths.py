"""The paths a command writes: checked before it writes anything, written whole, and what a failed write made, removed.

Every command line refuses a path it cannot write with one line naming its flag (vitjax.errors.ConfigError), before
it creates a file or a folder: a workdir, an export's file, the attention maps' folder, a data_dir, translations.

Every file vitjax writes goes through `replacing` (a fresh temporary file in the target's folder, renamed onto it) or
`appending` (no-follow): nothing is written through a symbolic link someone planted, and no reader sees half a file.
`refuse_links` refuses a folder (a workdir) that holds links, before anything is written or deleted in it.
"""

import contextlib
import errno
import os
import stat
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


def publish(tmp: str, path: str) -> None:
  """Moves a finished temporary file onto `path` (atomically) with an ordinary file's mode (0666 less the umask).

  A link at `path` is replaced, never followed. (mkstemp and some writers, safetensors, create owner-only files.)
  """
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o666 & ~umask)
  os.replace(tmp, path)


@contextlib.contextmanager
def replacing(path: str, mode: str | None = "wb", suffix: str = ".tmp", **open_kwargs):
  """The one way vitjax writes a file: whole or not at all, as in `with paths.replacing(path, "w") as f:`.

  Yields a file object (`mode`, `open_kwargs` as for open) on a fresh temporary file that mkstemp makes in `path`'s
  folder (O_EXCL: never a file or link someone else put there); on success it is synced, given an ordinary file's mode
  and renamed onto `path` (a link there is replaced, not followed); on any failure it is removed. mode=None yields the
  temporary file's path instead, for writers that take a file name (`suffix`: the extension they need, ".npz").
  """
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=suffix, dir=folder)
  try:
    if mode is None:
      os.close(fd)
      yield tmp
    else:
      with os.fdopen(fd, mode, **open_kwargs) as f:
        yield f
        f.flush()
        os.fsync(f.fileno())
    publish(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def write_text(path: str, text: str) -> None:
  """`path` holds `text` (UTF-8), written through `replacing`."""
  with replacing(path, "w", encoding="utf-8") as f:
    f.write(text)


def _link_line(path: str) -> str:
  return (
    f"{path} is a symbolic link (to {os.readlink(path)}); vitjax writes and deletes nothing through links it did not "
    "make: replace it with a real file or folder (or remove it), then rerun"
  )


@contextlib.contextmanager
def appending(path: str):
  """A text file opened to append lines to (created 0666 less the umask), refusing a link at `path` (ConfigError)."""
  try:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
  except OSError as e:
    if e.errno == errno.ELOOP:
      raise ConfigError(_link_line(path)) from None
    raise
  if not stat.S_ISREG(os.fstat(fd).st_mode):
    os.close(fd)
    raise ConfigError(f"{path} is not a regular file; move it away, then rerun")
  with os.fdopen(fd, "a", encoding="utf-8") as f:
    yield f


def refuse_links(root: str, folders: tuple[str, ...] = ()) -> None:
  """ConfigError if `root` is a link, or holds one at its top level or anywhere under its `folders` (one line).

  A run deletes old checkpoints and rewrites its files: through a planted link that would reach outside the workdir.
  """
  root = os.path.abspath(root)
  if os.path.islink(root):
    target = os.path.realpath(root)
    if not os.path.isdir(target):
      raise ConfigError(f"{root} is a symbolic link to {os.readlink(root)}, which is no folder; remove the link")
    raise ConfigError(f"{root} is a symbolic link (to {os.readlink(root)}); give the folder itself: {target}")
  if not os.path.isdir(root):
    return
  for name in sorted(os.listdir(root)):
    path = os.path.join(root, name)
    if os.path.islink(path):
      raise ConfigError(_link_line(path))
    if name in folders and os.path.isdir(path):
      for top, dirs, files in os.walk(path):  # (os.walk follows no links)
        for entry in sorted(dirs + files):
          if os.path.islink(os.path.join(top, entry)):
            raise ConfigError(_link_line(os.path.join(top, entry)))
