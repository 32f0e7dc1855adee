"""Translation: corpus BLEU and chrF (sacrebleu) of the decoded split, and the teacher-forced loss.

Also BLEU of copying the source (a floor), and for a source with several references per entry (the Ding dictionary's
synonyms) exact_match and bleu_synonyms.

Options, the decoding: method ('beam', 'greedy', 'sample'), beam_size, alpha (beam search's length penalty),
temperature and top_k (sampling), extra_len (a translation is at most 1.5 x the source's length + extra_len
tokens). The decoding of the evaluator that chooses the run's best (config.best) is also how the trained model
translates (vitjax.load(W).translate, python -m vitjax.translate) unless told otherwise: vitjax.decode.configured.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from vitjax import decode
from vitjax import mesh as mesh_lib
from vitjax.errors import ConfigError
from vitjax.logs import Progress
from vitjax.tasks.base import check_stop, cross_entropy

OPTIONS = dict(decode.DECODING)


def metrics(options: dict) -> dict[str, str]:
  """The metrics this type reports, and which way is better.

  Returns:
    bleu, chrf, loss (min), bleu_copy_source, examples, exact_match and bleu_synonyms.
  """
  del options
  return {"bleu": "max", "chrf": "max", "loss": "min", "bleu_copy_source": "max", "examples": "max",
          "exact_match": "max", "bleu_synonyms": "max"}  # fmt: skip


def check(ev) -> None:
  """Checks the entry before anything is written.

  Checks a translation run, the decoding options (vitjax.decode.check_decoding; top_k against
  config.data.vocab_size), and a split the task has.

  Raises:
    ConfigError: naming config.evals.NAME and what is wrong.
  """
  what = f"config.evals.{ev.name}"
  if ev.config.task != "translation":
    raise ConfigError(f"{what}: type 'translation' evaluates a translation run, not a {ev.config.task!r} run")
  vocab = ev.config.data.get("vocab_size")
  name = lambda key: f"--{what}.{key}"
  decode.check_decoding(ev.options, name=name, vocab_size=vocab if isinstance(vocab, int) else None)
  changed = {
    k: v for k, v in ev.options.items() if k in decode.DECODING and v != decode.DECODING[k]
  }  # (defaults: always there)
  decode.check_method_options(ev.options["method"], changed, name=name)
  ev.task.check_split(ev.split, f"evals.{ev.name}.split")


def run(ev, net, variables, stop=None, step=None) -> dict:
  """Decodes the split with the entry's decoding and scores it with sacrebleu.

  Arguments as in classification.run.

  Returns:
    dict: {"loss": the teacher-forced cross-entropy per target token, "bleu", "chrf", "bleu_copy_source": the
    BLEU of the untranslated sources, "examples"} and, for a source with several references per entry,
    "exact_match" and "bleu_synonyms".
  """
  import sacrebleu  # pylint: disable=g-import-not-at-top

  del step
  task, params = ev.task, variables["params"]
  pairs, batches = task.eval_batches(ev.split, ev.examples)
  progress = Progress(f"eval {ev.split}", len(batches), unit="sentences")
  hyps = [""] * len(pairs)
  loss_sum = count = 0.0
  for b in batches:
    check_stop(stop)
    g = mesh_lib.to_global(b, net.batch_sharding, ("src", "tgt", "mask"))
    batch_loss, n = _loss(net.model, params, g)
    loss_sum, count = loss_sum + float(batch_loss), count + float(n)
    max_len = task.decode_len(b["src"].shape[1], ev.options["extra_len"])
    out = mesh_lib.gather(task.translate_batch(net.model, params, g["src"], max_len, ev.options))
    index = mesh_lib.gather(jax.make_array_from_process_local_data(net.batch_sharding, b["index"]))
    for row, i in zip(task.tokenizer.decode_batch(out), index):
      if i >= 0:
        hyps[i] = row
    progress.update(int((index >= 0).sum()))
  refs = [t for _, t in pairs]
  return {
    "loss": loss_sum / max(count, 1.0),
    "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
    "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score,
    "bleu_copy_source": sacrebleu.corpus_bleu([s for s, _ in pairs], [refs]).score,
    "examples": float(len(pairs)),
    **synonym_scores(task.references(), pairs, hyps),
  }


def synonym_scores(references: dict, pairs, hyps) -> dict:
  """Metrics for a source whose entries have several correct translations: exact_match and bleu_synonyms.

  References as text.load_references gives them. exact_match (the share of translations equal to one of them) and
  bleu_synonyms (BLEU with all of them as references); {} when references is empty.
  """
  import sacrebleu  # pylint: disable=g-import-not-at-top

  if not references:
    return {}
  refs = [references.get(pair, [pair[1]]) for pair in pairs]
  width = max(len(r) for r in refs)
  streams = [[r[k] if k < len(r) else None for r in refs] for k in range(width)]
  exact = sum(h.strip() in r for h, r in zip(hyps, refs, strict=True))
  return {"exact_match": exact / max(len(pairs), 1), "bleu_synonyms": sacrebleu.corpus_bleu(hyps, streams).score}


@functools.partial(jax.jit, static_argnums=0)
def _loss(model, params, batch):
  logits, _ = model.apply({"params": params}, batch["src"], batch["tgt"], train=False)
  w = (batch["tgt"] != model.pad_id) & batch["mask"][:, None]
  ce = cross_entropy(logits, batch["tgt"], logits.shape[-1])
  return jnp.sum(ce * w), jnp.sum(w)
