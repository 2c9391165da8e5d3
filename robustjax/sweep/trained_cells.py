"""A sweep's NAS-Bench-201 cells trained from scratch: a space sweep whose plan has a
``[training]`` table (or ``robustjax sweep run --space nb201 --train pgd_at``).

Each technique set of the table is a :class:`~robustjax.sweep.trained.TrainedNetwork` of the
zoo's ``nas.SPACE``; the cells of a sweep's chunk train with it in populations
(:func:`robustjax.training.train_population`, every network from the init and batch order
``robustjax train`` gives it with the recipe's seed; :func:`layout` says how), then each
trained cell is written at its own shapes as a ``robustjax zoo convert`` folder, so the
folder of a technique set is a folder of standalone networks (``nas.standalone.load_folder``)::

    <trained_dir>/nas.SPACE/<techniques>/<hash>/populations/<hash of the cells>/  # checkpoints to resume
    <trained_dir>/nas.SPACE/<techniques>/<hash>/<index>/{weights/, card.json}      # a finished cell

The hash covers everything the weights depend on (techniques, recipe, attack, data), so
another recipe is another set of networks. A cell's id is
``<arch_id>/nas.SPACE/<techniques>/<hash>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from robustjax import training
from robustjax.checks import read_json_object
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.evaluation.plan import TrainingRun
from robustjax.nas import build
from robustjax.nas.nb201 import NB201Config, NB201Space
from robustjax.nas.trainable import standalone_network, trainable
from robustjax.sweep import trained
from robustjax.sweep.trained import CARD, TrainedNetwork

# Cells per population in the "unrolled" layout, whose program holds each cell's own step: on
# a 2-core CPU, the steps of PGD-7 AT of NB201 digits cells (batch 256, a probe) compiled in
# 15-17 s for 2 cells, 42 s for 4 and 188 s for 8, and 4 cells stepped in 0.60 s as two
# programs of 2 against 0.74 s as one of 4.
UNROLLED_CELLS = 2


def layout(sweep_layout: str) -> str:
    """How a sweep's cells train (``train_population``'s layout) under its ``--layout``:
    ``masks`` side by side (``vmap``), ``sequential`` one after another, ``auto`` each cell at
    its own shapes in populations of :data:`UNROLLED_CELLS` (``unrolled``) on the CPU, where
    it trained 1.9x the cells per hour of ``sequential``, and side by side elsewhere."""
    if sweep_layout == "auto":
        return "unrolled" if jax.default_backend() == "cpu" else "vmap"
    if sweep_layout not in ("masks", "sequential"):
        raise ValueError(f"cells trained from scratch train under layout auto, masks or sequential; got {sweep_layout!r}")
    return "vmap" if sweep_layout == "masks" else "sequential"


def populations(cells: Sequence, layout: str) -> list[Sequence]:
    """``cells`` in the populations they train as under ``layout`` (``train_population``'s):
    :data:`UNROLLED_CELLS` at a time unrolled, all together otherwise."""
    size = UNROLLED_CELLS if layout == "unrolled" else len(cells)
    return [cells[start:start + size] for start in range(0, len(cells), size)]


def initial_network(space: NB201Space, config: NB201Config, key: jax.Array, layout: str) -> Classifier:
    """Cell ``config`` initialised from ``key`` (as ``robustjax train`` initialises it) in the
    form ``layout`` trains it: at its own shapes unrolled, in the supernet's layout
    (:func:`~robustjax.nas.trainable.trainable`) otherwise."""
    if layout == "unrolled":
        return build.as_classifier(space, build.build_network(space, config, key=key), config, name=config.arch_id)
    return trainable(space, config, key=key, sequential=layout == "sequential")


def grid(space: Any, run: TrainingRun, dataset: str) -> list[TrainedNetwork]:
    """The space's network (``nas.SPACE``) trained with each technique set of ``run``
    (``trained.grid``); a space that is not NAS-Bench-201's is refused here."""
    if not isinstance(space, NB201Space):
        raise ValueError(f"a sweep with a [training] table trains NAS-Bench-201 cells or zoo models; {space.name} is "
                         "not a NAS-Bench-201 space (train BigNAS subnets as zoo models: --models nas.SPACE)")
    return trained.grid([f"nas.{space.name}"], run, dataset)


def cell_id(cells: TrainedNetwork, config: NB201Config) -> str:
    """The sweep id of cell ``config`` trained as ``cells``: ``<arch_id>/<cells' id>``."""
    return f"{config.arch_id}/{cells.arch_id}"


def train(cells: TrainedNetwork, space: NB201Space, configs: Sequence[NB201Config], folder: Path, data: ImageDataset,
          *, checkpoint_every: int, layout: str, on_step: Callable[[training.StepReport], None] | None = None
          ) -> None:
    """Trains the cells ``configs`` as one population into ``folder`` (their technique set's)
    in ``layout`` (``train_population``'s), resuming the population's checkpoints when a run
    of the same cells was killed; then writes each cell's folder, card last, and removes the
    population's checkpoints."""
    recipe = cells.recipe
    networks = [initial_network(space, config, jax.random.key(recipe.seed), layout) for config in configs]
    population = folder / "populations" / hashlib.sha256(
        json.dumps([c.index for c in configs]).encode()).hexdigest()[:12]
    try:
        result = training.train_population(networks, data, population, recipe, cells.techniques,
                                           seeds=[recipe.seed] * len(configs), attack_eps=cells.attack_eps,
                                           attack_steps=cells.attack_steps, checkpoint_every=checkpoint_every,
                                           on_step=on_step, layout=layout)
    except ValueError as error:
        raise ValueError(f"training {cells.arch_id} cells: {error}") from error
    for i, config in enumerate(configs):
        network = result.classifiers[i] if layout == "unrolled" else standalone_network(space, config,
                                                                                         result.classifiers[i])
        figures = {name: values[i] if isinstance(values, list) else values
                   for name, values in result.last_metrics.items() if name != "stopped"}
        training.save_trained(folder / str(config.index), _Trained(network, result.steps, figures), model=cells.model,
                              recipe=recipe, techniques=cells.techniques, dataset=data.name,
                              build_kwargs={"arch": config.index},
                              extra={"split": cells.split, "attack_eps": cells.attack_eps,
                                     "attack_steps": cells.attack_steps, "network_id": cell_id(cells, config),
                                     "stopped_at": result.stopped[i]})
    shutil.rmtree(population)
    with contextlib.suppress(OSError):  # other populations may still train there
        population.parent.rmdir()


@dataclasses.dataclass(frozen=True)
class _Trained:  # what training.save_trained reads of a training's result
    classifier: Classifier
    steps: int
    last_metrics: dict


def summary(folder: Path) -> dict:
    """A trained cell's training in export columns: steps, last loss and accuracy, and the
    step its loss went non-finite (None: it did not)."""
    record = read_json_object(folder / CARD, required=("training",))["training"]
    last = record.get("final_metrics") or {}
    return {"train_steps": record["steps"], "train_loss": last.get("loss"), "train_accuracy": last.get("accuracy"),
            "diverged_at": record.get("stopped_at")}

