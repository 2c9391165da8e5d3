"""A plan as items: the units that a population evaluation runs and a sweep stores.

A plan expands into items: the clean pass, each ``[[attacks]]`` entry (all its epsilons
and restarts, which share one program), each corruption at each severity, each ImageNet-P
perturbation and each system-noise variant (decoder x resize). Running an item on a
population gives, per network, per figure of the item (one per epsilon of an attack sweep,
two for a perturbation sequence, one otherwise) and per evaluated example, its outcome:
whether the network classified the example correctly under that item, or for a sequence
item the example's sequence's flip rate and top-5 distance. Every figure (accuracy, robust
accuracy, attack success rate, worst case over attacks, WCAR, flip probability, top-5
distance) is a mean over these outcomes, so it can be recomputed from them later.

The sections a population's one program does not run ([metrics], [natural_shift], and
[sanity] when enabled) form one more item, ``report``: each network, alone, is evaluated by
``robustjax evaluate``'s runner with the whole plan; its figures are the report's metric
values, natural-shift figures and check verdicts, and its record the network's evaluation
items (``resume`` records), from which ``robustjax report --db`` renders its report. That
evaluation records the clean, attack, corruption and sequence outcomes too
(``evaluation.records``), so a sweep takes those items' rows from it rather than running
them again in a population.

An item's ``key`` hashes what its outcome depends on: its settings, the plan's seed, batch
size (attack keys are drawn per batch) and precision. Random keys are those of
``robustjax evaluate``: attack batch ``b`` gets ``fold_in(key(seed), b)``, corruption
``c`` at severity ``s`` gets ``fold_in(fold_in(fold_in(key(seed), c), s), b)``, perturbation
``p`` gets ``fold_in(fold_in(key(seed), p), b)`` over batches of the sequences' own batch size.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from robustjax import noise
from robustjax.attacks.base import AttackResult
from robustjax.attacks.threat import per_example_norm
from robustjax.certify import bounds, smoothing
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset, from_arrays
from robustjax.distributed import to_host
from robustjax.evaluation import metric_suite, sanity
from robustjax.evaluation.compacted import compactable, population_attack
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import REFERENCE_BASELINE, AttackRun, Plan
from robustjax.evaluation.progress import UNTRACKED, Step
from robustjax.metrics import proxies
from robustjax.metrics.calibration import max_softmax
from robustjax.nas.packing import PackedChoices
from robustjax.nas.population import network_count, over_networks
from robustjax.noise import flip, sequences
from robustjax.precision import with_precision

# Per-example outcomes that are values rather than correct-or-not (sequence items: rates).
VALUE_KINDS = ("sequence", "proxy")
# Items of certified lower bounds (``[certify]``): verified, or certified by smoothing, per example.
CERTIFIED_KINDS = ("bound", "smoothing")
# The streams of the seed's key that smoothing's noise draws and the Hessian's start vectors come from.
SMOOTHING_STREAM, PROXY_STREAM = 40, 41
# The kind of the item that runs, per network, the sections a population's one program does
# not: the 23 metrics (each network's own neurons), natural shift (other datasets), the
# sanity checks (they read the whole report).
REPORT = "report"


class PopulationTooLarge(ValueError):
    """Not even the smallest population an item can run fits in a device's free memory."""


@dataclasses.dataclass(frozen=True)
class Item:
    """One unit of a plan. ``settings`` is JSON-ready and, with the plan's seed and batch
    size, determines the outcome; ``labels`` names each figure the item produces."""

    kind: str  # "clean" | "attack" | "corruption" | "sequence" | "system_noise" | "bound" | "smoothing" | "proxy"
    #            | "report"
    settings: dict = dataclasses.field(hash=False)
    labels: tuple[str, ...]
    run: Any = dataclasses.field(default=None, compare=False, repr=False)  # the AttackRun of an attack item

    def key_for(self, plan: Plan) -> str:
        text = json.dumps({"kind": self.kind, "settings": self.settings, "seed": plan.seed,
                           "batch_size": plan.batch_size, "precision": plan.precision}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def outcome_dtype(kind: str) -> type:
    """The dtype of an item kind's per-example outcomes: float32 rates or bool correctness."""
    return np.float32 if kind in VALUE_KINDS else np.bool_


def per_network_sections(plan: Plan) -> list[str]:
    """The plan's sections that a sweep runs per network (the ``report`` item): ``metrics``
    and ``natural_shift`` when present, ``sanity`` when ``enabled = true`` (unset, the
    checks run in ``robustjax evaluate`` only: each network's cost several attacks)."""
    present = [name for name in ("metrics", "natural_shift") if getattr(plan, name) is not None]
    return present + (["sanity"] if plan.sanity.enabled is True else [])


def report_plan(plan: Plan) -> Plan:
    """What a ``report`` item evaluates each network with: the whole plan (its sections read
    the attack and corruption items), the sanity checks only when asked for, no training."""
    return dataclasses.replace(plan, training=None,
                               sanity=dataclasses.replace(plan.sanity, enabled=plan.sanity.enabled is True))


def check_population_plan(plan: Plan) -> None:
    """Refuses, before any work, plan sections that ``evaluate_population`` does not run:
    those a sweep runs per network (``robustjax sweep run --space`` runs them)."""
    if present := per_network_sections(plan):
        raise ValueError(f"plan sections {present} run per network, not in a population's one program: "
                         "`robustjax sweep run --space SPACE` runs them (each network alone, as robustjax evaluate "
                         "does); remove them here, or use a sweep")


def report_labels(plan: Plan) -> tuple[str, ...]:
    """The figures of a ``report`` item (:func:`report_figures`): ``metric NAME`` per
    metric, ``shift NAME`` per natural-shift set, ``sanity NAME`` per check."""
    labels = []
    if plan.metrics is not None:
        labels += [f"metric {info.name}" for info in metric_suite.CATALOGUE]
    if plan.natural_shift is not None:
        labels += [f"shift {name}" for name in (*plan.natural_shift.datasets, *plan.natural_shift.ood)]
    if plan.sanity.enabled is True:
        labels += [f"sanity {name}" for name in sanity.CHECKS]
    return tuple(labels)


def report_figures(report: dict) -> dict[str, float | None]:
    """A ``report`` item's figures from a network's report: each metric's value; each
    natural-shift set's accuracy (its mean accuracy for ImageNet-C and CIFAR-10-C, its AUROC
    for an out-of-distribution set); each sanity check's verdict, 1 for a warning and 0 for
    a pass. None where the report has no value."""
    out: dict[str, float | None] = {}
    if report.get("metrics") and report["metrics"].get("results"):
        out |= {f"metric {entry['name']}": entry["value"] for entry in report["metrics"]["results"]}
    if report.get("natural_shift") and report["natural_shift"].get("results") is not None:
        measure = {"classification": "accuracy", "corruptions": "mean_accuracy", "ood": "auroc"}
        out |= {f"shift {entry['name']}": entry[measure[entry["kind"]]] for entry in report["natural_shift"]["results"]}
    if report.get("sanity") and report["sanity"].get("checks"):
        out |= {f"sanity {check['name']}": {"warn": 1.0, "pass": 0.0}.get(check["verdict"])
                for check in report["sanity"]["checks"]}
    return out


def attack_settings(run: AttackRun) -> dict:
    """The settings an attack entry's outcome depends on (besides the seed, batch size and
    precision): the attack, its parameters, its epsilons and restarts."""
    return {"attack": run.attack.name, "params": run.attack.params(), "eps": list(run.eps), "restarts": run.restarts}


def attack_label(run: AttackRun, params: dict) -> str:
    """``"pgd eps=0.1"``: the attack and, when it has one, its epsilon."""
    return f"{run.attack.name} eps={params['eps']:g}" if "eps" in params else run.attack.name


CLEAN = Item("clean", {}, ("clean",))


def record_name(plan: Plan, item: Item) -> str:
    """The name under which ``robustjax evaluate`` keeps ``item``'s records
    (``evaluation.resume``): its kind and key, the key of its rows in a sweep's store; for
    the clean pass and a corruption with the ``"reference"`` baseline, whose records hold
    the reference model's outcomes too, also that model's name."""
    name = f"{item.kind}-{item.key_for(plan)}"
    with_reference = item.kind == "clean" or (item.kind == "corruption" and plan.corruptions.baseline == REFERENCE_BASELINE)
    return f"{name}-{plan.reference}" if with_reference and plan.reference is not None else name


def attack_item(run: AttackRun) -> Item:
    """The item of attack entry ``run`` (its figures unlabelled: :func:`expand` labels them)."""
    return Item("attack", attack_settings(run), (), run)


def corruption_item(plan: Plan, index: int, severity: int) -> Item:
    """The item of the plan's corruption at position ``index``, at ``severity``."""
    name = plan.corruptions.names[index]
    settings = {"name": name, "severity": severity, "preset": plan.corruptions.preset, "index": index}
    return Item("corruption", settings, (f"{name} {severity}",))


def sequence_item(plan: Plan, index: int) -> Item:
    """The item of the plan's ImageNet-P perturbation at position ``index``."""
    run, name = plan.sequences, plan.sequences.names[index]
    settings = {"name": name, "difficulty": run.difficulty, "length": run.length, "preset": run.preset,
                "batch_size": run.batch_size, "index": index}
    return Item("sequence", settings, (f"{name} flip_probability", f"{name} top5_distance"))


def system_noise_item(plan: Plan, variant: noise.system.SystemNoiseVariant) -> Item:
    """The item of one decoder x resize variant of the plan's system noise."""
    settings = {"decoder": variant.decoder, "resize": variant.resize, "quality": plan.system_noise.quality}
    return Item("system_noise", settings, (f"{variant.decoder}+{variant.resize}",))


def bound_item(plan: Plan, method: str, norm: str) -> Item:
    """The item of ``[certify]``'s bound ``method`` at every one of its eps in ``norm``: per
    example, verified (every image within eps classified correctly, ``certify.bounds.verified``)."""
    eps = plan.certify_eps()[norm]
    named = "" if norm == "linf" else f" {norm}"
    return Item("bound", {"method": method, "norm": norm, "eps": list(eps)},
                tuple(f"{method}{named} eps={e:g}" for e in eps))


def smoothing_item(plan: Plan) -> Item:
    """The item of ``[certify]``'s randomized smoothing: per example and radius, classified
    correctly by the smoothed classifier with a certified L2 radius of at least that radius."""
    run = plan.certify
    settings = {"sigma": run.sigma, "n0": run.n0, "n": run.n, "alpha": run.alpha, "radii": list(run.radii)}
    return Item("smoothing", settings, tuple(f"smoothing sigma={run.sigma:g} r={r:g}" for r in run.radii))


def certify_items(plan: Plan) -> list[Item]:
    """The ``[certify]`` table's items: one per norm with eps and bound method, and smoothing
    when it has a sigma."""
    if plan.certify is None:
        return []
    norms = [norm for norm, eps in plan.certify_eps().items() if eps]
    return ([bound_item(plan, method, norm) for norm in norms for method in plan.certify.bounds]
            + ([smoothing_item(plan)] if plan.certify.sigma is not None else []))


def proxy_item(plan: Plan) -> Item:
    """The item of the plan's ``[proxies]``: per example, each proxy's value (the NTK's
    condition number is its batch's, :meth:`ItemRunner._proxies`)."""
    return Item("proxy", plan.proxies.as_dict(), tuple(f"proxy {name}" for name in plan.proxies.names))


def expand(plan: Plan) -> list[Item]:
    """The plan's items, in the order they run; figure labels are unique within the plan
    (a repeated attack label gains its entry's position, ``"pgd eps=0.1 #3"``). The last,
    when the plan has sections that run per network, is the ``report`` item."""
    items = [CLEAN]
    seen: set[str] = {"clean"}
    for position, run in enumerate(plan.runs):
        labels = []
        for params in run.entries():
            label = attack_label(run, params)
            labels.append(f"{label} #{position}" if label in seen else label)
            seen.add(labels[-1])
        items.append(Item("attack", attack_settings(run), tuple(labels), run))
    if plan.corruptions is not None:
        items += [corruption_item(plan, index, severity) for index in range(len(plan.corruptions.names))
                  for severity in plan.corruptions.severities]
    if plan.sequences is not None:
        items += [sequence_item(plan, index) for index in range(len(plan.sequences.names))]
    if plan.system_noise is not None:
        items += [system_noise_item(plan, variant) for variant in plan.system_noise.variants()]
    items += certify_items(plan)
    if plan.proxies is not None:
        items.append(proxy_item(plan))
    if per_network_sections(plan):
        items.append(Item(REPORT, {"plan": report_plan(plan).as_dict()}, report_labels(plan)))
    return items


NORMS = ("linf", "l2", "l1", "l0")  # the perturbation norms an attack item records per example


@functools.partial(jax.jit, static_argnums=(0, 1))
def _classify(axes: Any, sequential: bool, classifier: Classifier, x: jax.Array, y: jax.Array) -> dict:
    """(networks, batch) per record: correct, top softmax probability, every logit finite."""
    def one(params):
        logits = classifier.replace(params=params)(x)
        return {"outcome": jnp.argmax(logits, -1) == y, "confidence": max_softmax(logits),
                "finite": jnp.isfinite(logits).all(axis=-1)}

    return over_networks(one, classifier.params, axes, sequential)


def _attack(run: AttackRun, classifier: Classifier, x: jax.Array, y: jax.Array, key: jax.Array) -> AttackResult:
    """The entry's attack on one network, with a leading epsilon axis."""
    if run.swept:
        return run.attack.sweep(classifier, x, y, key=key, eps=run.eps, restarts=run.restarts)
    return jax.tree.map(lambda a: a[None], run.attack(classifier, x, y, key=key))


@jax.jit
def _attack_fields(x_adv: jax.Array, success: jax.Array, queries: jax.Array, x: jax.Array) -> dict:
    """(epsilons, batch) per record: success, queries and the perturbation's norms."""
    delta = x_adv - x[None]
    return {"success": success, "queries": queries,
            **{norm: jax.vmap(lambda d, norm=norm: per_example_norm(d, norm))(delta) for norm in NORMS}}


@jax.jit
def _network_fields(result: AttackResult, x: jax.Array) -> dict:
    """(networks, 1, batch) per record of an attack's result with a leading network axis."""
    return jax.vmap(lambda r: _attack_fields(r.x_adv[None], r.success[None], r.queries[None], x))(result)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _attack_records(run: AttackRun, axes: Any, sequential: bool, classifier: Classifier, x: jax.Array,
                    y: jax.Array, key: jax.Array) -> dict:
    """(networks, epsilons, batch) per record of the run's attack on every network, same key."""
    def one(params):
        result = _attack(run, classifier.replace(params=params), x, y, key)
        return _attack_fields(result.x_adv, result.success, result.queries, x)

    return over_networks(one, classifier.params, axes, sequential)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _verified(method: str, norm: str, eps: tuple[float, ...], rows_per_pass: int, axes: Any, sequential: bool,
              classifier: Classifier, x: jax.Array, y: jax.Array) -> jax.Array:
    """(networks, eps, batch): each example verified by ``method`` at each ``norm`` eps, every network."""
    def one(params):
        network = classifier.replace(params=params)
        return jnp.stack([bounds.verified(network, x, y, e, method=method, norm=norm, rows_per_pass=rows_per_pass)
                          for e in eps])

    return over_networks(one, classifier.params, axes, sequential)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _class_counts(num: int, draws_per_pass: int, axes: Any, sequential: bool, classifier: Classifier, x: jax.Array,
                  sigma: jax.Array, key: jax.Array) -> jax.Array:
    """(networks, batch, classes): the base classifier's votes over ``num`` noise draws, every network."""
    def one(params):
        return smoothing.class_counts(classifier.replace(params=params), x, sigma=sigma, num=num, key=key,
                                      draws_per_pass=draws_per_pass)

    return over_networks(one, classifier.params, axes, sequential)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _proxy_values(names: tuple[str, ...], iterations: int, axes: Any, sequential: bool, classifier: Classifier,
                  x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
    """(networks, proxies, batch): the per-example proxies of ``names`` (0 for the NTK's,
    which is per batch), every network."""
    def one(params):
        network = classifier.replace(params=params)
        per_example = {"jacobian_norm": lambda: proxies.jacobian_norm(network, x),
                       "hessian_eigenvalue": lambda: proxies.hessian_eigenvalue(network, x, y, key=key,
                                                                                iterations=iterations),
                       "ntk_condition_number": lambda: jnp.zeros(x.shape[0])}
        return jnp.stack([per_example[name]() for name in names])

    return over_networks(one, classifier.params, axes, sequential)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _ntk_condition(axes: Any, sequential: bool, classifier: Classifier, x: jax.Array) -> jax.Array:
    """(networks,): the condition number of each network's empirical NTK on ``x``, a
    singular one counted as ``1 / (B eps)``."""
    def one(params):
        condition = proxies.ntk_condition_number(classifier.replace(params=params), x)
        return jnp.minimum(condition, 1 / (x.shape[0] * jnp.finfo(jnp.float32).eps))

    return over_networks(one, classifier.params, axes, sequential)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _sequence_scores(name: str, preset: str, length: int, difficulty: int, axes: Any, sequential: bool,
                     classifier: Classifier, x: jax.Array, key: jax.Array) -> jax.Array:
    """(networks, 2, batch): each sequence's flip rate and top-5 distance on every network;
    the frames are made once and shared by the networks."""
    frames = sequences.sequence_frames(name, preset, length, difficulty, x, key)

    def one(params):
        return jnp.stack(flip.per_sequence_scores(classifier.replace(params=params), frames, name, difficulty))

    return over_networks(one, classifier.params, axes, sequential)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _corrupt(name: str, severity: int, preset: str, x: jax.Array, key: jax.Array) -> jax.Array:
    return noise.create(name, severity, preset)(x, key)


def _joined(parts: list[dict[str, np.ndarray]], axis: int) -> dict[str, np.ndarray]:
    """The records of ``parts`` joined along ``axis``."""
    return {name: np.concatenate([part[name] for part in parts], axis=axis) for name in parts[0]}


# (batch number, images, labels, host mask of real examples, adversarial examples per epsilon)
OnAdversarial = Callable[[int, jax.Array, jax.Array, np.ndarray, jax.Array], None]
# The evaluated examples are kept on the devices between items up to this size; larger sets stream.
KEPT_BYTES = 1 << 30


class ItemRunner:
    """The one executor of plan items: runs any item of :func:`expand` on a population, or on
    a lone network (``axes`` None: ``robustjax evaluate``), and records each example's
    outcome. The evaluated examples are read once and kept as sharded batches (also in the
    sequences' batch size) when they take at most ``KEPT_BYTES``, and streamed from the
    dataset for every item otherwise; the system-noise images are made once per variant."""

    def __init__(self, dataset: ImageDataset, plan: Plan, parallel: DataParallel | None = None):
        self.dataset, self.plan = dataset, plan
        self.parallel = parallel or DataParallel(plan.batch_size)
        examples = dataset.num_examples if plan.num_examples is None else min(plan.num_examples, dataset.num_examples)
        self.keep = examples * int(np.prod(dataset.image_shape)) * 4 <= KEPT_BYTES
        with jax.set_mesh(self.parallel.mesh):
            self.seed_key = jax.random.key(plan.seed)
        self._kept: dict[tuple, list] = {}  # (what, settings) -> batches
        self._sizes: dict[tuple, int] = {}  # (program, networks, sequential) -> networks per run

    @property
    def batches(self) -> list:
        """The evaluated examples as sharded ``(x, y, host mask)`` batches of the plan's size."""
        return self._batches(("examples",), lambda: self.parallel.batches(self.dataset, self.plan.num_examples))

    def _batches(self, name: tuple, make: Callable[[], Iterator]) -> list | Iterator:
        """``make()``'s batches, kept under ``name`` when the runner keeps its examples."""
        if not self.keep:
            return make()
        if name not in self._kept:
            with jax.set_mesh(self.parallel.mesh):
                self._kept[name] = list(make())
        return self._kept[name]

    def run(self, item: Item, classifier: Classifier, axes: Any, sequential: bool = False, *,
            clean: np.ndarray | None = None) -> np.ndarray:
        """(networks, figures, examples): per network, correct under ``item`` (bool), or for
        a sequence item each example's flip rate and top-5 distance (float32); ``sequential``
        runs the networks one after another (``nas.population.over_networks``); ``clean``:
        as :meth:`records` takes it."""
        return self.records(item, classifier, axes, sequential, clean=clean)["outcome"]

    def records(self, item: Item, classifier: Classifier, axes: Any = None, sequential: bool = False, *,
                step: Step = UNTRACKED, reference: Classifier | None = None, clean: np.ndarray | None = None,
                on_adversarial: OnAdversarial | None = None) -> dict[str, np.ndarray]:
        """Each example's records under ``item``, each (networks, figures, examples):
        ``outcome`` (what :meth:`run` returns; for an attack, correct clean and not fooled);
        for the clean pass, a corruption and a system-noise variant also ``confidence`` (top
        softmax probability) and ``finite`` (every logit finite), and with ``reference`` (a
        lone network: a baseline) its ``reference_outcome`` on the same images; for an
        attack ``success``, ``queries`` and the perturbation's norms (:data:`NORMS`).

        ``axes`` None: ``classifier`` is one network, which keeps the attacks' own fast paths
        (compaction, nested epsilon grids); ``on_adversarial`` then sees each batch's
        adversarial examples. An attack's outcome needs the networks' clean correctness,
        (networks, examples): ``clean``, or a clean pass here. ``step`` advances per batch.

        A population whose program would not fit in a device's free memory runs in parts of
        the largest size that fits (:meth:`fitting_size`), the last part from the ladder of
        :func:`rung`; each network's outcome is the one it gets in any population. Runs under
        the runner's own mesh, whatever mesh the caller has set.
        """
        if axes is not None and (on_adversarial is not None or reference is not None):
            raise ValueError("on_adversarial and reference are for a lone network (axes None)")
        with jax.set_mesh(self.parallel.mesh):
            classifier = with_precision(classifier, self.plan.precision)
            if axes is None:
                return self._run(item, classifier, None, False, step, reference, clean, on_adversarial)
            networks = network_count(classifier.params, axes)
            size = self.fitting_size(item, classifier, axes, sequential)
            parts = []
            for start in range(0, networks, size):
                count = min(size, networks - start)
                members = np.arange(start, start + rung(count, size, self.parallel.network_shards))
                part = classifier if count == networks else classifier.replace(
                    params=_select(classifier.params, axes, np.minimum(members, start + count - 1)))
                part_clean = None if clean is None else clean[np.minimum(members, networks - 1)]
                records = self._run(item, part, axes, sequential, step, None, part_clean)
                parts.append({name: values[:count] for name, values in records.items()})
            return _joined(parts, axis=0)

    def _run(self, item: Item, classifier: Classifier, axes: Any, sequential: bool, step: Step = UNTRACKED,
             reference: Classifier | None = None, clean: np.ndarray | None = None,
             on_adversarial: OnAdversarial | None = None) -> dict[str, np.ndarray]:
        classifier = classifier.replace(params=self.parallel.place_population(classifier.params, axes))
        if item.kind == "attack":
            if clean is None:
                clean = self._classified(classifier, axes, sequential, self.batches)["outcome"]
            records = self._attacked(item.run, classifier, axes, sequential, step, on_adversarial)
            return records | {"outcome": clean[:, None] & ~records["success"]}
        if item.kind in CERTIFIED_KINDS:
            return {"outcome": self._certified(item, classifier, axes, sequential, step)}
        if item.kind == "proxy":
            return {"outcome": self._proxies(classifier, axes, sequential, step)}
        if item.kind == "sequence":
            static = self._sequence_static(item.settings)
            return {"outcome": np.concatenate([
                to_host(_sequence_scores(*static, axes, sequential, classifier, x, key))[:, :, mask]
                for x, key, mask in step.track(self._sequence_inputs(item.settings))], axis=2)}
        reference = None if reference is None else self.parallel.replicate(reference)
        records = self._classified(classifier, axes, sequential, step.track(self._images(item)), reference)
        return {name: values[:, None] for name, values in records.items()}

    def _images(self, item: Item) -> list | Iterator:
        """The batches an item classifying images classifies: the evaluated examples, as a
        corruption makes them, or as a system-noise variant decodes them."""
        if item.kind == "corruption":
            s = item.settings
            preset = s["preset"] or noise.default_preset(tuple(self.dataset.image_shape))
            key = jax.random.fold_in(jax.random.fold_in(self.seed_key, s["index"]), s["severity"])
            return ((_corrupt(s["name"], s["severity"], preset, x, jax.random.fold_in(key, b)), y, mask)
                    for b, (x, y, mask) in enumerate(self.batches))
        if item.kind == "system_noise":
            return self._system_noise_batches(item.settings)
        return self.batches

    def _attacked(self, run: AttackRun, classifier: Classifier, axes: Any, sequential: bool, step: Step,
                  on_adversarial: OnAdversarial | None) -> dict[str, np.ndarray]:
        """(networks, epsilons, examples) per record of the attack entry ``run``, each batch
        ``b`` with key ``fold_in(key(seed), b)``."""
        parts = []
        for b, (x, y, mask) in enumerate(step.track(self.batches)):
            key = jax.random.fold_in(self.seed_key, b)
            if axes is None:  # one network: the attack's own program, with its fast paths
                result = _attack(run, classifier, x, y, key)
                if on_adversarial is not None:
                    on_adversarial(b, x, y, mask, result.x_adv)
                fields = jax.tree.map(lambda a: a[None], _attack_fields(result.x_adv, result.success,
                                                                        result.queries, x))
            elif not run.swept and compactable(run.attack, classifier, x):
                fields = _network_fields(population_attack(run.attack, axes, sequential, classifier, x, y, key), x)
            else:
                fields = _attack_records(run, axes, sequential, classifier, x, y, key)
            parts.append({name: to_host(values)[..., mask] for name, values in fields.items()})
        return _joined(parts, axis=2)

    def _certified(self, item: Item, classifier: Classifier, axes: Any, sequential: bool, step: Step) -> np.ndarray:
        """(networks, figures, examples): verified at each eps of a bound item; certified
        correct at each radius of a smoothing item, batch ``b``'s draws from
        ``fold_in(fold_in(key(seed), SMOOTHING_STREAM), b)`` (``certify.certify``'s split)."""
        run, parts = self.plan.certify, []
        for b, (x, y, mask) in enumerate(step.track(self.batches)):
            if item.kind == "bound":
                outcome = to_host(_verified(item.settings["method"], item.settings["norm"], tuple(item.settings["eps"]),
                                            run.rows_per_pass, axes, sequential, classifier, x, y))
            else:
                key = jax.random.fold_in(jax.random.fold_in(self.seed_key, SMOOTHING_STREAM), b)
                select, estimate = jax.random.split(key)
                counts = [to_host(_class_counts(num, run.draws_per_pass, axes, sequential, classifier, x,
                                                jnp.float32(run.sigma), k))
                          for num, k in ((run.n0, select), (run.n, estimate))]
                result = smoothing.certificate(*counts, sigma=run.sigma, alpha=run.alpha)
                correct = result.prediction == to_host(y)[None]
                outcome = np.stack([correct & (result.radius >= r) for r in run.radii], axis=1)
            parts.append(outcome[..., mask])
        return np.concatenate(parts, axis=2)

    def _proxies(self, classifier: Classifier, axes: Any, sequential: bool, step: Step) -> np.ndarray:
        """(networks, proxies, examples) of the plan's ``[proxies]``: the Jacobian norm and
        the Hessian's eigenvalue per example (batch ``b``'s start vectors from
        ``fold_in(fold_in(key(seed), PROXY_STREAM), b)``), the NTK's condition number per
        batch of real examples (a singular kernel counts as ``1 / (B eps)``, the largest
        condition number float32 resolves), repeated for each of its examples."""
        run, parts = self.plan.proxies, []
        for b, (x, y, mask) in enumerate(step.track(self.batches)):
            key = jax.random.fold_in(jax.random.fold_in(self.seed_key, PROXY_STREAM), b)
            values = np.array(to_host(_proxy_values(run.names, run.iterations, axes, sequential, classifier, x, y, key)))
            if "ntk_condition_number" in run.names:
                real = x[np.flatnonzero(mask)]
                condition = to_host(_ntk_condition(axes, sequential, classifier, real))
                values[:, run.names.index("ntk_condition_number")] = condition[:, None]
            parts.append(values[..., mask])
        return np.concatenate(parts, axis=2)

    def compiled(self, item: Item, classifier: Classifier, axes: Any, sequential: bool = False) -> Any:
        """The compiled program that runs one batch of ``item`` over this population (which
        the run reuses): its ``memory_analysis()`` and ``cost_analysis()`` are XLA's."""
        classifier = classifier.replace(params=self.parallel.place_population(classifier.params, axes))
        x, y, _ = next(iter(self.batches))
        if item.kind == "attack":
            lowered = _attack_records.lower(item.run, axes, sequential, classifier, x, y, self.seed_key)
        elif item.kind == "sequence":
            x, key, _ = next(self._sequence_inputs(item.settings))
            lowered = _sequence_scores.lower(*self._sequence_static(item.settings), axes, sequential, classifier, x,
                                             key)
        else:
            lowered = _classify.lower(axes, sequential, classifier, x, y)
        return lowered.compile()

    def memory_needed(self, item: Item, classifier: Classifier, axes: Any, sequential: bool = False) -> int:
        """Bytes the item's program over this population needs on one device (XLA's
        memory analysis of the compiled program, which the run reuses)."""
        stats = self.compiled(item, classifier, axes, sequential).memory_analysis()
        return stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes

    def fitting_size(self, item: Item, classifier: Classifier, axes: Any, sequential: bool = False) -> int:
        """The most networks of this population that ``item``'s program runs at once within
        a device's free memory (all of them when they fit), from XLA's memory analysis of
        the compiled programs, which the run reuses; a multiple of the network shards.
        Raises :class:`PopulationTooLarge` when not even one network per shard fits."""
        networks = network_count(classifier.params, axes)
        # Attack and sequence items have programs of their own; the other items share one.
        program = (item.labels if item.kind in ("attack", "sequence") else "predict", networks, sequential)
        if program not in self._sizes:
            free, whole = free_memory_bytes(), self.memory_needed(item, classifier, axes, sequential)
            self._sizes[program] = networks if whole <= free else self._largest_fitting(
                item, classifier, axes, sequential, whole, free)
        return self._sizes[program]

    def _largest_fitting(self, item: Item, classifier: Classifier, axes: Any, sequential: bool, whole: int,
                         free: int) -> int:
        """The size that fits ``free`` bytes: estimated from the memory of the whole
        population (``whole`` bytes) and of the smallest one, linear in between, then
        halved while it does not fit, or grown while the next size fits (memory is nearly,
        not exactly, linear in the networks)."""
        networks, unit = network_count(classifier.params, axes), self.parallel.network_shards

        def needed(size: int) -> int:
            return self.memory_needed(item, classifier.replace(params=_select(classifier.params, axes,
                                                                             np.arange(size))), axes, sequential)

        least = whole if unit == networks else needed(unit)
        if least > free:
            networks_named = "one network needs" if unit == 1 else f"{unit} networks (one per network shard) need"
            raise PopulationTooLarge(
                f"{networks_named} about {least / 2**30:.2f} GiB for {item.labels[0]} at batch size "
                f"{self.parallel.batch_size}, and {free / 2**30:.2f} GiB are free: pass a smaller batch_size "
                f"(--batch-size){'' if unit == 1 else ' or fewer --network-shards'}")
        per_network = max(1, (whole - least) // (networks - unit))
        size = min(networks - unit, unit + (free - least) // per_network // unit * unit)
        while size > unit and needed(size) > free:
            size = max(unit, size // 2 // unit * unit)
        while size + unit < networks and needed(size + unit) <= free:
            size += unit
        return size

    @staticmethod
    def _classified(classifier: Classifier, axes: Any, sequential: bool, batches,
                    reference: Classifier | None = None) -> dict[str, np.ndarray]:
        """(networks, examples) per record of :func:`_classify` over ``batches``, each batch
        made once and, with ``reference`` (a lone network), classified by it too
        (``reference_outcome``)."""
        parts = []
        for x, y, mask in batches:
            part = {name: to_host(values)[:, mask] for name, values in _classify(axes, sequential, classifier, x,
                                                                                 y).items()}
            if reference is not None:
                part["reference_outcome"] = to_host(_classify(None, False, reference, x, y)["outcome"])[:, mask]
            parts.append(part)
        return _joined(parts, axis=1)

    def _sequence_static(self, settings: dict) -> tuple[str, str, int, int]:
        """(name, preset, length, difficulty) of a sequence item, defaults filled in and
        checked as ``noise.evaluate_sequences`` checks them."""
        x = next(iter(self.batches))[0]
        preset = settings["preset"] or noise.default_preset(tuple(self.dataset.image_shape))
        preset, length = sequences.check_arguments(x, settings["name"], self.seed_key, settings["length"],
                                                   settings["difficulty"], preset)
        return settings["name"], preset, length, settings["difficulty"]

    def _sequence_inputs(self, settings: dict) -> Iterator[tuple[jax.Array, jax.Array, np.ndarray]]:
        """Per batch of the sequences' batch size: images, key and host mask (``robustjax
        evaluate``'s keys)."""
        parallel = DataParallel(settings["batch_size"], network_shards=self.parallel.network_shards)
        batches = self._batches(("sequences", settings["batch_size"]),
                                lambda: parallel.batches(self.dataset, self.plan.num_examples))
        key = jax.random.fold_in(self.seed_key, settings["index"])
        for b, (x, _, mask) in enumerate(batches):
            yield x, jax.random.fold_in(key, b), mask

    def _system_noise_batches(self, settings: dict) -> list | Iterator:
        """The evaluated images JPEG-encoded at the plan's quality, then decoded, resized and
        centre-cropped back to the dataset's size by the variant (RobustART's ImageNet-S)."""
        variant = noise.system.SystemNoiseVariant(settings["decoder"], settings["resize"])

        def decoded_batches() -> Iterator:
            images, labels = self.dataset.arrays(limit=self.plan.num_examples)
            crop = self.dataset.image_shape[0]
            decoded = []
            for image in images:  # uint8 all the way, as noise.system.evaluate_system_noise
                pixels = noise.system.decode(jpeg_bytes(image, settings["quality"]), variant.decoder)
                pixels = noise.system.center_crop(
                    noise.system.resize(pixels, variant.resize, noise.system.default_resize(crop)), crop)
                decoded.append(noise.system.to_grey(pixels) if self.dataset.image_shape[-1] == 1 else pixels)
            variant_set = from_arrays(np.stack(decoded), labels, num_classes=self.dataset.num_classes,
                                      name=f"{self.dataset.name} {variant.name}")
            return self.parallel.batches(variant_set, None)

        return self._batches(("system_noise", variant, settings["quality"]), decoded_batches)


def free_memory_bytes() -> int:
    """Free memory of a local device: its allocator's limit less what is in use, or on the
    CPU the host's available memory shared by every simulated device."""
    devices = jax.local_devices()
    stats = devices[0].memory_stats()
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // len(devices)


def _select(params: Any, axes: Any, members: Any) -> Any:
    """The population of networks ``members`` (indices, in order; the network axis kept)."""
    if isinstance(axes, tuple):
        return tuple(_select(p, a, members) for p, a in zip(params, axes))
    if axes is None:
        return params
    return jax.tree.map(lambda leaf: leaf.select(members) if isinstance(leaf, PackedChoices) else leaf[np.asarray(members)],
                        params, is_leaf=lambda leaf: isinstance(leaf, PackedChoices))


def padded_size(networks: int, network_shards: int) -> int:
    """``networks`` rounded up to a multiple of ``network_shards``."""
    return -(-networks // network_shards) * network_shards


def rung(networks: int, size: int, network_shards: int = 1) -> int:
    """The population that runs the last ``networks`` of a sweep in populations of
    ``size``: the smallest of ``size``, ``size/2``, ``size/4`` and ``size/8`` (each a multiple
    of ``network_shards``) that holds them. A short ladder: at most four programs per item,
    and a last population padded by less than its own size (or by at most ``size/8``)."""
    ladder = [padded_size(max(1, size >> halving), network_shards) for halving in range(4)]
    return min(r for r in ladder if r >= networks) if networks <= size else padded_size(networks, network_shards)


def jpeg_bytes(image: np.ndarray, quality: int) -> bytes:
    """One [0, 1] image (grey or RGB) encoded as JPEG by Pillow."""
    from PIL import Image

    pixels = np.round(image * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def figures(item: Item, outcome: np.ndarray) -> dict[str, float]:
    """Per figure label, the mean of one network's (figures, examples) outcome: an accuracy,
    or a sequence item's flip probability and top-5 distance."""
    return {label: float(row.mean()) for label, row in zip(item.labels, outcome)}
