"""How good a frozen representation is, the three ways papers report it.

A linear probe, few-shot linear classifiers and k-nearest neighbours, on features computed once (the task's `features`:
the model's pooled representation, the input of its head).

    linear   ridge regression from the features (standardised by the fitting set's mean and deviation) to
             one-hot targets in {-1, 1}, in closed form; the regulariser is chosen on the selection split
             (valid) from a grid scaled by the number of examples, so one eigendecomposition serves them all
    Nshot    the same classifier fitted on N examples per class drawn from the fitting set, with a fixed
             regulariser (FEWSHOT_L2, big_vision's), averaged over `draws` draws (mean and standard deviation)
    knn      cosine similarity to every fitting example; the k nearest vote with weight exp(similarity / T)
             (k = 20, T = 0.07: DINO's weighted k-NN)

Everything runs in numpy on the host in float64 (the probe's linear algebra, not the features, which the task
computes jit-compiled and sharded over the mesh): the results do not depend on the device or its precision.
All functions take features float [N, D] and integer labels [N].
"""

from __future__ import annotations

import dataclasses

import numpy as np
from absl import logging

FEWSHOT_L2 = 2.0**10  # big_vision's few-shot regulariser (on standardised features)
LINEAR_L2 = tuple(10.0**k for k in range(-6, 2))  # x the number of fitting examples: the linear probe's grid


@dataclasses.dataclass(frozen=True)
class Options:
  """What to report: few-shot sizes and draws, k-NN's k and temperature."""

  shots: tuple[int, ...] = (1, 5, 10, 25)
  draws: int = 5
  knn_k: int = 20
  knn_temperature: float = 0.07
  seed: int = 0

  @classmethod
  def of(cls, options: dict, what: str = "probe") -> Options:
    """The Options in a dict (the probe evaluator's options; others ignored).

    ValueError, naming `what`, for values out of range.
    """
    p = dict(options)
    shots = p.get("shots", cls.shots)
    shots = tuple(shots) if isinstance(shots, list | tuple) else (shots,)
    if not shots or not all(isinstance(n, int) and n >= 1 for n in shots):
      raise ValueError(f"{what}: shots={shots!r}: give examples per class, integers >= 1, e.g. (1, 5, 10, 25)")
    for key, low in (("draws", 1), ("knn_k", 1), ("seed", 0)):
      if not isinstance(p.get(key, 1), int) or p.get(key, 1) < low:
        raise ValueError(f"{what}: {key}={p.get(key)!r} must be an integer >= {low}")
    if not p.get("knn_temperature", 1.0) > 0:
      raise ValueError(f"{what}: knn_temperature={p.get('knn_temperature')!r} must be positive")
    fields = {f.name for f in dataclasses.fields(cls)} - {"shots"}
    return cls(shots=shots, **{k: v for k, v in p.items() if k in fields})


class Ridge:
  """Closed-form ridge regression from features x [N, D] to one-hot targets in {-1, 1} over `num_classes`.

  Solvable for many regularisers from one eigendecomposition (of x^T x [D, D], or x x^T [N, N] when N < D).
  """

  def __init__(self, x: np.ndarray, y: np.ndarray, num_classes: int):
    x = np.asarray(x, np.float64)
    self.mean, self.std = x.mean(0), x.std(0) + 1e-6
    x = (x - self.mean) / self.std
    t = 2.0 * np.eye(num_classes)[np.asarray(y)] - 1.0
    self.offset = t.mean(0)  # the bias, unregularised: the targets' mean on centred features
    t = t - self.offset
    if len(x) >= x.shape[1]:
      self.eigs, q = np.linalg.eigh(x.T @ x)
      self.left, self.right = q, q.T @ (x.T @ t)
    else:  # w = x^T (x x^T + l2)^-1 t
      self.eigs, q = np.linalg.eigh(x @ x.T)
      self.left, self.right = x.T @ q, q.T @ t
    self.num_examples = len(x)

  def predict(self, x: np.ndarray, l2: float) -> np.ndarray:
    """Class predictions int [M] for features x [M, D]."""
    w = (self.left / (self.eigs + l2)[None]) @ self.right
    return np.argmax(((np.asarray(x, np.float64) - self.mean) / self.std) @ w + self.offset, axis=1)

  def accuracy(self, x, y, l2: float) -> float:
    """The share of features x [M, D] whose prediction with regulariser `l2` equals its label y int [M]."""
    return float(np.mean(self.predict(x, l2) == np.asarray(y)))


def linear_probe(fit, select, evaluate: dict, num_classes: int) -> dict:
  """Ridge on all of `fit` = (x, y), the regulariser chosen by accuracy on `select` = (x, y).

  Returns {"l2": the chosen one, split: accuracy for each (x, y) of `evaluate` {split: (x, y)}}.
  """
  ridge = Ridge(*fit, num_classes)
  grid = [a * ridge.num_examples for a in LINEAR_L2]
  scores = [ridge.accuracy(*select, l2) for l2 in grid]
  l2 = grid[int(np.argmax(scores))]  # the first best: the weakest regulariser among ties
  return {"l2": l2, **{split: ridge.accuracy(x, y, l2) for split, (x, y) in evaluate.items()}}


def few_shot(fit, evaluate: dict, num_classes: int, options: Options = Options()) -> dict:
  """Few-shot accuracy of ridge classifiers fitted on `shots` examples per class of `fit` = (x, y).

  {shots: {split: (mean, std) of the accuracy over options.draws draws}}; fewer examples where a class has fewer.
  """
  x, y = np.asarray(fit[0]), np.asarray(fit[1])
  out = {}
  fewest = min(int((y == c).sum()) for c in range(num_classes))
  for shots in options.shots:
    if shots > fewest:  # that class's draws then all take the same examples, fewer than `shots`
      logging.warning(
        "%dshot: the smallest class has %d examples to fit on: each draw takes those %d, not %d; give shots of %d "
        "or fewer, or more examples (fit_examples=None)", shots, fewest, fewest, shots, fewest,
      )  # fmt: skip
    accs = {split: [] for split in evaluate}
    for draw in range(options.draws):
      rng = np.random.default_rng([options.seed, shots, draw])
      idx = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:shots] for c in range(num_classes)])
      ridge = Ridge(x[idx], y[idx], num_classes)
      for split, (ex, ey) in evaluate.items():
        accs[split].append(ridge.accuracy(ex, ey, FEWSHOT_L2))
    out[shots] = {split: (float(np.mean(a)), float(np.std(a))) for split, a in accs.items()}
  return out


def _unit(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def knn(fit, x: np.ndarray, y: np.ndarray, num_classes: int, options: Options = Options(), chunk: int = 1024):
  """Accuracy of the weighted k-NN classifier over `fit` = (x, y) on features x [M, D] with labels y [M]."""
  bank, bank_y = _unit(fit[0]), np.asarray(fit[1])
  k = min(options.knn_k, len(bank))
  correct = 0
  for start in range(0, len(x), chunk):
    sims = _unit(x[start : start + chunk]) @ bank.T  # [m, N]
    top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    weights = np.exp(np.take_along_axis(sims, top, axis=1).astype(np.float64) / options.knn_temperature)
    votes = np.zeros((len(top), num_classes))
    np.add.at(votes, (np.arange(len(top))[:, None], bank_y[top]), weights)
    correct += int(np.sum(votes.argmax(1) == np.asarray(y[start : start + chunk])))
  return correct / max(len(x), 1)


def evaluate(features: dict, num_classes: int, options: Options = Options(), fit: str = "train", select="valid"):
  """The three evaluations of `features` {split: (x, y)}.

  Fitted on `fit`, the linear probe's regulariser chosen on `select`, reported on every other split. Returns {split:
  {"linear": acc, "knn": acc, "{N}shot": mean, "{N}shot_std": std}} and "linear_l2".
  """
  reported = {s: xy for s, xy in features.items() if s != fit}
  linear = linear_probe(features[fit], features[select], reported, num_classes)
  shots = few_shot(features[fit], reported, num_classes, options)
  out = {}
  for split, (x, y) in reported.items():
    row = {"linear": linear[split], "knn": knn(features[fit], x, y, num_classes, options)}
    for n, accs in shots.items():
      row[f"{n}shot"], row[f"{n}shot_std"] = accs[split]
    out[split] = row
  out["linear_l2"] = linear["l2"]
  return out
