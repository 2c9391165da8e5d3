"""Square Attack (Andriushchenko, Croce, Flammarion & Hein, "Square Attack: a query-efficient
black-box adversarial attack via random search", ECCV 2020), linf and l2.

A random search on a loss of the logits. Each iteration, every example proposes a change of
its best point ``x_best`` inside a square window of side ``s`` at a random position (drawn
per example), queries it once, and keeps it when the loss decreases or the example becomes
adversarial. The side follows the authors' ``p_selection`` schedule: the fraction of pixels
changed at iteration ``i`` is ``p_init / 2^j``, ``j`` the number of thresholds
(10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000) below ``floor(10000 i / max_queries)``,
and ``s = round(sqrt(p H W))``.

- linf: the start is ``x + eps * sign`` with one random sign per column and channel
  (vertical stripes). A proposal sets the window of each channel to ``x +- eps`` (one
  random sign per channel); a sign draw that would leave the window unchanged is replaced
  by a uniform draw among the other sign vectors (the authors' resampling loop).
- l2: the start is a grid of pseudo-Gaussian bumps of side ``H // 5`` with random signs,
  rescaled to norm ``eps``. A proposal empties a second random window and moves its
  perturbation mass, plus the unused budget ``eps^2 - ||delta||^2``, into the first window
  (per channel), where a new bump of random sign is added to the old content; the
  perturbation is then rescaled to norm ``eps``.

The loss is the margin ``attack_margin`` untargeted and the cross-entropy of the target
targeted, as in the authors' code (``loss`` chooses otherwise). Every candidate is clipped
to [0, 1], and each returned image is inside the eps-ball by construction.

Deviations from the authors' code: window positions are drawn per example from every
position ``0 .. H - s`` (their ``randint(0, h - s)`` never reaches the last one), the linf
side is capped at ``min(H, W)`` instead of ``H - 1``, and the l2 bump orientation is drawn
per example.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from robustjax.attacks.base import AttackResult, finalize, register_attack
from robustjax.attacks.compaction import Segmented
from robustjax.attacks.score import ScoreAttack, per_example, query, select
from robustjax.checks import check_choice, check_in_interval, check_nonnegative_float
from robustjax.losses import attack_cross_entropy, attack_margin

NORMS = ("linf", "l2")
LOSSES = ("margin", "ce")
THRESHOLDS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)
_TINY = 1e-12


def halving_starts(max_queries: int) -> np.ndarray:
    """First iteration at which ``p`` has been halved ``j + 1`` times (``p_selection``):
    the smallest ``i`` with ``floor(10000 i / max_queries) > THRESHOLDS[j]``."""
    return np.array([-(-(t + 1) * max_queries // 10000) for t in THRESHOLDS], np.int32)


def square_sides(p_init: float, height: int, width: int, norm: str) -> np.ndarray:
    """Window side after ``j`` halvings of ``p``, for ``j = 0 .. 9``.

    linf: ``round(sqrt(p H W))`` in ``[1, min(H, W)]``. l2: at least 3 and odd, at most
    the largest odd number ``<= min(H, W)``.
    """
    sides = []
    for j in range(len(THRESHOLDS) + 1):
        side = round(math.sqrt(p_init / 2**j * height * width))
        if norm == "linf":
            side = min(max(side, 1), min(height, width))
        else:
            side = max(side, 3)
            side += 1 - side % 2
            side = min(side, min(height, width) - 1 + min(height, width) % 2)
        sides.append(side)
    return np.array(sides, np.int32)


def _inverse_square_sums(n: int) -> np.ndarray:
    """``T[m] = sum_{k=1}^{m} 1 / k^2`` for ``m = 0 .. n``."""
    return np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1) ** 2)]).astype(np.float32)


def _rectangle(i, j, rows, cols, sums):
    """Pseudo-Gaussian of a ``rows x cols`` rectangle at (i, j) (inside it): the sum of
    ``1 / (k + 1)^2`` over the nested rectangles ``k = d .. K`` around the centre
    ``(rows // 2, cols // 2)`` that contain (i, j), ``d`` its Chebyshev distance to the
    centre and ``K = max(rows // 2, cols // 2)``."""
    distance = jnp.maximum(jnp.abs(i - rows // 2), jnp.abs(j - cols // 2))
    top = jnp.maximum(rows // 2, cols // 2) + 1
    last = sums.shape[0] - 1
    return sums[jnp.clip(top, 0, last)] - sums[jnp.clip(distance, 0, last)]


def bump(i: Int[Array, "*shape"], j: Int[Array, "*shape"], side, size: int) -> Float[Array, "*shape"]:
    """The authors' ``meta_pseudo_gaussian_pert``: in an ``s x s`` window, the upper
    ``s // 2`` rows hold a rectangle pseudo-Gaussian, the lower rows its negative, each
    half normalised, the whole of unit l2 norm. Evaluated at local coordinates (i, j),
    ``0 <= i, j < s`` (zero outside); ``side`` is a scalar and ``size >= side`` is static."""
    sums = jnp.asarray(_inverse_square_sums(size + 2))
    half = side // 2

    def halves(rows, cols):
        upper = jnp.where(rows < half, _rectangle(rows, cols, half, side, sums), 0.0)
        lower = jnp.where(rows >= half, _rectangle(rows - half, cols, side - half, side, sums), 0.0)
        inside = (rows < side) & (cols < side)
        return jnp.where(inside, upper, 0.0), jnp.where(inside, lower, 0.0)

    grid = jnp.arange(size)
    upper_all, lower_all = halves(grid[:, None], grid[None, :])
    upper_norm = jnp.sqrt(jnp.sum(upper_all**2, axis=(-2, -1)))
    lower_norm = jnp.sqrt(jnp.sum(lower_all**2, axis=(-2, -1)))
    upper, lower = halves(i, j)
    value = upper / jnp.maximum(upper_norm, _TINY) - lower / jnp.maximum(lower_norm, _TINY)
    return value / jnp.sqrt(1.0 + (half > 0))


def random_signs(key: jax.Array, shape: tuple[int, ...]) -> Float[Array, "*shape"]:
    """Independent uniform signs in {-1, +1}."""
    return jnp.where(jax.random.bernoulli(key, 0.5, shape), 1.0, -1.0)


def other_signs(key: jax.Array, signs: Float[Array, "b 1 1 c"]) -> Float[Array, "b 1 1 c"]:
    """A uniform draw among the ``2^C - 1`` sign vectors that differ from ``signs``.

    Flips a uniform non-empty set of channels: its lowest channel ``k`` has probability
    ``2^(C-1-k) / (2^C - 1)``, the channels above it are flipped with probability 1/2.
    """
    channels = signs.shape[-1]
    lowest_key, rest_key = jax.random.split(key)
    weights = (channels - 1 - jnp.arange(channels)) * jnp.log(2.0)
    lowest = jax.random.categorical(lowest_key, weights, shape=signs.shape[:-1] + (1,))
    index = jnp.arange(channels)
    coin = jax.random.bernoulli(rest_key, 0.5, signs.shape)
    flip = (index == lowest) | ((index > lowest) & coin)
    return jnp.where(flip, -signs, signs)


def square_window(
    key: jax.Array, shape: tuple[int, ...], side,
) -> tuple[Bool[Array, "b h w 1"], Int[Array, "b h 1 1"], Int[Array, "b 1 w 1"]]:
    """A square window of ``side`` at a uniform position per example, inside the image.

    Returns the mask and the local row and column of every pixel (outside the window,
    meaningless).
    """
    batch, height, width = shape[:3]
    top_key, left_key = jax.random.split(key)
    top = jax.random.randint(top_key, (batch, 1, 1, 1), 0, height - side + 1)
    left = jax.random.randint(left_key, (batch, 1, 1, 1), 0, width - side + 1)
    rows = jnp.arange(height)[None, :, None, None] - top
    cols = jnp.arange(width)[None, None, :, None] - left
    inside = (rows >= 0) & (rows < side) & (cols >= 0) & (cols < side)
    return inside, rows, cols


def linf_start(key: jax.Array, x: Float[Array, "b h w c"], eps) -> Float[Array, "b h w c"]:
    """Vertical stripes: ``x + eps * sign``, one sign per example, column and channel."""
    batch, _, width, channels = x.shape
    return jnp.clip(x + eps * random_signs(key, (batch, 1, width, channels)), 0.0, 1.0)


def linf_proposal(key: jax.Array, x, x_best, eps, side) -> Float[Array, "b h w c"]:
    """``x_best`` with a random window set to ``x +- eps`` (a sign per channel), clipped."""
    window_key, sign_key, other_key = jax.random.split(key, 3)
    inside, _, _ = square_window(window_key, x.shape, side)
    signs = random_signs(sign_key, (x.shape[0], 1, 1, x.shape[-1]))

    def fill(s):
        return jnp.where(inside, jnp.clip(x + eps * s, 0.0, 1.0), x_best)

    unchanged = jnp.all(jnp.abs(fill(signs) - x_best) < 1e-7, axis=(1, 2, 3))
    return fill(jnp.where(per_example(unchanged, signs), other_signs(other_key, signs), signs))


def _l2_norm(delta, axes=(1, 2, 3)):
    return jnp.sqrt(jnp.sum(delta * delta, axis=axes, keepdims=True))


def l2_start(key: jax.Array, x: Float[Array, "b h w c"], eps) -> Float[Array, "b h w c"]:
    """Bumps of side ``H // 5`` tiled from offset ``(H - 5 s) // 2``, each with a random
    sign per channel and a random orientation, rescaled to norm ``eps``, clipped."""
    batch, height, width, channels = x.shape
    side = height // 5
    offset = (height - 5 * side) // 2
    tiles_down, tiles_across = height // side, width // side
    rows = np.arange(height)[:, None] - offset
    cols = np.arange(width)[None, :] - offset
    tiled = (rows >= 0) & (rows // side < tiles_down) & (cols >= 0) & (cols // side < tiles_across)
    tile = np.where(tiled, (rows // side) * tiles_across + cols // side, 0)
    i, j = rows % side, cols % side
    sign_key, turn_key = jax.random.split(key)
    signs = random_signs(sign_key, (batch, tiles_down * tiles_across, channels))[:, tile]  # (b, h, w, c)
    turned = jax.random.bernoulli(turn_key, 0.5, (batch, tiles_down * tiles_across))[:, tile]  # (b, h, w)
    size = max(height, width)
    pattern = jnp.where(turned, bump(j, i, side, size), bump(i, j, side, size))
    delta = jnp.where(tiled[None, :, :, None], pattern[..., None] * signs, 0.0)
    return jnp.clip(x + delta * eps / (_l2_norm(delta) + _TINY), 0.0, 1.0)


def l2_proposal(key: jax.Array, x, x_best, eps, side) -> Float[Array, "b h w c"]:
    """Moves the perturbation mass of a random window into another one with a new bump
    (the authors' l2 update), keeping the norm at ``eps``."""
    first_key, second_key, turn_key, sign_key = jax.random.split(key, 4)
    batch, height, width, channels = x.shape
    delta = x_best - x
    inside, rows, cols = square_window(first_key, x.shape, side)
    emptied, _, _ = square_window(second_key, x.shape, side)
    window_norm = _l2_norm(jnp.where(inside, delta, 0.0), (1, 2))
    both_norm = _l2_norm(jnp.where(inside | emptied, delta, 0.0), (1, 2))
    turned = jax.random.bernoulli(turn_key, 0.5, (batch, 1, 1, 1))
    i, j = jnp.where(turned, cols, rows), jnp.where(turned, rows, cols)
    pattern = jnp.where(inside, bump(i, j, side, max(height, width)), 0.0)
    old = jnp.where(inside, delta, 0.0) / (window_norm + 1e-10)
    new = pattern * random_signs(sign_key, (batch, 1, 1, channels)) + old
    room = jnp.maximum(eps**2 - _l2_norm(delta) ** 2, 0.0) / channels + both_norm**2
    new = new / (_l2_norm(new, (1, 2)) + _TINY) * jnp.sqrt(room)
    delta = jnp.where(inside, new, jnp.where(emptied, 0.0, delta))
    return jnp.clip(x + delta * eps / (_l2_norm(delta) + _TINY), 0.0, 1.0)


class _State(NamedTuple):
    iteration: jax.Array  # shared by the examples still searching
    keys: jax.Array  # per example: its proposals' randomness
    x_best: jax.Array
    margin: jax.Array
    loss: jax.Array
    done: jax.Array
    queries: jax.Array


@register_attack("square")
@dataclasses.dataclass(frozen=True)
class Square(ScoreAttack, Segmented):
    """Square Attack in the linf or l2 ball of radius ``eps`` (defaults: AutoAttack's).

    Attributes:
      eps: radius of the threat ball.
      norm: ``"linf"`` or ``"l2"`` (l2 needs images of at least 5 x 5 pixels).
      max_queries: per-example budget, the clean and final checks included; the search
        makes at most ``max_queries - 3`` square proposals after its start point.
      p_init: initial fraction of pixels in the window, in (0, 1].
      loss: ``"margin"`` (``losses.attack_margin``) or ``"ce"`` (cross-entropy of the
        target, or minus that of the label when untargeted); ``None`` is the authors'
        choice: margin untargeted, cross-entropy targeted.
    """

    traceable = ("eps",)

    eps: float | jax.Array = 8 / 255
    norm: str = "linf"
    max_queries: int = 5000
    p_init: float = 0.8
    loss: str | None = None

    def __post_init__(self):
        check_nonnegative_float(self.eps, "eps", traceable=True)
        check_choice(self.norm, NORMS, "norm")
        check_in_interval(self.p_init, "p_init", 0.0, 1.0, closed_high=True)
        if self.loss is not None:
            check_choice(self.loss, LOSSES, "loss")
        self.check_budget()

    @property
    def min_queries(self) -> int:
        return 3  # clean check, start point, final check

    def validate(self, classifier, x, y, key, target) -> None:
        super().validate(classifier, x, y, key, target)
        if self.norm == "l2" and min(x.shape[1:3]) < 5:
            raise ValueError(f"l2 Square needs images of at least 5 x 5 pixels, got {tuple(x.shape[1:3])}")

    def objective(self, logits, y, target) -> Float[Array, " b"]:
        """Per-example loss the search minimises."""
        loss = self.loss or ("margin" if target is None else "ce")
        if loss == "margin":
            return attack_margin(logits, y, target)
        return -attack_cross_entropy(logits, y, target)

    @property
    def segment_length(self) -> int:
        """Iterations between two compactions of the batch (a hundredth of the budget)."""
        return max(10, -(-self.max_queries // 100))

    def start(self, classifier, x, y, key, target) -> _State:
        start_key, loop_key = jax.random.split(key)
        start = linf_start if self.norm == "linf" else l2_start
        clean_margin = attack_margin(classifier(x), y, target)  # the clean check: one query
        attacked = clean_margin >= 0
        x_start = start(start_key, x, self.eps)
        logits = query(classifier, x_start, attacked)
        margin = jnp.where(attacked, attack_margin(logits, y, target), clean_margin)
        return _State(
            iteration=jnp.zeros((), jnp.int32),
            keys=jax.random.split(loop_key, x.shape[0]),
            x_best=select(attacked, x_start, x),
            margin=margin,
            loss=self.objective(logits, y, target),
            done=margin < 0,
            queries=1 + attacked.astype(jnp.int32),
        )

    def active(self, s: _State) -> jax.Array:
        return ~s.done & (s.queries <= self.max_queries - 2)  # room for a query and the final check

    def advance(self, classifier, x, y, target, state: _State) -> _State:
        propose = linf_proposal if self.norm == "linf" else l2_proposal
        starts = jnp.asarray(halving_starts(self.max_queries))
        sides = jnp.asarray(square_sides(self.p_init, x.shape[1], x.shape[2], self.norm))
        end = state.iteration + self.segment_length

        def one_proposal(key, image, best, side):
            return propose(key, image[None], best[None], self.eps, side)[0]

        def step(s: _State) -> _State:
            side = sides[jnp.sum(s.iteration >= starts)]
            keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(s.keys, s.iteration)
            candidate = jax.vmap(one_proposal, in_axes=(0, 0, 0, None))(keys, x, s.x_best, side)
            moving = self.active(s)
            logits = query(classifier, candidate, moving)
            margin, loss = attack_margin(logits, y, target), self.objective(logits, y, target)
            better = moving & (loss < s.loss)
            accept = better | (moving & (margin < 0))
            return s._replace(
                iteration=s.iteration + 1,
                x_best=select(accept, candidate, s.x_best),
                margin=jnp.where(accept, margin, s.margin),
                loss=jnp.where(better, loss, s.loss),
                done=s.done | (accept & (margin < 0)),
                queries=s.queries + moving,
            )

        return jax.lax.while_loop(lambda s: (s.iteration < end) & self.active(s).any(), step, state)

    def finish(self, classifier, x, y, target, state: _State) -> AttackResult:
        return finalize(classifier, state.x_best, y, target, state.queries)
