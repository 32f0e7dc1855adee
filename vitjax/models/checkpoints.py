"""Checkpoints, read: WORKDIR/checkpoints/STEP through one orbax CheckpointManager, with integrity checks.

The format and its reader: vitjax.load, evaluation, init_from and averaging read here; vitjax.train.checkpoints adds
the writer (what it keeps, when it saves, corrupt steps set aside).

A step holds the TrainState, the data iterator's position and their checksums. Its metrics (its evaluation, if any)
rank it: `--checkpoint=best` is the best evaluated kept step by config.best ('max' or 'min' by its evaluator; a
non-finite evaluation is never best), `latest` the newest, or a step number.

Integrity: at save time every array gets a checksum computed on the devices (two position-weighted sums of its
bit patterns modulo 2^32: independent of sharding and reduction order, and any single changed word changes it),
and the data position a SHA-256; they are saved in the same step. Every restore recomputes and compares them. A
step that fails (truncated or missing files, unreadable metadata, flipped bytes) is named in one line with what
is wrong and skipped: "latest" and "best" fall back to the next intact step (training also moves the broken one to
WORKDIR/corrupt/; nothing is deleted). A step whose arrays have other shapes than the config's model is not corrupt
but another config's, and says so.
"""

from __future__ import annotations

import hashlib
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from vitjax.errors import ConfigError
from vitjax.logs import muted
from vitjax.mesh import agree, path_name

CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"  # WORKDIR/averaged: vitjax.average's mean of several steps' parameters (--checkpoint=averaged)


def _words(x) -> jax.Array:
  """An array's bit patterns as a flat uint32 vector (8-byte types: two words each)."""
  x = jnp.asarray(x)
  if x.dtype == jnp.bool_:
    x = x.astype(jnp.uint8)
    unsigned = jnp.uint8
  else:
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
  return jax.lax.bitcast_convert_type(x, unsigned).reshape(-1).astype(jnp.uint32)


@jax.jit
def _fingerprint(x) -> jax.Array:
  """[2] uint32: two position-weighted sums of an array's bit patterns (see the module docstring)."""
  u = _words(x)
  i = jnp.arange(u.shape[0], dtype=jnp.uint32)
  a = jnp.sum(u * (2 * i + 1), dtype=jnp.uint32)  # odd weights: invertible mod 2^32
  b = jnp.sum(u * ((i * jnp.uint32(2654435761)) | 1), dtype=jnp.uint32)
  return jnp.stack([a, b])


def checksums(tree) -> dict:
  """{path: [uint32, uint32]} of every array of a tree (see the module docstring).

  One small program per distinct shape, dtype and sharding, called per array: a model's blocks share theirs, so a
  run compiles a dozen or so small programs. One program over the whole tree compiled for seconds: ViT-B/16's AdamW
  state (601 arrays, 2-core EPYC) took 7.1 s the first time and 981 ms a save after, against 2.3 s and 405 ms.
  """
  return named_checksums(jax.device_get(jax.tree.map(_fingerprint, tree)))


def named_checksums(values) -> dict:
  """{path: [uint32, uint32]} of a tree of fingerprints (each a uint32 pair, on the host)."""
  return {path_name(p): [int(v[0]), int(v[1])] for p, v in jax.tree_util.tree_leaves_with_path(values)}


def text_checksum(text: str) -> str:
  """The SHA-256 hex digest of `text` (UTF-8): the checksum of a checkpoint's data-iterator state."""
  return hashlib.sha256(text.encode()).hexdigest()


class CorruptCheckpoint(Exception):
  """A checkpoint that cannot be read back as it was written; the message says what is wrong."""


def _read_only_options(**kw) -> ocp.CheckpointManagerOptions:
  # (the settings orbax would otherwise change with a warning)
  return ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False, **kw)


def has_checkpoints(workdir: str) -> bool:
  """Whether WORKDIR/checkpoints/ holds a step (an entry whose name is all digits)."""
  return latest_step(workdir) is not None


def latest_step(workdir: str) -> int | None:
  """The newest step WORKDIR/checkpoints/ holds, written to the end (orbax names it by its number then), or None."""
  path = os.path.join(workdir, CHECKPOINTS)
  return max((int(n) for n in os.listdir(path) if n.isdigit()), default=None) if os.path.isdir(path) else None


class Checkpoints:
  """WORKDIR/checkpoints read through one orbax CheckpointManager (see the module docstring).

  best, best_mode: the metric that ranks evaluated steps (config.best) and 'max' or 'min' (its evaluator's).
  subdir: CHECKPOINTS, or AVERAGED for vitjax.average's (its state is {"params", "model_state"} only).
  """

  ITEMS = ("state", "data", "checksums")

  read_only = True  # (the writer, vitjax.train.checkpoints.Checkpoints, is not)

  def __init__(self, workdir: str, best: str, best_mode: str, subdir: str = CHECKPOINTS):
    self.workdir = workdir
    self.directory = os.path.join(workdir, subdir)
    self.best, self.best_mode = best, best_mode
    worst = -math.inf if best_mode == "max" else math.inf
    best_fn = lambda metrics: metrics[best] if math.isfinite(metrics[best]) else worst
    if self.read_only and not os.path.isdir(self.directory):
      raise ConfigError(
        f"no {CHECKPOINTS}/ in {workdir}: train first (python -m vitjax.main --config=... --workdir={workdir}), "
        "or evaluate imported weights as they are (--mode=eval --config=... --config.init_from=...)"
      )
    try:
      with muted("Given directory is read only"):  # orbax's, for a read-only manager: read as a folder unwritable
        self.manager = ocp.CheckpointManager(self.directory, options=self._options(best_fn), item_names=self.ITEMS)
    except Exception as e:  # a step whose metadata is unreadable stops orbax from listing the others
      raise ConfigError(f"{self.directory}: orbax cannot list the checkpoints ({_first_line(e)})") from None

  def _options(self, best_fn) -> ocp.CheckpointManagerOptions:
    return _read_only_options(best_fn=best_fn, best_mode=self.best_mode)

  # -- which steps
  def steps(self) -> list[int]:
    """The kept steps, in ascending order."""
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest kept step; None if there is none."""
    return self.manager.latest_step()

  def best_step(self) -> int | None:
    """The kept step with the best metrics (ties: the later step, as orbax keeps it); None if none was evaluated."""
    ranked = self._ranked()
    return ranked[0] if ranked else None

  def _ranked(self) -> list[int]:
    """Evaluated steps (finite metric), best first."""
    scored = [(s, (self.metrics(s) or {}).get(self.best)) for s in self.steps()]
    sign = 1 if self.best_mode == "max" else -1
    ranked = sorted(((sign * v, s) for s, v in scored if v is not None and math.isfinite(v)), reverse=True)
    return [s for _, s in ranked]

  def metrics(self, step: int) -> dict | None:
    """The metrics a step was saved with (its evaluation), or None."""
    return self.manager.metrics(step)

  def candidates(self, which: str) -> list[int]:
    """The steps `which` ('latest', 'best' or a step number) may use, in order of preference.

    The fallbacks for a corrupt one follow ('latest': older steps; 'best': the next best, then the latest).
    """
    steps = self.steps()
    if not steps:
      raise ConfigError(f"{self.directory} holds no finished checkpoint")
    if which == "latest":
      return steps[::-1]
    if which == "best":
      ranked = self._ranked()
      if not ranked:
        logging.warning("no evaluated checkpoint in %s: using the latest, step %d", self.directory, steps[-1])
      return ranked + [s for s in steps[::-1] if s not in ranked]
    try:
      step = int(which)
    except ValueError:
      raise ConfigError(
        f"--checkpoint={which!r}: use 'best', 'latest', a step number ({steps}) or 'averaged'"
      ) from None
    if step not in steps:
      raise ConfigError(f"no checkpoint for step {step} in {self.directory}; there are {steps}")
    return [step]

  # -- restoring
  def restore(self, which: str, abstract_state, with_data: bool = True, variables_only: bool = False):
    """(step, state, data position) of the first intact candidate of `which` (see candidates()).

    variables_only: restore only params and model_state (a dict; abstract is {"params", "model_state"}), no
    optimizer state (evaluation, loading); "ema": the moving average of the parameters in place of them.
    Corrupt steps are logged and skipped (and, when training, moved to WORKDIR/corrupt/); a step of other
    shapes raises ConfigError; no intact step raises ConfigError listing what is wrong with each.
    """
    problems = []
    for step in self.candidates(which):
      try:
        state, data = self._restore_verified(step, abstract_state, with_data, variables_only)
        error = None
      except CorruptCheckpoint as e:
        error = str(e)
      if agree(error is not None)[0]:  # corrupt for one process is corrupt for all: all skip the same steps
        error = error or "corrupt as read by another process"
        problems.append(f"step {step}: {error}")
        logging.warning("checkpoint %d in %s is corrupt (%s): skipped", step, self.directory, error)
        self._set_aside(step)
        continue
      if problems:
        logging.warning("using checkpoint %d instead", step)
      return step, state, data
    if which not in ("latest", "best"):  # the one step asked for
      others = [s for s in self.steps() if s != int(which)]
      raise ConfigError(
        f"checkpoint {which} in {self.directory} is corrupt ({problems[0].split(': ', 1)[1]}); the workdir keeps "
        f"{others or 'no other step'}"
      )
    raise ConfigError(
      f"no intact checkpoint in {self.directory}: {'; '.join(problems)}. Restore the workdir from a copy, or "
      "start again in a new --workdir"
    )

  def restore_variables(self, which: str, abstract: dict, weights: str = "params"):
    """(step, parameters, other collections) of `which` (see restore).

    Only those arrays are read, not the optimizer's. abstract: {"params", "model_state"} as vitjax.models.network.Network.abstract.
    weights: "params" (the trained parameters) or "ema" (their moving average, config.ema_decay, found by its place in
    the saved optimizer state; ConfigError if the run kept none).
    """
    if weights not in ("params", "ema"):
      raise ConfigError(f"weights={weights!r}: use 'params' (the trained parameters) or 'ema' (their average)")
    step, (params, model_state), _ = self.restore(which, abstract, with_data=False, variables_only=weights)
    return step, params, model_state

  def _restore_verified(self, step, abstract, with_data, variables_only):
    target = abstract
    if variables_only == "ema":
      target = {"model_state": abstract["model_state"], "opt_state": self._ema_target(step, abstract["params"])}
    elif variables_only:
      target = {"params": abstract["params"], "model_state": abstract["model_state"]}
    self._check_shapes(step, target)
    expected = None
    if os.path.isdir(os.path.join(self.directory, str(step), "checksums")):
      try:
        expected = self.manager.restore(step, args=ocp.args.Composite(checksums=ocp.args.JsonRestore()))["checksums"]
      except Exception as e:
        raise CorruptCheckpoint(f"its checksums cannot be read: {_first_line(e)}") from None
    else:
      logging.warning("checkpoint %d has no checksums (written before vitjax recorded them): not verified", step)
    items = {}
    if variables_only:
      restore_args = ocp.checkpoint_utils.construct_restore_args(target)
      items["state"] = ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)
    else:
      items["state"] = ocp.args.StandardRestore(target)
    if with_data:
      items["data"] = ocp.args.JsonRestore()
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:
      raise CorruptCheckpoint(f"orbax cannot read it: {_fault(e)}") from None
    state, data = restored["state"], restored.get("data") if with_data else None
    if variables_only == "ema":  # the placeholders left out of the read, and the average as the parameters
      state = {"params": _ema_of(state["opt_state"]), "model_state": state["model_state"]}
    if expected is not None:
      got = checksums(_without_placeholders(restored["state"]) if variables_only == "ema" else state)
      bad = [k for k, v in got.items() if expected["state"].get(k) != v]
      if bad:
        raise CorruptCheckpoint(f"{len(bad)} arrays differ from their checksums, e.g. {bad[0]}")
      if with_data and (not isinstance(data, str) or text_checksum(data) != expected["data"]):
        raise CorruptCheckpoint("the data position differs from its checksum")
    if variables_only:
      state = (state["params"], dict(state.get("model_state") or {}))
    return state, data

  def _ema_target(self, step, params) -> list | dict:
    """The saved optimizer state's tree with orbax's PLACEHOLDER everywhere but the moving average of the parameters.

    The average is optim.track_ema's `ema`, laid out as the parameters. A read of that alone, with no optimizer to
    rebuild. ConfigError if the run kept no average.
    """
    path = os.path.join(self.directory, str(step), "state")
    try:
      with open(os.path.join(path, "_METADATA")) as f:
        entries = [e["key_metadata"] for e in json.load(f)["tree_metadata"].values()]
    except (OSError, ValueError, KeyError) as e:
      raise CorruptCheckpoint(f"its metadata cannot be read: {_first_line(e)}") from None
    wanted = {path_name(p): a for p, a in jax.tree_util.tree_leaves_with_path(params)}
    tree, found = {}, False
    for keys in entries:
      if keys[0]["key"] != "opt_state":
        continue
      names = [str(k["key"]) for k in keys]  # opt_state / i / ema / param path: track_ema is the chain's last
      inside = "/".join(names[3:]) if len(names) > 3 and names[2] == "ema" else None
      found |= inside in wanted
      _insert(tree, keys, wanted.get(inside, ocp.PLACEHOLDER))
    if not found:
      raise ConfigError(
        f"weights='ema': the run in {self.workdir} keeps no moving average of its parameters (config.ema_decay is "
        "not set); evaluate its parameters (weights='params'), or train with --config.ema_decay=0.9999"
      )
    return tree["opt_state"]

  def _check_shapes(self, step, target) -> None:
    """ConfigError when the step's arrays have other shapes than `target` (another config's checkpoint).

    CorruptCheckpoint when its metadata cannot be read.
    """
    try:
      saved = saved_shapes(os.path.join(self.directory, str(step), "state"))
    except Exception as e:
      raise CorruptCheckpoint(f"its metadata cannot be read: {_first_line(e)}") from None
    if not saved:
      raise CorruptCheckpoint("its metadata lists no arrays")
    leaves = jax.tree_util.tree_leaves_with_path(target)
    wanted = {path_name(p): tuple(a.shape) for p, a in leaves if a is not ocp.PLACEHOLDER}
    differ = [f"{k}: {saved.get(k)} there, {v} now" for k, v in wanted.items() if saved.get(k) != v]
    if differ:
      if all(d.startswith("opt_state/") for d in differ):  # the parameters fit: another optimizer or rules
        fix = (
          "The parameters fit, the optimizer's state does not (optim, frozen, lr_mults or wd_mults changed): train "
          f"in a new workdir from these weights, --config.init_from={self.workdir}, or use the config it was "
          "written with"
        )
        differ = differ[:1]
      else:
        fix = "Use the config it was written with"
      raise ConfigError(
        f"checkpoint {step} in {self.directory} was written by another config: its arrays have other shapes "
        f"({'; '.join(differ[:5])}{' ...' if len(differ) > 5 else ''}). {fix}"
      )

  def _set_aside(self, step: int) -> None:
    """What becomes of a corrupt step: the reader leaves it where it is (the writer moves it aside)."""

  def close(self) -> None:
    """Waits for the writes in flight, then closes (idempotent)."""
    if self.manager is not None:
      self.manager.wait_until_finished()
      self.manager.close()
      self.manager = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def read_variables(workdir: str, which, abstract: dict, weights: str, best: str, best_mode: str, keep: int = 5):
  """(step, parameters, other collections) of a workdir's checkpoint `which`.

  'best', 'latest', a step (see Checkpoints.candidates), or 'averaged' (vitjax.average's mean; its step is its newest
  member's). abstract: vitjax.models.network.Network.abstract. best, best_mode: config.best and its evaluator's mode;
  keep: config.keep_checkpoints (for the hint on averaging).
  """
  if str(which) != AVERAGED:
    with Checkpoints(workdir, best, best_mode) as ckpts:
      return ckpts.restore_variables(str(which), abstract, weights)
  if weights != "params":
    raise ConfigError("--checkpoint=averaged holds averaged parameters, not a moving average: use --weights=params")
  found = [d for d in (AVERAGED, AVERAGED + ".old") if os.path.isdir(os.path.join(workdir, d))]
  if not found:  # (.old: an averaging that stopped between its two renames)
    raise ConfigError(
      f"no averaged checkpoint in {workdir}: write one with python -m vitjax.average --workdir={workdir} "
      f"--last={min(5, keep)}"
    )
  with Checkpoints(workdir, best, best_mode, subdir=found[0]) as ckpts:
    return ckpts.restore_variables("latest", abstract)


def _insert(tree, keys, value) -> None:
  """Puts `value` at `keys` in a nested tree of lists and dicts, making the containers on the way.

  `keys` is orbax's key metadata: key_type 1 a sequence index, else a dict key.
  """
  node = tree
  for i, k in enumerate(keys):
    key = int(k["key"]) if k["key_type"] == 1 else str(k["key"])
    if isinstance(node, list):
      node.extend([None] * (key + 1 - len(node)))
    if i == len(keys) - 1:
      node[key] = value
    else:
      child = node[key] if isinstance(node, list) else node.get(key)
      if child is None:
        child = [] if keys[i + 1]["key_type"] == 1 else {}
        node[key] = child
      node = child


def _without_placeholders(tree):
  return jax.tree.map(lambda x: None if x is ocp.PLACEHOLDER else x, tree)


def _ema_of(opt_state):
  """The `ema` entry of a restored optimizer state (see Checkpoints._ema_target): the top-level chain's last."""
  return opt_state[-1]["ema"]


def saved_shapes(path: str) -> dict[str, tuple]:
  """The shapes of the arrays in an orbax PyTree directory (a step's state/), read with tensorstore's blocking calls.

  As {'params/encoder/block_0/attn/query/kernel': shape, ...}. Orbax's own metadata read runs on an asyncio loop that it
  closes when a read fails, and the reads still pending then print tracebacks from tensorstore's threads; a damaged file
  raises here instead, and nothing is left pending.
  """
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  with open(os.path.join(path, "_METADATA")) as f:
    meta = json.load(f)
  base = {"driver": "file", "path": path.rstrip("/") + "/"}
  kv = ts.KvStore.open({"driver": "ocdbt", "base": base} if meta.get("use_ocdbt", True) else base).result()
  shapes = {}
  for entry in meta["tree_metadata"].values():
    if entry["value_metadata"]["value_type"] not in ("jax.Array", "np.ndarray"):
      continue  # scalars and strings live in the metadata itself
    keys = [str(k["key"]) for k in entry["key_metadata"]]
    for suffix in ("/zarr.json", "/.zarray"):
      found = kv.read(".".join(keys) + suffix).result()
      if found.state == "value":
        shapes["/".join(keys)] = tuple(json.loads(found.value)["shape"])
        break
    else:
      raise ValueError(f"no array metadata for {'/'.join(keys)}")
  return shapes


def _fault(e: BaseException) -> str:
  """The first line of what went wrong inside orbax: its innermost cause.

  orbax's own line, 'Encountered error while reading array index ...', names a bound method where it means the store;
  the cause names the array and the fault.
  """
  while e.__cause__ is not None:
    e = e.__cause__
  return _first_line(e)


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def load_params(workdir: str) -> tuple[dict, dict]:
  """(parameters, other collections such as BatchNorm statistics) of a workdir's latest intact checkpoint, as saved.

  For config.init_from=WORKDIR: the shapes may differ from the model's; vitjax.models.adapt fits them.
  """
  workdir = os.path.abspath(workdir)
  run = os.path.dirname(workdir)
  if os.path.basename(workdir) == AVERAGED and has_checkpoints(run):
    raise ConfigError(
      f"init_from={workdir!r}: init_from reads a run's latest intact checkpoint, not its average; give the run, "
      f"{run}, or export the average (python -m vitjax.export --checkpoint=averaged) and start from that file"
    )
  if not has_checkpoints(workdir):
    raise ConfigError(
      f"init_from={workdir!r}: no checkpoints/ there; give a workdir of a vitjax run, 'timm:NAME:FILE' or 'npz:FILE'"
    )
  manager = ocp.CheckpointManager(
    os.path.join(workdir, CHECKPOINTS), options=_read_only_options(), item_names=Checkpoints.ITEMS
  )
  with manager:
    problems = []
    for step in sorted(manager.all_steps(), reverse=True):
      try:
        saved_shapes(os.path.join(workdir, CHECKPOINTS, str(step), "state"))  # a damaged step stops here, quietly
        handler = ocp.StandardCheckpointHandler()
        try:
          meta = handler.metadata(epath.Path(workdir, CHECKPOINTS, str(step), "state"))
        finally:
          handler.close()
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)  # any shapes, host
        restored = manager.restore(
          step,
          args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(restore_args=as_numpy), checksums=ocp.args.JsonRestore()
          ),
        )
        state, expected = restored["state"], restored["checksums"]["state"]
        variables = {"params": state["params"], "model_state": state.get("model_state") or {}}
        bad = [k for k, v in checksums(variables).items() if expected.get(k) != v]
        if bad:
          raise CorruptCheckpoint(f"{len(bad)} arrays differ from their checksums, e.g. {bad[0]}")
      except Exception as e:
        problems.append(f"step {step}: {_first_line(e)}")
        logging.warning("init_from: checkpoint %d of %s is not usable (%s): skipped", step, workdir, problems[-1])
        continue
      logging.info("init_from: step %d, the latest intact checkpoint of %s", step, workdir)
      return state["params"], dict(state.get("model_state") or {})
  raise ConfigError(f"init_from={workdir!r}: no intact checkpoint there ({'; '.join(problems)})")
