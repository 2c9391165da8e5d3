"""Runs an evaluation plan over a dataset and builds the report, one section at a time.

Batches are padded to the plan's batch size (so every batch reuses one compiled program)
and sharded over all local devices along the batch axis; padded examples are masked out
of every count. After the clean pass and after each attack, ``on_update`` receives the
report so far, so a failure later in the plan never loses what was already measured; an
attack that fails is recorded as failed with its error and the plan goes on.
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import robustjax
from robustjax.attacks.threat import per_example_norm
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.evaluation.plan import AttackRun, Plan
from robustjax.evaluation.timing import timed
from robustjax.zoo.registry import count_params

SCHEMA_VERSION = 1
NORMS = ("linf", "l2", "l1", "l0")


class DataParallel:
    """Pads batches to a fixed size and shards them over a 1-D mesh of local devices."""

    def __init__(self, batch_size: int):
        devices = jax.local_devices()
        self.mesh = jax.make_mesh((len(devices),), ("batch",), devices=devices, axis_types=(AxisType.Auto,))
        # Round up so that every device gets the same number of examples.
        self.batch_size = -(-batch_size // len(devices)) * len(devices)
        self.sharded = NamedSharding(self.mesh, PartitionSpec("batch"))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())

    def replicate(self, tree):
        return jax.device_put(tree, self.replicated)

    def batches(self, dataset: ImageDataset, limit: int | None) -> Iterator[tuple[jax.Array, jax.Array, np.ndarray]]:
        """Yields sharded ``(x, y)`` and the host mask of real (not padding) examples."""
        for x, y in dataset.batches(self.batch_size, limit=limit):
            real = len(y)
            pad = self.batch_size - real
            if pad:
                x = np.concatenate([x, np.repeat(x[:1], pad, axis=0)])
                y = np.concatenate([y, np.repeat(y[:1], pad, axis=0)])
            mask = np.arange(self.batch_size) < real
            yield jax.device_put(x, self.sharded), jax.device_put(y, self.sharded), mask


@jax.jit
def _predict(classifier: Classifier, x: jax.Array) -> jax.Array:
    return jnp.argmax(classifier(x), axis=-1)


def _mean_or_none(values: np.ndarray) -> float | None:
    return float(np.mean(values)) if values.size else None


def clean_section(classifier: Classifier, dataset: ImageDataset, plan: Plan, parallel: DataParallel):
    """Clean accuracy, and the host mask of correctly classified examples."""
    correct = []
    with timed() as timing:
        for x, y, mask in parallel.batches(dataset, plan.num_examples):
            correct.append((np.asarray(_predict(classifier, x)) == np.asarray(y))[mask])
    correct = np.concatenate(correct)
    section = {
        "accuracy": float(correct.mean()),
        "num_correct": int(correct.sum()),
        "timing": timing.as_dict(len(correct)),
    }
    return section, correct


def _attack_batches(run: AttackRun, classifier: Classifier, dataset: ImageDataset, plan: Plan, parallel: DataParallel):
    """Yields, per batch, the host mask and the per-epsilon results (leading axis: epsilon)."""
    key = jax.random.key(plan.seed)
    for index, (x, y, mask) in enumerate(parallel.batches(dataset, plan.num_examples)):
        batch_key = jax.random.fold_in(key, index)
        if run.swept:
            result = run.attack.sweep(classifier, x, y, key=batch_key, eps=run.eps, restarts=run.restarts)
        else:
            result = jax.tree.map(lambda a: a[None], run.attack(classifier, x, y, key=batch_key))
        delta = result.x_adv - x[None]
        norms = {norm: jax.vmap(lambda d: per_example_norm(d, norm))(delta) for norm in NORMS}
        yield mask, {"success": result.success, "queries": result.queries, **norms}


def attack_sections(
    run: AttackRun, classifier: Classifier, dataset: ImageDataset, plan: Plan,
    parallel: DataParallel, clean_correct: np.ndarray,
) -> list[dict]:
    """Robust accuracy, success rate, perturbation norms, queries and timing of one plan
    entry: one section per epsilon of its sweep."""
    columns: dict[str, list[np.ndarray]] = {}
    with timed() as timing:
        for mask, values in _attack_batches(run, classifier, dataset, plan, parallel):
            for name, value in values.items():
                columns.setdefault(name, []).append(np.asarray(value)[:, mask])
    columns = {name: np.concatenate(parts, axis=1) for name, parts in columns.items()}
    num_correct = int(clean_correct.sum())
    timing_fields = {**timing.as_dict(clean_correct.size), "grid_size": len(run.entries())}
    sections = []
    for i, params in enumerate(run.entries()):
        success = columns["success"][i]
        fooled = clean_correct & success  # correctly classified examples the attack flipped
        norms = {norm: columns[norm][i][fooled] for norm in NORMS}
        sections.append({
            "name": run.attack.name,
            "params": params,
            "status": "ok",
            "robust_accuracy": float((clean_correct & ~success).mean()),
            "attack_success_rate": float(fooled.sum() / num_correct) if num_correct else None,
            "num_adversarial": int(fooled.sum()),
            "perturbation": {
                "linf_mean": _mean_or_none(norms["linf"]),
                "l2_mean": _mean_or_none(norms["l2"]),
                "l1_mean": _mean_or_none(norms["l1"]),
                "l0_mean": _mean_or_none(norms["l0"]),
                "l2_median": float(np.median(norms["l2"])) if norms["l2"].size else None,
            },
            "queries_mean": float(columns["queries"][i].mean()),
            "timing": timing_fields,
        })
    return sections


def environment() -> dict:
    devices = jax.local_devices()
    return {
        "robustjax": robustjax.__version__,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "machine": platform.machine(),
    }


def evaluate(
    classifier: Classifier,
    dataset: ImageDataset,
    plan: Plan,
    *,
    on_update: Callable[[dict], None] = lambda report: None,
) -> dict:
    """Runs ``plan`` and returns the report (schema: docs/report-schema.md)."""
    if tuple(dataset.image_shape) != tuple(classifier.input_shape):
        raise ValueError(
            f"dataset {dataset.name!r} has images of shape {tuple(dataset.image_shape)}, "
            f"model {classifier.name!r} expects {tuple(classifier.input_shape)}"
        )
    if dataset.num_classes > classifier.num_classes:
        raise ValueError(
            f"dataset {dataset.name!r} has {dataset.num_classes} classes, "
            f"model {classifier.name!r} predicts only {classifier.num_classes}"
        )
    parallel = DataParallel(plan.batch_size)
    classifier = parallel.replicate(classifier)
    num_examples = dataset.num_examples if plan.num_examples is None else min(plan.num_examples, dataset.num_examples)
    report = {
        "schema_version": SCHEMA_VERSION,
        "status": "running",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {
            "name": classifier.name,
            "num_classes": classifier.num_classes,
            "input_shape": list(classifier.input_shape),
            "num_params": count_params(classifier),
        },
        "dataset": {"name": dataset.name, "num_examples": num_examples},
        "plan": plan.as_dict(),
        "environment": environment(),
        "clean": None,
        "attacks": [],
    }
    report["clean"], clean_correct = clean_section(classifier, dataset, plan, parallel)
    on_update(report)
    for run in plan.runs:
        try:
            sections = attack_sections(run, classifier, dataset, plan, parallel, clean_correct)
        except Exception as error:  # recorded in the report; the rest of the plan still runs
            sections = [{"name": run.attack.name, "params": params, "status": "failed",
                         "error": f"{type(error).__name__}: {error}"} for params in run.entries()]
        report["attacks"].extend(sections)
        on_update(report)
    failed = any(section["status"] != "ok" for section in report["attacks"])
    report["status"] = "incomplete" if failed else "complete"
    on_update(report)
    return report
