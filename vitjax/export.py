"""Command line: a trained ViT or Swin out to timm (`.safetensors`) or to the original ViT release's `.npz`.

    python -m vitjax.export --workdir=workdirs/vit_digits --format=timm --out=vit_digits.safetensors
    python -m vitjax.export --workdir=workdirs/vit_digits --format=npz --out=vit_digits.npz [--checkpoint=latest]

timm: FILE.safetensors holds the state dict and FILE.json the model's timm arguments; in Python,

    import json, safetensors.torch, vitjax.convert as convert
    model = convert.build_timm(json.load(open("vit_digits.json")))       # timm's VisionTransformer / SwinTransformer
    model.load_state_dict(safetensors.torch.load_file("vit_digits.safetensors"), strict=True)

gives the logits of `vitjax.load(workdir)` on the same (NCHW) images. npz: `convert.from_vit_npz(FILE, act=...)`,
the original ViT code and timm's npz reader load it. The model is built at the run's image size.

Exit status: 0 written; 2 a problem you can fix (one "error: ..." line: no such workdir, a model the format has
no equivalent for, an --out that cannot be written); the workdir is only read, and a refused export writes nothing.
"""

import json
import os
import shutil

from absl import flags

from vitjax import cli, paths
from vitjax.config import read_config
from vitjax.errors import ConfigError

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags, defined when it runs (so that `export` imports beside other commands' flags)."""
  flags.DEFINE_string("workdir", None, "the run to export", required=True)
  flags.DEFINE_enum("format", None, ["timm", "npz"], "timm (.safetensors + .json) or npz (the original ViT layout)")
  flags.DEFINE_string("out", None, "the file to write (.safetensors for timm, .npz for npz)", required=True)
  flags.DEFINE_string("checkpoint", "best", "'best' (best validation metric), 'latest' or a step number")
  flags.DEFINE_enum(
    "weights", "params", ["params", "ema"], "the trained parameters or their moving average (ema_decay)"
  )
  flags.mark_flag_as_required("format")


def export(workdir: str, fmt: str, out: str, checkpoint: str = "best", weights: str = "params") -> list[str]:
  """Writes the export; returns the paths written. Raises ConfigError for what the user can fix.

  Everything is checked, and the model converted, before anything is written; a write that fails all the same
  removes what the export had written (and the folders it had made).
  """
  import numpy as np

  import vitjax
  from vitjax import convert

  suffix = {"timm": ".safetensors", "npz": ".npz"}[fmt]
  if not out.endswith(suffix):
    raise ConfigError(f"--out={out}: a --format={fmt} export is a {suffix} file (e.g. --out=model{suffix})")
  side = out[: -len(suffix)] + ".json"
  files = [out, side] if fmt == "timm" else [out]
  paths.check_writable(out, "out", folder=False)
  if os.path.isdir(side):
    raise ConfigError(f"--out={out}: {side}, its config beside it, is a folder; move it away or give another --out")
  task = read_config(workdir).get("task")
  if task == "translation":
    raise ConfigError(
      f"--workdir={workdir} is a translation run: vitjax.export writes image models (ViT, Swin); "
      "give an image run's --workdir"
    )
  trained = vitjax.load(workdir, checkpoint, weights)
  variables = trained.variables  # (config.lora's adapters: the converters fold them into their kernels)
  image = tuple(trained.task.example_inputs()[0].shape[1:3])  # [B, H, W, C] for the image models
  try:
    if fmt == "timm":
      state_dict, cfg = convert.to_timm(trained.model, variables, image)
    else:
      arrays = convert.to_vit_npz(trained.model, variables)
  except ValueError as e:  # a model the format cannot express
    raise ConfigError(f"--format={fmt}: {e}") from None
  folder = os.path.dirname(os.path.abspath(out))
  created, new = paths.missing_folders(folder), [f for f in files if not os.path.exists(f)]
  try:
    os.makedirs(folder, exist_ok=True)
    if fmt == "npz":
      with paths.replacing(out) as f:
        np.savez(f, **arrays)
      return [out]
    meta = {"vitjax_workdir": os.path.abspath(workdir), "vitjax_step": str(trained.step), "vitjax_weights": weights}
    convert.save_safetensors(out, state_dict, meta)  # (atomic: it removes its own temporary file if it fails)
    paths.write_text(side, json.dumps(cfg, indent=1))
    return [out, side]
  except OSError as e:
    for path in new:
      if os.path.isfile(path):
        os.remove(path)
    if created:
      shutil.rmtree(created[-1], ignore_errors=True)
    raise ConfigError(
      f"--out={out}: cannot write it ({e.strerror}); give another --out, in a writable folder with room"
    ) from None


def main() -> None:
  """Command line entry: exports --workdir's --checkpoint (its --weights) in --format to --out; prints the files."""
  written = export(FLAGS.workdir, FLAGS.format, FLAGS.out, FLAGS.checkpoint, FLAGS.weights)
  print("wrote " + ", ".join(written))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
