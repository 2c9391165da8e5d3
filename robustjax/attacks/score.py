"""Shared pieces of the score-based black-box attacks (Square, SPSA, NES, SimBA).

These attacks read the classifier's logits only, never its gradients. Each runs as one
``lax.while_loop`` over a batch with a per-example query budget ``max_queries`` that
counts every model evaluation of the example: the clean check that opens the attack, the
attack's own queries, and the final check of :func:`~robustjax.attacks.base.finalize`.
An example whose clean image is already misclassified (untargeted) or already classified
as the target (targeted) is not attacked: it costs the clean and the final check only.

A batched model call charges one query for each image an example needs; the images of
examples that need none are sent as placeholders, and a call that no example needs is
skipped (:func:`query`), so that counting the real images of each example in the model's
calls gives its ``queries`` exactly.
"""

from __future__ import annotations

import abc
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from robustjax.attacks.base import Attack
from robustjax.attacks.compaction import Segmented, traced
from robustjax.checks import check_positive_int
from robustjax.classifier import Classifier
from robustjax.distributed import to_host
from robustjax.losses import attack_margin
from robustjax.sharding import skip_unless

# Rows of the classifier's output looked at to tell probabilities from logits.
_PROBE_ROWS = 2
# Pixel value of the images sent for examples that make no query (outside [0, 1]).
PLACEHOLDER = -1.0


@jax.jit
def _outputs(classifier: Classifier, x: jax.Array) -> jax.Array:
    return classifier(x)


def looks_like_probabilities(outputs: np.ndarray) -> bool:
    """Whether every row is non-negative and sums to 1 (within float32 rounding)."""
    return bool((outputs >= 0).all() and np.allclose(outputs.sum(-1), 1.0, atol=1e-4))


def warn_if_probabilities(
    classifier: Classifier, x, consequence: str = "score-based attacks then optimise a flattened objective"
) -> None:
    """Warns when the classifier seems to return probabilities where logits are promised.

    Evaluates the classifier on the host on the first images of ``x`` (a validation
    step, not an attack query: it is not counted). Skipped inside a trace.
    """
    if traced(classifier, x):
        return
    outputs = np.asarray(_outputs(classifier, jnp.asarray(to_host(x)[:_PROBE_ROWS])))
    if looks_like_probabilities(outputs):
        warnings.warn(
            f"classifier {classifier.name!r} seems to return probabilities (rows are non-negative "
            f"and sum to 1) where logits are expected; {consequence}. Return logits (drop the final softmax).",
            stacklevel=3,
        )


class ScoreAttack(Attack):
    """Base of score-based attacks: a ``max_queries`` budget and the probability check.

    Subclasses set ``min_queries``, the smallest budget that lets an example make one
    attack step (clean check, the step's queries, final check).
    """

    @property
    @abc.abstractmethod
    def min_queries(self) -> int:
        """The smallest useful ``max_queries``."""

    def check_budget(self) -> None:
        """``max_queries`` must be an integer that allows at least one attack step."""
        check_positive_int(self.max_queries, "max_queries")
        if self.max_queries < self.min_queries:
            raise ValueError(
                f"max_queries must be >= {self.min_queries} for {self.name!r} (the clean check, "
                f"one attack step and the final check), got {self.max_queries}"
            )

    def validate(self, classifier, x, y, key, target) -> None:
        super().validate(classifier, x, y, key, target)
        warn_if_probabilities(classifier, x)


class EstimatedGradientAttack(ScoreAttack, Segmented):
    """Base of the attacks whose iteration estimates a gradient from probes and queries the
    point it steps to (NES, SPSA): ``queries_per_iteration`` images per example, run
    compacted (:mod:`robustjax.attacks.compaction`). Their state has ``done`` and
    ``queries`` per example."""

    @property
    @abc.abstractmethod
    def queries_per_iteration(self) -> int:
        """Model images one iteration costs an example."""

    @property
    def min_queries(self) -> int:
        return self.queries_per_iteration + 2  # and the clean and final checks

    @property
    def segment_length(self) -> int:
        """Iterations between two compactions of the batch: a hundredth of the most an
        example can make."""
        iterations = (self.max_queries - 2) // self.queries_per_iteration
        return max(1, -(-iterations // 100))

    def active(self, s) -> Bool[Array, " b"]:
        return ~s.done & (s.queries <= self.max_queries - self.queries_per_iteration - 1)

    @staticmethod
    def clean_check(classifier: Classifier, x, y, target) -> dict[str, Array]:
        """The state's ``margin`` (best so far: none yet, or the clean one of the examples
        not attacked), ``done`` and ``queries`` after the clean check (one query)."""
        clean_margin = attack_margin(classifier(x), y, target)
        attacked = clean_margin >= 0
        return dict(margin=jnp.where(attacked, jnp.inf, clean_margin), done=~attacked,
                    queries=jnp.ones(x.shape[0], jnp.int32))


def per_example(values: Array, like: Array) -> Array:
    """``values`` of shape (B,) or (B, n) reshaped to broadcast against ``like``."""
    return values.reshape(values.shape + (1,) * (like.ndim - values.ndim))


def select(mask: Bool[Array, " b"], new, old):
    """Per example, ``new`` where ``mask`` else ``old`` (pytrees of batched arrays)."""
    return jax.tree.map(lambda n, o: jnp.where(per_example(mask, n), n, o), new, old)


def query(
    classifier: Classifier, points: Float[Array, "b *n h w c"], needed: Bool[Array, " b"],
) -> Float[Array, "b *n k"]:
    """Logits of a batch of candidate images per example (one query per image for the
    examples that are ``needed``).

    The model sees one batch of all the images, example-major; the images of examples not
    needed are sent as :data:`PLACEHOLDER` images (every pixel -1, outside the [0, 1] box)
    so that a counting oracle can skip them, and the model is not called at all when no
    example is needed (the logits are then zeros).
    """
    images = jnp.where(per_example(needed, points), points, PLACEHOLDER).reshape((-1,) + points.shape[-3:])

    def skip(batch):
        return jnp.zeros((batch.shape[0], classifier.num_classes), batch.dtype)

    logits = skip_unless(needed.any(), lambda batch: classifier(batch), skip, images)
    return logits.reshape(points.shape[:-3] + (classifier.num_classes,))


def antithetic_gradient(
    f, x: Float[Array, "b h w c"], directions: Float[Array, "b n h w c"], scale,
) -> Float[Array, "b h w c"]:
    """The antithetic finite-difference estimate ``1 / (2 n scale) * sum_k (f(x + scale
    u_k) - f(x - scale u_k)) u_k`` over the ``n`` directions ``u_k`` of each example (2 n
    queries); ``f`` maps candidates (B, m, H, W, C) to values (B, m)."""
    samples = directions.shape[1]
    values = f(x[:, None] + scale * jnp.concatenate([directions, -directions], axis=1))
    difference = values[:, :samples] - values[:, samples:]
    return jnp.mean(per_example(difference, directions) * directions, axis=1) / (2.0 * scale)


def per_candidate(
    objective, logits: Float[Array, "b n k"], y: Int[Array, " b"], target: Int[Array, " b"] | None,
) -> Float[Array, "b n"]:
    """``objective(logits, y, target)`` (per-example losses of ``robustjax.losses``) for
    every candidate of every example."""
    batch, n = logits.shape[:2]
    repeat = None if target is None else jnp.repeat(target, n)
    return objective(logits.reshape(batch * n, -1), jnp.repeat(y, n), repeat).reshape(batch, n)
