"""Runs an evaluation plan over a dataset and builds the report, one section at a time.

Every clean, attack, corruption, sequence and system-noise item runs through the executor
that runs a sweep's populations, ``items.ItemRunner``, here on the network alone (which
keeps the attacks' own fast paths: compaction, nested epsilon grids), and each section is
derived from the items' per-example records; the metrics read the adversarial examples of
the attack entry they name as that entry makes them.

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
import importlib.metadata
import os
import platform
from collections.abc import Callable

import jax
import numpy as np

import robustjax
from robustjax import metrics, noise
from robustjax.checks import check_precision
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.data.shift import ShiftSet
from robustjax.evaluation import metric_suite, natural_shift, progress, sanity
from robustjax.evaluation.items import (
    CLEAN,
    NORMS,
    Item,
    ItemRunner,
    OnAdversarial,
    attack_item,
    attack_label,
    attack_settings,
    certify_items,
    corruption_item,
    proxy_item,
    record_name,
    sequence_item,
    system_noise_item,
)
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import (
    BASELINES,
    REFERENCE_BASELINE,
    AttackRun,
    CorruptionRun,
    Plan,
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

# Installed distributions whose version can change a figure (model code, numerics, decoders).
VERSIONED = ("jaxlib", "flax", "numpy", "optax", "pillow", "opencv-python-headless", "opencv-python", "av")


def _mean_or_none(values: np.ndarray) -> float | None:
    return float(np.mean(values)) if values.size else None


def _reliability(confidence: np.ndarray, correct: np.ndarray) -> dict:
    """ECE's 15 bins as lists (``metrics.calibration.reliability_bins``; null: an empty bin)."""
    bins = metrics.calibration.reliability_bins(confidence, correct)
    return {name: [None if np.isnan(v) else v for v in np.asarray(values).tolist()] for name, values in bins.items()}


def recorded(store: ItemStore | None, plan: Plan, item: Item, compute: Callable[[], dict[str, np.ndarray]]) -> Finished:
    """``item``'s records, (figures, examples) each, and the ``seconds`` they took: read
    from ``store`` (under ``items.record_name``), or ``compute()``d (``ItemRunner.records``
    of one network), timed, and stored."""
    def compute_timed() -> Finished:
        with timed() as timing:
            records = compute()
        return Finished({"seconds": dataclasses.asdict(timing)}, {name: values[0] for name, values in records.items()})

    return run_item(store, record_name(plan, item), compute_timed)


def clean_section(clean: Finished, name: str) -> dict:
    """Clean accuracy and calibration (RobustART's RMS calibration error and AURRA, ECE and
    its bins) from the clean pass's records. A model (``name``) whose logits are not finite
    on some example is refused: every later number would be meaningless."""
    correct, confidence, finite = (clean.arrays[record][0] for record in ("outcome", "confidence", "finite"))
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise ValueError(f"model {name!r} returns NaN or infinite logits for {bad.size} of the "
                         f"{finite.size} evaluated examples (the first at index {bad[0]})")
    return {
        "accuracy": float(correct.mean()),
        "num_correct": int(correct.sum()),
        "calibration": {
            "rms_calibration_error": float(metrics.calibration.rms_calibration_error(confidence, correct)),
            "expected_calibration_error": float(metrics.calibration.expected_calibration_error(confidence, correct)),
            "aurra": float(metrics.calibration.aurra(confidence, correct)),
            "reliability": _reliability(confidence, correct),
        },
        "timing": Timing(**clean.section["seconds"]).as_dict(len(correct)),
    }


def _share(part, whole) -> float | None:
    """``part / whole`` of two counts, exactly as a Python float (None when ``whole`` is 0)."""
    return int(part) / int(whole) if int(whole) else None


def attack_sections(run: AttackRun, attack: Finished, clean_correct: np.ndarray) -> list[dict]:
    """Robust accuracy, success rate, perturbation norms, queries and timing of one plan
    entry, one section per epsilon of its sweep, from its records (``attack``)."""
    records = attack.arrays
    # RobustART's counts: correct clean and under each epsilon's attack.
    counts = metrics.robustart.AdversarialRobustnessStats.empty(len(run.entries())).update(
        clean_correct, records["outcome"])
    timing_fields = {**Timing(**attack.section["seconds"]).as_dict(clean_correct.size), "grid_size": len(run.entries())}
    sections = []
    for i, params in enumerate(run.entries()):
        fooled = clean_correct & ~records["outcome"][i]  # correctly classified examples the attack flipped
        norms = {norm: records[norm][i][fooled] for norm in NORMS}
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
            "queries_mean": float(records["queries"][i].mean()),
            "queries_median": float(np.median(records["queries"][i])),
            "timing": timing_fields,
        })
    return sections


def _attack_item(store: ItemStore | None, plan: Plan, run: AttackRun, runner: ItemRunner, classifier: Classifier,
                 clean_correct: np.ndarray, step: Step, on_adversarial: OnAdversarial | None) -> Finished:
    """The records of attack entry ``run``, from ``store`` unless ``on_adversarial`` must see
    its adversarial examples (the metrics read them as they are made: it then runs even when
    stored); the consumer's time is not the attack's."""
    item = attack_item(run)

    def compute(consumer: OnAdversarial | None = None) -> dict[str, np.ndarray]:
        return runner.records(item, classifier, step=step, clean=clean_correct[None], on_adversarial=consumer)

    if on_adversarial is None:
        return recorded(store, plan, item, compute)
    consumed = Timing()

    def consume(*args) -> None:
        with timed() as spent:
            on_adversarial(*args)
        consumed.wall_s += spent.wall_s
        consumed.compile_s += spent.compile_s

    finished = recorded(None, plan, item, lambda: compute(consume))
    seconds = finished.section["seconds"]
    finished.section["seconds"] = {"wall_s": seconds["wall_s"] - consumed.wall_s,
                                   "compile_s": seconds["compile_s"] - consumed.compile_s}
    if store is not None:
        store.save(record_name(plan, item), finished)
    return finished


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


def _corruption_results(store: ItemStore | None, plan: Plan, index: int, runner: ItemRunner, classifier: Classifier,
                        baseline: Classifier | None, step: Step) -> tuple[list[dict], list[dict]]:
    """Accuracy under the plan's corruption at position ``index``, one result per severity
    (each severity one item), and the items' ``seconds``; ``baseline`` (the reference model
    of a ``"reference"`` baseline) classifies the same corrupted images. ``step`` advances
    per batch and severity."""
    run = plan.corruptions
    name = run.names[index]
    family = noise.get(name).family
    results, seconds = [], []
    for severity in run.severities:
        item = corruption_item(plan, index, severity)
        records = recorded(store, plan, item, lambda: runner.records(item, classifier, step=step, reference=baseline))
        correct = records.arrays["outcome"][0]
        result = {"name": name, "family": family, "severity": severity, "accuracy": float(correct.mean()),
                  "error": 1.0 - float(correct.mean())}
        if baseline is not None:
            result["baseline_error"] = 1.0 - float(records.arrays["reference_outcome"][0].mean())
        results.append(result)
        seconds.append(records.section["seconds"])
    return results, seconds


def _named_items(kind: str, names: tuple[str, ...], section: dict, on_progress: Callable[[dict], None],
                 on_step: OnStep, units: int,
                 compute: Callable[[int, Step], tuple[list[dict], list[dict]]]) -> list[dict]:
    """Runs the items of each name (``compute``: its results and their items' ``seconds``),
    adding its results to ``section``, or its error to ``section["failed"]`` when one raises
    (the other names still run); ``on_progress`` receives the section after each name, a
    step of ``units`` for ``on_step``. Returns the items' ``seconds``."""
    seconds = []
    for index, name in enumerate(names):
        try:
            with progress.step(on_step, f"{kind} {name}", units) as step:
                results, spent = compute(index, step)
        except Exception as error:  # recorded in the report; the other names still run
            section["failed"].append({"name": name, "error": f"{type(error).__name__}: {error}"})
        else:
            section["results"].extend(results)
            seconds.extend(spent)
        on_progress(section)
    return seconds


def _total(seconds: list[dict]) -> Timing:
    """The timing of a section from the ``seconds`` of its items."""
    return Timing(sum(s["wall_s"] for s in seconds), sum(s["compile_s"] for s in seconds))


def corruption_section(
    runner: ItemRunner, classifier: Classifier, plan: Plan, clean_correct: np.ndarray,
    on_progress: Callable[[dict], None], store: ItemStore | None = None, on_step: OnStep = progress.ignore,
    reference: Classifier | None = None, reference_correct: np.ndarray | None = None,
) -> dict:
    """Accuracy under every corruption and severity, and the corruption errors (mCE and
    relative mCE when the run names a baseline: a published table, or ``reference`` on the
    same corrupted images with ``reference_correct`` its clean outcome). ``on_progress``
    receives the section after each corruption (one step of ``on_step``; each severity one
    item of ``store``); a corruption that fails is recorded and the others still run."""
    run, dataset = plan.corruptions, runner.dataset
    preset = run.preset or noise.default_preset(tuple(dataset.image_shape))
    baseline = reference if run.baseline == REFERENCE_BASELINE else None
    if run.baseline == REFERENCE_BASELINE and (reference is None or reference_correct is None):
        raise ValueError('corruptions.baseline = "reference" needs the reference model (metrics.reference) and '
                         "its clean outcome")
    section = {"status": "running", **run.as_dict(), "preset": preset, "results": [], "failed": []}
    if baseline is not None:
        section["baseline_model"] = baseline.name
    units = len(run.severities) * num_batches(dataset, plan, runner.parallel.batch_size)
    seconds = _named_items("corruption", run.names, section, on_progress, on_step, units,
                           lambda index, step: _corruption_results(store, plan, index, runner, classifier, baseline,
                                                                   step))
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


def _sequence_results(store: ItemStore | None, plan: Plan, index: int, runner: ItemRunner, classifier: Classifier,
                      step: Step) -> tuple[list[dict], list[dict]]:
    """Flip probability and top-5 distance of the plan's perturbation at position ``index``
    (one item), and the item's ``seconds``; ``step`` advances per batch."""
    item = sequence_item(plan, index)
    records = recorded(store, plan, item, lambda: runner.records(item, classifier, step=step))
    flips, top5 = records.arrays["outcome"]
    name = plan.sequences.names[index]
    result = {"name": name, "family": noise.sequences.get(name).family,
              "flip_probability": float(flips.mean()), "top5_distance": float(top5.mean())}
    return [result], [records.section["seconds"]]


def sequence_section(runner: ItemRunner, classifier: Classifier, plan: Plan, on_progress: Callable[[dict], None],
                     store: ItemStore | None = None, on_step: OnStep = progress.ignore) -> dict:
    """Flip probability and top-5 distance per perturbation (Hendrycks & Dietterich 2019,
    ImageNet-P), averaged over sequences; ``on_progress`` receives the section after each one
    (one item of ``store``, one step of ``on_step``)."""
    run, dataset = plan.sequences, runner.dataset
    preset = run.preset or noise.default_preset(tuple(dataset.image_shape))
    section = {"status": "running", **run.as_dict(), "preset": preset, "results": [], "failed": []}
    seconds = _named_items("sequence", run.names, section, on_progress, on_step,
                           num_batches(dataset, plan, DataParallel(run.batch_size).batch_size),
                           lambda index, step: _sequence_results(store, plan, index, runner, classifier, step))
    results = section["results"]
    section["mean_flip_probability"] = float(np.mean([r["flip_probability"] for r in results])) if results else None
    section["mean_top5_distance"] = float(np.mean([r["top5_distance"] for r in results])) if results else None
    section["timing"] = _total(seconds).as_dict(len(results) * num_evaluated(dataset, plan))
    section["status"] = "ok" if not section["failed"] else "incomplete"
    return section


def system_noise_section(runner: ItemRunner, classifier: Classifier, plan: Plan, store: ItemStore | None = None,
                         step: Step = UNTRACKED) -> dict:
    """Accuracy under every decoder x resize variant (RobustART's ImageNet-S), each variant
    one item, and its mean, standard deviation and negative standard deviation. The
    evaluated images are encoded as JPEG at the plan's quality, then each variant decodes,
    resizes and centre-crops them back to the model's input size. ``step`` advances per
    variant."""
    run, accuracy, seconds = plan.system_noise, {}, []
    for variant in run.variants():
        item = system_noise_item(plan, variant)
        records = recorded(store, plan, item, lambda: runner.records(item, classifier))
        accuracy[variant.name] = float(records.arrays["outcome"][0].mean())
        seconds.append(records.section["seconds"])
        step.advance()
    result = noise.system.summarize(accuracy)
    return {"status": "ok", **run.as_dict(),
            "results": [{"decoder": variant.decoder, "resize": variant.resize, "accuracy": accuracy[variant.name]}
                        for variant in run.variants()],
            "mean_accuracy": result.mean, "std_accuracy": result.std, "negative_std": result.negative_std,
            "timing": _total(seconds).as_dict(len(accuracy) * num_evaluated(runner.dataset, plan))}


def certified_section(runner: ItemRunner, classifier: Classifier, plan: Plan,
                      attacked: list[tuple[dict, np.ndarray]], store: ItemStore | None = None,
                      step: Step = UNTRACKED) -> dict:
    """The ``[certify]`` items: each bound's verified accuracy at each eps (L-infinity and
    L2), and the smoothed classifier's certified accuracy at each L2 radius. Per norm and
    eps, the ``intervals`` hold robust accuracy between its certified lower bound (an
    example counts when any bound verifies it) and the attacks' upper bound (an example
    counts when every finished attack in that norm at that eps failed on it; ``attacked``
    pairs each attack section with its examples' host mask of correctness under it);
    ``contradictions`` counts examples verified yet broken by an attack, which sound bounds
    never give. Smoothing certifies the smoothed classifier, not the network the attacks
    ran on, so it stands apart."""
    verified: dict[tuple[str, float], list[np.ndarray]] = {}
    bounds, smoothing, seconds = [], None, []
    for item in certify_items(plan):
        records = recorded(store, plan, item, lambda item=item: runner.records(item, classifier, step=step))
        seconds.append(records.section["seconds"])
        outcome = records.arrays["outcome"]
        if item.kind == "bound":
            norm = item.settings["norm"]
            for eps, row in zip(item.settings["eps"], outcome):
                verified.setdefault((norm, eps), []).append(row)
                bounds.append({"method": item.settings["method"], "norm": norm, "eps": eps,
                               "verified_accuracy": float(row.mean())})
        else:
            smoothing = {"sigma": item.settings["sigma"], "n0": item.settings["n0"], "n": item.settings["n"],
                         "alpha": item.settings["alpha"],
                         "results": [{"radius": radius, "certified_accuracy": float(row.mean())}
                                     for radius, row in zip(item.settings["radii"], outcome)]}
    intervals = []
    for (norm, eps), rows in verified.items():
        certified = np.logical_or.reduce(rows)
        at_eps = [(section, mask) for section, mask in attacked
                  if section["params"].get("norm", "linf") == norm and section["params"].get("eps") == eps]
        robust = np.logical_and.reduce([mask for _, mask in at_eps]) if at_eps else None
        intervals.append({
            "norm": norm, "eps": eps, "certified": float(certified.mean()),
            "attacked": None if robust is None else float(robust.mean()),
            "width": None if robust is None else float(robust.mean() - certified.mean()),
            "attacks": [section["name"] for section, _ in at_eps],
            "contradictions": None if robust is None else int((certified & ~robust).sum())})
    budgets = plan.certify_eps()
    return {"status": "ok", **plan.certify.as_dict(), "eps": list(budgets["linf"]), "l2_eps": list(budgets["l2"]),
            "bounds": bounds,
            "intervals": intervals, "smoothing": smoothing,
            "timing": _total(seconds).as_dict(len(seconds) * num_evaluated(runner.dataset, plan))}


def proxies_section(runner: ItemRunner, classifier: Classifier, plan: Plan, store: ItemStore | None = None,
                    step: Step = UNTRACKED) -> dict:
    """The plan's ``[proxies]`` for this network: each proxy's mean and median over the
    evaluated examples (the NTK's condition number is each batch's, so its mean weighs the
    batches by their examples)."""
    item = proxy_item(plan)
    records = recorded(store, plan, item, lambda: runner.records(item, classifier, step=step))
    values = records.arrays["outcome"]
    return {"status": "ok", **plan.proxies.as_dict(),
            "results": [{"name": name, "mean": float(row.mean()), "median": float(np.median(row))}
                        for name, row in zip(plan.proxies.names, values)],
            "timing": Timing(**records.section["seconds"]).as_dict(values.shape[-1])}


def num_evaluated(dataset: ImageDataset, plan: Plan) -> int:
    return dataset.num_examples if plan.num_examples is None else min(plan.num_examples, dataset.num_examples)


def num_batches(dataset: ImageDataset, plan: Plan, batch_size: int) -> int:
    """The batches of ``batch_size`` one pass over the evaluated examples takes."""
    return -(-num_evaluated(dataset, plan) // batch_size)


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
            "certified": "bounds: none; smoothing: split(fold_in(fold_in(key(seed), 40), b)) gives the selection "
                         "and the estimation draws' keys, draw pass i of each fold_in(that key, i)",
            "proxies": "the Hessian's power-iteration start: fold_in(fold_in(key(seed), 41), b)",
            "metrics": "the adversarial examples of the attack entry they name (its keys); the transfer attack "
                       "on the reference: fold_in(fold_in(k, b), 1), EBD: e, where k, e = "
                       "split(fold_in(key(seed), 23))",
            "sanity": "fold_in(key(seed), 25), for PGD's random starts",
        },
    }


def _common(plan: Plan) -> dict:
    """What every item's outcome depends on besides its own settings: the seed (keys), the
    batch size (keys are drawn per batch) and the precision."""
    return {"seed": plan.seed, "batch_size": plan.batch_size, "precision": plan.precision}


def item_names(plan: Plan) -> dict[str, str]:
    """The stored names of the plan's items that read other items' records, ``metrics`` and
    ``sanity`` (every other item is stored under ``items.record_name``)."""
    common = _common(plan)
    names = {}
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
    check_precision(classifier)
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
        "certified": None,
        "proxies": None,
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
    runner = ItemRunner(dataset, plan, parallel)
    if reference is not None:
        reference = parallel.replicate(reference)
    batches = num_batches(dataset, plan, parallel.batch_size)
    with progress.step(on_step, "clean", batches) as step:
        clean = recorded(store, plan, CLEAN, lambda: runner.records(CLEAN, classifier, step=step, reference=reference))
    report["clean"], clean_correct = clean_section(clean, classifier.name), clean.arrays["outcome"][0]
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
    finished = []  # (section, mask of the examples correct clean and under the attack) of every attack that ran
    for position, run in enumerate(plan.runs):
        try:
            with progress.step(on_step, attack_step(run), batches) as step:
                attack = _attack_item(store, plan, run, runner, classifier, clean_correct, step,
                                      metrics.consumer(position))
            sections = attack_sections(run, attack, clean_correct)
            outcomes, under_attack = list(attack.arrays["outcome"]), list(~attack.arrays["success"])
        except Exception as error:  # recorded in the report; the rest of the plan still runs
            sections, outcomes, under_attack = [{"name": run.attack.name, "params": params, "status": "failed",
                                                 "error": f"{type(error).__name__}: {error}"}
                                                for params in run.entries()], [], []
            metrics.source_failed(position, error)
        report["attacks"].extend(sections)
        finished.extend(zip(sections, outcomes))
        metrics.source_finished(position, sections, under_attack)
        report["worst_case"] = worst_case_section(finished, clean_correct)
        on_update(report)
    metrics.store_item(num_evaluated(dataset, plan))

    if plan.corruptions is not None:
        try:
            publish("corruptions")(corruption_section(
                runner, classifier, plan, clean_correct, publish("corruptions"), store, on_step, reference,
                clean.arrays["reference_outcome"][0] if "reference_outcome" in clean.arrays else None))
        except Exception as error:  # recorded in the report
            publish("corruptions")(failed(plan.corruptions.as_dict(), error))
    if plan.sequences is not None:
        publish("sequences")(sequence_section(runner, classifier, plan, publish("sequences"), store, on_step))
    if plan.natural_shift is not None:
        publish("natural_shift")(natural_shift.natural_shift_section(
            plan.natural_shift, shift_sets, classifier, dataset, plan, parallel, report["clean"]["accuracy"],
            publish("natural_shift"), scoped(store, _common(plan) | {"natural_shift": plan.natural_shift.as_dict()}),
            on_step))

    def published_or_failed(part: str, settings: dict, units: tuple[int, str], compute: Callable[[Step], dict]) -> None:
        """Publishes the section ``compute`` makes in one step of ``units`` (count and name;
        count 0: the section sets it); one that raises is recorded as failed with
        ``settings`` and its error, like a failed attack, and the plan goes on."""
        try:
            with progress.step(on_step, part.replace("_", " "), *units) as step:
                section = compute(step)
            publish(part)(section)
        except Exception as error:  # recorded in the report
            publish(part)(failed(settings, error))

    if plan.system_noise is not None:
        published_or_failed("system_noise", plan.system_noise.as_dict(), (len(plan.system_noise.variants()), "variants"),
                            lambda step: system_noise_section(runner, classifier, plan, store, step))
    if plan.certify is not None:
        published_or_failed("certified", plan.certify.as_dict(), (len(certify_items(plan)) * batches, "batches"),
                            lambda step: certified_section(runner, classifier, plan, finished, store, step))
    if plan.proxies is not None:
        published_or_failed("proxies", plan.proxies.as_dict(), (batches, "batches"),
                            lambda step: proxies_section(runner, classifier, plan, store, step))
    if plan.metrics is not None:
        try:
            publish("metrics")(metrics.section(report["clean"], clean_correct, report["corruptions"]))
        except Exception as error:  # recorded in the report
            publish("metrics")(failed({"settings": plan.metrics.as_dict()}, error))
    if plan.sanity.enabled is not False:  # after the metrics: the black-box check reads their transfer accuracy
        published_or_failed("sanity", {"settings": plan.sanity.as_dict()}, (len(sanity.CHECKS), "checks"),
                            lambda step: run_item(store, names["sanity"], lambda: Finished(sanity.sanity_section(
                                classifier, dataset, plan, parallel, report, clean_correct, step=step))).section)
    failed_parts = any(section["status"] != "ok" for section in report["attacks"])
    failed_parts |= any(report[part] is not None and report[part]["status"] != "ok"
                        for part in ("corruptions", "sequences", "system_noise", "certified", "proxies", "metrics",
                                     "sanity", "natural_shift"))
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

    def consumer(self, position: int) -> OnAdversarial | None:
        """What the attack entry at ``position`` feeds its adversarial examples to, if any:
        the metrics pass reads those of its epsilon."""
        if self.pass_ is None or position != self.position:
            return None
        return lambda b, x, y, mask, x_adv: self.pass_.update(b, x, y, mask, x_adv[self.entry])

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
