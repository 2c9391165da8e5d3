"""Runs an evaluation plan over a dataset and builds the report, one section at a time.

Batches are padded to the plan's batch size (so every batch reuses one compiled program)
and sharded over all local devices along the batch axis; padded examples are masked out
of every count. After the clean pass and after each attack, ``on_update`` receives the
report so far, so a failure later in the plan never loses what was already measured; an
attack that fails is recorded as failed with its error and the plan goes on.

With a ``store`` (``evaluation.resume``) each item is kept as it finishes (the clean pass,
each attack entry, each corruption and sequence perturbation, the system noise, the
metrics), and an item already there is read back instead of run, so a rerun after a crash
ends with the report an uninterrupted run gives. Randomness comes only from the plan's
seed, folded per item and batch as :func:`randomness` records in the report.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib.metadata
import os
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
from robustjax.data.shift import ShiftSet
from robustjax.distributed import to_host
from robustjax.evaluation import metric_suite, natural_shift, progress, sanity
from robustjax.evaluation.items import attack_label, attack_settings, jpeg_bytes
from robustjax.evaluation.parallel import DataParallel, predict
from robustjax.evaluation.plan import (
    BASELINES,
    REFERENCE_BASELINE,
    AttackRun,
    CorruptionRun,
    Plan,
    SequenceRun,
    SystemNoiseRun,
)
from robustjax.evaluation.progress import UNTRACKED, OnStep, Step
from robustjax.evaluation.resume import (
    Finished,
    ItemStore,
    content_name,
    examples_digest,
    run_item,
    scoped,
    weights_digest,
)
from robustjax.evaluation.timing import Timing, timed
from robustjax.output_folder import SCHEMA_VERSION
from robustjax.precision import with_precision
from robustjax.zoo.registry import count_params

NORMS = ("linf", "l2", "l1", "l0")
# Installed distributions whose version can change a figure (model code, numerics, decoders).
VERSIONED = ("jaxlib", "flax", "numpy", "optax", "pillow", "opencv-python-headless", "opencv-python", "av")


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _corrupt(name: str, severity: int, preset: str, x: jax.Array, key: jax.Array) -> jax.Array:
    return noise.create(name, severity, preset)(x, key)


def _mean_or_none(values: np.ndarray) -> float | None:
    return float(np.mean(values)) if values.size else None


@jax.jit
def _confidence_and_prediction(classifier: Classifier, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Top softmax probability, predicted class, and whether every logit is finite."""
    logits = classifier(x)
    return metrics.calibration.max_softmax(logits), jnp.argmax(logits, axis=-1), jnp.isfinite(logits).all(axis=-1)


def _reliability(confidence: np.ndarray, correct: np.ndarray) -> dict:
    """ECE's 15 bins as lists (``metrics.calibration.reliability_bins``; null: an empty bin)."""
    bins = metrics.calibration.reliability_bins(confidence, correct)
    return {name: [None if np.isnan(v) else v for v in np.asarray(values).tolist()] for name, values in bins.items()}


def clean_section(classifier: Classifier, dataset: ImageDataset, plan: Plan, parallel: DataParallel,
                  step: Step = UNTRACKED):
    """Clean accuracy and calibration (RobustART's RMS calibration error and AURRA, ECE and its bins),
    and the host mask of correctly classified examples. A model whose logits are not finite
    on some example is refused: every later number would be meaningless. ``step`` advances
    per batch."""
    correct, confidence, finite = [], [], []
    with timed() as timing:
        for x, y, mask in step.track(parallel.batches(dataset, plan.num_examples)):
            top, prediction, batch_finite = _confidence_and_prediction(classifier, x)
            correct.append((to_host(prediction) == to_host(y))[mask])
            confidence.append(to_host(top)[mask])
            finite.append(to_host(batch_finite)[mask])
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
            "reliability": _reliability(confidence, correct),
        },
        "timing": timing.as_dict(len(correct)),
    }
    return section, correct


def _clean_item(classifier: Classifier, reference: Classifier | None, dataset: ImageDataset, plan: Plan,
                parallel: DataParallel, step: Step) -> Finished:
    """The clean pass: its section and the per-example correctness of the model (and of
    ``reference``, the baseline of relative mCE), which every later section reads."""
    section, correct = clean_section(classifier, dataset, plan, parallel, step)
    arrays = {"correct": correct}
    if reference is not None:
        arrays["reference_correct"] = np.concatenate([(to_host(predict(reference, x)) == to_host(y))[mask]
                                                      for x, y, mask in parallel.batches(dataset, plan.num_examples)])
    return Finished(section, arrays)


# (batch number, images, labels, host mask of real examples, adversarial examples of one epsilon)
OnAdversarial = Callable[[int, jax.Array, jax.Array, np.ndarray, jax.Array], None]


def _attack_batches(run: AttackRun, classifier: Classifier, dataset: ImageDataset, plan: Plan, parallel: DataParallel,
                    step: Step, on_adversarial: tuple[int, OnAdversarial] | None = None):
    """Yields, per batch, the host mask and the per-epsilon results (leading axis: epsilon).
    ``on_adversarial`` (epsilon index, consumer) receives that epsilon's adversarial examples
    of each batch as they are made."""
    key = jax.random.key(plan.seed)
    for index, (x, y, mask) in enumerate(step.track(parallel.batches(dataset, plan.num_examples))):
        batch_key = jax.random.fold_in(key, index)
        if run.swept:
            result = run.attack.sweep(classifier, x, y, key=batch_key, eps=run.eps, restarts=run.restarts)
        else:
            result = jax.tree.map(lambda a: a[None], run.attack(classifier, x, y, key=batch_key))
        if on_adversarial is not None:
            entry, consume = on_adversarial
            consume(index, x, y, mask, result.x_adv[entry])
        delta = result.x_adv - x[None]
        norms = {norm: jax.vmap(lambda d: per_example_norm(d, norm))(delta) for norm in NORMS}
        yield mask, {"success": result.success, "queries": result.queries, **norms}


def _share(part, whole) -> float | None:
    """``part / whole`` of two counts, exactly as a Python float (None when ``whole`` is 0)."""
    return int(part) / int(whole) if int(whole) else None


def attack_sections(
    run: AttackRun, classifier: Classifier, dataset: ImageDataset, plan: Plan,
    parallel: DataParallel, clean_correct: np.ndarray, step: Step = UNTRACKED,
    on_adversarial: tuple[int, OnAdversarial] | None = None,
) -> tuple[list[dict], list[np.ndarray]]:
    """Robust accuracy, success rate, perturbation norms, queries and timing of one plan
    entry: one section per epsilon of its sweep, and per section the host mask of the
    examples the attack did not fool (correct under attack). ``step`` advances per batch;
    ``on_adversarial`` sees one epsilon's adversarial examples (:func:`_attack_batches`)."""
    columns: dict[str, list[np.ndarray]] = {}
    consumed = Timing()  # what on_adversarial spends is not the attack's time

    def consume(*args) -> None:
        with timed() as spent:
            on_adversarial[1](*args)
        consumed.wall_s += spent.wall_s
        consumed.compile_s += spent.compile_s

    watched = None if on_adversarial is None else (on_adversarial[0], consume)
    with timed() as timing:
        for mask, values in _attack_batches(run, classifier, dataset, plan, parallel, step, watched):
            for name, value in values.items():
                columns.setdefault(name, []).append(to_host(value)[:, mask])
    timing = Timing(timing.wall_s - consumed.wall_s, timing.compile_s - consumed.compile_s)
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
        if section["params"].get("eps") is not None:  # eps None: a minimal-norm attack, no shared ball
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


def _corruption_item(name: str, index: int, preset: str, run: CorruptionRun, classifier: Classifier,
                     baseline: Classifier | None, dataset: ImageDataset, plan: Plan, parallel: DataParallel,
                     step: Step) -> Finished:
    """Accuracy under corruption ``name`` (position ``index`` in the plan) at every severity,
    and the per-example correctness behind it, (severities, examples); ``baseline`` (the
    reference model of a ``"reference"`` baseline) classifies the same corrupted images.
    ``step`` advances per batch and severity."""
    seed_key = jax.random.key(plan.seed)
    models = {"correct": classifier} | ({} if baseline is None else {"baseline_correct": baseline})
    with timed() as timing:
        outcomes = {kind: [] for kind in models}
        for severity in run.severities:
            key = jax.random.fold_in(jax.random.fold_in(seed_key, index), severity)
            correct = {kind: [] for kind in models}
            for batch, (x, y, mask) in enumerate(step.track(parallel.batches(dataset, plan.num_examples))):
                corrupted = _corrupt(name, severity, preset, x, jax.random.fold_in(key, batch))
                for kind, model in models.items():
                    correct[kind].append((to_host(predict(model, corrupted)) == to_host(y))[mask])
            for kind in models:
                outcomes[kind].append(np.concatenate(correct[kind]))
    outcomes = {kind: np.stack(rows) for kind, rows in outcomes.items()}
    family = noise.get(name).family
    results = [{"name": name, "family": family, "severity": severity, "accuracy": float(correct.mean()),
                "error": 1.0 - float(correct.mean())} for severity, correct in zip(run.severities, outcomes["correct"])]
    if baseline is not None:
        for result, correct in zip(results, outcomes["baseline_correct"]):
            result["baseline_error"] = 1.0 - float(correct.mean())
    return Finished({"results": results, "seconds": dataclasses.asdict(timing)}, outcomes)


def _named_items(store: ItemStore | None, kind: str, names: tuple[str, ...], section: dict,
                 on_progress: Callable[[dict], None], on_step: OnStep, units: int,
                 compute: Callable[[int, str, Step], Finished]) -> list[dict]:
    """Runs one item per name, ``{kind}-{index}-{name}``, adding its ``results`` to
    ``section``, or its error to ``section["failed"]`` when it raises (the other names still
    run); ``on_progress`` receives the section after each. Each item is a step of ``units``
    for ``on_step``. Returns the items' ``seconds``."""
    seconds = []
    for index, name in enumerate(names):
        try:
            with progress.step(on_step, f"{kind} {name}", units) as step:
                finished = run_item(store, f"{kind}-{index}-{name}", lambda: compute(index, name, step))
        except Exception as error:  # recorded in the report; the other names still run
            section["failed"].append({"name": name, "error": f"{type(error).__name__}: {error}"})
        else:
            section["results"].extend(finished.section["results"])
            seconds.append(finished.section["seconds"])
        on_progress(section)
    return seconds


def _total(seconds: list[dict]) -> Timing:
    """The timing of a section from the ``seconds`` of its items."""
    return Timing(sum(s["wall_s"] for s in seconds), sum(s["compile_s"] for s in seconds))


def corruption_section(
    run: CorruptionRun, classifier: Classifier, dataset: ImageDataset, plan: Plan, parallel: DataParallel,
    clean_correct: np.ndarray, on_progress: Callable[[dict], None], store: ItemStore | None = None,
    on_step: OnStep = progress.ignore, reference: Classifier | None = None,
    reference_correct: np.ndarray | None = None,
) -> dict:
    """Accuracy under every corruption and severity, and the corruption errors (mCE and
    relative mCE when the run names a baseline: a published table, or ``reference`` on the
    same corrupted images with ``reference_correct`` its clean outcome). ``on_progress``
    receives the section after each corruption (one item of ``store``, one step of
    ``on_step``); a corruption that fails is recorded and the others still run."""
    preset = run.preset or noise.default_preset(tuple(dataset.image_shape))
    baseline = reference if run.baseline == REFERENCE_BASELINE else None
    if run.baseline == REFERENCE_BASELINE and (reference is None or reference_correct is None):
        raise ValueError('corruptions.baseline = "reference" needs the reference model (metrics.reference) and '
                         "its clean outcome")
    section = {"status": "running", **run.as_dict(), "preset": preset, "results": [], "failed": []}
    if baseline is not None:
        section["baseline_model"] = baseline.name
    units = len(run.severities) * num_batches(dataset, plan, parallel)
    seconds = _named_items(scoped(store, corruption_scope(plan)), "corruption", run.names, section, on_progress, on_step, units,
                           lambda index, name, step: _corruption_item(name, index, preset, run, classifier, baseline,
                                                                      dataset, plan, parallel, step))
    baseline_clean = None if baseline is None else 1.0 - float(reference_correct.mean())
    section.update(corruption_summary(section["results"], run, 1.0 - float(clean_correct.mean()), baseline_clean))
    section["timing"] = _total(seconds).as_dict(len(section["results"]) * num_evaluated(dataset, plan))
    section["status"] = "ok" if not section["failed"] else "incomplete"
    return section


def corruption_summary(results: list[dict], run: CorruptionRun, clean_error: float,
                       baseline_clean_error: float | None = None) -> dict:
    """Per-corruption mean error (and CE, relative CE against the baseline), their means
    over all corruptions and per family. The baseline's errors are a published table's, or
    for the ``"reference"`` baseline each result's ``baseline_error`` with
    ``baseline_clean_error``. Where the baseline makes no error (CE) or no more error than
    clean (relative CE), the mean is None and ``mce_reason`` (``relative_mce_reason``) says why."""
    names = list(dict.fromkeys(r["name"] for r in results))
    if not names:
        return {"per_corruption": [], "mce": None, "relative_mce": None, "mean_error": None,
                "mean_error_by_family": {}}
    errors = np.array([[r["error"] for r in results if r["name"] == name] for name in names])
    per_corruption = [{"name": name, "family": noise.get(name).family,
                       "mean_error": float(e)} for name, e in zip(names, metrics.mean_corruption_error(errors))]
    summary = {"per_corruption": per_corruption, "mce": None, "relative_mce": None,
               "mean_error": float(np.mean([c["mean_error"] for c in per_corruption])),
               "mean_error_by_family": {
                   family: float(np.mean([c["mean_error"] for c in per_corruption if c["family"] == family]))
                   for family in dict.fromkeys(c["family"] for c in per_corruption)}}
    if run.baseline is None:
        return summary
    if run.baseline == REFERENCE_BASELINE:
        baseline = np.array([[r["baseline_error"] for r in results if r["name"] == name] for name in names])
        baseline_clean = baseline_clean_error
    else:
        baseline = np.array([BASELINES[run.baseline][name] for name in names])
        baseline_clean = metrics.ALEXNET_CLEAN_ERROR
    for key, flat, why in (("mce", baseline.sum(axis=1) <= 0, "makes no error under"),
                           ("relative_mce", (baseline - baseline_clean).sum(axis=1) <= 0,
                            "makes no more error than on clean images under")):
        if flat.any():
            summary[f"{key}_reason"] = (f"the baseline ({run.baseline}) {why} {[n for n, f in zip(names, flat) if f]}, so "
                                        f"{'CE' if key == 'mce' else 'relative CE'} is undefined")
    with np.errstate(divide="ignore", invalid="ignore"):
        ce = np.asarray(metrics.corruption_error(errors, baseline))
        relative = np.asarray(metrics.relative_corruption_error(errors, clean_error, baseline, baseline_clean))
    for entry, c, r in zip(per_corruption, ce, relative):
        entry.update(ce=float(c) if np.isfinite(c) else None, relative_ce=float(r) if np.isfinite(r) else None)
    summary.update(mce=None if "mce_reason" in summary else float(np.mean(ce)),
                   relative_mce=None if "relative_mce_reason" in summary else float(np.mean(relative)))
    return summary


def _sequence_item(name: str, index: int, preset: str, run: SequenceRun, classifier: Classifier,
                   dataset: ImageDataset, plan: Plan, parallel: DataParallel, step: Step) -> Finished:
    """Flip probability and top-5 distance of perturbation ``name`` (position ``index``);
    ``step`` advances per batch."""
    seed_key = jax.random.key(plan.seed)
    flips, top5 = [], []
    with timed() as timing:
        for batch, (x, _, mask) in enumerate(step.track(parallel.batches(dataset, plan.num_examples))):
            key = jax.random.fold_in(jax.random.fold_in(seed_key, index), batch)
            out = noise.evaluate_sequences(classifier, x, name, key, length=run.length,
                                           difficulty=run.difficulty, preset=preset)
            flips.append(to_host(out["flip_rate_per_sequence"])[mask])
            top5.append(to_host(out["top5_distance_per_sequence"])[mask])
    flips, top5 = np.concatenate(flips), np.concatenate(top5)
    result = {"name": name, "family": noise.sequences.get(name).family,
              "flip_probability": float(flips.mean()), "top5_distance": float(top5.mean())}
    return Finished({"results": [result], "seconds": dataclasses.asdict(timing)},
                    {"flip_rate": flips, "top5_distance": top5})


def sequence_section(
    run: SequenceRun, classifier: Classifier, dataset: ImageDataset, plan: Plan, on_progress: Callable[[dict], None],
    store: ItemStore | None = None, on_step: OnStep = progress.ignore,
) -> dict:
    """Flip probability and top-5 distance per perturbation (Hendrycks & Dietterich 2019,
    ImageNet-P), averaged over sequences; ``on_progress`` receives the section after each one
    (one item of ``store``, one step of ``on_step``)."""
    parallel = DataParallel(run.batch_size)
    classifier = parallel.replicate(classifier)
    preset = run.preset or noise.default_preset(tuple(dataset.image_shape))
    section = {"status": "running", **run.as_dict(), "preset": preset, "results": [], "failed": []}
    seconds = _named_items(scoped(store, sequence_scope(plan)), "sequence", run.names, section, on_progress, on_step,
                           num_batches(dataset, plan, parallel),
                           lambda index, name, step: _sequence_item(name, index, preset, run, classifier, dataset,
                                                                    plan, parallel, step))
    results = section["results"]
    section["mean_flip_probability"] = float(np.mean([r["flip_probability"] for r in results])) if results else None
    section["mean_top5_distance"] = float(np.mean([r["top5_distance"] for r in results])) if results else None
    section["timing"] = _total(seconds).as_dict(len(results) * num_evaluated(dataset, plan))
    section["status"] = "ok" if not section["failed"] else "incomplete"
    return section


def system_noise_item(run: SystemNoiseRun, classifier: Classifier, dataset: ImageDataset, plan: Plan,
                      step: Step = UNTRACKED) -> Finished:
    """Accuracy under every decoder x resize variant (RobustART's ImageNet-S) and its mean,
    standard deviation and negative standard deviation, with the per-example correctness
    behind it, (variants, examples). The evaluated images are encoded as JPEG at
    ``run.quality``, then each variant decodes, resizes and centre-crops them back to the
    model's input size. ``step`` advances once, at the end."""
    x, y = dataset.arrays(limit=plan.num_examples)
    encoded = [jpeg_bytes(image, run.quality) for image in x]
    section = {"status": "running", **run.as_dict()}
    with timed() as timing:
        result = noise.system.evaluate_system_noise(classifier, encoded, y, run.variants(), batch_size=plan.batch_size,
                                                    crop=dataset.image_shape[0])
    step.advance()
    variants = {variant.name: variant for variant in run.variants()}
    section["results"] = [{"decoder": variants[name].decoder, "resize": variants[name].resize, "accuracy": accuracy}
                          for name, accuracy in result.accuracy.items()]
    section.update(mean_accuracy=result.mean, std_accuracy=result.std, negative_std=result.negative_std,
                   timing=timing.as_dict(len(variants) * len(y)), status="ok")
    return Finished(section, {"correct": np.stack([result.correct[name] for name in result.accuracy])})


def num_evaluated(dataset: ImageDataset, plan: Plan) -> int:
    return dataset.num_examples if plan.num_examples is None else min(plan.num_examples, dataset.num_examples)


def num_batches(dataset: ImageDataset, plan: Plan, parallel: DataParallel) -> int:
    """The batches one pass over the evaluated examples takes."""
    return -(-num_evaluated(dataset, plan) // parallel.batch_size)


def _installed_versions() -> dict[str, str]:
    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def environment() -> dict:
    """What ran the evaluation: versions of robustjax, JAX and every installed package of
    ``VERSIONED``, Python, the backend and its devices, and ``XLA_FLAGS``."""
    devices = jax.local_devices()
    return {
        "robustjax": robustjax.__version__,
        "jax": jax.__version__,
        **_installed_versions(),
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "machine": platform.machine(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def randomness(plan: Plan, parallel: DataParallel) -> dict:
    """The seed, the PRNG, and how each item's keys derive from ``key(seed)`` (b: the batch
    of ``batch_size`` examples, the plan's rounded up to a multiple of the devices)."""
    return {
        "seed": plan.seed,
        "prng_impl": str(jax.config.jax_default_prng_impl),
        "threefry_partitionable": bool(jax.config.jax_threefry_partitionable),
        "batch_size": parallel.batch_size,
        "keys": {
            "clean": None,
            "attacks": "fold_in(key(seed), b), the same for every [[attacks]] entry; with restarts, restart r "
                       "takes split(that key, restarts)[r] at every epsilon",
            "corruptions": "fold_in(fold_in(fold_in(key(seed), c), s), b): corruption c (its position in names) "
                           "at severity s",
            "sequences": "fold_in(fold_in(key(seed), p), b): perturbation p (its position in names), batches of "
                         "sequences.batch_size rounded up to a multiple of the devices",
            "system_noise": None,
            "metrics": "the adversarial examples of the attack entry they name (its keys); the transfer attack "
                       "on the reference: fold_in(fold_in(k, b), 1), EBD: e, where k, e = "
                       "split(fold_in(key(seed), 23))",
            "sanity": "fold_in(key(seed), 25), for PGD's random starts",
        },
    }


def _attack_item(run: AttackRun, classifier: Classifier, dataset: ImageDataset, plan: Plan, parallel: DataParallel,
                 clean_correct: np.ndarray, step: Step, on_adversarial: tuple[int, OnAdversarial] | None) -> Finished:
    sections, adversarial_correct = attack_sections(run, classifier, dataset, plan, parallel, clean_correct, step,
                                                    on_adversarial)
    return Finished({"entries": sections}, {"correct": np.stack(adversarial_correct)})


def _common(plan: Plan) -> dict:
    """What every item's outcome depends on besides its own settings: the seed (keys), the
    batch size (keys are drawn per batch) and the precision."""
    return {"seed": plan.seed, "batch_size": plan.batch_size, "precision": plan.precision}


def _scope(plan: Plan, run: CorruptionRun | SequenceRun) -> dict:
    """What a corruption's or a perturbation's item depends on besides its name and position."""
    return _common(plan) | {key: value for key, value in run.as_dict().items() if key != "names"}


def corruption_scope(plan: Plan) -> dict:
    """The scope (``resume.Scoped``) in which ``corruption-{index}-{name}`` names each
    corruption's item."""
    return _scope(plan, plan.corruptions)


def sequence_scope(plan: Plan) -> dict:
    """The scope (``resume.Scoped``) in which ``sequence-{index}-{name}`` names each
    perturbation's item."""
    return _scope(plan, plan.sequences)


def item_names(plan: Plan) -> dict[str, str]:
    """The stored name of each item of ``plan`` that is named by its own settings: ``clean``,
    ``attack-{position}``, ``system_noise``, ``metrics``, ``sanity`` (corruptions, sequences
    and natural-shift sets are named within their section's scope)."""
    common = _common(plan)
    names = {"clean": content_name("clean", common | {"reference": plan.reference})}
    for position, run in enumerate(plan.runs):
        names[f"attack-{position}"] = content_name("attack", common | attack_settings(run))
    if plan.system_noise is not None:
        names["system_noise"] = content_name("system_noise", common | plan.system_noise.as_dict())
    if plan.metrics is not None:
        position, entry = plan.metrics_source()
        names["metrics"] = content_name("metrics", common | {"metrics": plan.metrics.as_dict(), "entry": entry,
                                                             "attack": attack_settings(plan.runs[position])})
    names["sanity"] = content_name("sanity", common | {"plan": plan.as_dict()})  # it reads the whole report
    return names


def attack_step(run: AttackRun) -> str:
    """``"attack pgd linf eps=0.01,0.03"``: the progress step of a plan entry."""
    params = run.attack.params()
    norm = f" {params['norm']}" if "norm" in params else ""
    eps = run.eps or ((params["eps"],) if params.get("eps") is not None else ())
    return f"attack {run.attack.name}{norm}" + (f" eps={','.join(f'{e:.4g}' for e in eps)}" if eps else "")


def evaluate(
    classifier: Classifier,
    dataset: ImageDataset,
    plan: Plan,
    *,
    profile: ImageDataset | None = None,
    reference: Classifier | None = None,
    on_update: Callable[[dict], None] = lambda report: None,
    store: ItemStore | None = None,
    on_step: OnStep = progress.ignore,
    shift_sets: list[ShiftSet] | None = None,
    weights: str | None = None,
) -> dict:
    """Runs ``plan`` and returns the report (schema: docs/report-schema.md).

    The plan's metrics section profiles neuron bounds on ``profile`` (the training split)
    and compares with ``reference`` (the model its ``metrics.reference`` names); metrics
    that need either are reported as skipped without it. Items found in ``store`` (opened
    with this run's ``resume.fingerprint``) are reused, and every item that finishes is
    stored there. ``on_step`` follows each item's progress (``evaluation.progress``).
    ``shift_sets`` are the plan's ``[natural_shift]`` sets (``natural_shift.load_sets``); None
    opens them here, before any work. ``weights`` says where the weights came from (a
    folder, "bundled"); the report names it beside the weights' and the examples' hashes.
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
    if plan.natural_shift is not None and shift_sets is None:
        shift_sets = natural_shift.load_sets(plan.natural_shift, classifier)
    weights_hash = weights_digest(classifier)[:16]  # of the weights as given, before any cast
    parallel = DataParallel(plan.batch_size)
    classifier = parallel.replicate(with_precision(classifier, plan.precision))
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
            "weights": {"source": weights, "sha256": weights_hash},
        },
        "dataset": {"name": dataset.name, "num_examples": num_examples,
                    "sha256": examples_digest(dataset, plan.num_examples)[:16]},
        "plan": plan.as_dict(),
        "environment": environment(),
        "randomness": randomness(plan, parallel),
        "clean": None,
        "attacks": [],
        "worst_case": [],
        "corruptions": None,
        "sequences": None,
        "system_noise": None,
        "metrics": None,
        "sanity": None,
        "natural_shift": None,
    }
    try:
        _run_plan(report, classifier, dataset, plan, parallel, profile, reference, on_update, store, on_step,
                  shift_sets)
    except BaseException as error:  # Ctrl-C (or SIGTERM made KeyboardInterrupt), or a bug: say so, then raise
        report["status"] = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
        if not isinstance(error, KeyboardInterrupt):
            report["error"] = f"{type(error).__name__}: {error}"
        on_update(report)
        raise
    return report


def _run_plan(report: dict, classifier: Classifier, dataset: ImageDataset, plan: Plan, parallel: DataParallel,
              profile: ImageDataset | None, reference: Classifier | None, on_update: Callable[[dict], None],
              store: ItemStore | None, on_step: OnStep, shift_sets: list[ShiftSet] | None = None) -> None:
    """Fills ``report`` item by item, passing it to ``on_update`` after each; each item is a
    step for ``on_step``. Every section reads the records of the items it builds on: the
    clean pass's correctness, the attack entries' outcomes, the corruption errors."""
    names = item_names(plan)
    if reference is not None:
        reference = parallel.replicate(reference)
    batches = num_batches(dataset, plan, parallel)
    with progress.step(on_step, "clean", batches) as step:
        clean = run_item(store, names["clean"], lambda: _clean_item(classifier, reference, dataset, plan, parallel,
                                                                    step))
    report["clean"], clean_correct = clean.section, clean.arrays["correct"]
    on_update(report)

    def publish(part: str) -> Callable[[dict], None]:
        """Stores a (partial) section in the report and passes the report on."""
        def update(section: dict) -> None:
            report[part] = section
            on_update(report)

        return update

    def failed(settings: dict, error: BaseException) -> dict:
        return {"status": "failed", **settings, "error": f"{type(error).__name__}: {error}"}

    metrics = _MetricsOfEntry(plan, store, names, classifier, parallel, profile, reference, on_step)
    finished = []  # (section, mask of the examples correct under the attack) of every attack that ran
    for position, run in enumerate(plan.runs):
        name, consumer = names[f"attack-{position}"], metrics.consumer(position)
        try:
            with progress.step(on_step, attack_step(run), batches) as step:
                compute = lambda: _attack_item(run, classifier, dataset, plan, parallel, clean_correct, step, consumer)
                # the metrics read this entry's adversarial examples as they are made: run it even when stored
                item = run_item(None if consumer else store, name, compute)
                if consumer is not None and store is not None:
                    store.save(name, item)
            sections, adversarial_correct = item.section["entries"], list(item.arrays["correct"])
        except Exception as error:  # recorded in the report; the rest of the plan still runs
            sections, adversarial_correct = [{"name": run.attack.name, "params": params, "status": "failed",
                                              "error": f"{type(error).__name__}: {error}"}
                                             for params in run.entries()], []
            metrics.source_failed(position, error)
        report["attacks"].extend(sections)
        finished.extend(zip(sections, adversarial_correct))
        metrics.source_finished(position, sections, adversarial_correct)
        report["worst_case"] = worst_case_section(finished, clean_correct)
        on_update(report)
    metrics.store_item(num_evaluated(dataset, plan))

    if plan.corruptions is not None:
        try:
            publish("corruptions")(corruption_section(
                plan.corruptions, classifier, dataset, plan, parallel, clean_correct, publish("corruptions"), store,
                on_step, reference, clean.arrays.get("reference_correct")))
        except Exception as error:  # recorded in the report
            publish("corruptions")(failed(plan.corruptions.as_dict(), error))
    if plan.sequences is not None:
        publish("sequences")(sequence_section(plan.sequences, classifier, dataset, plan, publish("sequences"), store,
                                              on_step))
    if plan.natural_shift is not None:
        publish("natural_shift")(natural_shift.natural_shift_section(
            plan.natural_shift, shift_sets, classifier, dataset, plan, parallel, report["clean"]["accuracy"],
            publish("natural_shift"), scoped(store, _common(plan) | {"natural_shift": plan.natural_shift.as_dict()}),
            on_step))

    def stored_or_failed(part: str, settings: dict, units: tuple[int, str],
                         compute: Callable[[Step], Finished]) -> None:
        """Publishes a section that is one item of ``store`` and one step of ``units`` (count
        and name; count 0: the section sets it); one that raises is recorded as failed with
        ``settings`` and its error, like a failed attack, and the plan goes on."""
        try:
            with progress.step(on_step, part.replace("_", " "), *units) as step:
                section = run_item(store, names[part], lambda: compute(step)).section
            publish(part)(section)
        except Exception as error:  # recorded in the report
            publish(part)(failed(settings, error))

    if plan.system_noise is not None:
        stored_or_failed("system_noise", plan.system_noise.as_dict(), (1, "passes"), lambda step: system_noise_item(
            plan.system_noise, classifier, dataset, plan, step))
    if plan.metrics is not None:
        try:
            publish("metrics")(metrics.section(report["clean"], clean_correct, report["corruptions"]))
        except Exception as error:  # recorded in the report
            publish("metrics")(failed({"settings": plan.metrics.as_dict()}, error))
    if plan.sanity.enabled is not False:  # after the metrics: the black-box check reads their transfer accuracy
        stored_or_failed("sanity", {"settings": plan.sanity.as_dict()}, (len(sanity.CHECKS), "checks"),
                         lambda step: Finished(sanity.sanity_section(classifier, dataset, plan, parallel, report,
                                                                     clean_correct, step=step)))
    failed_parts = any(section["status"] != "ok" for section in report["attacks"])
    failed_parts |= any(report[part] is not None and report[part]["status"] != "ok"
                        for part in ("corruptions", "sequences", "system_noise", "metrics", "sanity", "natural_shift"))
    report["status"] = "incomplete" if failed_parts else "complete"
    on_update(report)


class _MetricsOfEntry:
    """The metrics item of a plan and the attack entry it reads (``Plan.metrics_source``):
    unless the item is stored, a :class:`metric_suite.MetricsPass` is built before that entry
    runs and fed its adversarial examples; the item is stored once the entry finishes, and
    its section completed from the other items' records at the end."""

    def __init__(self, plan: Plan, store: ItemStore | None, names: dict[str, str], classifier: Classifier,
                 parallel: DataParallel, profile: ImageDataset | None, reference: Classifier | None,
                 on_step: OnStep):
        self.plan, self.store, self.name = plan, store, names.get("metrics")
        self.item: Finished | None = None
        self.pass_: metric_suite.MetricsPass | None = None
        self.error: BaseException | None = None
        self.source_section: dict | None = None
        self.source_correct: np.ndarray | None = None
        if plan.metrics is None:
            return
        self.position, self.entry = plan.metrics_source()
        self.item = None if store is None else store.load(self.name)
        if self.item is not None:
            return
        try:
            with progress.step(on_step, "metrics profiling", 0, "batches") as step:
                self.pass_ = metric_suite.MetricsPass(plan.metrics, classifier, plan, parallel, profile=profile,
                                                      reference=reference, step=step)
        except Exception as error:  # recorded in the metrics section; the plan goes on
            self.error = error

    def consumer(self, position: int) -> tuple[int, OnAdversarial] | None:
        """What the attack entry at ``position`` feeds its adversarial examples to, if any."""
        if self.pass_ is None or position != self.position:
            return None
        return self.entry, self.pass_.update

    def source_failed(self, position: int, error: BaseException) -> None:
        if self.plan.metrics is not None and position == self.position and self.item is None:
            self.pass_, self.error = None, ValueError(f"the attack entry the metrics read failed ({error})")

    def source_finished(self, position: int, sections: list[dict], adversarial_correct: list[np.ndarray]) -> None:
        if self.plan.metrics is not None and position == self.position and adversarial_correct:
            self.source_section, self.source_correct = sections[self.entry], adversarial_correct[self.entry]

    def store_item(self, num_examples: int) -> None:
        """Finishes the pass into the metrics item and stores it."""
        if self.pass_ is not None:
            self.item, self.pass_ = self.pass_.finish(num_examples), None
            if self.store is not None:
                self.store.save(self.name, self.item)

    def section(self, clean: dict, clean_correct: np.ndarray, corruptions: dict | None) -> dict:
        """The metrics section, from the item and the records of the clean pass, the source
        entry and the corruptions."""
        if self.item is None:
            raise self.error or ValueError("the metrics did not run")
        if self.source_correct is None:
            raise ValueError("the attack entry the metrics read has no outcome")
        label = attack_label(self.plan.runs[self.position], self.source_section["params"])
        return metric_suite.with_recorded_figures(self.item.section, self.item.arrays.get("transfer_correct"), clean,
                                                  self.source_section, label, self.source_correct, clean_correct,
                                                  corruptions)
