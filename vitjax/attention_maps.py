"""Looking inside a trained image model: attention maps, attention rollout, position-embedding similarity.

    python -m vitjax.attention_maps --workdir=W --out=DIR --example=N [--split=test] [--patch=ROW,COL] [--checkpoint=best]
    python -m vitjax.attention_maps --workdir=W --out=DIR --image=FILE

writes PNGs into DIR:
  input.png                 the image as the model sees it (after the evaluation's resize)
  attention.png             ViT: each layer's attention (rows) of each head (columns) from the query token (the class
                            token, or with --patch or without a class token that patch) over the patch grid
  rollout.png               ViT: attention rollout (Abnar and Zuidema 2020): the product over layers of the
                            head-averaged attention plus the identity (the residual), rows renormalised; the
                            query's row over the patches
  posemb_similarity.png     ViT: the cosine similarity of each patch's position embedding with every other's
                            (the ViT paper's figure 7): one small map per patch, laid out as the grid
  window_attention.png      Swin: each block's (rows) window attention of each head (columns) from the chosen
                            patch (--patch in the first stage's grid, default its centre) over its window, drawn
                            on that stage's grid (shifted windows follow the patch)
and prints one line per file. The weights come from the reference attention path (the model's
implementation="reference", whose outputs are those of every other path), read through flax's intermediates,
so the model's results do not change.
"""

from __future__ import annotations

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

import vitjax
from vitjax import cli, models, paths
from vitjax import data as data_lib
from vitjax.config import read_config
from vitjax.data import augment, device_ops
from vitjax.data import splits as splits_lib
from vitjax.errors import ConfigError
from vitjax.models.swin import effective_window, window_partition
from vitjax.posenc import sincos_2d
from vitjax.tasks.base import VALID

flags.DEFINE_string("workdir", None, "the trained run to look into", required=True)
flags.DEFINE_string("out", None, "the directory the PNGs go to", required=True)
flags.DEFINE_string("image", None, "an image file (any size: it is resized as in evaluation)")
flags.DEFINE_integer("example", None, "or the N-th example of --split of the run's dataset")
flags.DEFINE_string("split", "test", "the split --example reads: 'valid' (the run's validation split), 'test', ...")
flags.DEFINE_string("patch", None, "ROW,COL: the query patch (ViT: instead of the class token; Swin: in stage 0)")
flags.DEFINE_string("checkpoint", "best", "'best', 'latest' or a step number")
FLAGS = flags.FLAGS


# ------------------------------------------------------------------------------ what is computed


def attention_weights(model, variables, image: np.ndarray) -> tuple[dict, dict]:
  """The attention weights of every layer for one image, from the reference path.

  The image is float [H, W, C] in the model's input range. Returns ({module path: [B', heads, T, S] (a scanned stack:
  [layers, B', heads, T, S])}, the model's intermediates).
  """
  reference = model.clone(implementation="reference")
  (_, out), state = reference.apply(variables, jnp.asarray(image)[None], train=False, mutable=["intermediates"])
  flat = jax.tree_util.tree_flatten_with_path(state["intermediates"], is_leaf=lambda x: isinstance(x, tuple))[0]
  weights = {}
  for path, value in flat:
    names = [str(getattr(k, "key", k)) for k in path]
    if names[-1] == "attention_weights":
      weights["/".join(names[:-1])] = np.asarray(value[0])
  return weights, jax.tree.map(np.asarray, out)


def vit_layers(weights: dict) -> list[np.ndarray]:
  """The encoder's attention in layer order: [heads, T, T] each (batch of one)."""
  layers = []
  for path in sorted((p for p in weights if p.startswith("encoder/")), key=_layer_number):
    w = weights[path]
    layers += [w[i, 0] for i in range(w.shape[0])] if "/blocks/" in path else [w[0]]
  return layers


def _layer_number(path: str) -> int:
  part = path.split("/")[1]
  return int(part.split("_")[1]) if part.startswith("block_") else -1


def rollout(layers: list[np.ndarray]) -> np.ndarray:
  """Attention rollout [T, T] (Abnar and Zuidema 2020).

  The product over layers of rownorm(mean_heads(A) + I), first layer rightmost; every row sums to 1.
  """
  t = layers[0].shape[-1]
  out = np.eye(t)
  for a in layers:
    a = a.mean(axis=0) + np.eye(t)
    out = (a / a.sum(axis=-1, keepdims=True)) @ out
  return out


def posemb_similarity(table: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
  """Cosine similarity of the patches' position embeddings [N, D] (N = gh gw) -> [gh, gw, gh, gw]."""
  unit = table / np.linalg.norm(table, axis=-1, keepdims=True).clip(1e-12)
  return (unit @ unit.T).reshape(*grid, *grid)


def window_slots(hw: tuple[int, int], window, shift) -> np.ndarray:
  """The map position (row-major) of each window slot of a Swin block: [nW, N], -1 for padding.

  By the block's own shift, padding and partition.
  """
  h, w = hw
  win, sh = effective_window(hw, window, shift)
  index = np.arange(h * w).reshape(1, h, w, 1)
  if any(sh):
    index = np.roll(index, (-sh[0], -sh[1]), axis=(1, 2))
  index = np.pad(index, ((0, 0), (0, (-h) % win[0]), (0, (-w) % win[1]), (0, 0)), constant_values=-1)
  return np.asarray(window_partition(index, win))[0, :, :, 0]


def swin_patch_attention(weights: np.ndarray, hw, window, shift, patch: tuple[int, int]) -> np.ndarray:
  """The attention of `patch` (row, col on this block's map) over its window: [heads, h, w].

  Zero outside the window. weights: the block's [nW, heads, N, N] (batch of one).
  """
  slots = window_slots(hw, window, shift)
  wi, si = np.argwhere(slots == patch[0] * hw[1] + patch[1])[0]
  row = weights[wi, :, si, :]  # [heads, N]
  out = np.zeros((weights.shape[1], hw[0] * hw[1]))
  valid = slots[wi] >= 0
  out[:, slots[wi][valid]] = row[:, valid]
  return out.reshape(-1, *hw)


def swin_blocks(model, weights: dict, intermediates: dict, patch: tuple[int, int]) -> list[tuple[str, np.ndarray]]:
  """(block name, [heads, h, w]) for every Swin block, the patch followed to each stage's grid."""
  window = model.window_size if not isinstance(model.window_size, int) else (model.window_size,) * 2
  window = tuple(window)
  out = []
  for s, depth in enumerate(model.depths):
    hw = tuple(intermediates[f"stage_{s}"].shape[1:3])
    here = (min(patch[0] >> s, hw[0] - 1), min(patch[1] >> s, hw[1] - 1))
    for j in range(depth):
      shift = (0, 0) if j % 2 == 0 else (window[0] // 2, window[1] // 2)
      name = f"stage_{s}_block_{j}"
      out.append((name, swin_patch_attention(weights[f"{name}/attn"], hw, window, shift, here)))
  return out


# ------------------------------------------------------------------------------ drawing


def _grid_of(model, image_hw) -> tuple[int, int]:
  ph, pw = model.patch_hw
  return image_hw[0] // ph, image_hw[1] // pw


def _show(ax, image, overlay=None, title=None):
  ax.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray", interpolation="nearest")
  if overlay is not None:
    h, w = image.shape[:2]
    ax.imshow(overlay, cmap="inferno", alpha=0.6, extent=(-0.5, w - 0.5, h - 0.5, -0.5), interpolation="nearest")
  ax.set_xticks([])
  ax.set_yticks([])
  if title:
    ax.set_title(title, fontsize=7)


def _save(fig, path) -> str:
  with paths.replacing(path) as f:
    fig.savefig(f, dpi=90, bbox_inches="tight", format="png")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  plt.close(fig)
  return path


def inspect(trained, image: np.ndarray, out_dir: str, patch: tuple[int, int] | None = None) -> list[str]:
  """Writes the PNGs of the module docstring for one uint8 image [H, W, C]; returns their paths.

  The image is already at the model's size.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  draw = {models.ViT: _draw_vit, models.Swin: _draw_swin}.get(models.family_of(trained.model).cls)
  if draw is None:
    raise ConfigError(f"vitjax.attention_maps draws ViT and Swin models, not {type(trained.model).__name__}")
  grid = _grid_of(trained.model, image.shape[:2])  # ViT's patch grid; Swin's first stage's
  if patch is not None and not (0 <= patch[0] < grid[0] and 0 <= patch[1] < grid[1]):
    where = "the" if draw is _draw_vit else "stage 0's"
    raise ConfigError(
      f"--patch={patch[0]},{patch[1]} is outside {where} {grid[0]}x{grid[1]} patch grid "
      f"(e.g. --patch={grid[0] // 2},{grid[1] // 2})"
    )
  shown = image.astype(np.float32) / 255.0
  pre = trained.task.preprocess()
  x = np.asarray(device_ops.to_float(jnp.asarray(image), pre.mean, pre.std))
  weights, inter = attention_weights(trained.model, trained.variables, x)
  created = paths.missing_folders(out_dir)
  try:
    os.makedirs(out_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(2, 2))
    _show(ax, shown)
    written = [_save(fig, os.path.join(out_dir, "input.png"))]
    return written + draw(trained, image, shown, weights, inter, out_dir, patch)
  except OSError as e:
    plt.close("all")
    if created:
      shutil.rmtree(created[-1], ignore_errors=True)
    raise ConfigError(
      f"--out={out_dir}: cannot write there ({e.strerror}); give another --out, in a writable folder with room"
    ) from None


def prefix_tokens(model, tokens: int, grid: tuple[int, int]) -> tuple[int, int]:
  """(class tokens, register tokens) before a ViT's patches, among its `tokens` over a patch `grid`."""
  cls = int(model.has_class_token)
  return cls, tokens - grid[0] * grid[1] - cls


def register_share(a: np.ndarray, query: int, cls: int, registers: int) -> np.ndarray:
  """[heads]: the share of the query's attention (a [heads, T, T]) that goes to the register tokens."""
  return a[:, query, cls : cls + registers].sum(-1)


def _draw_vit(trained, image, shown, weights, inter, out_dir, patch) -> list[str]:
  """attention.png (every layer's and head's attention from the query), rollout.png, posemb_similarity.png."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  model, written = trained.model, []
  grid = _grid_of(model, image.shape[:2])
  layers = vit_layers(weights)
  cls, registers = prefix_tokens(model, layers[0].shape[-1], grid)
  prefix = cls + registers
  if patch is None and cls:
    query, what = 0, "class token"
  else:
    r, c = patch if patch is not None else (grid[0] // 2, grid[1] // 2)  # (inspect checked --patch)
    query, what = prefix + r * grid[1] + c, f"patch ({r}, {c})"
  heads = layers[0].shape[0]
  fig, axes = plt.subplots(len(layers), heads + 1, figsize=(1.6 * (heads + 1), 1.6 * len(layers)), squeeze=False)
  for i, a in enumerate(layers):
    _show(axes[i, 0], shown, title=f"layer {i}")
    share = register_share(a, query, cls, registers)  # the registers, apart from the patch grid
    for h in range(heads):
      title = f"head {h}" + (f", registers {share[h]:.0%}" if registers else "")
      _show(axes[i, h + 1], shown, a[h, query, prefix:].reshape(grid), title=title)
  fig.suptitle(f"attention from the {what}", fontsize=9)
  written.append(_save(fig, os.path.join(out_dir, "attention.png")))
  roll = rollout(layers)
  fig, axes = plt.subplots(1, 2, figsize=(4, 2))
  _show(axes[0], shown, title="input")
  _show(axes[1], shown, roll[query, prefix:].reshape(grid), title=f"rollout from the {what}")
  written.append(_save(fig, os.path.join(out_dir, "rollout.png")))
  table = _position_table(model, trained.variables["params"], grid)
  sim = posemb_similarity(table, grid)
  fig, axes = plt.subplots(*grid, figsize=(0.5 * grid[1] + 1, 0.5 * grid[0] + 1), squeeze=False)
  for r in range(grid[0]):
    for c in range(grid[1]):
      axes[r, c].imshow(sim[r, c], cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
      axes[r, c].set_xticks([])
      axes[r, c].set_yticks([])
  fig.suptitle("position embedding similarity (cosine)", fontsize=9)
  written.append(_save(fig, os.path.join(out_dir, "posemb_similarity.png")))
  return written


def _draw_swin(trained, image, shown, weights, inter, out_dir, patch) -> list[str]:
  """window_attention.png: each block's window attention of one patch of stage 0's grid (shifted windows too)."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  del image
  model, written = trained.model, []
  first = tuple(inter["stage_0"].shape[1:3])
  patch = patch if patch is not None else (first[0] // 2, first[1] // 2)  # (inspect checked --patch)
  blocks = swin_blocks(model, weights, inter, patch)
  heads = max(m.shape[0] for _, m in blocks)
  fig, axes = plt.subplots(len(blocks), heads, figsize=(1.6 * heads, 1.6 * len(blocks)), squeeze=False)
  for i, (name, maps) in enumerate(blocks):
    for h in range(heads):
      if h < maps.shape[0]:
        _show(axes[i, h], shown, maps[h], title=f"{name.replace('stage_', 's').replace('_block_', ' b')} h{h}")
      else:
        axes[i, h].axis("off")
  fig.suptitle(f"window attention of patch {patch} (stage 0 grid)", fontsize=9)
  written.append(_save(fig, os.path.join(out_dir, "window_attention.png")))
  return written


def _position_table(model, params, grid) -> np.ndarray:
  """The patches' position embeddings [N, D].

  The learned table (without the class token's row) or the fixed 2-D sin-cos one.
  """
  if model.posemb == "learn":  # (rows for the class token and registers first, unless model.class_posemb is False)
    table = np.asarray(params["posembed"]["pos_embedding"])[0]
    return table[len(table) - grid[0] * grid[1] :]

  return np.asarray(sincos_2d(*grid, model.width))


# ------------------------------------------------------------------------------ the command line


def _image(trained, path: str | None, example: int | None, split: str) -> np.ndarray:
  """uint8 [H, W, C] at the model's size, from a file or the run's dataset."""
  info = trained.task.describe()
  channels, size = info["channels"], tuple(info["image_size"])
  if (path is None) == (example is None):
    raise ConfigError("give one of --image=FILE or --example=N")
  if path is not None:
    import PIL.Image  # pylint: disable=g-import-not-at-top

    try:
      pil = PIL.Image.open(path).convert("L" if channels == 1 else "RGB")
    except (OSError, ValueError) as e:
      raise ConfigError(f"--image={path}: not an image PIL can read ({e})") from None
    image = np.asarray(pil)
  else:
    source, positions = _split_examples(trained, split)
    if not 0 <= example < len(positions):
      raise ConfigError(f"--example={example}: {split} has examples 0 to {len(positions) - 1}")
    image = np.asarray(source[int(positions[example])]["image"])
  image = image[..., None] if image.ndim == 2 else image
  return augment.preprocess_eval(image, size, trained.task.preprocess())


def _split_examples(trained, split: str):
  """(the tfds source, the positions in it of --split's examples), as `--mode=eval --split=...` reads them.

  'valid' is the run's validation split (held out of its training split, or the dataset's own), the others the
  dataset's (the training split without what was held out).
  """
  d = trained.config.data
  name, positions = trained.task.split_source(split)
  try:
    source, _ = data_lib.open_split(d.name, name, d.get("data_dir"))
  except ValueError:  # tfds: an unknown split name
    names = list(dict.fromkeys([VALID, *splits_lib.prepared_builder(d.name, d.get("data_dir")).info.splits]))
    raise ConfigError(
      f"--split={split}: {d.name} has no such split; give one of {', '.join(names)} (e.g. --split={names[0]})"
    ) from None
  return source, np.arange(len(source)) if positions is None else positions


def main() -> None:
  """Command line entry: writes the attention PNGs of one image of a trained run into --out.

  The image is --image, or the --example-th example of --split; the paths written are printed.

  Raises:
    ConfigError: --workdir is not an image run, --patch is not ROW,COL, --out cannot be written, ... (checked before
      anything is written).
  """
  if (FLAGS.image is None) == (FLAGS.example is None):
    raise ConfigError("give one of --image=FILE or --example=N")
  if FLAGS.example is not None and FLAGS.example < 0:
    raise ConfigError(f"--example={FLAGS.example} must be 0 or more (e.g. --example=0)")
  patch = None
  if FLAGS.patch:
    try:
      patch = tuple(int(v) for v in FLAGS.patch.split(","))
      assert len(patch) == 2
    except (ValueError, AssertionError):
      raise ConfigError(f"--patch={FLAGS.patch}: give ROW,COL, e.g. --patch=3,4") from None
  paths.check_writable(FLAGS.out, "out", folder=True)
  task = read_config(FLAGS.workdir).get("task")
  if task not in ("classification", "mae"):
    raise ConfigError(
      f"--workdir={FLAGS.workdir} is a {task} run: attention maps need an image-classification run (a ViT or Swin)"
    )
  trained = vitjax.load(FLAGS.workdir, FLAGS.checkpoint)
  image = _image(trained, FLAGS.image, FLAGS.example, FLAGS.split)
  for path in inspect(trained, image, FLAGS.out, patch):
    print(path)


if __name__ == "__main__":
  cli.run(main)
