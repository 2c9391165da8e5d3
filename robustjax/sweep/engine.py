"""Sweeps: a plan times a list of networks, evaluated population by population.

A :class:`Sweep` names what results depend on: the plan, the dataset, and where the
networks come from (subnets of a NAS space's supernet, zoo / user models, or zoo models
trained with each technique set of the plan's ``[training]`` table, ``sweep.trained``, or a
NAS-Bench-201 space's cells trained from scratch with it, ``sweep.trained_cells``). Its
:class:`Context` (one per process) loads those once and evaluates a chunk of networks: a
population of subnets or of trained networks of one architecture (one compiled program per
item) or one model, item by item, giving result rows for the store. An item that fails on a
population is retried network by network, so a failure is recorded for the networks it
belongs to, with its error.

:func:`run_local` is the local executor: it claims chunks from the store, evaluates them on
every local device (the example axis sharded) and commits each item's rows as it finishes.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from robustjax import data, nas, zoo
from robustjax.classifier import Classifier
from robustjax.evaluation import records
from robustjax.evaluation.items import (
    REPORT,
    Item,
    ItemRunner,
    PopulationTooLarge,
    expand,
    figures,
    outcome_dtype,
    report_figures,
    report_plan,
    rung,
)
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import Plan
from robustjax.evaluation.resume import Finished, MemoryStore
from robustjax.evaluation.runner import environment, evaluate
from robustjax.nas.population import (
    LAYOUTS,
    Population,
    check_layout,
    choose_layout,
    exact_subnet,
    from_supernet,
)
from robustjax.nas.recalibrate import DEFAULT_IMAGES, calibration_subset
from robustjax.sweep import trained, trained_cells
from robustjax.sweep.store import Store, pack
from robustjax.training import StepReport
from robustjax.training.dataset import training_dataset

# Rough size of a result row beyond its packed outcome: keys, figures, timing.
ROW_OVERHEAD_BYTES = 512
# The most networks one sweep database holds: each has a row per item and a card.
MAX_NETWORKS = 1_000_000
# A sweep's layouts: a lone network runs at its own shapes anyway, so "exact" is not offered.
SWEEP_LAYOUTS = tuple(layout for layout in LAYOUTS if layout != "exact")


@dataclasses.dataclass(frozen=True)
class Sweep:
    """What a sweep evaluates: ``plan`` on ``dataset``/``split``, over the subnets of NAS
    ``space`` (weights from ``supernet``, a folder of ``nas train``, or the space's bundled
    supernet; batch norm recalibrated on ``calibration_images`` training images), over the
    space's standalone trained networks in folder ``weights`` (one per NAS-Bench-201 index,
    ``nas.standalone.load_folder``; their own batch-norm statistics), or over
    ``models`` (zoo names or ``package.module:function``), one network each. A plan with a
    ``[training]`` table makes the networks the zoo ``models`` trained with each of its
    technique sets, into folders under ``trained_dir``; over a NAS-Bench-201 ``space`` it
    makes the networks the space's cells trained from scratch with each technique set, a
    population at a time. ``layout``: how a population of
    subnets runs, ``"auto"``, ``"masks"``, ``"sequential"`` or ``"packed"``
    (``nas.population.choose_layout``; a lone network runs at its own shapes), and how
    cells train (``sweep.trained_cells.layout``)."""

    plan: Plan
    dataset: str = data.DEFAULT_DATASET
    split: str = "test"
    data_dir: str | None = None
    space: str | None = None
    supernet: str | None = None
    models: tuple[str, ...] = ()
    population_size: int = 64
    calibration_images: int = DEFAULT_IMAGES
    network_shards: int = 1  # devices the networks split over (the others split the examples)
    trained_dir: str | None = None
    weights: str | None = None
    layout: str = "auto"

    def __post_init__(self):
        check_layout(self.layout, self.network_shards, SWEEP_LAYOUTS)
        if self.layout == "packed" and (self.weights is not None or self.models or self.training):
            raise ValueError("layout 'packed' runs subnets that share a supernet's weights; standalone networks "
                             "(--weights, --models, trained ones) have their own (use masks or sequential)")
        if (self.space is None) == (not self.models):
            raise ValueError("a sweep runs over a NAS space (--space) or a list of models (--models), one of the two")
        if isinstance(self.population_size, bool) or not isinstance(self.population_size, int) \
                or self.population_size < 1:
            raise ValueError(f"population_size must be an integer >= 1, got {self.population_size!r}")
        if self.models and self.network_shards != 1:
            raise ValueError("--network-shards splits a population of subnets; a model sweep runs one model at a time")
        if self.training and (self.weights is not None or self.supernet is not None):
            raise ValueError("a plan with a [training] table trains a space's cells from scratch: --weights and "
                             "--supernet give networks already trained")
        if self.weights is not None and (self.space is None or self.supernet is not None):
            raise ValueError("--weights DIR sweeps a NAS space's standalone networks: pass it with --space, without "
                             "--supernet")
        if self.training and self.trained_dir is None:
            raise ValueError("a sweep with a [training] table needs trained_dir, the folder its networks train into")

    @property
    def training(self) -> bool:
        return self.plan.training is not None

    @property
    def trains_cells(self) -> bool:
        """Whether its networks are a NAS-Bench-201 space's cells trained from scratch."""
        return self.training and self.space is not None


def _digest(arrays: Sequence[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


class Context:
    """A sweep's inputs, loaded once per process: the dataset, the items, the supernet and
    calibration images, or the models. What only evaluating needs (the examples placed on
    the devices, :attr:`runner`) is made on first use, so a driver that only defines the
    store and hands out chunks (the Ray executor's) never makes it."""

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self.dataset = data.load(sweep.dataset, sweep.split, data_dir=sweep.data_dir)
        self.items = expand(sweep.plan)
        self.by_key = {item.key_for(sweep.plan): item for item in self.items}
        self.parallel = DataParallel(sweep.plan.batch_size, network_shards=sweep.network_shards)
        if sweep.space is not None and sweep.weights is not None:
            self.space = nas.space(sweep.space)
            self.folder_entries = nas.standalone.folder_entries(sweep.weights)
        elif sweep.trains_cells:
            self.space = nas.space(sweep.space)
            self.cell_trainings = {t.arch_id: t for t in trained_cells.grid(self.space, sweep.plan.training,
                                                                           sweep.dataset)}
        elif sweep.space is not None:
            space = nas.space(sweep.space)
            if sweep.supernet is not None:
                self.supernet = nas.Supernet.load(sweep.supernet, space=space)
            elif space.name in nas.models.EMBEDDED:
                self.supernet = nas.bundled_supernet(space.name)
            else:
                raise ValueError(f"{space.name} has no bundled supernet: pass --supernet DIR (from `robustjax nas "
                                 "train`) or --weights DIR (its standalone networks)")
            self.space = self.supernet.space
            train = data.load(sweep.dataset, "train", data_dir=sweep.data_dir)
            self.calibration = calibration_subset(train, sweep.calibration_images)
        if sweep.training and sweep.models:
            self.trained_networks = {n.arch_id: n for n in trained.grid(sweep.models, sweep.plan.training, sweep.dataset)}

    @functools.cached_property
    def runner(self) -> ItemRunner:
        """The items' runner, holding the evaluated examples as sharded batches."""
        return ItemRunner(self.dataset, self.sweep.plan, self.parallel)

    @functools.cached_property
    def data_key(self) -> str:
        """A hash of every evaluated example (images and labels), in order, read on the host
        batch by batch as the runner reads them."""
        batches = self.dataset.batches(self.parallel.batch_size, limit=self.sweep.plan.num_examples)
        return _digest([array for x, y in batches for array in (x, y)])

    @functools.cached_property
    def num_examples(self) -> int:
        limit = self.sweep.plan.num_examples
        return self.dataset.num_examples if limit is None else min(limit, self.dataset.num_examples)

    @functools.cache
    def model(self, spec: str) -> Classifier:
        return zoo.load(spec)

    @functools.cache
    def training_data(self, spec: str, split: str) -> data.ImageDataset:
        return training_dataset(spec, split, data_dir=self.sweep.data_dir)

    def folder(self, arch_id: str) -> Path:
        """Where trained network ``arch_id`` is kept (a zoo model's also trains there; a
        cell's population trains in its parent, ``trained_cells``)."""
        if self.sweep.trains_cells:
            cells, config = self.cell(arch_id)
            return Path(self.sweep.trained_dir, cells.arch_id, str(config.index))
        return Path(self.sweep.trained_dir, arch_id)

    def train(self, arch_ids: Sequence[str], on_step: Callable[[str, StepReport], None] | None = None) -> None:
        """Trains those of the trained networks ``arch_ids`` that have not finished (none in
        a sweep without ``[training]``); ``on_step`` receives each one's steps (a population
        of cells reports as its first network)."""
        if not self.sweep.training:
            return
        if self.sweep.trains_cells:
            self._train_cells(arch_ids, on_step)
            return
        for arch_id in arch_ids:
            if trained.is_trained(self.folder(arch_id)):
                continue
            network = self.trained_networks[arch_id]
            trained.train(network, self.folder(arch_id), self.training_data(network.dataset, network.split),
                          checkpoint_every=self.sweep.plan.training.checkpoint_every,
                          on_step=None if on_step is None else functools.partial(on_step, arch_id))

    def cell(self, arch_id: str) -> tuple[trained.TrainedNetwork, nas.nb201.NB201Config]:
        """Trained cell ``arch_id``'s training and cell."""
        config, key = arch_id.split("/", 1)
        return self.cell_trainings[key], self.space.resolve(config)

    def _train_cells(self, arch_ids: Sequence[str], on_step: Callable[[str, StepReport], None] | None) -> None:
        """The cells of ``arch_ids`` not trained yet, in populations of one technique set, in
        the training layout of the sweep's (``trained_cells.layout``)."""
        untrained: dict[str, list] = collections.defaultdict(list)
        for arch_id in arch_ids:
            if not trained.is_trained(self.folder(arch_id)):
                untrained[arch_id.split("/", 1)[1]].append(arch_id)
        layout = trained_cells.layout(self.sweep.layout)
        for key, ids in untrained.items():
            cells = self.cell_trainings[key]
            for group in trained_cells.populations(ids, layout):
                trained_cells.train(cells, self.space, [self.cell(a)[1] for a in group],
                                    Path(self.sweep.trained_dir, key), self.training_data(cells.dataset, cells.split),
                                    checkpoint_every=self.sweep.plan.training.checkpoint_every, layout=layout,
                                    on_step=None if on_step is None else functools.partial(on_step, group[0]))

    def definition(self) -> dict:
        """What the results depend on; a store holds one definition."""
        sweep = self.sweep
        plan = dataclasses.replace(sweep.plan, training=None)  # trained networks' ids hash their training
        if sweep.weights is not None:  # each network's file: its name, size and time of writing
            networks = {"space": nas.supernet.describe_space(self.space), "standalone": hashlib.sha256(json.dumps(
                [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in self.folder_entries.values()]).encode()
            ).hexdigest()[:16]}
        elif sweep.trains_cells:
            networks = {"space": nas.supernet.describe_space(self.space),
                        "trained": "cells trained from scratch, one network per technique set; ids hash the training "
                                   "settings"}
        elif sweep.space is not None:
            networks = {"space": nas.supernet.describe_space(self.supernet.space),
                        "weights": _digest(jax.tree.leaves(self.supernet.state)),
                        "calibration": _digest([self.calibration])}
        elif sweep.training:
            networks = {"trained": "zoo models, one network per technique set; ids hash the training settings"}
        else:
            networks = {"models": {spec: _digest(jax.tree.leaves(self.model(spec).params)) for spec in sweep.models}}
        return {"plan": plan.as_dict(), "items": list(self.by_key),
                "dataset": {"name": sweep.dataset, "split": sweep.split, "examples": self.num_examples},
                "data_key": self.data_key, "networks": networks}

    def networks(self, archs: Sequence[Any]) -> list[tuple[str, str, dict]]:
        """``(arch_id, bucket, card)`` of each network: its id, the shape bucket that decides
        which networks share a compiled program, and its card (config, params, FLOPs). A
        sweep of models, or of trained networks, takes its own networks and ignores ``archs``."""
        if self.sweep.training and self.sweep.models:
            return [(arch_id, n.name, trained.card(n)) for arch_id, n in self.trained_networks.items()]
        if self.sweep.space is None:
            return [(spec, spec, self.model_card(spec)) for spec in self.sweep.models]
        configs = [self.space.resolve(arch) for arch in archs]
        if self.sweep.weights is not None:
            nas.standalone.check_present(self.sweep.weights, self.folder_entries, configs)
        if self.sweep.training:  # a bucket per technique set: its cells train as one population
            return [(trained_cells.cell_id(cells, c), cells.arch_id, nas.models.network_card(self.space, c)
                     | {"techniques": str(cells.techniques), "training": cells.settings})
                    for cells in self.cell_trainings.values() for c in configs]
        return [(c.arch_id, str(nas.build.resolution(self.space, c)), nas.models.network_card(self.space, c))
                for c in configs]

    def model_card(self, spec: str) -> dict:
        """The card of model ``spec``: its cost, and a NAS network's ids, ops and costs in
        its space (``nas.models.network_card``), so its rows join as a space sweep's do."""
        if (card := nas.models.zoo_card(spec)) is not None:
            return {"model": spec} | card
        return {"model": spec, "params": zoo.count_params(self.model(spec)),
                "flops": int(zoo.count_flops(self.model(spec)))}

    def population(self, arch_ids: Sequence[str], pad_to: int) -> Population:
        """The networks ``arch_ids`` as one population of their bucket's population size
        ``pad_to``, padded with copies of the first network (a bucket's last, smaller chunk
        to the size ``items.rung`` gives), so that the chunks of a bucket share few
        programs; a lone network (``pad_to`` 1) runs at its own shapes
        (``nas.population.choose_layout``). Trained networks of one architecture stack
        likewise, read from their folders."""
        size = rung(len(arch_ids), pad_to, self.sweep.network_shards)
        if self.sweep.training and self.sweep.models:
            networks = [trained.load(self.trained_networks[a], self.folder(a)) for a in arch_ids]
            return Population.stack(networks + networks[:1] * (size - len(networks)))
        if self.sweep.space is None:  # the network's id is the spec the user typed, whatever its name
            (spec,) = arch_ids
            return Population.stack([self.model(spec).replace(name=spec)])
        padded = list(arch_ids) + [arch_ids[0]] * (size - len(arch_ids))
        layout = choose_layout(self.sweep.layout, pad_to, self.space, self.sweep.network_shards)
        if self.sweep.weights is not None or self.sweep.training:  # each file read once; the padding repeats
            weights = self.standalone_weights(arch_ids)
            population = nas.standalone.from_networks(self.space, [self.space.resolve(a.split("/")[0]) for a in padded],
                                                      weights + weights[:1] * (size - len(weights)),
                                                      sequential=layout == "sequential")
            return dataclasses.replace(population, arch_ids=tuple(padded))
        if layout == "exact":
            return exact_subnet(self.supernet, arch_ids[0], calibration=self.calibration)
        return from_supernet(self.supernet, padded, calibration=self.calibration, sequential=layout == "sequential",
                             packed=layout == "packed")

    def evaluate(self, arch_ids: Sequence[str], missing: dict[str, list[str]], *, pad_to: int, worker: str,
                 on_train: Callable[[str, StepReport], None] | None = None,
                 on_trained: Callable[[str, dict], None] | None = None) -> Iterator[list[dict]]:
        """Rows of every (network, item) in ``missing`` (item key -> arch ids), item by item,
        once the trained networks among ``arch_ids`` have trained (``on_train`` receives
        their steps; a training that fails stops the sweep, and a rerun resumes it; a trained
        cell's training figures go to ``on_trained``, and a cell whose training diverged
        fails its items). A network that lacks the ``report`` item comes first, alone, with
        the rows of the items its evaluation recorded; the population runs only the
        (network, item) pairs left."""
        wanted = {key: list(ids) for key, ids in missing.items() if ids}
        if not wanted:
            return
        self.train(arch_ids, on_train)
        if self.sweep.trains_cells:
            diverged = {a: rows for a in arch_ids if (rows := self._diverged_rows(a, wanted, worker, on_trained))}
            yield from diverged.values()
            arch_ids = [a for a in arch_ids if a not in diverged]
            wanted = {key: ids for key, ids in wanted.items() if ids}
            if not wanted:
                return
        if report_key := self.report_key(wanted):
            for arch_id in wanted.pop(report_key):
                yield self._report_rows(report_key, arch_id, wanted, worker)
        wanted = {key: ids for key, ids in wanted.items() if ids}
        if not wanted:
            return
        started = time.perf_counter()
        try:
            population = self.population(arch_ids, pad_to)
        except Exception as error:  # every item of these networks fails with it; the sweep goes on
            for key, ids in wanted.items():
                yield [self._failed(a, key, error, worker, time.perf_counter() - started) for a in ids]
            return
        setup = time.perf_counter() - started
        clean = None  # the population's clean outcome, (networks, examples), once its clean item ran here
        for key, ids in wanted.items():
            item = self.by_key[key]
            rows, outcome = self._item_rows(population, item, key, ids, worker, setup / len(wanted), clean)
            if item.kind == "clean" and outcome is not None:
                clean = outcome[:, 0]
            yield rows

    def _diverged_rows(self, arch_id: str, wanted: dict[str, list[str]], worker: str,
                       on_trained: Callable[[str, dict], None] | None) -> list[dict]:
        """Trained cell ``arch_id``'s figures to ``on_trained``; if its training diverged, the
        failed rows of its ``wanted`` items, which leave ``wanted``."""
        summary = trained_cells.summary(self.folder(arch_id))
        if on_trained is not None:
            on_trained(arch_id, summary)
        if summary["diverged_at"] is None:
            return []
        error = FloatingPointError(f"its training stopped at step {summary['diverged_at'] + 1}: the loss or the "
                                   "weights went non-finite")
        rows = [self._failed(arch_id, key, error, worker, 0.0) for key, ids in wanted.items() if arch_id in ids]
        for ids in wanted.values():
            if arch_id in ids:
                ids.remove(arch_id)
        return rows

    def report_key(self, missing: dict[str, list[str]]) -> str | None:
        """The key of the plan's ``report`` item when some network of ``missing`` lacks it."""
        return next((key for key, ids in missing.items() if ids and self.by_key[key].kind == REPORT), None)

    def units(self, missing: dict[str, list[str]]) -> int:
        """The steps :meth:`evaluate` yields for ``missing``: one per network lacking the
        ``report`` item, and one per other item that some other network lacks."""
        reported = set(missing.get(self.report_key(missing), ()))
        return len(reported) + sum(1 for key, ids in missing.items()
                                   if self.by_key[key].kind != REPORT and set(ids) - reported)

    def alone(self, arch_id: str) -> Classifier:
        """Network ``arch_id`` as a classifier of its own; a supernet's subnet at its own
        shapes, so that the metrics count its own neurons (a masked subnet would count the
        supernet's)."""
        if self.sweep.weights is not None or self.sweep.trains_cells:
            network = nas.standalone.network(self.space, arch_id.split("/")[0], *self.standalone_weights([arch_id]))
            return network.replace(name=arch_id)
        if self.sweep.space is not None:
            return exact_subnet(self.supernet, arch_id, calibration=self.calibration).member(0)
        return self.population([arch_id], 1).member(0)

    def standalone_weights(self, arch_ids: Sequence[str]) -> list[dict]:
        """The weights of standalone networks ``arch_ids``, read from the sweep's folder (a
        trained cell's from its technique set's)."""
        if not self.sweep.training:
            return nas.standalone.load_folder(self.space, self.sweep.weights, arch_ids)
        return [nas.standalone.load_folder(self.space, self.folder(a).parent, [self.cell(a)[1]])[0]
                for a in arch_ids]

    @functools.cached_property
    def reference(self) -> Classifier | None:
        """The plan's reference model (``metrics.reference``), or None."""
        return None if self.sweep.plan.reference is None else self.model(self.sweep.plan.reference)

    @functools.cached_property
    def profile(self) -> data.ImageDataset | None:
        """The split the metrics profile their neuron bounds on; None without metrics, or when
        the dataset lacks it (the bounded metrics are then skipped, as robustjax evaluate does)."""
        metrics = self.sweep.plan.metrics
        if metrics is None:
            return None
        try:
            return data.load(self.sweep.dataset, metrics.profile_split, data_dir=self.sweep.data_dir)
        except ValueError:
            return None

    def _report_rows(self, key: str, arch_id: str, missing: dict[str, list[str]], worker: str) -> list[dict]:
        """The ``report`` item of one network: ``robustjax evaluate``'s runner on the network
        alone with the whole plan; the row's figures are the report's (``report_figures``),
        its record every evaluation item and, as item ``report``, the report itself. With it,
        the rows of the network's other ``missing`` items whose outcomes the evaluation
        recorded (``records.outcome``); the network leaves those items' lists in ``missing``."""
        started = time.perf_counter()
        try:
            network = self.alone(arch_id)
            stored = MemoryStore()
            report = evaluate(network, self.dataset, report_plan(self.sweep.plan), profile=self.profile,
                              reference=self.reference, store=stored)
            stored.save(REPORT, Finished(report))
        except Exception as error:  # recorded for this network; the sweep goes on
            return [self._failed(arch_id, key, error, worker, time.perf_counter() - started)]
        rows = [{"arch_id": arch_id, "item_key": key, "status": "ok", "figures": report_figures(report),
                 "outcome": stored.snapshot(), "examples": 0, "error": None,
                 "seconds": time.perf_counter() - started, "worker": worker}]
        for item_key, ids in missing.items():
            item = self.by_key[item_key]
            if arch_id in ids and (outcome := records.outcome(self.sweep.plan, item, stored)) is not None:
                rows.append(self._ok(arch_id, item_key, item, outcome, worker, 0.0))
                ids.remove(arch_id)
        return rows

    def _item_rows(self, population: Population, item: Item, key: str, ids: list[str], worker: str,
                   setup: float, clean: np.ndarray | None = None) -> tuple[list[dict], np.ndarray | None]:
        """The rows of ``item`` for networks ``ids`` of ``population``, and its outcome for
        every network of the population (None when it failed); an attack reads the networks'
        ``clean`` outcome when given (``ItemRunner.records``)."""
        started = time.perf_counter()
        try:
            outcome = self.runner.run(item, population.classifier, population.axes, population.sequential,
                                      clean=clean)
        except PopulationTooLarge:  # not one network fits: the sweep's settings are wrong for all, stop
            raise
        except Exception:  # find the networks it fails on, one at a time
            return [self._alone(item, key, arch_id, worker) for arch_id in ids], None
        seconds = (time.perf_counter() - started + setup) / len(population)
        position = {arch_id: i for i, arch_id in enumerate(population.arch_ids)}
        return [self._ok(arch_id, key, item, outcome[position[arch_id]], worker, seconds) for arch_id in ids], outcome

    def _alone(self, item: Item, key: str, arch_id: str, worker: str) -> dict:
        started = time.perf_counter()
        try:
            population = self.population([arch_id], 1)
            outcome = self.runner.run(item, population.classifier, population.axes, population.sequential)[0]
        except Exception as error:  # recorded for this network; the sweep goes on
            return self._failed(arch_id, key, error, worker, time.perf_counter() - started)
        return self._ok(arch_id, key, item, outcome, worker, time.perf_counter() - started)

    def _ok(self, arch_id: str, key: str, item: Item, outcome: np.ndarray, worker: str, seconds: float) -> dict:
        return {"arch_id": arch_id, "item_key": key, "status": "ok", "figures": figures(item, outcome),
                "outcome": pack(outcome), "examples": outcome.shape[-1], "error": None, "seconds": seconds,
                "worker": worker}

    @staticmethod
    def _failed(arch_id: str, key: str, error: Exception, worker: str, seconds: float) -> dict:
        return {"arch_id": arch_id, "item_key": key, "status": "failed", "figures": None, "outcome": None,
                "examples": None, "error": f"{type(error).__name__}: {error}", "seconds": seconds, "worker": worker}


@functools.cache
def context(sweep: Sweep) -> Context:
    """The process's context of ``sweep`` (built once)."""
    return Context(sweep)


def open_store(sweep: Sweep, path: str, archs: Sequence[Any]) -> tuple[Store, list[str]]:
    """The sweep's store at ``path`` (made, or checked to hold this sweep), with the networks
    ``archs`` added; returns it and the arch ids of ``archs``, in order (a packed sweep's in
    ``nas.population.packing_order``). ``archs`` may be a ``range``: its length is checked
    before any network is built."""
    if len(archs) > MAX_NETWORKS:
        raise ValueError(f"a sweep of {len(archs):,} networks is more than one database holds ({MAX_NETWORKS:,}): "
                         "sample some with --n N, or split the ids over several databases with --ids")
    ctx = context(sweep)
    if sweep.layout == "packed":  # populations that share the most (NB201: one signature) run together
        archs = nas.population.packing_order(ctx.space, [ctx.space.resolve(arch) for arch in archs],
                                             sweep.population_size)
    networks = ctx.networks(archs)
    row_bytes = ROW_OVERHEAD_BYTES + sum(len(pack(np.zeros((len(i.labels), ctx.num_examples), outcome_dtype(i.kind))))
                                         for i in ctx.items)
    store = Store.open(path, ctx.definition(), environment=environment(), expected_bytes=len(networks) * row_bytes)
    store.set_items((key, item.kind, item.settings, item.labels) for key, item in ctx.by_key.items())
    store.add_networks(networks)
    return store, [arch_id for arch_id, _, _ in networks]


def chunk_size(sweep: Sweep, store: Store, selection: Sequence[str]) -> Callable[[str], int]:
    """Per network, how many networks its population holds: the population size, or its
    bucket's share of the selection when that is smaller (a population is not padded
    beyond the networks there are)."""
    if sweep.space is None and not sweep.training:
        return lambda arch_id: 1
    buckets = {arch_id: bucket for arch_id, bucket, _ in store.networks()}
    counts = collections.Counter(buckets[arch_id] for arch_id in selection)
    return lambda arch_id: min(sweep.population_size, counts[buckets[arch_id]])


def run_local(sweep: Sweep, store: Store, selection: Sequence[str], *, worker: str, lease_s: float = 1800.0,
              on_chunk: Callable[[list[str]], None] | None = None,
              on_train: Callable[[str, StepReport], None] | None = None,
              on_item: Callable[[list[str], float], None] | None = None) -> None:
    """Claims and evaluates chunks of ``selection`` until none is left to claim, committing
    each item's rows as it finishes; ``on_item`` receives the chunk's arch ids and the share
    of its work committed so far after each item (a ``report`` item counts once per
    network), ``on_chunk`` each finished chunk's arch ids, ``on_train`` each training step
    of a trained network. The claims are renewed meanwhile (``Store.heartbeat``). An error
    (a failed training) stops it, its chunk released."""
    ctx = context(sweep)
    size_of = chunk_size(sweep, store, selection)
    with store.heartbeat(worker, lease_s):  # the claims live while an item or a training runs
        while chunk := store.claim(worker, list(selection), lease_s, size_of):
            missing = store.missing(chunk)
            units = ctx.units(missing)
            try:
                for done, rows in enumerate(ctx.evaluate(chunk, missing, pad_to=size_of(chunk[0]), worker=worker,
                                                         on_train=on_train, on_trained=store.annotate), start=1):
                    store.commit(rows)
                    if on_item is not None:
                        on_item(chunk, min(1.0, done / units))
            finally:  # a chunk that raised is free again at once, for a rerun in this process too
                store.release(worker, chunk)
            if on_chunk is not None:
                on_chunk(chunk)
