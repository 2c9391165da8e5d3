"""Automatic sanity checks against gradient masking, run after the attacks of a plan.

Gradient masking (obfuscated gradients) makes gradient-based attacks fail without making
the model robust, so the reported robust accuracy overstates robustness. These checks look
for its known symptoms, as listed by Athalye, Carlini & Wagner, "Obfuscated Gradients Give
a False Sense of Security" (ICML 2018, arXiv 1802.00420, §3.1), the checklist of Carlini
et al., "On Evaluating Adversarial Robustness" (arXiv 1902.06705, §"Common Severe Flaws"
and "Common Pitfalls") and AutoAttack's flags (Croce & Hein 2020, fra31/auto-attack
``flags_doc.md``). Each check gives a verdict (``pass``, ``warn`` or ``skipped`` with a
reason), what it measured, a sentence saying what it saw and advice on what to do.

Two checks read the report's attack sections only (robust accuracy against epsilon, and
black-box or transfer attacks against white-box ones); the others run on the first
``plan.sanity.num_examples`` correctly classified examples, padded to whole shards of the
evaluation's mesh, with a few jitted forward and backward passes and two short PGD runs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np

from robustjax import attacks, losses
from robustjax.attacks import flags
from robustjax.attacks.decision import DecisionAttack
from robustjax.attacks.flags import BLACK_BOX_TOLERANCE
from robustjax.attacks.score import ScoreAttack
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.distributed import to_host
from robustjax.evaluation.parallel import DataParallel
from robustjax.evaluation.plan import Plan, SanityRun
from robustjax.evaluation.progress import UNTRACKED, Step
from robustjax.evaluation.timing import timed

# Stream of the plan's seed for the checks' randomness (PGD's random starts).
_STREAM = 25
# The usual CIFAR Linf budget, for plans without a Linf attack.
DEFAULT_EPS = 8 / 255
# A rise of robust accuracy with epsilon within this many binomial standard errors of the
# accuracy is taken for sampling noise.
NOISE_Z = 2.0
# Later restarts may fool this share of the examples (and always one) without a warning.
RESTART_TOLERANCE = 0.01
# PGD with the whole [0, 1] box as its Linf ball should fool (nearly) every example.
UNBOUNDED_MAX_ACCURACY = 0.05
# Loss landscape: an example is irregular when one step of the grid carries more than this
# share of the loss's total variation along the line (an even rise gives 1 / grid each).
LANDSCAPE_MAX_STEP_SHARE = 0.5
# ... and the check warns when more than this share of the examples is irregular or flat.
LANDSCAPE_MAX_IRREGULAR = 0.2
# A warning's advice names the model's weakness first below this many times chance accuracy.
WEAK_MODEL_CHANCE_FACTOR = 3


@dataclasses.dataclass(frozen=True)
class CheckInfo:
    """A check's name, the literature behind it, and what to do when it warns."""

    name: str
    reference: str
    advice: str


CHECKS = {info.name: info for info in (
    CheckInfo("accuracy_falls_with_eps", "Athalye et al. 2018 (arXiv 1802.00420) §3.1; Carlini et al. 2019 "
              "(arXiv 1902.06705): success rate must increase monotonically with the distortion bound",
              "A larger ball contains the smaller one, so a correct attack can only do better: run the attack "
              "with more steps and restarts, and look for gradient masking."),
    CheckInfo("unbounded_pgd", "Athalye et al. 2018 §3.1: unbounded attacks must reach 100% success; Carlini "
              "et al. 2019: at large epsilon accuracy must reach 0",
              "The attack cannot find points that are trivially adversarial: gradients are masked or the attack is "
              "broken; try BPDA for non-differentiable layers, EOT for randomness, or a black-box attack."),
    CheckInfo("black_box_beats_white_box", "Athalye et al. 2018 §3.1; Carlini et al. 2019 §Common Pitfalls; "
              "AutoAttack's Square flag (0.2% tolerance)",
              "Gradient-free attacks should do worse than white-box ones: the white-box attacks are being "
              "misled; run adaptive attacks (BPDA, EOT, margin losses) and report the best attack per example."),
    CheckInfo("input_gradients", "AutoAttack's zero-gradient flag (Croce & Hein 2020); Athalye et al. 2018 "
              "§4.1 (shattered gradients) and §4.3 (vanishing and exploding gradients)",
              "Gradient-based attacks cannot move these examples: replace non-differentiable layers by a "
              "differentiable approximation (BPDA), return logits, or use black-box attacks such as Square."),
    CheckInfo("probability_outputs", "AutoAttack's softmax-output flag (Croce & Hein 2020): softmax outputs "
              "cause numerical instabilities that prevent gradient-based attacks from performing well",
              "Return the logits (drop the final softmax or log-softmax): attack losses saturate on probabilities."),
    CheckInfo("restarts_converged", "Carlini et al. 2019: use enough random restarts; Mosbach et al. 2018 "
              "(arXiv 1810.12042): more restarts lowered the accuracy of logit-pairing defences",
              "The attack has not converged: evaluate with more restarts and steps until robust accuracy "
              "stops falling."),
    CheckInfo("deterministic_forward", "AutoAttack's randomized-defence flag (Croce & Hein 2020); Athalye et "
              "al. 2018 §4.2 (stochastic gradients, EOT)",
              "A random forward pass gives stochastic gradients: attack the expectation over the randomness "
              "(EOT): wrap the model with Classifier.randomized and evaluate it with AutoAttack's rand version "
              "({name = \"autoattack\", version = \"rand\"}) or attacks with eot_samples; or make the model "
              "deterministic (eval mode)."),
    CheckInfo("loss_landscape", "Engstrom, Ilyas & Athalye 2018 (arXiv 1807.10272): loss landscapes of a masked "
              "model are flat or jagged along the gradient direction",
              "The loss does not respond smoothly to the gradient's direction: gradients are masked; try BPDA, "
              "black-box attacks or attacks on a smoothed surrogate."),
)}


def check_entry(name: str, verdict: str, value, message: str, reason: str | None = None) -> dict:
    """One check's report entry (``reason`` only for skipped checks)."""
    info = CHECKS[name]
    entry = {"name": name, "verdict": verdict, "value": value, "message": message, "advice": info.advice,
             "reference": info.reference}
    return entry if reason is None else {**entry, "reason": reason}


def skipped(name: str, reason: str) -> dict:
    return check_entry(name, "skipped", None, f"not checked: {reason}", reason)


def _finished(report: dict) -> list[dict]:
    """The report's finished attack sections that have an epsilon."""
    return [s for s in report["attacks"] if s["status"] == "ok" and s["params"].get("eps") is not None]


def _norm(section: dict) -> str:
    return section["params"].get("norm", "linf")


def noise_tolerance(accuracy: float, num_examples: int) -> float:
    """``NOISE_Z`` binomial standard errors ``sqrt(p (1 - p) / n)`` of an accuracy ``p``
    measured on ``n`` examples, and never less than one example."""
    return max(NOISE_Z * math.sqrt(accuracy * (1 - accuracy) / num_examples), 1 / num_examples)


def accuracy_falls_with_eps(report: dict) -> dict:
    """Robust accuracy of each attack (same name and parameters but epsilon) must not rise
    with epsilon: the ball of a larger epsilon contains the smaller one. Warns when, for
    some eps_a < eps_b, accuracy(eps_b) - accuracy(eps_a) exceeds :func:`noise_tolerance`;
    a flat or falling curve passes."""
    name = "accuracy_falls_with_eps"
    curves: dict[str, list[dict]] = {}
    for section in _finished(report):
        params = {k: v for k, v in section["params"].items() if k != "eps"}
        curves.setdefault(json.dumps({"name": section["name"], **params}, sort_keys=True), []).append(section)
    curves = {key: sorted(sections, key=lambda s: s["params"]["eps"]) for key, sections in curves.items()
              if len({s["params"]["eps"] for s in sections}) > 1}
    if not curves:
        return skipped(name, "no attack ran at two or more epsilons")
    n = report["dataset"]["num_examples"]
    rises = []
    for sections in curves.values():
        for i, low in enumerate(sections):
            for high in sections[i + 1:]:
                rise = high["robust_accuracy"] - low["robust_accuracy"]
                tolerance = noise_tolerance((high["robust_accuracy"] + low["robust_accuracy"]) / 2, n)
                if high["params"]["eps"] > low["params"]["eps"] and rise > tolerance:
                    rises.append({"attack": low["name"], "norm": _norm(low), "eps_low": low["params"]["eps"],
                                  "eps_high": high["params"]["eps"], "rise": rise, "tolerance": tolerance})
    value = {"curves": len(curves), "rises": rises}
    if not rises:
        return check_entry(name, "pass", value, f"robust accuracy does not rise with epsilon on any of the "
                           f"{len(curves)} epsilon curve(s)")
    worst = max(rises, key=lambda r: r["rise"])
    return check_entry(name, "warn", value, f"robust accuracy of {worst['attack']} ({worst['norm']}) rises by "
                       f"{worst['rise']:.1%} from eps {worst['eps_low']:.4g} to {worst['eps_high']:.4g} "
                       f"(noise tolerance {worst['tolerance']:.1%}); {len(rises)} such rise(s) in all")


def attack_kind(name: str) -> str:
    """``"black-box"`` for score- and decision-based attacks (subclasses of
    :class:`ScoreAttack` or :class:`DecisionAttack`), ``"white-box"`` otherwise."""
    return "black-box" if issubclass(attacks.get(name), ScoreAttack | DecisionAttack) else "white-box"


def _transfer_measurements(report: dict) -> list[dict]:
    """The metrics section's AAW (white-box) and AAB (transferred from the reference model)
    accuracies, both under its one attack."""
    section = report.get("metrics")
    if section is None or section["status"] == "failed":
        return []
    entries = {e["name"]: e for e in section["results"] if e["name"] in ("AAW", "AAB") and e["status"] == "ok"}
    found = []
    for metric, kind in (("AAW", "white-box"), ("AAB", "transfer")):
        if metric not in entries:
            continue
        settings = entries[metric]["settings"]
        source = f", transferred from {settings['source']}" if kind == "transfer" else ""
        found.append({"scale": "accuracy", "norm": settings["attack"].get("norm", "linf"),
                      "eps": settings["attack"].get("eps"), "kind": kind,
                      "attack": f"{settings['attack']['name']} (metric {metric}{source})",
                      "accuracy": entries[metric]["value"]})
    return found


def black_box_beats_white_box(report: dict) -> dict:
    """At each norm and epsilon where both ran, the best black-box (score- or
    decision-based) or transfer attack must not leave a lower accuracy than the best
    white-box attack, beyond AutoAttack's tolerance of 0.2 percentage points and never
    less than one example. Attack sections compare by robust accuracy, the metrics
    section's AAB with its AAW (accuracy under the same attack, transferred or not)."""
    name = "black_box_beats_white_box"
    measured = [{"scale": "robust_accuracy", "norm": _norm(s), "eps": s["params"]["eps"], "kind": attack_kind(s["name"]),
                 "attack": s["name"], "accuracy": s["robust_accuracy"]} for s in _finished(report)]
    measured += _transfer_measurements(report)
    budgets: dict[tuple, dict[str, list[dict]]] = {}
    for m in measured:
        group = "white-box" if m["kind"] == "white-box" else "black-box"
        budgets.setdefault((m["scale"], m["norm"], m["eps"]), {}).setdefault(group, []).append(m)
    shared = {budget: groups for budget, groups in budgets.items() if len(groups) == 2}
    if not shared:
        return skipped(name, "no black-box or transfer attack ran at the norm and epsilon of a white-box attack")
    tolerance = max(BLACK_BOX_TOLERANCE, 1 / report["dataset"]["num_examples"])
    comparisons = []
    for (_, norm, eps), groups in shared.items():
        white = min(groups["white-box"], key=lambda m: m["accuracy"])
        black = min(groups["black-box"], key=lambda m: m["accuracy"])
        comparisons.append({"norm": norm, "eps": eps, "white_box": white["attack"], "white_box_accuracy":
                            white["accuracy"], "black_box": black["attack"], "black_box_accuracy": black["accuracy"],
                            "gap": white["accuracy"] - black["accuracy"]})
    value = {"tolerance": tolerance, "comparisons": comparisons}
    worst = max(comparisons, key=lambda c: c["gap"])
    n = report["dataset"]["num_examples"]
    if round(worst["gap"] * n) <= tolerance * n:  # in examples, as accuracies are counts / n
        return check_entry(name, "pass", value, f"no black-box or transfer attack beats the white-box attacks at "
                           f"{len(comparisons)} shared norm and epsilon budget(s)")
    return check_entry(name, "warn", value, f"{worst['black_box']} leaves {worst['black_box_accuracy']:.1%} accuracy "
                       f"at {worst['norm']} eps {worst['eps']:.4g}, {worst['gap']:.1%} below the best white-box "
                       f"attack ({worst['white_box']}, {worst['white_box_accuracy']:.1%})")


@jax.jit
def _loss_along_gradient_sign(classifier: Classifier, x: jax.Array, y: jax.Array, sizes: jax.Array) -> jax.Array:
    """The attack loss (negated CW margin) at ``clip(x + t * sign(gradient), 0, 1)`` for
    every step size ``t`` of ``sizes``: shape (steps, batch)."""
    def loss(images):
        return -losses.margin(classifier(images), y)

    direction = jnp.sign(jax.grad(lambda images: loss(images).sum())(x))
    return jax.vmap(lambda t: loss(jnp.clip(x + t * direction, 0.0, 1.0)))(sizes)


def _entry(flag: flags.Flag) -> dict:
    return check_entry(flag.name, "warn" if flag.raised else "pass", flag.value, flag.message)


def input_gradients(margin: np.ndarray, gradient: np.ndarray) -> dict:
    """:func:`robustjax.attacks.flags.input_gradients` as a check entry."""
    return _entry(flags.input_gradients(margin, gradient))


def probability_outputs(outputs: np.ndarray) -> dict:
    """:func:`robustjax.attacks.flags.probability_outputs` as a check entry."""
    return _entry(flags.probability_outputs(outputs))


def deterministic_forward(first: np.ndarray, again: np.ndarray, regrouped: np.ndarray) -> dict:
    """:func:`robustjax.attacks.flags.deterministic_forward` as a check entry."""
    return _entry(flags.deterministic_forward(first, again, regrouped))


def unbounded_pgd(success: np.ndarray, steps: int) -> dict:
    """PGD whose Linf ball is the whole [0, 1] box (eps 1), started at ``x`` (a random
    start there would be a uniform noise image, which fools a model without any gradient),
    must fool (nearly) every example: warns when more than 5% stay correctly classified."""
    name = "unbounded_pgd"
    correct = int((~success).sum())
    accuracy = correct / success.size
    value = {"eps": 1.0, "norm": "linf", "steps": steps, "accuracy": accuracy}
    if correct <= UNBOUNDED_MAX_ACCURACY * success.size:  # in examples: 1 of 20 is 5%, not 5% + rounding
        return check_entry(name, "pass", value, f"PGD-{steps} with the whole box as its ball leaves {accuracy:.0%} "
                           "accuracy")
    return check_entry(name, "warn", value, f"PGD-{steps} with the whole box as its ball (eps 1) still leaves "
                       f"{accuracy:.0%} of the examples correctly classified")


def restarts_converged(success: np.ndarray, eps: float, steps: int) -> dict:
    """Robust accuracy after the first ``r`` random restarts of PGD, per example worst
    case (``success``: restarts x examples). Warns when the second half of the restarts
    still lowers it by more than 1% of the examples and more than one example (one
    example fooled late can be the luck of a random start near the decision boundary)."""
    name = "restarts_converged"
    restarts, n = success.shape
    robust_counts = [int((~success[:r].any(axis=0)).sum()) for r in range(1, restarts + 1)]
    robust = [count / n for count in robust_counts]
    half = robust[restarts // 2 - 1]
    gain = half - robust[-1]
    tolerance = max(RESTART_TOLERANCE, 1 / n)
    value = {"eps": eps, "norm": "linf", "steps": steps, "robust_accuracy_after_restarts": robust,
             "gain_of_second_half": gain, "tolerance": tolerance}
    if robust_counts[restarts // 2 - 1] - robust_counts[-1] <= max(RESTART_TOLERANCE * n, 1):  # in examples
        return check_entry(name, "pass", value, f"restarts {restarts // 2 + 1}-{restarts} of PGD-{steps} lower "
                           f"robust accuracy by {gain:.1%} (tolerance {tolerance:.1%})")
    return check_entry(name, "warn", value, f"restarts {restarts // 2 + 1}-{restarts} of PGD-{steps} at eps "
                       f"{eps:.4g} still lower robust accuracy from {half:.0%} to {robust[-1]:.0%}")


def loss_landscape(loss: np.ndarray, sizes: np.ndarray) -> dict:
    """The attack loss along the gradient sign from each example (``loss``: step sizes x
    examples, the first size 0). An example is flat when the loss does not rise beyond
    float32 resolution over the whole line, irregular when one step of the grid carries
    more than half of the loss's total variation (a jump, or a rise that is undone);
    warns when more than 20% of the examples are flat or irregular."""
    name = "loss_landscape"
    loss = loss.astype(np.float64)
    increments = np.diff(loss, axis=0)
    variation = np.abs(increments).sum(axis=0)
    resolution = np.finfo(np.float32).eps * np.maximum(np.abs(loss[0]), 1.0)
    flat = loss[-1] - loss[0] <= resolution
    share = np.divide(np.abs(increments).max(axis=0), variation, out=np.ones_like(variation), where=variation > 0)
    irregular = ~flat & (share > LANDSCAPE_MAX_STEP_SHARE)
    value = {"max_step": float(sizes[-1]), "grid": len(sizes) - 1, "flat": float(flat.mean()),
             "irregular": float(irregular.mean()), "mean_rise": float((loss[-1] - loss[0]).mean())}
    if (flat | irregular).mean() <= LANDSCAPE_MAX_IRREGULAR:
        return check_entry(name, "pass", value, f"the loss rises along the gradient sign on "
                           f"{1 - (flat | irregular).mean():.0%} of the examples, without jumps")
    return check_entry(name, "warn", value, f"along the gradient sign up to {sizes[-1]:.4g}, the loss does not rise "
                       f"on {value['flat']:.0%} of the examples and jumps on {value['irregular']:.0%}")


def _largest_linf_eps(report: dict) -> float | None:
    linf = [s["params"]["eps"] for s in _finished(report) if _norm(s) == "linf"]
    return max(linf) if linf else None


def correct_examples(dataset: ImageDataset, plan: Plan, clean_correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first ``plan.sanity.num_examples`` examples the classifier gets right, by the clean
    pass's record ``clean_correct`` (one flag per evaluated example)."""
    return dataset.take(np.flatnonzero(clean_correct)[:plan.sanity.num_examples])


def _on_mesh(parallel: DataParallel, *arrays: np.ndarray) -> list[jax.Array]:
    """``arrays`` padded with copies of their first row to whole shards of the mesh's batch
    axis, and sharded over it."""
    shards = parallel.mesh.shape["batch"]
    pad = -len(arrays[0]) % shards
    return [jax.device_put(np.concatenate([a, np.repeat(a[:1], pad, axis=0)]), parallel.sharded) for a in arrays]


@dataclasses.dataclass(frozen=True)
class Probe:
    """What the model-based checks run on: the classifier, correctly classified examples
    (host arrays ``x``, ``y``), the mesh, the settings, the epsilon and a PRNG key."""

    classifier: Classifier
    x: np.ndarray
    y: np.ndarray
    parallel: DataParallel
    settings: SanityRun
    eps: float
    key: jax.Array

    def on_mesh(self, *arrays: np.ndarray) -> list[jax.Array]:
        return _on_mesh(self.parallel, *arrays)

    @functools.cached_property
    def outputs_and_margin_gradients(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Computed once, for both the gradient and the probability checks."""
        n = len(self.y)
        return tuple(to_host(a)[:n] for a in flags.outputs_and_margin_gradients(self.classifier, *self.on_mesh(self.x, self.y)))

    def logits(self, x: np.ndarray) -> np.ndarray:
        return to_host(flags.logits(self.classifier, self.on_mesh(x)[0]))[:len(x)]


def _probe_unbounded_pgd(probe: Probe) -> dict:
    attack = attacks.PGD(eps=1.0, norm="linf", steps=probe.settings.steps, random_start=False)
    success = attack(probe.classifier, *probe.on_mesh(probe.x, probe.y), key=probe.key).success
    return unbounded_pgd(to_host(success)[:len(probe.y)], probe.settings.steps)


def _probe_input_gradients(probe: Probe) -> dict:
    _, margin, gradient = probe.outputs_and_margin_gradients
    return input_gradients(margin, gradient)


def _probe_probability_outputs(probe: Probe) -> dict:
    return probability_outputs(probe.outputs_and_margin_gradients[0])


def _probe_restarts(probe: Probe) -> dict:
    # Restarts as a batch axis: every copy of the examples draws its own random start.
    restarts, n = probe.settings.restarts, len(probe.y)
    tiled = probe.on_mesh(np.tile(probe.x, (restarts, 1, 1, 1)), np.tile(probe.y, restarts))
    success = attacks.PGD(eps=probe.eps, norm="linf", steps=probe.settings.steps)(
        probe.classifier, *tiled, key=probe.key).success
    return restarts_converged(to_host(success)[:restarts * n].reshape(restarts, n), probe.eps,
                              probe.settings.steps)


def _probe_determinism(probe: Probe) -> dict:
    other, k = flags.regrouped(probe.x)
    redrawn = dataclasses.replace(probe, classifier=probe.classifier.redraw(1))  # a randomized model's next draw
    return deterministic_forward(probe.logits(probe.x), redrawn.logits(probe.x), redrawn.logits(other)[:k][::-1])


def _probe_landscape(probe: Probe) -> dict:
    sizes = np.linspace(0.0, probe.eps, probe.settings.grid + 1, dtype=np.float32)
    x, y = probe.on_mesh(probe.x, probe.y)
    loss = to_host(_loss_along_gradient_sign(probe.classifier, x, y, jnp.asarray(sizes)))[:, :len(probe.y)]
    return loss_landscape(loss, sizes)


MODEL_CHECKS = {"unbounded_pgd": _probe_unbounded_pgd, "input_gradients": _probe_input_gradients,
                "probability_outputs": _probe_probability_outputs, "restarts_converged": _probe_restarts,
                "deterministic_forward": _probe_determinism, "loss_landscape": _probe_landscape}


def run_check(name: str, probe: Probe) -> dict:
    """One model-based check; a check that raises (a model JAX cannot differentiate, for
    one) is reported as skipped with its error, and the others still run."""
    if not len(probe.y):
        return skipped(name, "no correctly classified example")
    try:
        return MODEL_CHECKS[name](probe)
    except Exception as error:  # recorded in the report
        return skipped(name, f"the check failed: {type(error).__name__}: {error}")


def weak_model_advice(check: dict, clean_accuracy: float, num_classes: int) -> dict:
    """``check`` with its advice led by the plain cause when it warns on a model that is barely
    better than chance (clean accuracy below ``WEAK_MODEL_CHANCE_FACTOR`` times chance, at most
    50%): such a model's loss is flat or erratic, which alone makes the checks warn."""
    if check["verdict"] != "warn" or clean_accuracy >= min(0.5, WEAK_MODEL_CHANCE_FACTOR / num_classes):
        return check
    cause = (f"The model classifies only {clean_accuracy:.0%} of the examples correctly (chance: {1 / num_classes:.0%}): "
             "a barely trained model warns for that reason alone, so evaluate trained weights first. Otherwise: ")
    return {**check, "advice": cause + check["advice"]}


def sanity_section(classifier: Classifier, dataset: ImageDataset, plan: Plan, parallel: DataParallel,
                   report: dict, clean_correct: np.ndarray, step: Step = UNTRACKED) -> dict:
    """The sanity checks of ``report`` (its attack and metrics sections) and of the model on
    ``dataset``; ``classifier`` is replicated on ``parallel``'s mesh, as in the runner, and
    ``clean_correct`` is the clean pass's per-example correctness.
    ``step`` advances after each check, of ``len(CHECKS)``."""
    eps = plan.sanity.eps or _largest_linf_eps(report) or DEFAULT_EPS
    with timed() as timing:
        x, y = correct_examples(dataset, plan, clean_correct)
        probe = Probe(classifier, x, y, parallel, plan.sanity, eps,
                      jax.random.fold_in(jax.random.key(plan.seed), _STREAM))
        checks = [run_check(name, probe) for name in step.track(MODEL_CHECKS)]
        checks += [check(report) for check in step.track((accuracy_falls_with_eps, black_box_beats_white_box))]
    checks = sorted(checks, key=lambda check: list(CHECKS).index(check["name"]))
    clean_accuracy = float(np.mean(clean_correct))
    checks = [weak_model_advice(check, clean_accuracy, classifier.num_classes) for check in checks]
    return {"status": "ok", "settings": {**plan.sanity.as_dict(), "eps": eps}, "num_examples": len(y),
            "checks": checks, "num_warnings": sum(c["verdict"] == "warn" for c in checks),
            "timing": timing.as_dict(len(y))}
