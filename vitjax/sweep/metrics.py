"""Reading a trial's metrics.jsonl: its evaluations, the best of them, and the error line of a failed trial."""

from __future__ import annotations

import json
import math
import os


def at_step(step) -> str:
  """The suffix " after step N" for a message, or "" when `step` is None."""
  return f" after step {step}" if step is not None else ""


def is_metric(key: str) -> bool:
  """An evaluator's NAME/METRIC (not training's train/...)."""
  return "/" in key and not key.startswith("train/")


def metric_names(rows) -> list[str]:
  """The evaluator metrics (NAME/METRIC) that appear in any of `rows`, sorted."""
  return sorted({k for r in rows for k in r if is_metric(k)})


def is_eval(row: dict) -> bool:
  """Whether a metrics.jsonl row is an evaluation during training.

  It has an evaluator metric and no "source", the mark of a --mode=eval row.
  """
  return "source" not in row and any(is_metric(k) for k in row)  # not a --mode=eval row


def metric_rows(workdir: str) -> list[dict]:
  """WORKDIR/metrics.jsonl's rows (a partly written last line is skipped)."""
  return MetricsFollower(workdir).new_rows()


def eval_rows(workdir: str) -> list[dict]:
  """The evaluations during training in WORKDIR/metrics.jsonl, by step."""
  return by_step(r for r in metric_rows(workdir) if is_eval(r))


def by_step(rows) -> list[dict]:
  """The rows in step order, one per step (the last row of a step that has several)."""
  out = {r["step"]: r for r in rows}
  return [out[s] for s in sorted(out)]


class MetricsFollower:
  """Reads the rows a run appends to its metrics.jsonl since the last call.

  The file is polled every second, so it is not read again from the start. A resume replaces the file (rows past its
  checkpoint dropped, a new inode): then it reads the new file from its start.
  """

  def __init__(self, workdir: str):
    self.path, self.offset, self.inode = os.path.join(workdir, "metrics.jsonl"), 0, None

  def new_rows(self) -> list[dict]:
    """The complete rows appended since the last call; [] while the file does not exist.

    A line still being written waits for the next call, a line that is not JSON is skipped, and a replaced or
    truncated file is read again from its start.
    """
    try:
      with open(self.path, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_ino != self.inode or st.st_size < self.offset:
          self.offset, self.inode = 0, st.st_ino
        f.seek(self.offset)
        data = f.read()
    except FileNotFoundError:
      return []
    complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next call
    self.offset += len(complete)
    rows = []
    for line in complete.splitlines():
      try:
        rows.append(json.loads(line))
      except ValueError:
        continue
    return rows


def best_row(rows: list[dict], objective: str, maximize: bool) -> dict | None:
  """The row with the best finite `objective` (of equals, the later step), or None.

  Ties go to the later step as the trainer's `best` checkpoint does (vitjax.train.checkpoints), so the sweep's best
  step is the step that checkpoint holds.
  """
  scored = [r for r in rows if r.get(objective) is not None and math.isfinite(r[objective])]
  sign = 1 if maximize else -1
  return max(scored, key=lambda r: (sign * r[objective], r["step"]), default=None)


def error_line(log_path: str, start: int) -> str:
  """The line that says why a run stopped: its 'error: ...' line, else its last ERROR line, else its last line."""
  try:
    with open(log_path, errors="replace") as f:
      f.seek(start)
      lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
  except OSError:
    return ""
  for ln in reversed(lines):
    if ln.startswith("error: "):
      return ln
  for ln in reversed(lines):
    if " ERROR " in ln:
      return ln.split(" ERROR ", 1)[1]
  return lines[-1] if lines else ""
