"""The Bible EN->ES Transformer of configs/transformer_bible_en_es.py trained for longer on both cores, with
checkpoints kept for averaging: the attempt at 25 BLEU (issue 27).

Run (from the repository root; `apt-get install sword-text-kjv sword-text-sparv` first):

    taskset -c 0,1 python -m vitjax.main --config=configs/transformer_bible_en_es_long.py \
        --workdir=workdirs/bible_en_es_long
    python -m vitjax.average --workdir=workdirs/bible_en_es_long --last=5
    python -m vitjax.sweep.decode --workdir=workdirs/bible_en_es_long --checkpoint=averaged \
        --beam_sizes=1,4,8 --alphas=0.6,1.0
    python -m vitjax.main --mode=eval --workdir=workdirs/bible_en_es_long --split=test --checkpoint=averaged

Expected (2026-11-25, both cores of the 2-core AMD EPYC, alone but for short unit tests in its first minutes):
the 100-minute budget (its six evaluations included), 1 h 41 min of wall time: 5,168 steps, 8.7 epochs; validation
BLEU 13.4 / 23.5 / 30.1 / 33.7 / 35.3 at steps 1,000 / 2,000 / 3,000 / 4,000 / 5,000 (first 300 verses), still
rising, slower; on the 1,000 test verses 32.34 BLEU (chrF 52.7) for the final checkpoint (beam 4, alpha 0.6), 32.52
(52.7) for the average of the last five. Rerun (2026-11-27, the 2-core AVX2 EPYC, capped at the same steps with
--config.total_steps=5168 --config.max_train_minutes=1000): 32.40 (52.7) final, 32.18 (52.6) averaged, 32.64 (53.1)
averaged with the decoding chosen on validation (beam 8, alpha 1.0); experiments/README.md, "The long Bible run".
Each test evaluation takes 3-6.5 minutes on 2 cores.
The recipe is the base config's (the recipe grid's choice, `:recipe`: none of its 9 points beat it by more
than its own run-to-run spread): d_model 256, 3+3 post-norm layers, shared 8k SentencePiece vocabulary, label
smoothing 0.1, dropout 0.1, about 2,048 tokens per side per step, warm-up 400 then inverse square root. Changes:
the time budget; evaluations every 1,000 steps (each beam-4 evaluation costs about a minute of training); a
checkpoint every 250 steps and the last 5 kept, for `vitjax.average --last=5`.
"""

import os

from vitjax.config import load_module

_base = load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "transformer_bible_en_es.py"))


def get_config():
  c = _base.get_config()
  c.max_train_minutes = 100
  c.eval_every = 1000
  c.checkpoint_every = 250
  c.keep_checkpoints = 5
  return c
