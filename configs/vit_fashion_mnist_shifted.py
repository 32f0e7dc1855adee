"""ViT on Fashion-MNIST, evaluated the way robustness papers evaluate: the clean test split beside shifted copies of
it (rotated 30 degrees, Gaussian noise), and the frozen representation's linear probe, few-shot and k-NN, with
`best` chosen by the probe's k-NN accuracy on validation. Each evaluator is one entry of config.evals
(vitjax.evaluators); their metrics are NAME/METRIC in the log, metrics.jsonl and TensorBoard.

Run (from the repository root):

    apt-get install dataset-fashion-mnist
    python -m vitjax.data.prepare --dataset=fashion_mnist
    python -m vitjax.main --config=configs/vit_fashion_mnist_shifted.py --workdir=workdirs/vit_fashion_mnist_shifted
    python -m vitjax.main --mode=eval --workdir=workdirs/vit_fashion_mnist_shifted --eval=rotated   # any evaluator
    python experiments/plot.py workdirs/vit_fashion_mnist_shifted --out=curves.png \
      --metrics=train/loss,eval/accuracy,test/accuracy,rotated/accuracy,noisy/accuracy,probe/knn

The model and training are configs/vit_fashion_mnist.py's (4 layers, width 96, conv stem), for 6 epochs.
Expected: see experiments/README.md ("Evaluators: a clean, two shifted and a probe evaluation in one run").
"""

import os

from vitjax.config import evaluator, load_module

_base = load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "vit_fashion_mnist.py"))


def get_config():
  c = _base.get_config()
  c.num_epochs = 6
  c.eval_every = "1 epoch"
  c.evals = dict(
    eval=evaluator("classification", calibration_bins=15),  # validation: accuracy, loss, calibration error
    test=evaluator("classification", split="test", calibration_bins=15),
    rotated=evaluator("classification", split="test", shift="rotate:30", calibration_bins=15),
    noisy=evaluator("classification", split="test", shift="noise:0.2", calibration_bins=15),
    probe=evaluator("probe", split="valid", shots=(1, 5, 10)),
  )
  c.best = "probe/knn"
  return c
