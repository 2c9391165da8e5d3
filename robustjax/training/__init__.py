"""Training with RobustART's aligned recipe and its techniques (issue 21).

    clf = rj.zoo.create("digits_cnn", pretrained=False)
    techniques = rj.training.techniques.create("pgd_at")
    recipe = rj.training.aligned("digits_cnn", techniques, steps=200, batch_size=64)
    result = rj.training.train(clf, rj.data.digits("train"), "run/", recipe, techniques)
    rj.training.save_trained("run/", result, model="digits_cnn", recipe=recipe, techniques=techniques)

Modules: ``techniques`` (``names``, ``get``, ``create``, and which combine), ``recipe`` (the
aligned recipe and its optax optimizer), ``augment`` (RobustART's and CIFAR's per-image augmentation), ``mixing``
(Mixup, CutMix, AugMix), ``model`` (a classifier's training, drop-path and attack modes),
``step`` (the jitted step), ``loop`` (batches, sharding, checkpoints,
metrics log), ``population`` (many networks stepping together in one program), ``output`` (the trained weights and card ``zoo.create(..., weights=)`` reads).
"""

from robustjax.training import techniques
from robustjax.training.loop import StepReport, TrainResult, batch_indices, train
from robustjax.training.output import save_trained
from robustjax.training.population import PopulationResult, train_population
from robustjax.training.recipe import Recipe, aligned
from robustjax.training.techniques import Technique, Techniques

__all__ = ["PopulationResult", "Recipe", "StepReport", "Technique", "Techniques", "TrainResult", "aligned",
           "batch_indices", "save_trained", "techniques", "train", "train_population"]
