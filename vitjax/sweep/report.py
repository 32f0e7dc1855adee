"""A sweep's results: SWEEP_DIR/report.md, trials.csv and plots, from the study and the trials' metrics.jsonl.

One row per trial (its newest attempt; an interrupted trial's retries are attempts of the same trial), best
objective first. Plots: the objective against each hyperparameter, every trial's evaluation curve, and Optuna's
parallel-coordinate and parameter-importance plots. For a live view of a running sweep in the browser:
`optuna-dashboard sqlite:///SWEEP_DIR/study.db` (pip install optuna-dashboard).
"""

from __future__ import annotations

import csv
import math
import os
import shlex
import warnings

from vitjax import paths
from vitjax import sweep as sweep_lib
from vitjax.logs import fmt_time
from vitjax.sweep.metrics import best_row, eval_rows
from vitjax.sweep.study import latest_attempts, slot

# Fewer complete trials than this: report.md says the parameter importances drawn from them are not reliable (fANOVA
# fits a random forest to the complete trials; a handful of points ranks the parameters by chance).
IMPORTANCE_TRIALS = 10

COLUMNS = ["trial", "state", "objective", "best_step", "last_step", "wall_s", "attempts", "overrides", "error"]


def rows(study, sweep_dir: str) -> list[dict]:
  """One dict per trial, sorted by the objective (best first; unfinished and failed trials last)."""
  described = study.user_attrs.get("sweep", {})
  objective = described.get("objective")
  maximize = described.get("direction", "maximize") == "maximize"
  trials = study.get_trials(deepcopy=False)
  attempts = {}
  for t in trials:
    attempts[slot(t)] = attempts.get(slot(t), 0) + 1
  out = []
  for n, t in sorted(latest_attempts(trials).items()):
    workdir = sweep_lib.trial_dir(sweep_dir, n)
    curve = eval_rows(workdir)
    state = t.state.name.lower()
    value = t.value if state == "complete" else None
    if state == "pruned" and t.intermediate_values:
      value = t.intermediate_values[max(t.intermediate_values)]
    best = best_row(curve, objective, maximize)
    out.append(
      {
        "trial": n,
        "state": state,
        "objective": value,
        "best_step": t.user_attrs.get("best_step", best["step"] if best else None),
        "last_step": curve[-1]["step"] if curve else None,
        "wall_s": t.user_attrs.get("wall_s"),
        "attempts": attempts[n],
        "overrides": t.user_attrs.get("overrides", ""),
        "error": t.user_attrs.get("error", ""),
        "params": dict(t.params),
        "curve": [(r["step"], r.get(objective)) for r in curve if r.get(objective) is not None],
      }
    )
  rank = {"complete": 0, "pruned": 1, "running": 2, "waiting": 3, "fail": 4}
  out.sort(key=lambda r: (rank.get(r["state"], 5), -_key(r["objective"], maximize), r["trial"]))
  return out


def _key(v, maximize: bool) -> float:
  if v is None or v != v:
    return -math.inf
  return v if maximize else -v


def write(study, sweep_dir: str, record: dict) -> str:
  """Writes report.md, trials.csv and the plots; returns a one-line summary.

  Long: the report's sections in the order report.md shows them.
  """
  table = rows(study, sweep_dir)
  described = study.user_attrs.get("sweep", {})
  objective, direction = described.get("objective", "objective"), described.get("direction", "maximize")
  params = sorted({k for r in table for k in r["params"]})
  with paths.replacing(os.path.join(sweep_dir, "trials.csv"), "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(COLUMNS[:3] + params + COLUMNS[3:])
    for r in table:
      w.writerow(
        [r["trial"], r["state"], _num(r["objective"])]
        + [r["params"].get(p, "") for p in params]
        + [r[c] if r[c] is not None else "" for c in COLUMNS[3:]]
      )
  plots = _plots(study, table, params, objective, direction, sweep_dir)
  counts = {}
  for r in table:
    counts[r["state"]] = counts.get(r["state"], 0) + 1
  best = next((r for r in table if r["state"] == "complete"), None)
  lines = [
    f"# Sweep: {record['study']}",
    "",
    f"- command: `{record['command']}`",
    f"- storage: `{record['storage']}`, study `{record['study']}`",
    f"- objective: {direction} `{objective}` (a trial's best evaluation during training)",
    f"- trials: {len(table)} ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))})",
    *_grid_lines(described.get("grid"), described.get("grid_order"), table),
    "",
    "| trial | state | " + " | ".join(f"`{p}`" for p in params) + f" | {objective} | best step | steps | wall | note |",
    "|" + " --- |" * (len(params) + 7),
  ]
  for r in table:
    note = r["error"] or (f"{r['attempts']} attempts" if r["attempts"] > 1 else "")
    lines.append(
      f"| {r['trial']} | {r['state']} | "
      + " | ".join(_fmt(r["params"].get(p)) for p in params)
      + f" | {_fmt(r['objective'])} | {_fmt(r['best_step'])} | {_fmt(r['last_step'])} | "
      + f"{fmt_time(r['wall_s']) if r['wall_s'] is not None else ''} | {note.replace('|', '/')} |"
    )
  if best is not None:
    workdir = sweep_lib.trial_dir(sweep_dir, best["trial"])
    retrain = shlex.join(
      ["python", "-m", "vitjax.main", f"--config={record['config']}", "--workdir=workdirs/best", *record["overrides"]]
      + best["overrides"].split()
    )
    lines += [
      "",
      f"## Best: trial {best['trial']}, {objective} {best['objective']:.4f} at step {best['best_step']}",
      "",
      "Train it again (a new workdir):",
      "",
      f"    {retrain}",
      "",
      "Its checkpoints, on the test split:",
      "",
      f"    python -m vitjax.main --mode=eval --workdir={workdir} --split=test",
    ]
  lines += ["", "## Plots", ""]
  for title, name, note in plots:
    lines.append(f"![{title}]({name})" if name.endswith(".png") else f"- {title}: {name}")
    if note:
      lines += ["", note, ""]
  lines += ["", f"Live view: `optuna-dashboard {record['storage']}` (pip install optuna-dashboard).", ""]
  paths.write_text(os.path.join(sweep_dir, "report.md"), "\n".join(lines))
  summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
  top = f"; best trial {best['trial']}: {objective} {best['objective']:.4f}" if best else ""
  return f"{os.path.join(sweep_dir, 'report.md')} ({len(table)} trials: {summary}{top})"


def _grid_lines(grid: list | None, order: str | None, table: list[dict]) -> list[str]:
  """For a grid of which only some points ran (--max_trials): how many, in which order, and the points left."""
  if not grid:
    return []
  ran = [r["params"] for r in table]
  left = [p for p in grid if not any(all(q.get(k) == v for k, v in p.items()) for q in ran)]
  if not left:
    return [f"- grid: all {len(grid)} points"]
  fmt = lambda p: ", ".join(f"{k}={_fmt(v)}" for k, v in p.items())
  return [
    f"- grid: {len(grid) - len(left)} of {len(grid)} points tried (all of them unless --max_trials caps the sweep), "
    f"taken in {_order_words(order)}; not tried: {'; '.join(fmt(p) for p in left)}"
  ]


def _order_words(order: str | None) -> str:
  """The study's grid_order in words: "shuffled, seed 0" (as recorded) -> "a shuffled order (seed 0)"."""
  if not order:
    return "the grid order"
  if order.startswith("shuffled, seed "):
    return f"a shuffled order (seed {order.removeprefix('shuffled, seed ')})"
  return order


def _importance_note(table: list[dict]) -> str:
  """A caveat for the importance plot when it was drawn from fewer than IMPORTANCE_TRIALS complete trials, else ""."""
  n = sum(r["state"] == "complete" for r in table)
  if n >= IMPORTANCE_TRIALS:
    return ""
  return (
    f"Parameter importances from {n} complete trial{'s' if n != 1 else ''} are not reliable (fewer than "
    f"{IMPORTANCE_TRIALS}): read them as a rough hint at most."
  )


def _num(v) -> str:
  return "" if v is None else repr(float(v))


def _fmt(v) -> str:
  if v is None:
    return ""
  if isinstance(v, float):
    return f"{v:.4g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.4f}".rstrip("0").rstrip(".")
  return str(v)


def _save(fig, path: str) -> None:
  """Writes the figure as PNG (through paths.replacing) and closes it."""
  import matplotlib.pyplot as plt

  with paths.replacing(path) as f:
    fig.savefig(f, dpi=100, format="png")
  plt.close(fig)


def _plots(study, table, params, objective, direction, sweep_dir) -> list[tuple[str, str, str]]:
  """Writes the plots; returns (title, file name or why it is missing, a note for the reader or "").

  Long: each plot drawn in turn, with why one is missing.
  """
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  out = []
  finished = [r for r in table if r["state"] in ("complete", "pruned") and r["objective"] is not None]
  if params and finished:
    fig, axes = plt.subplots(1, len(params), figsize=(4 * len(params), 3.4), squeeze=False, sharey=True)
    for ax, p in zip(axes[0], params):
      for state, marker in (("complete", "o"), ("pruned", "x")):
        pts = [(r["params"][p], r["objective"]) for r in finished if r["state"] == state and p in r["params"]]
        if pts:
          xs = [x if isinstance(x, int | float) and not isinstance(x, bool) else str(x) for x, _ in pts]
          ax.scatter(xs, [y for _, y in pts], marker=marker, label=state)
      numeric = [r["params"][p] for r in finished if isinstance(r["params"].get(p), int | float)]
      if numeric and min(numeric) > 0 and max(numeric) / min(numeric) >= 10:
        ax.set_xscale("log")
      ax.set_xlabel(p)
      ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(objective)
    axes[0][0].legend()
    fig.suptitle(f"{objective} ({direction}) against each hyperparameter")
    fig.tight_layout()
    _save(fig, os.path.join(sweep_dir, "objective_vs_params.png"))
    out.append(("objective against each hyperparameter", "objective_vs_params.png", ""))
  curves = [r for r in table if r["curve"]]
  if curves:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)  # 20 trials before a colour repeats
    for r in sorted(curves, key=lambda r: r["trial"]):
      steps, vals = zip(*r["curve"])
      ax.plot(
        steps, vals, marker=".", linestyle="--" if r["state"] != "complete" else "-", label=f"{r['trial']} {r['state']}"
      )
    ax.set_xlabel("step")
    ax.set_ylabel(objective)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, title="trial")
    ax.set_title("every trial's evaluations during training")
    fig.tight_layout()
    _save(fig, os.path.join(sweep_dir, "curves.png"))
    out.append(("every trial's evaluation curve", "curves.png", ""))
  import optuna

  for title, name, fn in (
    (
      "Optuna's parallel coordinates",
      "parallel_coordinate.png",
      optuna.visualization.matplotlib.plot_parallel_coordinate,
    ),
    (
      "Optuna's parameter importances (fANOVA)",
      "importance.png",
      optuna.visualization.matplotlib.plot_param_importances,
    ),
  ):
    try:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ax = fn(study)
      fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
      fig.set_size_inches(8, 5)
      fig.tight_layout()
      _save(fig, os.path.join(sweep_dir, name))
      out.append((title, name, _importance_note(table) if name == "importance.png" else ""))
    except Exception as e:  # too few complete trials, a single value per parameter, ...
      out.append((title, f"not drawn ({' '.join(str(e).split())[:200]})", ""))
  return out
