"""A few examples to look at: the first evaluated images, clean, under the plan's strongest
attack and corrupted, with the model's predictions (``report.html`` shows them).

The attack is the plan's entry with the largest epsilon (Linf entries first, a later entry
winning a tie), run once on these images; the corruption is the plan's first at its middle
severity, or ``gaussian_noise`` at 3 when the plan has none. Keys: ``fold_in(k, 0)`` for the
attack and ``fold_in(k, 1)`` for the corruption, where ``k = fold_in(key(seed), 26)``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from robustjax import noise
from robustjax.attacks.base import Attack
from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.evaluation.plan import Plan
from robustjax.files import write_atomically

FILE = "gallery.npz"
NUM_EXAMPLES = 6
KEY = 26  # after the metrics' 23 and 24 and the sanity checks' 25
DEFAULT_CORRUPTION = ("gaussian_noise", 3)


def strongest_attack(plan: Plan) -> tuple[Attack, str] | None:
    """The attack of the plan's entry with the largest epsilon (Linf first, later entries
    winning ties), set to that epsilon, and its label; the last attack as configured when
    no entry has an epsilon; None for a plan without attacks."""
    candidates = [(getattr(run.attack, "norm", "linf") == "linf", eps, position, run.attack)
                  for position, run in enumerate(plan.runs) for eps in run.eps]
    if candidates:
        _, eps, _, attack = max(candidates, key=lambda c: c[:3])
        attack = dataclasses.replace(attack, eps=eps)
        return attack, f"{attack.name} {getattr(attack, 'norm', 'linf')} eps={eps:.4g}"
    return (plan.runs[-1].attack, plan.runs[-1].attack.name) if plan.runs else None


@jax.jit
def _predict(classifier: Classifier, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Predicted class and its softmax probability."""
    probabilities = jax.nn.softmax(classifier(x), axis=-1)
    return probabilities.argmax(-1), probabilities.max(-1)


def gallery(classifier: Classifier, dataset: ImageDataset, plan: Plan, *,
            num_examples: int = NUM_EXAMPLES) -> dict[str, np.ndarray]:
    """Arrays of the first ``num_examples`` evaluated examples: ``clean``, ``label``,
    ``adversarial`` (absent for a plan without attacks), ``corrupted`` (N, H, W, C), each
    image kind's ``*_prediction`` and ``*_confidence`` (top softmax probability), and the
    labels ``attack`` and ``corruption`` (0-d strings). The attack runs as one jitted
    program (no compaction into smaller batches: a few images do not need it)."""
    limit = num_examples if plan.num_examples is None else min(num_examples, plan.num_examples)
    x, y = map(jnp.asarray, dataset.arrays(limit=limit))
    key = jax.random.fold_in(jax.random.key(plan.seed), KEY)
    images, labels = {"clean": x}, {}
    if (strongest := strongest_attack(plan)) is not None:
        attack, labels["attack"] = strongest
        images["adversarial"] = jax.jit(lambda c, x, y, k: attack(c, x, y, key=k).x_adv)(
            classifier, x, y, jax.random.fold_in(key, 0))
    if plan.corruptions is not None:
        name, severity = plan.corruptions.names[0], plan.corruptions.severities[len(plan.corruptions.severities) // 2]
        preset = plan.corruptions.preset
    else:
        (name, severity), preset = DEFAULT_CORRUPTION, None
    images["corrupted"] = noise.corrupt(x, name, severity, jax.random.fold_in(key, 1), preset=preset)
    labels["corruption"] = f"{name} severity {severity}"
    predictions, confidences = _predict(classifier, jnp.concatenate(list(images.values())))
    out = {"label": np.asarray(y), **{kind: np.array(label) for kind, label in labels.items()}}
    for i, (kind, image) in enumerate(images.items()):
        part = slice(i * len(y), (i + 1) * len(y))
        out |= {kind: np.asarray(image), f"{kind}_prediction": np.asarray(predictions[part], np.int32),
                f"{kind}_confidence": np.asarray(confidences[part], np.float32)}
    return out


def save(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """Writes ``arrays`` to the ``.npz`` file ``path`` atomically."""
    write_atomically(Path(path), lambda f: np.savez_compressed(f, **arrays))


def load(path: str | Path) -> dict[str, np.ndarray] | None:
    """The arrays :func:`save` wrote to ``path`` (never unpickling), or None without the file."""
    path = Path(path)
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as arrays:
        return dict(arrays)
