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
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from robustjax import noise
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset, from_arrays
from robustjax.distributed import to_host
from robustjax.evaluation import metric_suite, sanity
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import AttackRun, Plan
from robustjax.nas.population import network_count, over_networks
from robustjax.noise import flip, sequences
from robustjax.precision import with_precision

# Per-example outcomes that are values rather than correct-or-not (sequence items: rates).
VALUE_KINDS = ("sequence",)
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

    kind: str  # "clean" | "attack" | "corruption" | "sequence" | "system_noise" | "report"
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


def expand(plan: Plan) -> list[Item]:
    """The plan's items, in the order they run; figure labels are unique within the plan
    (a repeated attack label gains its entry's position, ``"pgd eps=0.1 #3"``). The last,
    when the plan has sections that run per network, is the ``report`` item."""
    items = [Item("clean", {}, ("clean",))]
    seen: set[str] = {"clean"}
    for position, run in enumerate(plan.runs):
        labels = []
        for params in run.entries():
            label = attack_label(run, params)
            labels.append(f"{label} #{position}" if label in seen else label)
            seen.add(labels[-1])
        items.append(Item("attack", attack_settings(run), tuple(labels), run))
    if plan.corruptions is not None:
        for index, name in enumerate(plan.corruptions.names):
            for severity in plan.corruptions.severities:
                settings = {"name": name, "severity": severity, "preset": plan.corruptions.preset, "index": index}
                items.append(Item("corruption", settings, (f"{name} {severity}",)))
    if plan.sequences is not None:
        run = plan.sequences
        for index, name in enumerate(run.names):
            settings = {"name": name, "difficulty": run.difficulty, "length": run.length, "preset": run.preset,
                        "batch_size": run.batch_size, "index": index}
            items.append(Item("sequence", settings, (f"{name} flip_probability", f"{name} top5_distance")))
    if plan.system_noise is not None:
        for variant in plan.system_noise.variants():
            settings = {"decoder": variant.decoder, "resize": variant.resize, "quality": plan.system_noise.quality}
            items.append(Item("system_noise", settings, (f"{variant.decoder}+{variant.resize}",)))
    if per_network_sections(plan):
        items.append(Item(REPORT, {"plan": report_plan(plan).as_dict()}, report_labels(plan)))
    return items


@functools.partial(jax.jit, static_argnums=(0, 1))
def _predict(axes: Any, sequential: bool, classifier: Classifier, x: jax.Array) -> jax.Array:
    """(networks, batch) predicted classes."""
    return over_networks(lambda p: jnp.argmax(classifier.replace(params=p)(x), -1), classifier.params, axes,
                         sequential)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _attack_success(run: AttackRun, axes: Any, sequential: bool, classifier: Classifier, x: jax.Array,
                    y: jax.Array, key: jax.Array) -> jax.Array:
    """(networks, epsilons, batch) success of the run's attack on every network, same key."""
    def one(params):
        member = classifier.replace(params=params)
        if run.swept:
            return run.attack.sweep(member, x, y, key=key, eps=run.eps, restarts=run.restarts).success
        return run.attack(member, x, y, key=key).success[None]

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


class ItemRunner:
    """Runs items on populations over one dataset: the evaluated examples are read once
    and kept as sharded batches (also in the sequences' batch size); the system-noise images
    are made once per variant."""

    def __init__(self, dataset: ImageDataset, plan: Plan, parallel: DataParallel | None = None):
        self.dataset, self.plan = dataset, plan
        self.parallel = parallel or DataParallel(plan.batch_size)
        with jax.set_mesh(self.parallel.mesh):
            self.batches = list(self.parallel.batches(dataset, plan.num_examples))
            self.seed_key = jax.random.key(plan.seed)
        self._variant_batches: dict[tuple, list] = {}
        self._sequence_batches: dict[int, list] = {}
        self._sizes: dict[tuple, int] = {}  # (program, networks, sequential) -> networks per run

    def run(self, item: Item, classifier: Classifier, axes: Any, sequential: bool = False) -> np.ndarray:
        """(networks, figures, examples): per network, correct under ``item`` (bool), or for
        a sequence item each example's flip rate and top-5 distance (float32); ``sequential``
        runs the networks one after another (``nas.population.over_networks``).

        A population whose program would not fit in a device's free memory runs in parts of
        the largest size that fits (:meth:`fitting_size`), the last part from the ladder of
        :func:`rung`; each network's outcome is the one it gets in any population. Runs under
        the runner's own mesh, whatever mesh the caller has set.
        """
        with jax.set_mesh(self.parallel.mesh):
            classifier = with_precision(classifier, self.plan.precision)
            networks = network_count(classifier.params, axes)
            size = self.fitting_size(item, classifier, axes, sequential)
            parts = []
            for start in range(0, networks, size):
                count = min(size, networks - start)
                members = np.arange(start, start + rung(count, size, self.parallel.network_shards))
                part = classifier if count == networks else classifier.replace(
                    params=_select(classifier.params, axes, np.minimum(members, start + count - 1)))
                parts.append(self._run(item, part, axes, sequential)[:count])
            return np.concatenate(parts)

    def _run(self, item: Item, classifier: Classifier, axes: Any, sequential: bool) -> np.ndarray:
        classifier = classifier.replace(params=self.parallel.place_population(classifier.params, axes))
        if item.kind == "attack":
            correct = self._correct(classifier, axes, sequential, self.batches)
            success = np.concatenate([
                to_host(_attack_success(item.run, axes, sequential, classifier, x, y,
                                        jax.random.fold_in(self.seed_key, b)))
                [:, :, mask] for b, (x, y, mask) in enumerate(self.batches)], axis=2)
            return correct[:, None] & ~success
        if item.kind == "corruption":
            s = item.settings
            preset = s["preset"] or noise.default_preset(tuple(self.dataset.image_shape))
            key = jax.random.fold_in(jax.random.fold_in(self.seed_key, s["index"]), s["severity"])
            corrupted = [(_corrupt(s["name"], s["severity"], preset, x, jax.random.fold_in(key, b)), y, mask)
                         for b, (x, y, mask) in enumerate(self.batches)]
            return self._correct(classifier, axes, sequential, corrupted)[:, None]
        if item.kind == "sequence":
            static = self._sequence_static(item.settings)
            return np.concatenate([to_host(_sequence_scores(*static, axes, sequential, classifier, x, key))[:, :, mask]
                                   for x, key, mask in self._sequence_inputs(item.settings)], axis=2)
        if item.kind == "system_noise":
            return self._correct(classifier, axes, sequential, self._system_noise_batches(item.settings))[:, None]
        return self._correct(classifier, axes, sequential, self.batches)[:, None]

    def memory_needed(self, item: Item, classifier: Classifier, axes: Any, sequential: bool = False) -> int:
        """Bytes the item's program over this population needs on one device (XLA's
        memory analysis of the compiled program, which the run reuses)."""
        classifier = classifier.replace(params=self.parallel.place_population(classifier.params, axes))
        x, y, _ = self.batches[0]
        if item.kind == "attack":
            lowered = _attack_success.lower(item.run, axes, sequential, classifier, x, y, self.seed_key)
        elif item.kind == "sequence":
            x, key, _ = next(self._sequence_inputs(item.settings))
            lowered = _sequence_scores.lower(*self._sequence_static(item.settings), axes, sequential, classifier, x,
                                             key)
        else:
            lowered = _predict.lower(axes, sequential, classifier, x)
        stats = lowered.compile().memory_analysis()
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
    def _correct(classifier: Classifier, axes: Any, sequential: bool, batches: list) -> np.ndarray:
        return np.concatenate([(to_host(_predict(axes, sequential, classifier, x)) == to_host(y)[None])[:, mask]
                               for x, y, mask in batches], axis=1)

    def _sequence_static(self, settings: dict) -> tuple[str, str, int, int]:
        """(name, preset, length, difficulty) of a sequence item, defaults filled in and
        checked as ``noise.evaluate_sequences`` checks them."""
        x = self.batches[0][0]
        preset = settings["preset"] or noise.default_preset(tuple(self.dataset.image_shape))
        preset, length = sequences.check_arguments(x, settings["name"], self.seed_key, settings["length"],
                                                   settings["difficulty"], preset)
        return settings["name"], preset, length, settings["difficulty"]

    def _sequence_inputs(self, settings: dict) -> Iterator[tuple[jax.Array, jax.Array, np.ndarray]]:
        """Per batch of the sequences' batch size: images, key and host mask (``robustjax
        evaluate``'s keys)."""
        size = settings["batch_size"]
        if size not in self._sequence_batches:
            parallel = DataParallel(size, network_shards=self.parallel.network_shards)
            self._sequence_batches[size] = list(parallel.batches(self.dataset, self.plan.num_examples))
        key = jax.random.fold_in(self.seed_key, settings["index"])
        for b, (x, _, mask) in enumerate(self._sequence_batches[size]):
            yield x, jax.random.fold_in(key, b), mask

    def _system_noise_batches(self, settings: dict) -> list:
        """The evaluated images JPEG-encoded at the plan's quality, then decoded, resized and
        centre-cropped back to the dataset's size by the variant (RobustART's ImageNet-S)."""
        variant = noise.system.SystemNoiseVariant(settings["decoder"], settings["resize"])
        cache_key = (variant, settings["quality"])
        if cache_key not in self._variant_batches:
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
            self._variant_batches[cache_key] = list(self.parallel.batches(variant_set, None))
        return self._variant_batches[cache_key]


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
    return params if axes is None else jax.tree.map(lambda leaf: leaf[np.asarray(members)], params)


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
