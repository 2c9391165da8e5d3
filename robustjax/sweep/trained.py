"""A sweep's trained networks: each zoo model of the sweep trained once per technique set of
its plan's ``[training]`` table (``evaluation.plan.TrainingRun``).

A network's id is ``<model>/<techniques>/<hash>``: the hash covers everything its weights
depend on (model, techniques, the recipe as resolved for the model's family, the attack
settings of an adversarial technique, the training data), so another recipe is another
network and never reuses rows. It trains into ``<trained_dir>/<id>``: the checkpoints a
killed training resumes from, then ``weights/`` and a ``card.json`` that records the
recipe (``training.save_trained``, which writes the card last). A folder with a card holds a
finished network, read back and never trained again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import jax

from robustjax import training, zoo
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.evaluation.plan import TrainingRun
from robustjax.training.model import TrainModel
from robustjax.training.output import check_model_for, trained_name

CARD = "card.json"


@dataclasses.dataclass(frozen=True)
class TrainedNetwork:
    """Zoo ``model`` trained with ``techniques`` and ``recipe`` on ``split`` of ``dataset``."""

    model: str
    techniques: training.Techniques
    recipe: training.Recipe
    dataset: str
    split: str
    attack_eps: float | None = None
    attack_steps: int | None = None

    @property
    def settings(self) -> dict:
        """What the trained weights depend on (the attack's settings only where there is an attack)."""
        attack = ({"attack_eps": self.attack_eps, "attack_steps": self.attack_steps}
                  if self.techniques.adversarial else {})
        return {"model": self.model, "techniques": list(self.techniques.names),
                "recipe": dataclasses.asdict(self.recipe), "dataset": self.dataset, "split": self.split, **attack}

    @property
    def arch_id(self) -> str:
        digest = hashlib.sha256(json.dumps(self.settings, sort_keys=True).encode()).hexdigest()[:12]
        return f"{self.model}/{self.techniques}/{digest}"

    @property
    def name(self) -> str:
        """The zoo name it is evaluated as; networks of one name stack into one population."""
        return trained_name(self.model, self.techniques)


def grid(models: Sequence[str], run: TrainingRun, dataset: str) -> list[TrainedNetwork]:
    """Every model with every technique set of ``run`` (the training data ``dataset`` unless
    ``run`` names one), model by model. Models that are not in the zoo, and techniques a
    model cannot take (``reparam`` of a non-RepVGG, ``dropout`` or ``drop_path`` without
    such layers), are refused here, before any training."""
    networks = []
    for model in models:
        if ":" in model:
            raise ValueError(f"a sweep with a [training] table trains zoo models; {model!r} is not one "
                             "(`robustjax zoo list` lists them)")
        family = zoo.get(model).family
        for techniques in run.techniques:
            check_model_for(model, techniques)
            recipe = run.recipe_for(family, techniques)
            if "dropout" in techniques or recipe.drop_path_rate:  # refused here if the model lacks the layers
                TrainModel.from_classifier(zoo.create(model, pretrained=False), dropout="dropout" in techniques,
                                           drop_path=recipe.drop_path_rate)
            networks.append(TrainedNetwork(model, techniques, recipe, run.dataset or dataset, run.split,
                                           run.attack_eps, run.attack_steps))
    return networks


def is_trained(folder: Path) -> bool:
    return (folder / CARD).is_file()


def train(network: TrainedNetwork, folder: Path, data: ImageDataset, *, checkpoint_every: int,
          on_step: Callable[[training.StepReport], None] | None = None) -> None:
    """Trains ``network`` on ``data`` into ``folder`` from a random start seeded by the
    recipe's seed, resuming from its checkpoints when a training there was killed."""
    classifier = zoo.create(network.model, pretrained=False, key=jax.random.key(network.recipe.seed))
    try:
        result = training.train(classifier, data, folder, network.recipe, network.techniques,
                                attack_eps=network.attack_eps, attack_steps=network.attack_steps,
                                checkpoint_every=checkpoint_every, on_step=on_step)
    except ValueError as error:
        raise ValueError(f"training {network.arch_id}: {error}") from error
    training.save_trained(folder, result, model=network.model, recipe=network.recipe, techniques=network.techniques,
                          dataset=data.name, extra={"split": network.split, "attack_eps": network.attack_eps,
                                                    "attack_steps": network.attack_steps,
                                                    "network_id": network.arch_id})


def load(network: TrainedNetwork, folder: Path) -> Classifier:
    """The trained network in ``folder``, named by its id."""
    return zoo.create(network.name, weights=folder).replace(name=network.arch_id)


@functools.cache
def _cost(name: str) -> tuple[int, int]:
    classifier = zoo.create(name, pretrained=False)
    return zoo.count_params(classifier), int(zoo.count_flops(classifier))


def card(network: TrainedNetwork) -> dict:
    """The store's card of ``network``: model, techniques, cost and training settings."""
    params, flops = _cost(network.name)
    return {"model": network.model, "techniques": str(network.techniques), "params": params, "flops": flops,
            "training": network.settings}
