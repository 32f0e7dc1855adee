"""The config's schema with its defaults. Every file in configs/ starts from `default_config()` and changes fields.

The command line (vitjax.main) locks the ConfigDict, so a misspelt override (--config.optim.lrr=1) fails with
one line naming the nearest field (--config.optim.lr) instead of being silently added; a config file's field that
vitjax never reads (c.optim.weight_decy = 0.1 in get_config()) fails the same way (unknown_fields).
"""

from __future__ import annotations

import difflib
import json

import ml_collections as mlc

from vitjax.errors import ConfigError

# The config's schema version. A workdir's config.json of an older version is brought to this one by migrate(),
# the one place that knows the old names: 1 (no config_version field) -> 2: optim.b1/b2/eps/momentum/nesterov
# became optim.kwargs; lr_mults, wd_mults and frozen were added. 2 -> 3: evaluators by name (config.evals as
# named entries with their own options; data.eval_split, data.eval_examples, probe and decode moved into them; the
# moving average's evaluation became an entry), best_metric and best_mode became best.
CONFIG_VERSION = 3


def default_config() -> mlc.ConfigDict:
  """The default experiment config: digits classified by a ViT-Ti/16 at 8 px; each field's comment says what it does.

  Returns:
    A new, unlocked ConfigDict at config_version CONFIG_VERSION.
  """
  c = mlc.ConfigDict()
  c.config_version = CONFIG_VERSION
  c.task = "classification"  # 'classification' | 'translation' | 'mae' (vitjax.tasks.TASKS)
  c.seed = 0
  # Model: `name` goes to vitjax.models.create; every other field overrides a model attribute.
  c.model = mlc.ConfigDict({"name": "vit_ti16", "num_classes": 10})
  c.data = _data()

  c.batch_size = 128  # global, over all devices of all processes
  # Durations (vitjax.durations): steps, or a string with a unit, "500 steps", "2 epochs", "60000 examples".
  c.num_epochs = mlc.FieldReference(None, field_type=float)  # the run's length: either epochs ...
  c.total_steps = mlc.FieldReference(None, field_type=object)  # ... or a duration (steps, epochs, examples)
  # A wall-clock budget for the run's training, its earlier sessions included (train/elapsed_s in metrics.jsonl):
  # when it runs out, the run evaluates, checkpoints and stops at that step (the schedule still follows
  # total_steps); a rerun after a stop goes on to the same end, one after the end trains nothing. None: no budget.
  c.max_train_minutes = mlc.FieldReference(None, field_type=float)
  _optimizer(c)

  c.label_smoothing = 0.0
  # An exponential moving average of the parameters, ema = d * ema + (1 - d) * params after every applied step
  # (e.g. 0.9999 over ~10^4+ steps; it starts from the initial parameters, with no warm-up). Kept in the optimizer
  # state, so checkpointed with it; an evaluator with weights="ema" evaluates it (e.g. c.evals.eval_ema =
  # evaluator("classification", weights="ema"), and best="eval_ema/accuracy"); `--mode=eval --weights=ema`,
  # vitjax.load(W, weights="ema") and export use it. BatchNorm statistics are the
  # raw model's. None: off.
  c.ema_decay = mlc.FieldReference(None, field_type=float)
  # The activations' dtype: 'float32' | 'bfloat16' | 'auto' (bfloat16 on TPUs, GPUs from Ampere on and CPUs with
  # AVX512-BF16 or AMX, where the bf16 step is 1.20-1.59x float32's speed, experiments/README.md, issue 28; float32
  # elsewhere).
  # Parameters, optimizer state and gradients are always float32.
  c.compute_dtype = "float32"
  _runs(c)
  return c


def _data() -> mlc.ConfigDict:
  """default_config's config.data: the dataset, its splits, preprocessing, augmentation and input pipeline."""
  d = mlc.ConfigDict()
  # 'digits', 'fashion_mnist', 'folder:PATH' / 'csv:FILE' (your images), or any tfds dataset prepared as array_record
  d.name = "digits"
  d.data_dir = mlc.FieldReference(None, field_type=str)  # None: $TFDS_DATA_DIR or ~/tensorflow_datasets
  d.train_split = "train"
  # "valid" (what evaluators read unless told otherwise, so `best` is chosen without the test split) is
  # valid_fraction of train_split, drawn by valid_seed and held out of training (vitjax.data.images.holdout_split).
  d.valid_fraction = 0.1
  d.valid_seed = 0
  # Few labels: None trains on every example of train_split's training part; a fraction in (0, 1] (0.01), a
  # percentage ('1%') or a count (600) trains on a class-balanced subset of it drawn by labelled_seed
  # (vitjax.data.splits.labelled_subset). The probe evaluator fits on the same subset.
  d.labelled = mlc.FieldReference(None, field_type=object)
  d.labelled_seed = 0
  d.image_size = 8
  # random_resized_crop and randaugment: False, True (their defaults) or a dict of options, from the command line
  # too: --config.data.augment.random_resized_crop="{'scale': (0.35, 1)}" (vitjax.data.augment.parse_augment)
  d.augment = mlc.ConfigDict(
    {
      "flip": False,
      "random_resized_crop": mlc.FieldReference(False, field_type=object),
      "randaugment": mlc.FieldReference(False, field_type=object),
      "mixup_alpha": 0.0,
      "cutmix_alpha": 0.0,
    }
  )
  d.eval_batch_size = 256
  # How images meet the model (vitjax.data.augment.Preprocess): per-channel mean and std in [0, 1] units (None:
  # x * 2 / 255 - 1, the original ViT's [-1, 1]), the evaluation's crop_fraction (resize the shorter side to
  # size / crop_fraction, centre crop; None: resize only) and interpolation ('bilinear', 'bicubic'). A field left
  # None takes, with init_from='timm:NAME:FILE' or 'hf:...', the pretrained model's config (so imported weights are
  # evaluated as they were trained), else the default. The resolved values go to WORKDIR/task.json.
  d.preprocess = mlc.ConfigDict(
    dict(
      mean=mlc.FieldReference(None, field_type=tuple),
      std=mlc.FieldReference(None, field_type=tuple),
      crop_fraction=mlc.FieldReference(None, field_type=float),
      interpolation=mlc.FieldReference(None, field_type=str),
    )
  )
  # grain worker processes: the same batches for any number, free to change on a resume. None (auto): 0 on a CPU,
  # where the step uses the cores; on a GPU or TPU the cores this process may use less one, at most 8 (one process
  # per host, as experiments/slurm_train.sh runs; several on one host without CPU binding: set a number each).
  d.worker_count = mlc.FieldReference(None, field_type=int)
  d.read_threads = 0
  # Read the training split into memory first, PNGs decoded: the same batches, made faster. None (auto): when its
  # estimated size, times 1 + worker_count copies, is at most cache_max_mb; True / False: always / never.
  d.cache = mlc.FieldReference(None, field_type=bool)
  d.cache_max_mb = 1024
  # Training batches made on the devices (vitjax.data.resident): the split decoded once and put on them, each step's
  # order, crop and flip made in jit, no host work per step. None (auto): on a GPU or TPU, when the decoded split fits
  # on_device_max_mb of a device (None: a quarter of its free memory) and the augmentation runs there (not
  # RandAugment); on a CPU the host pipeline. True / False: always (ConfigError if it cannot) / never. The same order
  # as the host's, other crop and flip draws.
  d.on_device = mlc.FieldReference(None, field_type=bool)
  d.on_device_max_mb = mlc.FieldReference(None, field_type=float)
  return d


def _optimizer(c: mlc.ConfigDict) -> None:
  """default_config's optimizer, per-parameter rules and learning-rate schedule, set on `c`."""
  # The optimizer (vitjax.train.optim): any optax optimizer by name, optax.NAME(learning_rate=schedule, **kwargs):
  # "adamw", "sgd", "lion", "adafactor", "lamb", "nadamw", ...; kwargs are NAME's own arguments (optax's defaults
  # for the rest), e.g. --config.optim.kwargs="{'b2': 0.95}" or, for sgd, "{'momentum': 0.9, 'nesterov': True}".
  c.optim = mlc.ConfigDict()
  c.optim.name = "adamw"
  c.optim.lr = 1e-3  # peak learning rate
  c.optim.kwargs = mlc.FieldReference({}, field_type=object)
  # The optimizer's own decoupled decay where it has one (adamw, lion, ...), else L2 on the gradient (sgd, ...);
  # per parameter by wd_mults (None: the model family's rules, no decay on biases, norms, positions, bias tables)
  c.optim.weight_decay = 1e-4
  c.optim.grad_clip_norm = 1.0  # global-norm clipping; 0 disables
  c.optim.accum_steps = 1  # gradient accumulation: micro-batches per step (the step stays the full batch's)
  # Layer-wise learning-rate decay (ViT and Swin; BEiT's and MAE's fine-tuning recipe, e.g. 0.65-0.75): the
  # parameters of layer i of L learn at lr * layer_decay ** (L + 1 - i), the head at lr; None (or 1) is off. The layer of
  # every parameter: ViT.layer_index and Swin.layer_index (vitjax/models).
  c.optim.layer_decay = mlc.FieldReference(None, field_type=float)
  # Per-parameter rules, (regex, value) over 'a/b/kernel' paths; the first rule a path matches (re.search) decides.
  # The run's log opens with one line per rule and what it matched; a rule that matches nothing is an error.
  c.lr_mults = ()  # learning-rate multipliers, e.g. (("pos_embedding", 0.1),); times layer_decay's
  c.wd_mults = mlc.FieldReference(None, field_type=tuple)  # weight-decay multipliers, e.g. ((".*/bias$", 0.0),)
  c.frozen = ()  # regexes of parameters never updated (no optimizer state), e.g. ("^(?!head/).*",): the head only
  # Low-rank adapters (vitjax.models.lora): rank 0 is off. With a rank, scale * A @ B beside every Dense layer whose
  # path a target regex matches (() = attention q/k/v/out and the MLP's; timm names such as "qkv", "mlp.fc1" work
  # too); alpha None is alpha = rank. Without a config.frozen of its own, all but the adapters and head/ are frozen.
  c.lora = mlc.ConfigDict()
  c.lora.rank = 0
  c.lora.alpha = mlc.FieldReference(None, field_type=float)
  c.lora.targets = ()
  c.lora.dropout = 0.0  # on the adapters' inputs in training (PEFT's lora_dropout)
  # Distillation (vitjax.train.teacher): a trained vitjax classifier's workdir as a frozen teacher ("" is off). The
  # teacher sees the student's augmented view; loss "soft" (KL at the temperature) or "hard" (the teacher's argmax);
  # the step's loss is (1 - weight) * the labels' + weight * the teacher's ("soft", 1.0, 1.0: function matching).
  c.distill = mlc.ConfigDict()
  c.distill.teacher = ""
  c.distill.checkpoint = "best"  # the teacher run's "best", "latest" or a step
  c.distill.loss = "soft"
  c.distill.temperature = 1.0
  c.distill.weight = 1.0
  c.distill.dtype = mlc.FieldReference(None, field_type=str)  # the teacher's compute dtype; None: its run's own

  c.schedule = mlc.ConfigDict()
  c.schedule.warmup_steps = mlc.FieldReference(None, field_type=object)  # a duration, or warmup_epochs
  c.schedule.warmup_epochs = mlc.FieldReference(None, field_type=float)
  c.schedule.decay = "cosine"  # 'cosine' | 'linear' | 'rsqrt' | 'constant'
  c.schedule.end_lr_factor = 0.0  # final lr = factor * peak (cosine, linear)
  c.schedule.rsqrt_timescale = mlc.FieldReference(None, field_type=int)  # default: the warm-up length


def _runs(c: mlc.ConfigDict) -> None:
  """default_config's devices, faults, cadences, evaluators, checkpoints, profiling and trackers, set on `c`."""
  # Devices (vitjax.mesh): (axis, size) pairs over the axes data, fsdp, tensor; one size may be -1 (the rest).
  # The batch is split over data x fsdp. E.g. (("data", -1), ("tensor", 2)): 2-way tensor parallel inside hosts.
  c.mesh = (("data", -1),)
  # Parameter sharding: a preset ('dp' replicated, 'fsdp', 'tp', 'fsdp_tp'; see vitjax.mesh), and (regex on
  # 'a/b/kernel' paths, mesh axis per dimension) rules that take precedence over it.
  c.sharding = "dp"
  c.sharding_rules = ()

  # A step whose loss, gradient norm or new parameters are not finite is never applied. "stop": end the run there
  # (exit status 3) naming the newest good checkpoint; "skip": go on without that update, counted in
  # train/skipped_steps, and stop after max_nonfinite_skips such steps in a row.
  c.on_nonfinite = "stop"
  c.max_nonfinite_skips = 10

  # Cadences, durations as above (an int is steps): a progress line (also at least every 30 s), a checkpoint, and
  # the evaluators' default cadence (each also runs at the end).
  c.log_every = mlc.FieldReference(50, field_type=object)
  c.eval_every = mlc.FieldReference(500, field_type=object)
  c.checkpoint_every = mlc.FieldReference(500, field_type=object)
  # Evaluators by name (vitjax.evaluators: one module per type, each with its own options): their metrics are
  # NAME/METRIC in the log, metrics.jsonl, TensorBoard and --json; `best` names one of them (higher is better, or
  # lower where the type says so: losses, ece). E.g. --config.evals.eval.every="1 epoch", or a config file's
  # c.evals.test = evaluator("classification", split="test", every="5 epochs").
  c.evals = mlc.ConfigDict({"eval": evaluator("classification")})
  c.best = "eval/accuracy"
  c.keep_checkpoints = 3  # the latest N steps, plus the best evaluated one by `best` (one orbax manager)
  # a workdir, 'timm:NAME:FILE' (.safetensors/.pth; Swin also Microsoft's .pth), 'npz:FILE' or 'hf:ORG/NAME[@REV]'
  c.init_from = ""
  # (first, last): a jax.profiler trace of those steps into WORKDIR/tb/plugins/profile (TensorBoard's profile tab).
  c.profile_steps = mlc.FieldReference(None, field_type=tuple)
  # Where the metrics go besides WORKDIR/metrics.jsonl (always written): "tensorboard" (WORKDIR/tb) and/or "wandb"
  # (Weights & Biases, `pip install wandb`; its run id is kept in the workdir, so a resume continues the same run;
  # WANDB_MODE=offline writes WORKDIR/wandb/ for `wandb sync`). vitjax.train.trackers.
  c.trackers = ("tensorboard",)
  # W&B's run: project, entity (None: your default), name (None: the workdir's name; a sweep's trial_NNNN), group
  # (a sweep: its directory's name), tags and notes.
  c.wandb = mlc.ConfigDict(
    {
      "project": "vitjax",
      "entity": mlc.FieldReference(None, field_type=str),
      "name": mlc.FieldReference(None, field_type=str),
      "group": mlc.FieldReference(None, field_type=str),
      "tags": (),
      "notes": mlc.FieldReference(None, field_type=str),
    }
  )


# what every config.evals entry has besides its type's own options (vitjax.evaluators.COMMON, with their defaults)
ENTRY = {"split": "valid", "every": None, "data": None, "weights": "params", "examples": None}


def evaluator(type_: str, **options) -> mlc.ConfigDict:
  """A config.evals entry of evaluator type `type_`: its common fields and the options given.

  So that each can be set from the command line: type, split ('valid'), every (None: config.eval_every), data (None: the
  run's), weights ('params' or 'ema') and examples (a cap during training; None: all). The type's own options
  (vitjax.evaluators.TYPE.OPTIONS) are those given; the others take their defaults where evaluators resolve the entry,
  and vitjax.evaluators.complete fills them in before a command line's overrides (and before a run writes its
  config), so --config.evals.NAME.OPTION sets any of them. A name the type does not have is refused there, in one
  line, before anything is written.
  """
  fields = {"type": type_, **ENTRY, **options}
  return mlc.ConfigDict({k: mlc.FieldReference(None, field_type=object) if v is None else v for k, v in fields.items()})


def translation_config(source: str, src_lang: str, tgt_lang: str, size: str = "small") -> mlc.ConfigDict:
  """Defaults of a translation experiment (task "translation"): the paper's optimiser and schedule, beam search.

  Long: the translation experiment's fields, each with its comment, as default_config's are.

  source: "bible", "ding", "tsv:PATH", "files:SRC,TGT" or "tfds:NAME[:SPLIT]" (see vitjax.data.text).
  """
  c = default_config()
  c.task = "translation"
  # None: the named size's value. All are overridable: --config.model.norm=pre, --config.model.d_model=384 ...
  c.model = mlc.ConfigDict(
    dict(
      name=f"transformer_{size}",
      norm="post",  # where LayerNorm sits: "post" (the paper's), "pre" or "respost" (see vitjax.layers.NORMS)
      posemb="sinusoidal",
      share_embeddings=True,
      tie_output=True,
      d_model=mlc.FieldReference(None, field_type=int),
      num_heads=mlc.FieldReference(None, field_type=int),
      d_ff=mlc.FieldReference(None, field_type=int),
      num_layers=mlc.FieldReference(None, field_type=int),
      dropout_rate=mlc.FieldReference(None, field_type=float),
      # Special token ids; None: the tokenizer's (a new one is trained with pad 0, eos 1, bos 2). bos_id=pad_id
      # decodes from pad, as flax's examples/wmt. An id the workdir's tokenizer lacks is an error naming the fix.
      pad_id=mlc.FieldReference(None, field_type=int),
      eos_id=mlc.FieldReference(None, field_type=int),
      bos_id=mlc.FieldReference(None, field_type=int),
    )
  )
  c.data = mlc.ConfigDict(
    dict(
      source=source,
      src_lang=src_lang,
      tgt_lang=tgt_lang,
      data_dir=mlc.FieldReference(None, field_type=str),
      test_source=mlc.FieldReference(None, field_type=str),  # a separate test set (e.g. tfds:NAME:test)
      vocab_size=8000,
      tokenizer_sentences=300_000,
      max_len=128,
      too_long="drop",
      tokens_per_batch=4096,  # global, per side: source and target are each about this many padded positions
      split_seed=0,
      num_valid=500,
      num_test=1000,
      # Books held out whole instead (bible only; OSIS names, "Job,Ruth"): every verse of valid_books is
      # 'valid', of test_books 'test', and num_valid / num_test are not used (vitjax.data.text.split_by_books).
      valid_books="",
      test_books="",
      eval_batch_size=64,
    )
  )
  # BLEU and chrF of the first 500 validation pairs, decoded with beam search; how the model translates too
  c.evals = mlc.ConfigDict({"eval": evaluator("translation", examples=500)})
  c.best = "eval/bleu"
  c.optim.name = "adamw"  # with weight_decay 0: Adam
  c.optim.kwargs = dict(b1=0.9, b2=0.98, eps=1e-9)
  c.optim.weight_decay = 0.0
  c.optim.grad_clip_norm = 0.0
  c.optim.lr = 1e-3  # peak, reached at the end of the warm-up
  c.schedule.warmup_steps = 1000
  c.schedule.decay = "rsqrt"  # lr * sqrt(warmup / step) after the warm-up: the paper's schedule
  c.label_smoothing = 0.1
  c.total_steps = 6000
  c.log_every = 100
  c.eval_every = 1000
  c.checkpoint_every = 500
  return c


def check(config) -> None:
  """ConfigError for a field set away from its default that the config's task never reads.

  config.batch_size in a translation run, whose batches hold data.tokens_per_batch tokens.
  """
  if config.get("task") == "translation" and config.get("batch_size", None) not in (None, default_config().batch_size):
    raise ConfigError(
      f"config.batch_size={config.batch_size} does nothing in a translation run: its batches hold "
      f"data.tokens_per_batch={config.data.tokens_per_batch} tokens; set --config.data.tokens_per_batch"
    )


# Fields that do not change what is trained: how often things happen, evaluation, layout on devices, paths.
BOOKKEEPING = (
  "config_version",  # (a workdir's config is migrated to today's version when read)
  "log_every",
  "eval_every",
  "evals.",
  "best",
  "checkpoint_every",
  "keep_checkpoints",
  "max_train_minutes",
  "profile_steps",
  "trackers",
  "wandb.",
  "init_from",  # only read at the first start
  "on_nonfinite",
  "max_nonfinite_skips",
  "mesh",
  "mesh_axes",  # (before config.mesh)
  "sharding",
  "sharding_rules",
  "data.data_dir",
  "data.worker_count",  # the training batches are the same for any number of grain workers (images.GlobalOrder)
  "data.read_threads",
  "data.cache",
  "data.cache_max_mb",
  "data.on_device_max_mb",  # (whether the split fits: data.on_device's auto may then choose the other mode)
  "data.eval_batch_size",
)


def is_bookkeeping(key: str) -> bool:
  """Whether the config field `key` (a dotted path) is bookkeeping, free to change on a resume.

  It is when BOOKKEEPING names it, or one of BOOKKEEPING's prefixes ending in a dot starts it.
  """
  return any(key == b or (b.endswith(".") and key.startswith(b)) for b in BOOKKEEPING)


# Subtrees whose keys are checked where they are read (models.create, evaluators, the optimizer, parse_augment).
OPEN = ("model.", "evals.", "optim.kwargs", "data.augment.")


def unknown_fields(config) -> list[tuple[str, str | None]]:
  """[(field, the nearest known one or None)] of a config's fields that vitjax never reads, in order.

  Known: the fields of the task's default (translation_config for 'translation', default_config otherwise), and
  anything under OPEN. A config file that sets `c.optim.weight_decy` adds a field the locked command line would
  refuse; this finds it.
  """
  task = config.get("task") if hasattr(config, "get") else None
  ref = translation_config("x", "en", "es") if task == "translation" else default_config()
  known = set(flatten(ref.to_dict()))
  out = []
  for key in flatten(config.to_dict() if hasattr(config, "to_dict") else dict(config)):
    if key not in known and not key.startswith(OPEN):
      near = difflib.get_close_matches(key, sorted(known), 1, 0.75)
      out.append((key, near[0] if near else None))
  return out


# fields whose value is a dict of their own, compared and recorded whole (not field by field)
WHOLE = ("optim.kwargs",)


def flatten(d: dict, prefix: str = "") -> dict:
  """A nested config dict as {'a.b': value}, its values as config.json holds them (tuples as lists).

  The WHOLE fields stay one value.
  """
  out = {}
  for k, v in d.items():
    if isinstance(v, dict) and v and f"{prefix}{k}" not in WHOLE:
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = json.loads(json.dumps(v))
  return out
