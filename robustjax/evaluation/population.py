"""A plan over many networks, evaluated as populations: one compiled program per item and
population size, whatever the networks.

``evaluate_population(supernet, archs, dataset, plan)`` groups the networks by the
resolution they compute at, cuts each group into populations of ``population_size`` (or
fewer, when the group is smaller; the last one padded with copies of its first network,
which are dropped from the results), recalibrates each subnet's batch norm in one vmapped pass, and runs the plan's
clean pass, attacks and corruptions over every population with ``jax.vmap``: each network
gets exactly the results it would get evaluated alone with the same keys. Batches of
examples are sharded over the local devices.

Early stop works per network (each network's finished examples are masked inside its
loop); compaction (moving unfinished examples into smaller batches) does not apply inside
a population, whose networks share one static batch shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from robustjax import noise
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import AttackRun, Plan
from robustjax.nas.population import Population, from_supernet, resolution_buckets
from robustjax.nas.recalibrate import calibration_subset
from robustjax.nas.supernet import Supernet

UNSUPPORTED = ("sequences", "system_noise", "metrics")


def check_population_plan(plan: Plan) -> None:
    """Refuses, before any work, plan items that populations do not run yet."""
    present = [name for name in UNSUPPORTED if getattr(plan, name) is not None]
    if present:
        raise ValueError(f"plan items {present} do not apply to populations yet (clean, [[attacks]] and "
                         f"[corruptions] do); remove them, or evaluate networks one at a time with `robustjax evaluate`")


@functools.partial(jax.jit, static_argnums=0)
def _predict(axes: Any, classifier: Classifier, x: jax.Array) -> jax.Array:
    """(networks, batch) predicted classes."""
    return jax.vmap(lambda p: jnp.argmax(classifier.replace(params=p)(x), -1), in_axes=(axes,))(classifier.params)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _attack(run: AttackRun, axes: Any, classifier: Classifier, x: jax.Array, y: jax.Array, key: jax.Array):
    """(networks, epsilons, batch) success of the run's attack on every network, same key."""
    def one(params):
        member = classifier.replace(params=params)
        if run.swept:
            return run.attack.sweep(member, x, y, key=key, eps=run.eps, restarts=run.restarts).success
        return run.attack(member, x, y, key=key).success[None]

    return jax.vmap(one, in_axes=(axes,))(classifier.params)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _corrupt(name: str, severity: int, preset: str, x: jax.Array, key: jax.Array) -> jax.Array:
    return noise.corruption_fn(name, severity, preset)(x, key)


def evaluate_population_batch(population: Population, dataset: ImageDataset, plan: Plan,
                              parallel: DataParallel | None = None) -> list[dict]:
    """Every network of ``population`` under ``plan``: a dict per network with its clean
    accuracy, per attack entry its robust accuracy, per corruption and severity its
    accuracy, and the per-example correctness behind each (``per_example``)."""
    check_population_plan(plan)
    parallel = parallel or DataParallel(plan.batch_size)
    classifier = parallel.replicate(population.classifier)
    axes = population.axes
    batches = list(parallel.batches(dataset, plan.num_examples))
    correct = np.concatenate([(np.asarray(_predict(axes, classifier, x)) == np.asarray(y)[None])[:, mask]
                              for x, y, mask in batches], axis=1)
    per_example = {"clean": correct}
    attacks: list[list[dict]] = [[] for _ in population.arch_ids]
    seed_key = jax.random.key(plan.seed)
    for run in plan.runs:
        success = np.concatenate([
            np.asarray(_attack(run, axes, classifier, x, y, jax.random.fold_in(seed_key, index)))[:, :, mask]
            for index, (x, y, mask) in enumerate(batches)], axis=2)
        for entry, params in enumerate(run.entries()):
            robust = correct & ~success[:, entry]
            key = f"{run.attack.name} {params}"
            per_example[key] = robust
            for network in range(len(population)):
                attacks[network].append({"name": run.attack.name, "params": params,
                                         "robust_accuracy": float(robust[network].mean())})
    corruptions: list[list[dict]] = [[] for _ in population.arch_ids]
    if plan.corruptions is not None:
        run = plan.corruptions
        preset = run.preset or noise.default_preset(tuple(dataset.image_shape))
        for index, name in enumerate(run.names):
            for severity in run.severities:
                key = jax.random.fold_in(jax.random.fold_in(seed_key, index), severity)
                hit = np.concatenate([
                    (np.asarray(_predict(axes, classifier, _corrupt(name, severity, preset, x,
                                                                    jax.random.fold_in(key, batch))))
                     == np.asarray(y)[None])[:, mask]
                    for batch, (x, y, mask) in enumerate(batches)], axis=1)
                per_example[f"{name} {severity}"] = hit
                for network in range(len(population)):
                    corruptions[network].append({"name": name, "severity": severity,
                                                 "accuracy": float(hit[network].mean())})
    return [{"arch_id": arch_id, "clean_accuracy": float(correct[i].mean()), "attacks": attacks[i],
             "corruptions": corruptions[i], "per_example": {k: v[i] for k, v in per_example.items()}}
            for i, arch_id in enumerate(population.arch_ids)]


def evaluate_population(supernet: Supernet, archs: Sequence[Any], dataset: ImageDataset, plan: Plan, *,
                        calibration: np.ndarray | ImageDataset | None = None, population_size: int = 64,
                        on_population: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Subnets ``archs`` of ``supernet`` under ``plan`` on ``dataset``, as populations of
    ``population_size`` networks; results in the order of ``archs``.

    ``calibration`` (images in [0, 1], or a dataset of which a seeded subset of 4,096 is
    read) recalibrates each subnet's batch norm; without it the supernet's statistics are
    used. ``on_population`` receives each population's results as they are done.
    """
    check_population_plan(plan)
    if not isinstance(population_size, int) or population_size < 1:
        raise ValueError(f"population_size must be an int >= 1, got {population_size!r}")
    images = None if calibration is None else calibration_subset(calibration)
    parallel = DataParallel(plan.batch_size)
    by_id = {}
    for configs in resolution_buckets(supernet.space, archs).values():
        size = min(population_size, len(configs))  # a bucket smaller than a population is not padded
        for start in range(0, len(configs), size):
            chunk = configs[start:start + size]
            padded = chunk + [chunk[0]] * (size - len(chunk))  # same shapes: no new compile
            population = from_supernet(supernet, padded, calibration=images)
            results = evaluate_population_batch(population, dataset, plan, parallel)[:len(chunk)]
            if on_population is not None:
                on_population(results)
            by_id.update((r["arch_id"], r) for r in results)
    return [by_id[supernet.space.resolve(arch).arch_id] for arch in archs]
