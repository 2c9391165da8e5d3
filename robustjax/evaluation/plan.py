"""Evaluation plans: which attacks to run, on how many examples, in what batches.

A plan file is TOML or JSON::

    batch_size = 250          # examples per compiled batch (default 128)
    num_examples = 1000       # optional: evaluate only the first N examples
    seed = 0                  # PRNG seed for the attacks' randomness
    precision = "float32"     # or "bfloat16": the network's convolutions and matrix products
                              # in bfloat16; losses, projections and figures stay float32

    [[attacks]]
    name = "pgd"              # a registered attack (robustjax.attacks.names())
    eps = [0.05, 0.1, 0.2]    # a list of epsilons runs as one vmapped sweep
    restarts = 1              # random restarts, vmapped; the per-example worst case is kept
    steps = 10                # any other field of the attack's config

    [corruptions]             # optional: accuracy under natural corruptions
    names = "imagenet-c"      # the 15 of ImageNet-C, "all" (19), or a list of names
    severities = [1, 2, 3, 4, 5]
    preset = "cifar"          # constants: "imagenet" or "cifar" (default: by image size)
    baseline = "alexnet"      # optional: normalise to mCE and relative mCE by AlexNet's errors, or
                              # "reference": by the errors of metrics.reference on the same images

    [sequences]               # optional: ImageNet-P flip probability and top-5 distance
    names = "all"             # the 14 perturbations, or a list of names
    difficulty = 1            # noise strength (noise) or comparison step (others): 1, 2 or 3
    batch_size = 16           # images per batch; each brings its whole sequence of frames

    [system_noise]            # optional: accuracy under decoder x resize variants (RobustART)
    decoders = ["pil", "opencv", "ffmpeg"]   # default: every installed decoder
    resizes = ["pil-bilinear", "opencv-area"]  # default: all 11 resize modes
    quality = 95              # JPEG quality the evaluated images are encoded with

    [metrics]                 # optional: the 23 metrics of the comprehensive evaluation framework
    attack = { name = "pgd", eps = 0.1, steps = 10 }  # the [[attacks]] entry their examples come
                              # from (added to the attacks when no entry matches it)
    reference = "digits_mlp"  # a second model: transfer source (AAB), the "original" of the
                              # defence-comparison metrics, and [corruptions]' "reference" baseline
    profile_split = "train"   # the split neuron bounds are profiled on
    # also: layers, conv_neuron, kmnc_sections, tknc_k, tknp_k, tknp_capacity, ebd_directions,
    # ebd2_step, ebd2_max_steps, rgb_sigma, ric_quality, toolkit_compat, ald_l0_denominator
    # (see MetricsRun). mCE and relative mCE are the [corruptions] table's.

    [natural_shift]           # optional: released natural-shift sets (data.shift) and OOD detection
    datasets = ["imagenet-a", "imagenet-r", "imagenet-o", "imagenet-c", "cifar10-c"]
    ood = "folder:PATH"       # optional: any folder of out-of-distribution images (or a list)
    data_dir = "~/tensorflow_datasets"  # released folders and prepared tfds sets (default: tfds')
    corruptions = "imagenet-c"  # of ImageNet-C / CIFAR-10-C: the 15, "all" (19) or a list
    severities = [1, 2, 3, 4, 5]
    num_examples = 1000       # optional: the first N examples of each set (default: the plan's)
    image_size = 224          # optional: resize and centre-crop images of varying size (ImageNet-A,
                              # -R, -O, folders); robustjax evaluate --image-size sets it

    [training]                # optional, for sweeps over zoo models (robustjax sweep run --models):
                              # train each model once per technique set, then evaluate them all
    techniques = ["baseline", "fast_at", "pgd_at,no_ema"]  # sets of training.techniques.names()
    steps = 300               # any field of training.Recipe replaces the aligned recipe's
    batch_size = 64           # (epochs, learning_rate, seed, ...; steps or epochs, not both)
    attack_eps = 0.2          # optional: an adversarial technique's eps and steps
    dataset = "digits"        # training data (default: the sweep's dataset), split "train"
    checkpoint_every = 100    # steps between the checkpoints a killed training resumes from

    [certify]                 # optional: certified lower bounds beside the attacks' upper bounds
    bounds = ["crown"]        # verified accuracy by "ibp", "crown-ibp", "crown" (robustjax.certify.bounds)
    eps = [0.01, 0.03]        # their L-infinity eps (default: the eps of the plan's Linf attacks)
    l2_eps = [0.5]            # their L2 eps (default: the eps of the plan's L2 attacks)
    sigma = 0.25              # optional: randomized smoothing with this noise (certify.smoothing)
    radii = [0.25, 0.5]       # the smoothed classifier's certified accuracy at these L2 radii
    n0 = 100                  # smoothing's selection draws, estimation draws and level
    n = 10000
    alpha = 0.001

    [proxies]                 # optional: training-free robustness proxies (metrics.proxies), which
                              # robustjax sweep analyze ranks against every robust figure
    names = ["jacobian_norm", "hessian_eigenvalue", "ntk_condition_number"]  # the default: all three
    iterations = 20           # the Hessian's power-iteration steps

    [sanity]                  # optional: checks against gradient masking (evaluation.sanity)
    enabled = true            # unset: robustjax evaluate runs them, a sweep does not; true: both
    num_examples = 32         # correctly classified examples the model-based checks use
    # also: steps, restarts, eps, grid (see SanityRun)

Every attack config is built (and so validated) when the plan is read, before anything
runs, so a malformed plan fails at once with a message naming the bad entry.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robustjax import attacks, builtin_plans, noise
from robustjax.attacks.base import Attack
from robustjax.certify.bounds import METHODS as BOUND_METHODS
from robustjax.checks import check_choice, check_positive_int
from robustjax.data.shift import NAMES as SHIFT_DATASETS
from robustjax.metrics.corruption import ALEXNET_IMAGENET_C_ERRORS
from robustjax.metrics.imperceptibility import L0_DENOMINATORS
from robustjax.precision import PRECISIONS

if TYPE_CHECKING:
    from robustjax.training import Recipe, Techniques

PLAN_KEYS = {"batch_size", "num_examples", "seed", "precision", "attacks", "corruptions", "sequences", "system_noise", "metrics",
             "sanity", "natural_shift", "training", "certify", "proxies"}
CORRUPTION_KEYS = {"names", "severities", "preset", "baseline"}
SEQUENCE_KEYS = {"names", "difficulty", "length", "preset", "batch_size"}
SYSTEM_NOISE_KEYS = {"decoders", "resizes", "quality"}
TRAINING_KEYS = {"techniques", "dataset", "split", "attack_eps", "attack_steps", "checkpoint_every"}  # and Recipe's
NATURAL_SHIFT_KEYS = {"datasets", "ood", "data_dir", "corruptions", "severities", "num_examples", "image_size"}
# Named sets of corruptions: the 15 of the ImageNet-C benchmark, or all 19.
CORRUPTION_SETS = {"imagenet-c": ("noise", "blur", "weather", "digital"), "all": noise.FAMILIES}
BASELINES = {"alexnet": ALEXNET_IMAGENET_C_ERRORS}
# The mCE baseline that is the plan's metrics.reference model, on the same corrupted images.
REFERENCE_BASELINE = "reference"
# The proxies a plan's [proxies] table computes per example (robustjax.metrics.proxies).
PROXIES = ("jacobian_norm", "hessian_eigenvalue", "ntk_condition_number")


@dataclasses.dataclass(frozen=True)
class AttackRun:
    """One plan entry: an attack, the epsilons it sweeps (empty: its own) and its restarts."""

    attack: Attack
    eps: tuple[float, ...] = ()
    restarts: int = 1

    @property
    def swept(self) -> bool:
        return len(self.eps) > 1 or self.restarts > 1

    def entries(self) -> list[dict]:
        """The parameters of each report entry this run produces, one per epsilon."""
        params = {**self.attack.params(), "restarts": self.restarts}
        return [{**params, "eps": eps} for eps in self.eps] if self.eps else [params]


@dataclasses.dataclass(frozen=True)
class CorruptionRun:
    """Corruptions, each at every severity; ``baseline`` names the errors that normalise mCE:
    a published table (``BASELINES``) or ``"reference"``, the plan's reference model
    (``metrics.reference``) classifying the same corrupted images."""

    names: tuple[str, ...]
    severities: tuple[int, ...] = noise.SEVERITIES
    preset: str | None = None
    baseline: str | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {"names": list(self.names), "severities": list(self.severities)}


@dataclasses.dataclass(frozen=True)
class SequenceRun:
    """ImageNet-P perturbation sequences (``noise.sequences``) and their evaluation settings."""

    names: tuple[str, ...]
    difficulty: int = 1
    length: int | None = None
    preset: str | None = None
    batch_size: int = 16

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {"names": list(self.names)}


@dataclasses.dataclass(frozen=True)
class SystemNoiseRun:
    """Decoder x resize variants (``noise.system``); images are JPEG-encoded at ``quality``."""

    decoders: tuple[str, ...]
    resizes: tuple[str, ...]
    quality: int = 95

    def variants(self) -> list:
        return noise.system.variants(self.decoders, self.resizes)

    def as_dict(self) -> dict:
        return {"decoders": list(self.decoders), "resizes": list(self.resizes), "quality": self.quality}


@dataclasses.dataclass(frozen=True)
class MetricsRun:
    """Settings of the 23 metrics (``evaluation.metric_suite``); defaults are the AISafety
    toolkit's (arXiv 2101.09617), except where noted.

    ``attack`` (default PGD-10, Linf, 8/255): the white-box attack whose adversarial
    examples feed the data metrics and AAW, ACAC, ACTC, NTE, RGB, RIC, ENI, neuron
    sensitivity and uncertainty; it is an entry of the plan's attacks (``Plan.metrics_source``),
    so these metrics read the very examples behind that entry's robust accuracy. Run on
    ``reference`` and transferred, it gives AAB. ``reference``: a model name (zoo) or
    ``package.module:function``; also the original model of CAV, CRR, CSR, CCV and COS, and the
    baseline of mCE when ``[corruptions]`` names ``baseline = "reference"``. ``layers``: the
    layers whose neurons count (None: every layer the classifier exposes but its logits).
    ``ebd_directions``: None takes min(1000, pixels). ``ald_l0_denominator``: ALD_0's
    ``"nonzero"`` (||x||_0, the definition) or ``"size"`` (C H W, the AISafety and DEEPSEC
    code); None follows ``toolkit_compat`` (``metrics.imperceptibility.lp_distortion``).
    """

    attack: Attack
    reference: str | None = None
    profile_split: str = "train"
    layers: tuple[str, ...] | None = None
    conv_neuron: str = "channel"
    kmnc_sections: int = 20
    tknc_k: int = 3
    tknp_k: int = 2
    tknp_capacity: int = 16384
    ebd_directions: int | None = None
    ebd2_step: float = 0.0005
    ebd2_max_steps: int = 1000
    rgb_sigma: float = 2.0
    ric_quality: int = 55
    toolkit_compat: bool = False
    ald_l0_denominator: str | None = None

    def as_dict(self) -> dict:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "attack"}
        return {"attack": {"name": self.attack.name, **self.attack.params()}, **fields,
                "layers": None if self.layers is None else list(self.layers)}


@dataclasses.dataclass(frozen=True)
class SanityRun:
    """Settings of the checks against gradient masking (``evaluation.sanity``).

    The model-based checks run on the first ``num_examples`` correctly classified
    examples: PGD (Linf) with ``steps`` steps, ``restarts`` random restarts at ``eps``, and
    the loss along the gradient sign at ``grid`` step sizes up to ``eps``. ``eps`` None: the
    largest Linf epsilon of the plan's attacks, or 8/255 when it has none. ``enabled`` None
    (unset): ``robustjax evaluate`` runs the checks and a sweep does not (they cost each
    network several attacks); True runs them in both, False in neither.
    """

    enabled: bool | None = None
    num_examples: int = 32
    steps: int = 10
    restarts: int = 4
    eps: float | None = None
    grid: int = 8

    def __post_init__(self):
        if self.enabled is not None and not isinstance(self.enabled, bool):
            raise ValueError(f"plan: sanity.enabled must be true or false, got {self.enabled!r}")
        for key in ("num_examples", "steps", "restarts", "grid"):
            check_positive_int(getattr(self, key), f"plan: sanity.{key}")
        for key, why in (("restarts", "later restarts are compared with earlier ones"),
                         ("grid", "the loss's steps are compared with each other")):
            if getattr(self, key) < 2:
                raise ValueError(f"plan: sanity.{key} must be >= 2 ({why}), got {getattr(self, key)!r}")
        if self.eps is not None and (isinstance(self.eps, bool) or not isinstance(self.eps, int | float)
                                     or not 0 < self.eps <= 1):
            raise ValueError(f"plan: sanity.eps must be a number in (0, 1], got {self.eps!r}")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CertifyRun:
    """Certified lower bounds on robust accuracy (``robustjax.certify``): the verified
    accuracy of each of ``bounds`` ("ibp", "crown-ibp", "crown") at each L-infinity ``eps``
    and L2 ``l2_eps`` (None: the eps of the plan's attacks in that norm), and, when
    ``sigma`` is set, the certified
    accuracy of the Gaussian-smoothed classifier (Cohen et al.'s CERTIFY with ``n0``,
    ``n`` and ``alpha``) at each L2 radius of ``radii``. ``rows_per_pass`` and
    ``draws_per_pass`` trade memory for speed and change no outcome."""

    bounds: tuple[str, ...] = ("crown",)
    eps: tuple[float, ...] | None = None
    l2_eps: tuple[float, ...] | None = None
    sigma: float | None = None
    radii: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    n0: int = 100
    n: int = 10_000
    alpha: float = 0.001
    rows_per_pass: int = 256
    draws_per_pass: int = 64

    def __post_init__(self):
        for method in self.bounds:
            check_choice(method, BOUND_METHODS, "plan: certify.bounds")
        if len(set(self.bounds)) < len(self.bounds):
            raise ValueError(f"plan: certify.bounds names a method twice: {list(self.bounds)}")
        for eps in self.eps or ():
            if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 <= eps < 1:
                raise ValueError(f"plan: certify.eps must be numbers in [0, 1) (eps >= 1 covers the whole image "
                                 f"box and certifies nothing), got {eps!r}")
        for eps in self.l2_eps or ():
            if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps >= 0:
                raise ValueError(f"plan: certify.l2_eps must be numbers >= 0, got {eps!r}")
        if self.sigma is not None and (isinstance(self.sigma, bool) or not isinstance(self.sigma, int | float)
                                       or not self.sigma > 0):
            raise ValueError(f"plan: certify.sigma must be a number > 0, got {self.sigma!r}")
        for radius in self.radii:
            if isinstance(radius, bool) or not isinstance(radius, int | float) or not radius >= 0:
                raise ValueError(f"plan: certify.radii must be numbers >= 0, got {radius!r}")
        for key in ("n0", "n", "rows_per_pass", "draws_per_pass"):
            check_positive_int(getattr(self, key), f"plan: certify.{key}")
        if self.n0 > self.n:
            raise ValueError(f"plan: certify.n0={self.n0} selection draws exceed n={self.n} estimation draws")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float) or not 0 < self.alpha < 1:
            raise ValueError(f"plan: certify.alpha must be in (0, 1), got {self.alpha!r}")
        if not self.bounds and self.sigma is None:
            raise ValueError("plan: [certify] certifies nothing: name bounds, or set sigma for smoothing")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {"bounds": list(self.bounds), "radii": list(self.radii),
                                           **{key: None if getattr(self, key) is None else list(getattr(self, key))
                                              for key in ("eps", "l2_eps")}}


@dataclasses.dataclass(frozen=True)
class ProxiesRun:
    """Training-free robustness proxies per example (``metrics.proxies``): the input-Jacobian
    norm, the input-Hessian's dominant eigenvalue (``iterations`` power-iteration steps) and
    the condition number of each batch's empirical NTK."""

    names: tuple[str, ...] = PROXIES
    iterations: int = 20

    def __post_init__(self):
        if not self.names:
            raise ValueError(f"plan: proxies.names is empty; name some of {list(PROXIES)}")
        for name in self.names:
            check_choice(name, PROXIES, "plan: proxies.names")
        check_positive_int(self.iterations, "plan: proxies.iterations")

    def as_dict(self) -> dict:
        return {"names": list(self.names), "iterations": self.iterations}


@dataclasses.dataclass(frozen=True)
class NaturalShiftRun:
    """Released natural-shift sets (``data.SHIFT_DATASETS``) and out-of-distribution folders
    (``"folder:PATH"``), read from ``data_dir``; ``corruptions`` x ``severities`` of ImageNet-C and
    CIFAR-10-C; the first ``num_examples`` of each set (None: the plan's ``num_examples``);
    ``image_size`` resizes and centre-crops images of varying size (None: they must share one)."""

    datasets: tuple[str, ...] = ()
    ood: tuple[str, ...] = ()
    data_dir: str | None = None
    corruptions: tuple[str, ...] = ()
    severities: tuple[int, ...] = noise.SEVERITIES
    num_examples: int | None = None
    image_size: int | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {key: list(getattr(self, key))
                                           for key in ("datasets", "ood", "corruptions", "severities")}


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """A grid of training techniques (``[training]``), read by sweeps over zoo models: each
    model trains once per technique set with RobustART's aligned recipe for its family
    (``training.aligned``), ``recipe``'s fields replacing the recipe's own, on ``split`` of
    ``dataset`` (None: the sweep's dataset); ``attack_eps`` and ``attack_steps`` (None: the
    technique's) set an adversarial technique's attack; a killed training resumes from its
    last checkpoint, saved every ``checkpoint_every`` steps."""

    techniques: tuple[Techniques, ...]
    recipe: tuple[tuple[str, Any], ...] = ()
    dataset: str | None = None
    split: str = "train"
    attack_eps: float | None = None
    attack_steps: int | None = None
    checkpoint_every: int = 100

    def recipe_for(self, family: str, techniques: Techniques) -> Recipe:
        """The recipe ``techniques`` train a model of ``family`` with."""
        from robustjax.training import aligned

        return aligned(family, techniques, **dict(self.recipe))

    def as_dict(self) -> dict:
        return {"techniques": [str(t) for t in self.techniques], "recipe": dict(self.recipe),
                "dataset": self.dataset, "split": self.split, "attack_eps": self.attack_eps,
                "attack_steps": self.attack_steps, "checkpoint_every": self.checkpoint_every}


def _check_keys(raw: dict, allowed: set[str], table: str) -> None:
    """Refuses keys of plan table ``table`` that are not ``allowed``, naming each with the
    nearest allowed key (``difflib``) and listing the allowed ones."""
    if not (unknown := sorted(set(raw) - allowed)):
        return
    nearest = {key: difflib.get_close_matches(key, allowed, n=1) for key in unknown}
    hints = [f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key) for key, close in nearest.items()]
    raise ValueError(f"plan: {table}: unknown key(s) {', '.join(hints)}; allowed keys are {sorted(allowed)}")


def _sanity_run(raw) -> SanityRun:
    if not isinstance(raw, dict):
        raise ValueError(f"plan: 'sanity' must be a table, got {raw!r}")
    _check_keys(raw, {f.name for f in dataclasses.fields(SanityRun)}, "[sanity]")
    return SanityRun(**raw)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A validated evaluation plan."""

    runs: tuple[AttackRun, ...]
    corruptions: CorruptionRun | None = None
    sequences: SequenceRun | None = None
    system_noise: SystemNoiseRun | None = None
    metrics: MetricsRun | None = None
    sanity: SanityRun = SanityRun()
    natural_shift: NaturalShiftRun | None = None
    training: TrainingRun | None = None
    certify: CertifyRun | None = None
    proxies: ProxiesRun | None = None
    batch_size: int = 128
    num_examples: int | None = None
    seed: int = 0
    precision: str = "float32"

    def __post_init__(self):
        check_positive_int(self.batch_size, "plan: batch_size")
        if self.num_examples is not None:
            check_positive_int(self.num_examples, "plan: num_examples")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"plan: seed must be an integer >= 0, got {self.seed!r}")
        check_choice(self.precision, PRECISIONS, "plan: precision")
        if self.corruptions is not None and self.corruptions.baseline == REFERENCE_BASELINE and self.reference is None:
            raise ValueError('plan: corruptions.baseline = "reference" needs a reference model: set metrics.reference')
        if self.certify is not None and self.certify.bounds and self.precision != "float32":
            raise ValueError(f"plan: certify.bounds need precision = \"float32\": bounds propagated through "
                             f"{self.precision} arithmetic are not sound (its rounding is not bounded)")
        if self.certify is not None and self.certify.bounds and not any(self.certify_eps().values()):
            raise ValueError("plan: certify.bounds need an eps: set certify.eps (or l2_eps), or add an L-infinity "
                             "or L2 attack")
        if self.metrics is not None and _source_entry(self.runs, self.metrics.attack) is None:
            # the metrics read an attack entry's examples: theirs becomes the last entry
            attack = self.metrics.attack
            object.__setattr__(self, "runs", (*self.runs, AttackRun(attack, (attack.eps,) if hasattr(attack, "eps")
                                                                    else ())))

    def certify_eps(self) -> dict[str, tuple[float, ...]]:
        """Per norm ("linf", "l2"), the eps the ``[certify]`` bounds run at: the table's own
        (``eps``, ``l2_eps``), or every eps of the plan's attack entries in that norm, in
        increasing order."""
        def attacked(norm: str) -> tuple[float, ...]:
            return tuple(sorted({float(params["eps"]) for run in self.runs for params in run.entries()
                                 if params.get("norm", "linf") == norm and params.get("eps") is not None}))

        if self.certify is None:
            return {"linf": (), "l2": ()}
        own = {"linf": self.certify.eps, "l2": self.certify.l2_eps}
        return {norm: attacked(norm) if eps is None else tuple(eps) for norm, eps in own.items()}

    @property
    def reference(self) -> str | None:
        """The second model of the plan (``metrics.reference``), or None."""
        return None if self.metrics is None else self.metrics.reference

    def metrics_source(self) -> tuple[int, int]:
        """(position in ``runs``, epsilon index) of the attack entry whose adversarial
        examples the metrics read (a plan whose attacks lack it gains it as its last entry)."""
        return _source_entry(self.runs, self.metrics.attack)

    @property
    def num_attack_entries(self) -> int:
        """Attack entries the plan runs: one per epsilon of each ``[[attacks]]`` sweep."""
        return sum(len(run.entries()) for run in self.runs)

    def as_dict(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "num_examples": self.num_examples,
            "seed": self.seed,
            "precision": self.precision,
            "attacks": [{"name": run.attack.name, **params} for run in self.runs for params in run.entries()],
            "corruptions": None if self.corruptions is None else self.corruptions.as_dict(),
            "sequences": None if self.sequences is None else self.sequences.as_dict(),
            "system_noise": None if self.system_noise is None else self.system_noise.as_dict(),
            "metrics": None if self.metrics is None else self.metrics.as_dict(),
            "sanity": self.sanity.as_dict(),
            "natural_shift": None if self.natural_shift is None else self.natural_shift.as_dict(),
            **({} if self.training is None else {"training": self.training.as_dict()}),
            **({} if self.certify is None else {"certify": self.certify.as_dict()}),
            **({} if self.proxies is None else {"proxies": self.proxies.as_dict()}),
        }


def _attack_run(where: str, entry) -> AttackRun:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise ValueError(f"plan: {where} must be a table with a string 'name', got {entry!r}")
    params = {k: v for k, v in entry.items() if k not in ("name", "restarts")}
    restarts = entry.get("restarts", 1)
    check_positive_int(restarts, f"plan: {where}.restarts")
    grid = params.get("eps")
    if isinstance(grid, list):
        if not grid:
            raise ValueError(f"plan: {where}.eps is an empty list")
        params["eps"] = grid[0]
    try:
        attack = attacks.create(entry["name"], **params)
        if "checks" in attack.params() and "checks" not in params:
            # AutoAttack's checks on every batch would repeat the report's sanity section.
            attack = dataclasses.replace(attack, checks="off")
        for eps in grid if isinstance(grid, list) else []:
            attacks.create(entry["name"], **{**params, "eps": eps})  # validates every epsilon
    except (TypeError, ValueError) as error:
        raise ValueError(f"plan: {where} ({entry['name']}): {error}") from None
    has_eps = any(f.name == "eps" for f in dataclasses.fields(attack))
    if restarts > 1 and not has_eps:
        raise ValueError(f"plan: {where} ({entry['name']}): restarts need an attack with an eps")
    eps = tuple(grid) if isinstance(grid, list) else (attack.eps,) if has_eps else ()
    return AttackRun(attack=attack, eps=eps, restarts=restarts)


def _corruption_settings(raw: dict, where: str, names_key: str) -> tuple[tuple[str, ...], tuple[int, ...], str | None]:
    """Validated corruption names (a set name or a list), severities and preset."""
    names = raw.get(names_key, "imagenet-c")
    if isinstance(names, str) and names in CORRUPTION_SETS:
        names = [name for family in CORRUPTION_SETS[names] for name in noise.names(family)]
    elif not isinstance(names, list) or not names:
        raise ValueError(f"plan: {where}.{names_key} must be {sorted(CORRUPTION_SETS)} or a non-empty list, got {names!r}")
    severities = raw.get("severities", list(noise.SEVERITIES))
    try:
        for name in names:
            noise.get(name)
        if not isinstance(severities, list) or not severities:
            raise ValueError(f"severities must be a non-empty list, got {severities!r}")
        for severity in severities:
            noise.registry.check_severity(severity)
    except ValueError as error:
        raise ValueError(f"plan: {where}: {error}") from None
    preset = raw.get("preset")
    if preset is not None and preset not in noise.PRESETS:
        raise ValueError(f"plan: {where}.preset must be one of {list(noise.PRESETS)}, got {preset!r}")
    return tuple(names), tuple(severities), preset


def _check_baseline(baseline: str, names, severities, where: str) -> None:
    if baseline == REFERENCE_BASELINE:
        return
    if baseline not in BASELINES:
        raise ValueError(f"plan: {where} must be one of {sorted([*BASELINES, REFERENCE_BASELINE])}, got {baseline!r}")
    if missing := [name for name in names if name not in BASELINES[baseline]]:
        raise ValueError(f"plan: {where}: the {baseline} baseline has no errors for {missing}")
    if sorted(severities) != list(noise.SEVERITIES):
        raise ValueError(f"plan: {where}: the {baseline} baseline needs all severities 1-5")


def _corruption_run(raw) -> CorruptionRun:
    if not isinstance(raw, dict):
        raise ValueError(f"plan: 'corruptions' must be a table, got {raw!r}")
    _check_keys(raw, CORRUPTION_KEYS, "[corruptions]")
    names, severities, preset = _corruption_settings(raw, "corruptions", "names")
    baseline = raw.get("baseline")
    if baseline is not None:
        _check_baseline(baseline, names, severities, "corruptions.baseline")
    return CorruptionRun(names, severities, preset, baseline)


# [metrics] keys of earlier plans: the one mCE of a report is the [corruptions] table's.
MOVED_METRICS_KEYS = {"corruptions", "severities", "preset", "mce_baseline"}


def _metrics_run(raw) -> MetricsRun:
    if not isinstance(raw, dict):
        raise ValueError(f"plan: 'metrics' must be a table, got {raw!r}")
    if moved := sorted(MOVED_METRICS_KEYS & set(raw)):
        raise ValueError(f"plan: metrics.{moved[0]} is no longer a [metrics] key: mCE and relative mCE come from the "
                         "plan's [corruptions] table, one mCE per report (names, severities, preset, and baseline = "
                         "\"reference\" for the errors of metrics.reference); move "
                         f"{', '.join(moved)} there")
    _check_keys(raw, {f.name for f in dataclasses.fields(MetricsRun)}, "[metrics]")
    entry = raw.get("attack", {"name": "pgd", "norm": "linf", "eps": 8 / 255, "steps": 10})
    if isinstance(entry, dict) and isinstance(entry.get("eps"), list):
        raise ValueError("plan: metrics.attack takes one eps, not a list")
    if not isinstance(entry, dict):
        raise ValueError(f"plan: metrics.attack must be a table naming an attack, got {entry!r}")
    attack = _attack_run("metrics.attack", entry).attack
    settings = {key: value for key, value in raw.items() if key != "attack"}
    if isinstance(settings.get("layers"), list):
        settings["layers"] = tuple(settings["layers"])
    run = MetricsRun(attack=attack, **settings)
    _check_metrics_settings(run)
    return run


def _source_entry(runs: tuple[AttackRun, ...], attack: Attack) -> tuple[int, int] | None:
    """(position, epsilon index) of the first attack entry that runs exactly ``attack``
    (one restart), or None."""
    for position, run in enumerate(runs):
        if run.restarts != 1 or run.attack.name != attack.name:
            continue
        for index, eps in enumerate(run.eps or (None,)):
            if (run.attack if eps is None else dataclasses.replace(run.attack, eps=eps)) == attack:
                return position, index
    return None


def _check_metrics_settings(run: MetricsRun) -> None:
    for key in ("kmnc_sections", "tknc_k", "tknp_k", "tknp_capacity", "ebd2_max_steps"):
        check_positive_int(getattr(run, key), f"plan: metrics.{key}")
    if run.ebd_directions is not None:
        check_positive_int(run.ebd_directions, "plan: metrics.ebd_directions")
    for key in ("ebd2_step", "rgb_sigma"):
        value = getattr(run, key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"plan: metrics.{key} must be a number > 0, got {value!r}")
    if isinstance(run.ric_quality, bool) or not isinstance(run.ric_quality, int) or not 1 <= run.ric_quality <= 100:
        raise ValueError(f"plan: metrics.ric_quality must be an integer from 1 to 100, got {run.ric_quality!r}")
    for key, value in (("reference", run.reference), ("profile_split", run.profile_split)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"plan: metrics.{key} must be a string, got {value!r}")
    if run.layers is not None and (not isinstance(run.layers, tuple) or not run.layers
                                   or not all(isinstance(name, str) for name in run.layers)):
        raise ValueError(f"plan: metrics.layers must be a non-empty list of layer names, got {run.layers!r}")
    if not isinstance(run.toolkit_compat, bool):
        raise ValueError(f"plan: metrics.toolkit_compat must be true or false, got {run.toolkit_compat!r}")
    try:
        check_choice(run.conv_neuron, ("channel", "unit"), "metrics.conv_neuron")
        if run.ald_l0_denominator is not None:
            check_choice(run.ald_l0_denominator, L0_DENOMINATORS, "metrics.ald_l0_denominator")
    except ValueError as error:
        raise ValueError(f"plan: {error}") from None


def _sequence_run(raw) -> SequenceRun:
    if not isinstance(raw, dict):
        raise ValueError(f"plan: 'sequences' must be a table, got {raw!r}")
    _check_keys(raw, SEQUENCE_KEYS, "[sequences]")
    names = raw.get("names", "all")
    names = noise.sequences.names() if names == "all" else names
    if not isinstance(names, list) or not names:
        raise ValueError(f"plan: sequences.names must be 'all' or a non-empty list, got {names!r}")
    run = SequenceRun(tuple(names), **{k: raw[k] for k in ("difficulty", "length", "preset", "batch_size") if k in raw})
    try:
        for name in run.names:
            noise.sequences.default_length(name, "cifar")  # validates the name
        noise.sequences.check_difficulty(run.difficulty)
        if run.length is not None:
            noise.sequences.check_length(run.length)
        if run.preset is not None:
            check_choice(run.preset, noise.PRESETS, "preset")
    except ValueError as error:
        raise ValueError(f"plan: sequences: {error}") from None
    check_positive_int(run.batch_size, "plan: sequences.batch_size")
    return run


def _system_noise_run(raw) -> SystemNoiseRun:
    if not isinstance(raw, dict):
        raise ValueError(f"plan: 'system_noise' must be a table, got {raw!r}")
    _check_keys(raw, SYSTEM_NOISE_KEYS, "[system_noise]")
    decoders = raw.get("decoders", list(noise.system.available_decoders()))
    resizes = raw.get("resizes", list(noise.system.RESIZE_MODES))
    for key, value in (("decoders", decoders), ("resizes", resizes)):
        if not isinstance(value, list) or not value:
            raise ValueError(f"plan: system_noise.{key} must be a non-empty list, got {value!r}")
    run = SystemNoiseRun(tuple(decoders), tuple(resizes), raw.get("quality", 95))
    try:
        run.variants()
    except ValueError as error:
        raise ValueError(f"plan: system_noise: {error}") from None
    if isinstance(run.quality, bool) or not isinstance(run.quality, int) or not 1 <= run.quality <= 100:
        raise ValueError(f"plan: system_noise.quality must be an integer from 1 to 100, got {run.quality!r}")
    return run


def _certify_run(raw) -> CertifyRun:
    if not isinstance(raw, dict):
        raise ValueError(f"plan: 'certify' must be a table, got {raw!r}")
    _check_keys(raw, {f.name for f in dataclasses.fields(CertifyRun)}, "[certify]")
    fields = dict(raw)
    for key in ("bounds", "eps", "l2_eps", "radii"):
        if key in fields:
            value = fields[key]
            value = [value] if isinstance(value, str | int | float) and not isinstance(value, bool) else value
            if not isinstance(value, list):
                raise ValueError(f"plan: certify.{key} must be a list, got {fields[key]!r}")
            fields[key] = tuple(value)
    return CertifyRun(**fields)


def _proxies_run(raw) -> ProxiesRun:
    if not isinstance(raw, dict):
        raise ValueError(f"plan: 'proxies' must be a table, got {raw!r}")
    _check_keys(raw, {f.name for f in dataclasses.fields(ProxiesRun)}, "[proxies]")
    names = raw.get("names", list(PROXIES))
    if not isinstance(names, list):
        raise ValueError(f"plan: proxies.names must be a list, got {names!r}")
    return ProxiesRun(tuple(names), raw.get("iterations", 20))


def _natural_shift_run(raw) -> NaturalShiftRun:
    if not isinstance(raw, dict):
        raise ValueError(f"plan: 'natural_shift' must be a table, got {raw!r}")
    _check_keys(raw, NATURAL_SHIFT_KEYS, "[natural_shift]")
    datasets, ood = raw.get("datasets", []), raw.get("ood", [])
    ood = [ood] if isinstance(ood, str) else ood
    for key, value in (("datasets", datasets), ("ood", ood)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"plan: natural_shift.{key} must be a list of strings, got {value!r}")
    if not datasets and not ood:
        raise ValueError(f"plan: natural_shift needs datasets (any of {list(SHIFT_DATASETS)}) or ood = \"folder:PATH\"")
    for name in datasets:
        if name not in SHIFT_DATASETS:
            close = difflib.get_close_matches(name, SHIFT_DATASETS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"plan: natural_shift.datasets: unknown dataset {name!r}{hint}; expected any of "
                             f"{list(SHIFT_DATASETS)}")
    if len(set(datasets)) != len(datasets) or len(set(ood)) != len(ood):
        raise ValueError("plan: natural_shift lists a dataset or an ood folder twice")
    for spec in ood:
        if not spec.startswith("folder:") or spec == "folder:":
            raise ValueError(f"plan: natural_shift.ood entries are \"folder:PATH\" (a folder of images), got {spec!r}")
    data_dir = raw.get("data_dir")
    if data_dir is not None and not isinstance(data_dir, str):
        raise ValueError(f"plan: natural_shift.data_dir must be a path string, got {data_dir!r}")
    num_examples, image_size = raw.get("num_examples"), raw.get("image_size")
    for key, value in (("num_examples", num_examples), ("image_size", image_size)):
        if value is not None:
            check_positive_int(value, f"plan: natural_shift.{key}")
    names, severities, _ = _corruption_settings(raw, "natural_shift", "corruptions")
    return NaturalShiftRun(tuple(datasets), tuple(ood), data_dir, names, severities, num_examples, image_size)


def technique_set(where: str, spec):
    """A ``techniques`` entry: names as a comma-separated string or a list; "" or "baseline"
    is the aligned baseline."""
    from robustjax import training

    if isinstance(spec, str):
        spec = [name for name in spec.split(",") if name.strip()]
    if not isinstance(spec, list) or not all(isinstance(name, str) for name in spec):
        raise ValueError(f"plan: {where} must be a string of comma-separated technique names or a list of names, "
                         f"got {spec!r}")
    try:
        return training.techniques.create([name for name in spec if name.strip() != "baseline"])
    except ValueError as error:
        raise ValueError(f"plan: {where}: {error}") from None


def _recipe_value(key: str, value, default):
    """A recipe override, type-checked against the field's default (lists become tuples);
    ``Recipe`` checks the values."""
    if isinstance(value, dict):
        raise ValueError(f"plan: training.{key} must be a number, a string or a boolean, got a table")
    if isinstance(value, list):
        return tuple(value)
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(default, int | float):
        ok, kind = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    elif isinstance(default, str):
        ok, kind = isinstance(value, str), "a string"
    else:  # an optional field
        ok, kind = True, ""
    if not ok:
        raise ValueError(f"plan: training.{key} must be {kind}, got {value!r}")
    return value


def _training_run(raw) -> TrainingRun:
    from robustjax import training

    if not isinstance(raw, dict):
        raise ValueError(f"plan: 'training' must be a table, got {raw!r}")
    defaults = {f.name: f.default for f in dataclasses.fields(training.Recipe)}
    _check_keys(raw, TRAINING_KEYS | set(defaults), "[training]")
    sets = raw.get("techniques", ["baseline"])
    if not isinstance(sets, list) or not sets:
        raise ValueError('plan: training.techniques must be a non-empty list of technique sets, e.g. ["baseline", '
                         f'"fast_at", "pgd_at,no_ema"], got {sets!r}')
    techniques: list = []
    for i, spec in enumerate(sets):
        parsed = technique_set(f"training.techniques[{i}]", spec)
        if parsed in techniques:
            raise ValueError(f"plan: training.techniques[{i}] ({spec!r}) repeats the technique set {str(parsed)!r}")
        techniques.append(parsed)
    recipe = {key: _recipe_value(key, value, defaults[key]) for key, value in raw.items() if key in defaults}
    if "steps" in recipe and "epochs" in recipe:
        raise ValueError("plan: training: give steps or epochs, not both")
    for parsed in techniques:
        try:
            training.aligned("", parsed, **recipe)
        except (TypeError, ValueError) as error:
            raise ValueError(f"plan: training: {error}") from None
    for key in ("dataset", "split"):
        if key in raw and not (isinstance(raw[key], str) and raw[key]):
            raise ValueError(f"plan: training.{key} must be a non-empty string, got {raw[key]!r}")
    eps = raw.get("attack_eps")
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps <= 1):
        raise ValueError(f"plan: training.attack_eps must be a number in (0, 1], got {eps!r}")
    for key in ("attack_steps", "checkpoint_every"):
        if key in raw:
            check_positive_int(raw[key], f"plan: training.{key}")
    return TrainingRun(tuple(techniques), tuple(sorted(recipe.items())),
                       **{key: raw[key] for key in TRAINING_KEYS - {"techniques"} if key in raw})


def plan_from_dict(raw: dict) -> Plan:
    """A :class:`Plan` from parsed TOML/JSON, validating every field."""
    if not isinstance(raw, dict):
        raise ValueError(f"plan: expected a table at the top level, got {type(raw).__name__}")
    _check_keys(raw, PLAN_KEYS, "the top level")
    entries = raw.get("attacks", [])
    if not isinstance(entries, list):
        raise ValueError(f"plan: 'attacks' must be a list of tables, got {type(entries).__name__}")
    runs = tuple(_attack_run(f"attacks[{i}]", entry) for i, entry in enumerate(entries))
    corruptions = _corruption_run(raw["corruptions"]) if "corruptions" in raw else None
    sequences = _sequence_run(raw["sequences"]) if "sequences" in raw else None
    system_noise = _system_noise_run(raw["system_noise"]) if "system_noise" in raw else None
    metrics = _metrics_run(raw["metrics"]) if "metrics" in raw else None
    natural_shift = _natural_shift_run(raw["natural_shift"]) if "natural_shift" in raw else None
    training = _training_run(raw["training"]) if "training" in raw else None
    certify = _certify_run(raw["certify"]) if "certify" in raw else None
    proxies = _proxies_run(raw["proxies"]) if "proxies" in raw else None
    settings = {key: raw[key] for key in ("batch_size", "num_examples", "seed", "precision") if key in raw}
    if "sanity" in raw:
        settings["sanity"] = _sanity_run(raw["sanity"])
    return Plan(runs=runs, corruptions=corruptions, sequences=sequences, system_noise=system_noise, metrics=metrics,
                natural_shift=natural_shift, training=training, certify=certify, proxies=proxies, **settings)


def create(name: str) -> Plan:
    """Built-in plan ``name`` (``builtin_plans.names()``), read and validated (every attack
    config built); an unknown name gets the registries' did-you-mean error."""
    return plan_from_dict(tomllib.loads(builtin_plans.get(name)))


def load_plan(spec: str | Path) -> Plan:
    """Reads a ``.toml`` or ``.json`` plan file, or a built-in plan by name (``whitebox``)."""
    path = Path(spec)
    if path.is_file():
        try:
            text, source, is_json = path.read_text(encoding="utf-8"), str(path), path.suffix == ".json"
        except UnicodeDecodeError as error:
            raise ValueError(f"plan {path}: not a UTF-8 text file ({error})") from None
    else:
        try:
            text = builtin_plans.get(str(spec))
        except ValueError as error:
            raise ValueError(f"no plan file at {str(spec)!r}, and {error}") from None
        source, is_json = f"built-in plan {spec!r}", False
    if not text.strip():  # a plan of defaults is written {} or with its settings, never as nothing
        raise ValueError(f"plan {source} is empty; start from a built-in plan: robustjax plan show default")
    try:
        raw = json.loads(text) if is_json else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"plan {source}: not valid {'JSON' if is_json else 'TOML'}: {error}") from None
    return plan_from_dict(raw)


def default_plan(dataset_name: str) -> Plan:
    """The built-in plan: ``digits`` for the embedded digits, ``default`` otherwise."""
    return load_plan("digits" if dataset_name.startswith("digits") else "default")
