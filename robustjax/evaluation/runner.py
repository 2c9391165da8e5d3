"""Runs an evaluation plan over a dataset and builds the report, one section at a time.

Batches are padded to the plan's batch size (so every batch reuses one compiled program)
and sharded over all local devices along the batch axis; padded examples are masked out
of every count. After the clean pass and after each attack, ``on_update`` receives the
report so far, so a failure later in the plan never loses what was already measured; an
attack that fails is recorded as failed with its error and the plan goes on.
"""

from __future__ import annotations

import datetime
import functools
import platform
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import robustjax
from robustjax import metrics, noise
from robustjax.attacks.threat import per_example_norm
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.evaluation import metric_suite
from robustjax.evaluation.items import jpeg_bytes
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import (
    BASELINES,
    AttackRun,
    CorruptionRun,
    Plan,
    SequenceRun,
    SystemNoiseRun,
)
from robustjax.evaluation.timing import timed
from robustjax.zoo.registry import count_params

SCHEMA_VERSION = 3
NORMS = ("linf", "l2", "l1", "l0")


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _predict_corrupted(name: str, severity: int, preset: str, classifier: Classifier, x, key) -> jax.Array:
    return jnp.argmax(classifier(noise.corruption_fn(name, severity, preset)(x, key)), axis=-1)


def _mean_or_none(values: np.ndarray) -> float | None:
    return float(np.mean(values)) if values.size else None


@jax.jit
def _confidence_and_prediction(classifier: Classifier, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Top softmax probability, predicted class, and whether every logit is finite."""
    logits = classifier(x)
    return metrics.calibration.max_softmax(logits), jnp.argmax(logits, axis=-1), jnp.isfinite(logits).all(axis=-1)


def clean_section(classifier: Classifier, dataset: ImageDataset, plan: Plan, parallel: DataParallel):
    """Clean accuracy and calibration (RobustART's RMS calibration error and AURRA, and ECE),
    and the host mask of correctly classified examples. A model whose logits are not finite
    on some example is refused: every later number would be meaningless."""
    correct, confidence, finite = [], [], []
    with timed() as timing:
        for x, y, mask in parallel.batches(dataset, plan.num_examples):
            top, prediction, batch_finite = _confidence_and_prediction(classifier, x)
            correct.append((np.asarray(prediction) == np.asarray(y))[mask])
            confidence.append(np.asarray(top)[mask])
            finite.append(np.asarray(batch_finite)[mask])
    correct, confidence, finite = np.concatenate(correct), np.concatenate(confidence), np.concatenate(finite)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise ValueError(f"model {classifier.name!r} returns NaN or infinite logits for {bad.size} of the "
                         f"{finite.size} evaluated examples (the first at index {bad[0]})")
    section = {
        "accuracy": float(correct.mean()),
        "num_correct": int(correct.sum()),
        "calibration": {
            "rms_calibration_error": float(metrics.calibration.rms_calibration_error(confidence, correct)),
            "expected_calibration_error": float(metrics.calibration.expected_calibration_error(confidence, correct)),
            "aurra": float(metrics.calibration.aurra(confidence, correct)),
        },
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


def _share(part, whole) -> float | None:
    """``part / whole`` of two counts, exactly as a Python float (None when ``whole`` is 0)."""
    return int(part) / int(whole) if int(whole) else None


def attack_sections(
    run: AttackRun, classifier: Classifier, dataset: ImageDataset, plan: Plan,
    parallel: DataParallel, clean_correct: np.ndarray,
) -> tuple[list[dict], list[np.ndarray]]:
    """Robust accuracy, success rate, perturbation norms, queries and timing of one plan
    entry: one section per epsilon of its sweep, and per section the host mask of the
    examples the attack did not fool (correct under attack)."""
    columns: dict[str, list[np.ndarray]] = {}
    with timed() as timing:
        for mask, values in _attack_batches(run, classifier, dataset, plan, parallel):
            for name, value in values.items():
                columns.setdefault(name, []).append(np.asarray(value)[:, mask])
    columns = {name: np.concatenate(parts, axis=1) for name, parts in columns.items()}
    adversarial_correct = ~columns["success"]  # (epsilons, examples)
    # RobustART's counts: correct clean and under each epsilon's attack.
    counts = metrics.robustart.AdversarialRobustnessStats.empty(len(run.entries())).update(
        clean_correct, adversarial_correct)
    timing_fields = {**timing.as_dict(clean_correct.size), "grid_size": len(run.entries())}
    sections = []
    for i, params in enumerate(run.entries()):
        fooled = clean_correct & ~adversarial_correct[i]  # correctly classified examples the attack flipped
        norms = {norm: columns[norm][i][fooled] for norm in NORMS}
        num_fooled = int(counts.clean_correct) - int(counts.robust_correct[i])
        sections.append({
            "name": run.attack.name,
            "params": params,
            "status": "ok",
            "robust_accuracy": _share(counts.robust_correct[i], counts.count),
            "attack_success_rate": _share(num_fooled, counts.clean_correct),  # 1 - RobustART's AR
            "num_adversarial": num_fooled,
            "perturbation": {
                "linf_mean": _mean_or_none(norms["linf"]),
                "l2_mean": _mean_or_none(norms["l2"]),
                "l1_mean": _mean_or_none(norms["l1"]),
                "l0_mean": _mean_or_none(norms["l0"]),
                "l2_median": float(np.median(norms["l2"])) if norms["l2"].size else None,
            },
            "queries_mean": float(columns["queries"][i].mean()),
            "queries_median": float(np.median(columns["queries"][i])),
            "timing": timing_fields,
        })
    return sections, list(adversarial_correct)


def worst_case_section(attacks: list[tuple[dict, np.ndarray]], clean_correct: np.ndarray) -> list[dict]:
    """Per threat model (norm and epsilon) that two or more finished attacks share: the
    worst case over them, per example (an example counts as robust only if every attack
    failed on it). ``robust_accuracy`` is over all examples; ``wcar`` is RobustART's WCAR,
    over the clean-correct ones. ``attacks`` pairs each section with its examples' host
    mask of correctness under the attack."""
    budgets: dict[tuple[str, float], list[tuple[dict, np.ndarray]]] = {}
    for section, adversarial_correct in attacks:
        if "eps" in section["params"]:
            budgets.setdefault((section["params"].get("norm", "linf"), section["params"]["eps"]), []).append(
                (section, adversarial_correct))
    entries = []
    for (norm, eps), members in budgets.items():
        if len(members) < 2:
            continue
        counts = metrics.robustart.AdversarialRobustnessStats.empty(len(members)).update(
            clean_correct, np.stack([mask for _, mask in members]))
        entries.append({"norm": norm, "eps": eps, "attacks": [section["name"] for section, _ in members],
                        "robust_accuracy": _share(counts.worst_case_correct, counts.count),
                        "wcar": _share(counts.worst_case_correct, counts.clean_correct)})
    return entries


def corruption_section(
    run: CorruptionRun, classifier: Classifier, dataset: ImageDataset, plan: Plan, parallel: DataParallel,
    clean_accuracy: float, on_progress: Callable[[dict], None],
) -> dict:
    """Accuracy under every corruption and severity, and the corruption errors (mCE and
    relative mCE when the run names a baseline). ``on_progress`` receives the section after
    each corruption; a corruption that fails is recorded and the others still run."""
    preset = run.preset or noise.default_preset(tuple(dataset.image_shape))
    section = {"status": "running", **run.as_dict(), "preset": preset, "results": [], "failed": []}
    seed_key = jax.random.key(plan.seed)
    with timed() as timing:
        for index, name in enumerate(run.names):
            try:
                accuracies = []
                for severity in run.severities:
                    key = jax.random.fold_in(jax.random.fold_in(seed_key, index), severity)
                    correct = [
                        (np.asarray(_predict_corrupted(name, severity, preset, classifier, x,
                                                       jax.random.fold_in(key, batch))) == np.asarray(y))[mask]
                        for batch, (x, y, mask) in enumerate(parallel.batches(dataset, plan.num_examples))
                    ]
                    accuracies.append(float(np.concatenate(correct).mean()))
            except Exception as error:  # recorded in the report; the other corruptions still run
                section["failed"].append({"name": name, "error": f"{type(error).__name__}: {error}"})
            else:
                family = noise.get(name).family
                section["results"].extend({"name": name, "family": family, "severity": severity,
                                           "accuracy": accuracy, "error": 1.0 - accuracy}
                                          for severity, accuracy in zip(run.severities, accuracies))
            on_progress(section)
    section.update(corruption_summary(section["results"], run, 1.0 - clean_accuracy))
    section["timing"] = timing.as_dict(len(section["results"]) * num_evaluated(dataset, plan))
    section["status"] = "ok" if not section["failed"] else "incomplete"
    return section


def corruption_summary(results: list[dict], run: CorruptionRun, clean_error: float) -> dict:
    """Per-corruption mean error (and CE, relative CE against the baseline), their means
    over all corruptions and per family."""
    names = list(dict.fromkeys(r["name"] for r in results))
    errors = np.array([[r["error"] for r in results if r["name"] == name] for name in names]).reshape(len(names), -1)
    per_corruption = [{"name": name, "family": noise.get(name).family,
                       "mean_error": float(e)} for name, e in zip(names, metrics.mean_corruption_error(errors))]
    summary = {"per_corruption": per_corruption, "mce": None, "relative_mce": None,
               "mean_error": float(np.mean([c["mean_error"] for c in per_corruption])) if names else None,
               "mean_error_by_family": {
                   family: float(np.mean([c["mean_error"] for c in per_corruption if c["family"] == family]))
                   for family in dict.fromkeys(c["family"] for c in per_corruption)}}
    if run.baseline is not None and names:
        baseline = np.array([BASELINES[run.baseline][name] for name in names])
        ce = metrics.corruption_error(errors, baseline)
        relative = metrics.relative_corruption_error(errors, clean_error, baseline, metrics.ALEXNET_CLEAN_ERROR)
        for entry, c, r in zip(per_corruption, ce, relative):
            entry.update(ce=float(c), relative_ce=float(r))
        summary.update(mce=float(np.mean(ce)), relative_mce=float(np.mean(relative)))
    return summary


def sequence_section(
    run: SequenceRun, classifier: Classifier, dataset: ImageDataset, plan: Plan, on_progress: Callable[[dict], None],
) -> dict:
    """Flip probability and top-5 distance per perturbation (Hendrycks & Dietterich 2019,
    ImageNet-P), averaged over sequences; ``on_progress`` receives the section after each one."""
    parallel = DataParallel(run.batch_size)
    classifier = parallel.replicate(classifier)
    preset = run.preset or noise.default_preset(tuple(dataset.image_shape))
    section = {"status": "running", **run.as_dict(), "preset": preset, "results": [], "failed": []}
    seed_key = jax.random.key(plan.seed)
    with timed() as timing:
        for index, name in enumerate(run.names):
            try:
                flips, top5 = [], []
                for batch, (x, _, mask) in enumerate(parallel.batches(dataset, plan.num_examples)):
                    key = jax.random.fold_in(jax.random.fold_in(seed_key, index), batch)
                    out = noise.evaluate_sequences(classifier, x, name, key, length=run.length,
                                                   difficulty=run.difficulty, preset=preset)
                    flips.append(np.asarray(out["flip_rate_per_sequence"])[mask])
                    top5.append(np.asarray(out["top5_distance_per_sequence"])[mask])
            except Exception as error:  # recorded in the report; the other perturbations still run
                section["failed"].append({"name": name, "error": f"{type(error).__name__}: {error}"})
            else:
                section["results"].append({"name": name, "family": noise.sequences.FAMILY[name],
                                           "flip_probability": float(np.concatenate(flips).mean()),
                                           "top5_distance": float(np.concatenate(top5).mean())})
            on_progress(section)
    results = section["results"]
    section["mean_flip_probability"] = float(np.mean([r["flip_probability"] for r in results])) if results else None
    section["mean_top5_distance"] = float(np.mean([r["top5_distance"] for r in results])) if results else None
    section["timing"] = timing.as_dict(len(results) * num_evaluated(dataset, plan))
    section["status"] = "ok" if not section["failed"] else "incomplete"
    return section


def system_noise_section(run: SystemNoiseRun, classifier: Classifier, dataset: ImageDataset, plan: Plan) -> dict:
    """Accuracy under every decoder x resize variant (RobustART's ImageNet-S) and its mean,
    standard deviation and negative standard deviation. The evaluated images are encoded
    as JPEG at ``run.quality``, then each variant decodes, resizes and centre-crops them back
    to the model's input size."""
    x, y = dataset.arrays(limit=plan.num_examples)
    encoded = [jpeg_bytes(image, run.quality) for image in x]
    section = {"status": "running", **run.as_dict()}
    with timed() as timing:
        result = noise.system.evaluate_system_noise(classifier, encoded, y, run.variants(), batch_size=plan.batch_size,
                                                    crop=dataset.image_shape[0])
    variants = {variant.name: variant for variant in run.variants()}
    section["results"] = [{"decoder": variants[name].decoder, "resize": variants[name].resize, "accuracy": accuracy}
                          for name, accuracy in result.accuracy.items()]
    section.update(mean_accuracy=result.mean, std_accuracy=result.std, negative_std=result.negative_std,
                   timing=timing.as_dict(len(variants) * len(y)), status="ok")
    return section


def num_evaluated(dataset: ImageDataset, plan: Plan) -> int:
    return dataset.num_examples if plan.num_examples is None else min(plan.num_examples, dataset.num_examples)


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
    profile: ImageDataset | None = None,
    reference: Classifier | None = None,
    on_update: Callable[[dict], None] = lambda report: None,
) -> dict:
    """Runs ``plan`` and returns the report (schema: docs/report-schema.md).

    The plan's metrics section profiles neuron bounds on ``profile`` (the training split)
    and compares with ``reference`` (the model its ``metrics.reference`` names); metrics
    that need either are reported as skipped without it.
    """
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
    num_examples = num_evaluated(dataset, plan)
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
        "worst_case": [],
        "corruptions": None,
        "sequences": None,
        "system_noise": None,
        "metrics": None,
    }
    report["clean"], clean_correct = clean_section(classifier, dataset, plan, parallel)
    on_update(report)
    finished = []  # (section, mask of the examples correct under the attack) of every attack that ran
    for run in plan.runs:
        try:
            sections, adversarial_correct = attack_sections(run, classifier, dataset, plan, parallel, clean_correct)
        except Exception as error:  # recorded in the report; the rest of the plan still runs
            sections, adversarial_correct = [{"name": run.attack.name, "params": params, "status": "failed",
                                              "error": f"{type(error).__name__}: {error}"}
                                             for params in run.entries()], []
        report["attacks"].extend(sections)
        finished.extend(zip(sections, adversarial_correct))
        on_update(report)
    report["worst_case"] = worst_case_section(finished, clean_correct)

    def publish(part: str) -> Callable[[dict], None]:
        """Stores a (partial) section in the report and passes the report on."""
        def update(section: dict) -> None:
            report[part] = section
            on_update(report)

        return update

    if plan.corruptions is not None:
        publish("corruptions")(corruption_section(plan.corruptions, classifier, dataset, plan, parallel,
                                                  report["clean"]["accuracy"], publish("corruptions")))
    if plan.sequences is not None:
        publish("sequences")(sequence_section(plan.sequences, classifier, dataset, plan, publish("sequences")))
    if plan.system_noise is not None:
        try:
            publish("system_noise")(system_noise_section(plan.system_noise, classifier, dataset, plan))
        except Exception as error:  # recorded in the report, like a failed attack
            publish("system_noise")({"status": "failed", **plan.system_noise.as_dict(),
                                     "error": f"{type(error).__name__}: {error}"})
    if plan.metrics is not None:
        try:
            publish("metrics")(metric_suite.metrics_section(plan.metrics, classifier, dataset, plan, parallel,
                                                            profile=profile, reference=reference,
                                                            on_progress=publish("metrics")))
        except Exception as error:  # recorded in the report, like a failed attack
            publish("metrics")({"status": "failed", "settings": plan.metrics.as_dict(),
                                "error": f"{type(error).__name__}: {error}"})
    failed = any(section["status"] != "ok" for section in report["attacks"])
    failed |= any(report[part] is not None and report[part]["status"] != "ok"
                  for part in ("corruptions", "sequences", "system_noise", "metrics"))
    report["status"] = "incomplete" if failed else "complete"
    on_update(report)
    return report
