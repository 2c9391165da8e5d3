"""SimBA, the Simple Black-box Attack (Guo, Gardner, You, Wilson & Weinberger, "Simple
Black-box Adversarial Attacks", ICML 2019), in the pixel and the DCT basis.

Each example walks through the directions ``q_1, q_2, ...`` of an orthonormal basis in a
random order, each direction once. At step ``k`` it queries ``x' - h q_k`` and keeps it
if the probability of the label drops (untargeted) or that of the target rises
(targeted); otherwise it queries ``x' + h q_k`` (a second query) and keeps it under the
same rule. A point that makes the example adversarial is always kept, and the example
stops there. The perturbation is the sum of the kept steps, ``delta = h * sum_k
+-q_k``, applied as ``clip(x + delta, 0, 1)``; the directions being orthonormal,
``||x_adv - x||_2 <= ||delta||_2 = h * sqrt(kept steps)``: the l2 norm is bounded by
the step count, ``h sqrt(max_queries - 2)``, with ``h`` the step size.

Bases: ``"pixel"``, the standard basis in a uniform random order; ``"dct"``, the
orthonormal 2-D DCT-II basis of each channel (``jax.scipy.fft.idctn``), low frequencies
first in the authors' strided block order: the ``freq_dims x freq_dims`` lowest
frequencies of every channel in random order, then, ring by ring of width ``stride``, the
next higher ones. The order is drawn per example, from a key of its own (so it does not
depend on the other examples of the batch). Defaults: the authors' step size ``h = 0.2``;
ART's ``freq_dims = 4``, ``stride = 1``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, Key

from robustjax.attacks.base import AttackResult, finalize, register_attack
from robustjax.attacks.compaction import Segmented
from robustjax.attacks.score import ScoreAttack, query, select
from robustjax.checks import check_choice, check_positive_float, check_positive_int
from robustjax.losses import attack_margin

BASES = ("dct", "pixel")


def frequency_rings(height: int, width: int, channels: int, freq_dims: int, stride: int) -> np.ndarray:
    """Ring of every DCT coefficient (H, W, C): 0 for the ``freq_dims x freq_dims`` lowest
    frequencies, then ``1 + (max(u, v) - freq_dims) // stride``."""
    u, v = np.arange(height)[:, None], np.arange(width)[None, :]
    highest = np.maximum(u, v)
    ring = np.where(highest < freq_dims, 0, 1 + (highest - freq_dims) // stride)
    return np.broadcast_to(ring[:, :, None], (height, width, channels))


def basis_order(keys: Key[Array, " b"], rings: np.ndarray) -> Int[Array, "b n"]:
    """Per example, from its key of ``keys`` (B,), the flat coefficient indices by
    increasing ring, uniformly shuffled within each ring."""
    flat = jnp.asarray(rings.reshape(-1), jnp.float32)

    def order(key):
        return jnp.argsort(flat + jax.random.uniform(key, flat.shape)).astype(jnp.int32)

    return jax.vmap(order)(keys)


class _State(NamedTuple):
    step: jax.Array  # shared by the examples still searching
    order: jax.Array  # per example: its basis directions, in the order tried
    coefficients: jax.Array
    score: jax.Array
    margin: jax.Array
    done: jax.Array
    queries: jax.Array


@register_attack("simba")
@dataclasses.dataclass(frozen=True)
class SimBA(ScoreAttack, Segmented):
    """SimBA (SimBA-DCT or SimBA pixel).

    Attributes:
      step_size: length of each step along a basis direction (the authors' epsilon).
      basis: ``"dct"`` or ``"pixel"``.
      max_queries: per-example budget, the clean and final checks included; a step costs
        one or two queries.
      freq_dims: DCT only, side of the block of lowest frequencies tried first.
      stride: DCT only, width of each following ring of frequencies.
    """

    traceable = ("step_size",)

    step_size: float | jax.Array = 0.2
    basis: str = "dct"
    max_queries: int = 10_000
    freq_dims: int = 4
    stride: int = 1

    def __post_init__(self):
        check_positive_float(self.step_size, "step_size", traceable=True)
        check_choice(self.basis, BASES, "basis")
        check_positive_int(self.freq_dims, "freq_dims")
        check_positive_int(self.stride, "stride")
        self.check_budget()

    @property
    def min_queries(self) -> int:
        return 3  # clean check, one step, final check

    def to_image(self, coefficients: Float[Array, "b h w c"]) -> Float[Array, "b h w c"]:
        """The perturbation whose basis coefficients are ``coefficients``."""
        if self.basis == "pixel":
            return coefficients
        return jax.scipy.fft.idctn(coefficients, type=2, axes=(1, 2), norm="ortho")

    @property
    def segment_length(self) -> int:
        """Steps between two compactions of the batch (a hundredth of the most an example
        can make, at least 10: a step is one or two model images per example)."""
        return max(10, -(-(self.max_queries - 2) // 100))

    def score(self, logits, y, target):
        """The score to lower: p(y), or -p(target)."""
        label = y if target is None else target
        probability = jnp.take_along_axis(jax.nn.softmax(logits), label[:, None], axis=1)[:, 0]
        return probability if target is None else -probability

    def start(self, classifier, x, y, key, target) -> _State:
        if self.basis == "pixel":
            rings = np.zeros(x.shape[1:], np.int32)
        else:
            rings = frequency_rings(*x.shape[1:], self.freq_dims, self.stride)
        logits = classifier(x)  # the clean check
        clean_margin = attack_margin(logits, y, target)
        return _State(
            step=jnp.zeros((), jnp.int32),
            order=basis_order(jax.random.split(key, x.shape[0]), rings),
            coefficients=jnp.zeros_like(x),
            score=self.score(logits, y, target),
            margin=clean_margin,
            done=clean_margin < 0,
            queries=jnp.ones(x.shape[0], jnp.int32),
        )

    def room(self, s: _State, cost: int) -> jax.Array:
        """The examples that go on searching and can afford ``cost`` more queries and
        the final check."""
        return ~s.done & (s.step < s.order.shape[1]) & (s.queries <= self.max_queries - 1 - cost)

    def active(self, s: _State) -> jax.Array:
        return self.room(s, 1)

    def advance(self, classifier, x, y, target, state: _State) -> _State:
        end = state.step + self.segment_length

        def evaluate(coefficients, needed):
            logits = query(classifier, jnp.clip(x + self.to_image(coefficients), 0.0, 1.0), needed)
            return self.score(logits, y, target), attack_margin(logits, y, target)

        def moved(coefficients, index, amount):
            flat = coefficients.reshape(x.shape[0], -1)
            return flat.at[jnp.arange(x.shape[0]), index].add(amount).reshape(x.shape)

        def step(s: _State) -> _State:
            index = s.order[:, s.step]
            first = self.room(s, 1)
            down = moved(s.coefficients, index, -self.step_size)
            score, margin = evaluate(down, first)
            kept = first & ((score < s.score) | (margin < 0))
            second = first & ~kept & (s.queries + 1 <= self.max_queries - 2)
            up = moved(s.coefficients, index, self.step_size)
            score_up, margin_up = evaluate(up, second)
            kept_up = second & ((score_up < s.score) | (margin_up < 0))
            return s._replace(
                step=s.step + 1,
                coefficients=select(kept, down, select(kept_up, up, s.coefficients)),
                score=jnp.where(kept, score, jnp.where(kept_up, score_up, s.score)),
                margin=jnp.where(kept, margin, jnp.where(kept_up, margin_up, s.margin)),
                done=s.done | (kept & (margin < 0)) | (kept_up & (margin_up < 0)),
                queries=s.queries + first + second,
            )

        return jax.lax.while_loop(lambda s: (s.step < end) & self.active(s).any(), step, state)

    def finish(self, classifier, x, y, target, state: _State) -> AttackResult:
        x_adv = jnp.clip(x + self.to_image(state.coefficients), 0.0, 1.0)
        return finalize(classifier, x_adv, y, target, state.queries)
