"""A plan over many networks, evaluated as populations: one compiled program per item and
population size, whatever the networks.

``evaluate_population(supernet, archs, dataset, plan)`` groups the networks by the
resolution they compute at, cuts each group into populations of ``population_size`` (or
fewer, when the group is smaller; the last one sized from a short ladder, ``items.rung``,
and padded with copies of its first network, which are dropped from the results); an item
whose population would not fit in memory runs it in parts that fit. It recalibrates each subnet's batch norm in one vmapped
pass, and runs the plan's items (``evaluation.items``: the clean pass, attacks, corruptions,
ImageNet-P sequences and system noise) over every population with ``jax.vmap``: each network
gets exactly the results it would get evaluated alone with the same keys. Batches of
examples are sharded over the local devices.

Early stop works per network. On one device, an attack whose examples finish early runs
compacted (``evaluation.compacted``): between segments each network's unfinished examples
move into a smaller batch, the size that holds the most any network has left; a batch
sharded over several devices, an epsilon sweep and a packed population keep one program,
in which each network's finished examples are masked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from robustjax.data.dataset import ImageDataset
from robustjax.evaluation.items import (
    ItemRunner,
    check_population_plan,
    expand,
    figures,
    padded_size,
    rung,
)
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import Plan
from robustjax.nas.population import (
    Population,
    check_layout,
    choose_layout,
    exact_subnet,
    from_supernet,
    packing_order,
    resolution_buckets,
)
from robustjax.nas.recalibrate import calibration_subset
from robustjax.nas.supernet import Supernet


def evaluate_population_batch(population: Population, dataset: ImageDataset, plan: Plan,
                              runner: ItemRunner | None = None) -> list[dict]:
    """Every network of ``population`` under ``plan``: a dict per network with its clean
    accuracy, per attack entry its robust accuracy, per corruption and severity and per
    system-noise variant its accuracy, per ImageNet-P perturbation its flip probability and
    top-5 distance, with a ``[certify]`` table its certified accuracies (``certified``, by
    figure label), with ``[proxies]`` their means (``proxies``), and the per-example
    outcomes behind each (``per_example``, keyed by figure label: correctness, or each
    sequence's flip rate and top-5 distance, or a proxy's values)."""
    runner = runner or ItemRunner(dataset, plan)
    results = [{"arch_id": arch_id, "attacks": [], "corruptions": [], "sequences": [], "system_noise": [],
                "per_example": {}} for arch_id in population.arch_ids]
    clean = None
    for item in expand(plan):  # the clean item first: the attacks read its outcome
        outcome = runner.run(item, population.classifier, population.axes, population.sequential, clean=clean)
        if item.kind == "clean":
            clean = outcome[:, 0]
        for result, network_outcome in zip(results, outcome):
            result["per_example"].update(zip(item.labels, network_outcome))
            values = figures(item, network_outcome)
            if item.kind == "clean":
                result["clean_accuracy"] = values["clean"]
            elif item.kind == "attack":
                result["attacks"].extend({"name": item.run.attack.name, "params": params,
                                          "robust_accuracy": values[label]}
                                         for label, params in zip(item.labels, item.run.entries()))
            elif item.kind == "sequence":
                flips, top5 = (values[label] for label in item.labels)
                result["sequences"].append({"name": item.settings["name"], "flip_probability": flips,
                                            "top5_distance": top5})
            elif item.kind in ("bound", "smoothing", "proxy"):
                result.setdefault({"proxy": "proxies"}.get(item.kind, "certified"), {}).update(values)
            else:
                result["corruptions" if item.kind == "corruption" else "system_noise"].append(
                    {**{k: v for k, v in item.settings.items() if k != "index"},
                     "accuracy": values[item.labels[0]]})
    return results


def evaluate_population(supernet: Supernet, archs: Sequence[Any], dataset: ImageDataset, plan: Plan, *,
                        calibration: np.ndarray | ImageDataset | None = None, population_size: int = 64,
                        network_shards: int = 1, layout: str = "auto",
                        on_population: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Subnets ``archs`` of ``supernet`` under ``plan`` on ``dataset``, as populations of
    ``population_size`` networks; results in the order of ``archs``.

    ``calibration`` (images in [0, 1], or a dataset of which a seeded subset of 4,096 is
    read) recalibrates each subnet's batch norm; without it the supernet's statistics are
    used. The local devices form a mesh of ``network_shards`` x the rest: networks split
    over the first axis, examples over the second (a population is padded to a multiple of
    ``network_shards``). ``layout`` (``nas.population.choose_layout``) runs a resolution
    bucket's subnets in one program over the supernet's shapes, side by side (masks), one
    after another (sequential) or packed by the choices they share (packed), or each at its own
    shapes (exact). ``on_population`` receives
    each population's results as they are done. An item whose population would not fit in a
    device's free memory runs it in parts of the largest size that fits; only one that not
    even a single network fits is refused, before it runs (``items.PopulationTooLarge``).
    """
    check_population_plan(plan)
    if not isinstance(population_size, int) or population_size < 1:
        raise ValueError(f"population_size must be an int >= 1, got {population_size!r}")
    check_layout(layout, network_shards)
    images = None if calibration is None else calibration_subset(calibration)
    runner = ItemRunner(dataset, plan, DataParallel(plan.batch_size, network_shards=network_shards))
    by_id = {}
    for configs in resolution_buckets(supernet.space, archs).values():
        for population, networks in _populations(supernet, configs, images, population_size, network_shards, layout):
            results = evaluate_population_batch(population, dataset, plan, runner)[:networks]
            if on_population is not None:
                on_population(results)
            by_id.update((r["arch_id"], r) for r in results)
    return [by_id[supernet.space.resolve(arch).arch_id] for arch in archs]


def _populations(supernet: Supernet, configs: list, calibration: np.ndarray | None, population_size: int,
                 network_shards: int, layout: str) -> Iterator[tuple[Population, int]]:
    """The populations of one resolution bucket, each with how many of its networks are real
    (the last masked one is padded with copies of its first network to the size
    ``items.rung`` gives: one of four sizes per item, so few programs)."""
    chosen = choose_layout(layout, len(configs), supernet.space, network_shards)
    if chosen == "exact":
        for config in configs:
            yield exact_subnet(supernet, config, calibration=calibration), 1
        return
    if chosen == "packed":  # populations of one signature share a program
        configs = packing_order(supernet.space, configs, population_size)
    size = padded_size(min(population_size, len(configs)), network_shards)
    for start in range(0, len(configs), size):
        chunk = configs[start:start + size]
        padded = rung(len(chunk), size, network_shards)
        yield from_supernet(supernet, chunk + [chunk[0]] * (padded - len(chunk)), calibration=calibration,
                            sequential=chosen == "sequential", packed=chosen == "packed"), len(chunk)
