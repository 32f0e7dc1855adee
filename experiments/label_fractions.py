"""Does MAE pre-training pay where labels are few? Fashion-MNIST with 1%, 10% and 100% of the training labels
(issue 47): a class-balanced subset of the 54,000 training images (`--config.data.labelled=F`, drawn by
`--config.data.labelled_seed`, the run's seed here: each seed its own subset), three arms on the same subset:

    mae      the encoder of an MAE pre-trained 5 epochs on all 54,000 training images (no labels), fine-tuned
             (layer decay 0.75) for STEPS on the labelled subset
    scratch  the same ViT trained from scratch for the same STEPS on the same subset (no layer decay)
    probe    the frozen MAE encoder under the probe evaluator, fitted on the same subset: linear, k-NN, 10-shot

One MAE pre-training per seed, under ROOT/mae_SEED (the command of experiments/mae_probe_seeds.py, so its
100% rows are this experiment's 100% column: `--summary` reads them from results/mae_probe_seeds.jsonl). Each
(arm, fraction, seed, tag) appends one JSON line to results/label_fractions.jsonl and is skipped when that line
exists (rerun to resume: vitjax resumes the workdir too). Models are evaluated on test at their `best`
checkpoint, chosen on the 6,000-image 'valid' split, as in the 100% rows; both arms see the same 'valid'.

    python experiments/label_fractions.py --arms=mae,probe --fractions=0.01,0.1 --seeds=0,1,2 --cores=0 --root=R &
    python experiments/label_fractions.py --arms=scratch --fractions=0.01,0.1 --seeds=0,1,2 --cores=1 --root=R &
    python experiments/label_fractions.py --summary    # the table: mean ± sd, paired differences ± standard error
    python experiments/label_fractions.py --plot=experiments/results/label_fractions.png

Tuning (seed 0, both arms alike): `--tag=NAME --set=--config.FIELD=VALUE ... --steps_x=3` adds config overrides
to the fine-tuning and scratch runs or multiplies their budget; rows keep their tag. `--summary` reports, for each
arm and fraction, the setting whose seed-0 run has the best validation accuracy, and lists every seed-0 setting. Fashion-MNIST must be
prepared (`python -m vitjax.data.prepare --dataset=fashion_mnist`).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
from mae_probe_seeds import MAE, VIT, main_cmd  # the same commands as the 100% rows (experiments/ is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "experiments", "results", "label_fractions.jsonl")
FULL = os.path.join(ROOT, "experiments", "results", "mae_probe_seeds.jsonl")  # the 100% rows
STEPS = {0.01: 500, 0.1: 1000}  # the fine-tuning budget of each fraction, the same for both arms
PROBE = ("linear", "knn", "10shot")


def pretrained(root: str, seed: int, cores: str | None) -> str:
  """ROOT/mae_SEED, pre-trained first unless ROOT/mae_SEED.json (its result) exists (a rerun resumes it)."""
  w = os.path.join(root, f"mae_{seed}")
  if not (os.path.exists(f"{w}.json") and os.path.getsize(f"{w}.json")):
    r = main_cmd(cores, f"--config={MAE}", f"--workdir={w}", "--config.num_epochs=5", f"--config.seed={seed}")
    with open(f"{w}.json", "w") as f:
      f.write(json.dumps(r) + "\n")
  return w


def run(
  arm: str, fraction: float, seed: int, root: str, cores: str | None, tag: str, extra: list[str], steps_x: float
) -> dict:
  subset = [f"--config.seed={seed}", f"--config.data.labelled={fraction}", f"--config.data.labelled_seed={seed}"]
  if arm == "probe":
    mae = pretrained(root, seed, cores)
    r = main_cmd(cores, "--mode=eval", "--eval=probe", "--split=test", f"--config={MAE}", f"--workdir={mae}", *subset)
    return {k: r[f"probe/{k}"] for k in PROBE} | {"wall_s": r["wall_s"]}
  w = os.path.join(root, f"{arm}_{fraction}_{seed}" + (f"_{tag}" if tag else ""))
  every = round(50 * steps_x)  # an evaluation (and a checkpoint) every 50 steps of the base budget
  train = [f"--config={VIT}", f"--workdir={w}", *subset, f"--config.total_steps={round(STEPS[fraction] * steps_x)}"]
  train += [f"--config.eval_every={every}", f"--config.checkpoint_every={every}", "--config.log_every=50"]
  if arm == "mae":
    train.append(f"--config.init_from={pretrained(root, seed, cores)}")
  elif arm == "scratch":
    train += ["--config.init_from=", "--config.optim.layer_decay=1.0"]
  else:
    raise SystemExit(f"unknown arm {arm!r}: use mae, scratch, probe")
  t = main_cmd(cores, *train, *extra)
  e = main_cmd(cores, "--mode=eval", f"--workdir={w}", "--split=test")
  return {"valid": t["eval/accuracy"], "test": e["eval/accuracy"], "best_step": e.get("step"), "train_s": t["wall_s"]}


def chosen() -> dict:
  """{(arm, fraction): tag}: each arm's setting at each fraction, the tag whose seed-0 run has the best validation
  accuracy (the tuning rule, the same for both arms; the probe has no setting)."""
  best: dict = {}
  for r in map(json.loads, open(OUT)) if os.path.exists(OUT) else []:
    if r["seed"] == 0 and r["arm"] != "probe":
      key = (r["arm"], r["fraction"])
      if key not in best or r["valid"] > best[key][0]:
        best[key] = (r["valid"], r.get("tag", ""))
  return {k: tag for k, (_, tag) in best.items()}


def rows(tags: dict | None = None) -> dict:
  """{(arm, fraction): {seed: test accuracy}} at each arm's chosen setting (or at `tags`, {(arm, fraction): tag},
  the default setting where it names none), and the 100% rows."""
  tags, out = chosen() if tags is None else tags, {}
  for r in map(json.loads, open(OUT)) if os.path.exists(OUT) else []:
    if r.get("tag", "") == tags.get((r["arm"], r["fraction"]), ""):
      out.setdefault((r["arm"], r["fraction"]), {})[r["seed"]] = r["linear"] if r["arm"] == "probe" else r["test"]
  for r in map(json.loads, open(FULL)) if os.path.exists(FULL) else []:
    if r["arm"] in ("mae", "scratch"):
      out.setdefault((r["arm"], 1.0), {})[r["seed"]] = r["test"]
    if r["arm"] == "mae":
      out.setdefault(("probe", 1.0), {})[r["seed"]] = r["probe"]["test"]["linear"]
  return out


def summary() -> None:
  """The table at each arm's chosen setting; below a fraction where tuning chose a setting other than the defaults,
  its row at the defaults too (the chosen setting may have fewer seeds run); then every seed-0 setting."""
  tags = chosen()
  fmt = lambda v: (
    "-" if not v else f"{100 * np.mean(v):.2f} ± {100 * np.std(v, ddof=1):.2f}" if len(v) > 1 else f"{100 * v[0]:.2f}"
  )
  print("| labels | MAE, fine-tuned | scratch | MAE - scratch (paired) | MAE, linear probe | probe - scratch |")
  print("| --- | --- | --- | --- | --- | --- |")
  at_tags, at_defaults = rows(tags), rows({})
  for f in sorted({f for _, f in at_tags}):
    for at in (tags, {}) if any(tags.get((a, f)) for a in ("mae", "scratch")) else (tags,):
      got = at_tags if at else at_defaults
      cells = {a: got.get((a, f), {}) for a in ("mae", "scratch", "probe")}

      def diff(a, b, c=cells):
        seeds = sorted(set(c[a]) & set(c[b]))
        d = [100 * (c[a][s] - c[b][s]) for s in seeds]
        if len(d) < 2:
          return "-" if not d else f"{d[0]:+.2f} (1 seed)"
        return f"{np.mean(d):+.2f} ± {np.std(d, ddof=1) / np.sqrt(len(d)):.2f} (n={len(d)})"

      vals = {a: list(c.values()) for a, c in cells.items()}
      setting = lambda a, f=f, at=at: f" ({at.get((a, f)) or 'default'})" if (a, f) in tags else ""
      print(
        f"| {100 * f:g}%{'' if at else ', defaults'} | {fmt(vals['mae'])}{setting('mae')} | "
        f"{fmt(vals['scratch'])}{setting('scratch')} | {diff('mae', 'scratch')} | {fmt(vals['probe'])} | "
        f"{diff('probe', 'scratch')} |"
      )
  tuning = [json.loads(x) for x in open(OUT)] if os.path.exists(OUT) else []
  print("\nseed 0, every setting (validation / test):")
  for r in sorted(tuning, key=lambda r: (r["fraction"], r["arm"], r.get("tag", ""))):
    if r["seed"] == 0 and r["arm"] != "probe":
      print(
        f"  {100 * r['fraction']:g}% {r['arm']:8s} {r.get('tag') or 'default':8s} {r['steps']:5d} steps: "
        f"{100 * r['valid']:.2f} / {100 * r['test']:.2f}"
      )


def plot(path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  # each point at its arm's chosen setting, unless that has fewer seeds run than the defaults (then the defaults)
  got, defaults = rows(), rows({})
  got = {k: v if len(v) >= len(defaults.get(k, {})) else defaults[k] for k, v in got.items()}
  fig, ax = plt.subplots(figsize=(5.5, 4))
  names = {"mae": "MAE, fine-tuned", "scratch": "from scratch", "probe": "MAE, linear probe"}
  for arm, label in names.items():
    fs = sorted(f for a, f in got if a == arm)
    if not fs:
      continue
    means = [100 * np.mean(list(got[(arm, f)].values())) for f in fs]
    sds = [100 * np.std(list(got[(arm, f)].values()), ddof=1) if len(got[(arm, f)]) > 1 else 0 for f in fs]
    ax.errorbar([100 * f for f in fs], means, yerr=sds, marker="o", capsize=3, label=label)
  ax.set_xscale("log")
  ax.set_xticks([1, 10, 100], ["1%", "10%", "100%"])
  ax.set_xlabel("labelled training images (%; 100% = 54,000)")
  ax.set_ylabel("test accuracy (%), mean ± sd over 3 seeds")
  ax.set_title("Fashion-MNIST: MAE pre-training against scratch")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print(path)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--arms", default="mae,scratch,probe")
  ap.add_argument("--fractions", default="0.01,0.1")
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--cores", default=None, help="taskset core list, e.g. 0")
  ap.add_argument("--root", default="/tmp/label_fractions")
  ap.add_argument("--tag", default="", help="a name for the rows of a tuning variant")
  ap.add_argument("--set", action="append", default=[], help="a config override for the training runs (repeat)")
  ap.add_argument("--steps_x", type=float, default=1.0, help="the fine-tuning budget times this (a tuning variant)")
  ap.add_argument("--summary", action="store_true")
  ap.add_argument("--plot", default=None, help="write the accuracy-against-labels plot here")
  a = ap.parse_args()
  if a.summary or a.plot:
    return summary() if a.summary else plot(a.plot)
  done = set()
  for r in map(json.loads, open(OUT)) if os.path.exists(OUT) else []:
    done.add((r["arm"], r["fraction"], r["seed"], r.get("tag", "")))
  for seed in map(int, a.seeds.split(",")):
    for fraction in map(float, a.fractions.split(",")):
      for arm in a.arms.split(","):
        if (arm, fraction, seed, a.tag) in done or (arm == "probe" and a.tag):
          continue
        result = run(arm, fraction, seed, a.root, a.cores, a.tag, a.set, a.steps_x)
        row = {"arm": arm, "fraction": fraction, "seed": seed, "tag": a.tag, "set": a.set, "steps_x": a.steps_x}
        row |= {"steps": round(STEPS[fraction] * a.steps_x), "cores": a.cores, **result}
        with open(OUT, "a") as f:
          f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()
