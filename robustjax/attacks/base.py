"""The attack contract: frozen configs called as pure functions, and their registry.

An attack is a frozen, hashable dataclass of hyperparameters. Calling it validates the
inputs on the host, then runs one jitted program with the config as a static argument,
except its traceable numbers (epsilon, step sizes), which the program takes as
arguments: each (architecture, attack config, input shape) compiles exactly once,
whatever those numbers.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from robustjax.checks import check_batch, check_key, check_nonnegative_float, check_positive_int
from robustjax.classifier import Classifier
from robustjax.fast_conv import with_fast_convolutions
from robustjax.losses import attack_margin
from robustjax.registry import Registry
from robustjax.sharding import auto_axes_over_batch


class AttackResult(NamedTuple):
    """What every attack returns, per example.

    Attributes:
      x_adv: adversarial images, inside the threat set and the [0, 1] box.
      success: the classifier, re-run on ``x_adv``, no longer predicts the label
        (untargeted) or predicts the target (targeted).
      queries: model evaluations (forward, or forward and backward) spent on the example,
        the final check of ``x_adv`` included.
      margin: distance from success on ``x_adv`` (see ``losses.attack_margin``);
        negative exactly when ``success``.
    """

    x_adv: Float[Array, "b h w c"]
    success: Bool[Array, " b"]
    queries: Int[Array, " b"]
    margin: Float[Array, " b"]


class Attack(abc.ABC):
    """Base of all attacks: ``attack(classifier, x, y, *, key, target=None) -> AttackResult``."""

    name: str = ""
    supports_targeted: bool = True
    # Number fields (epsilon, step sizes) that enter the compiled program as float32
    # arguments, so new values do not recompile; they may hold a JAX scalar (traced in a
    # user's program, or concrete). None (a default rule) stays part of the static config.
    traceable: tuple[str, ...] = ()

    def __call__(
        self,
        classifier: Classifier,
        x: Float[ArrayLike, "b h w c"],
        y: Int[ArrayLike, " b"],
        *,
        key: jax.Array | None = None,
        target: Int[ArrayLike, " b"] | None = None,
    ) -> AttackResult:
        self.validate(classifier, x, y, key, target)
        static, fields = split_traceable(self)
        return _run(static, classifier, *as_arrays(x, y, target), key, fields)

    def validate(self, classifier, x, y, key, target) -> None:
        """Host-side checks of a call's arguments, before anything is traced."""
        if not isinstance(classifier, Classifier):
            raise TypeError(f"classifier must be a robustjax.Classifier, got {type(classifier).__name__}")
        check_batch(classifier, x, y, target)
        if target is not None and not self.supports_targeted:
            raise ValueError(f"attack {self.name!r} has no targeted mode")
        if key is None:
            raise TypeError(f"attack {self.name!r} needs a PRNG key: call it with key=jax.random.key(seed)")
        check_key(key)

    def sweep(
        self,
        classifier: Classifier,
        x: Float[ArrayLike, "b h w c"],
        y: Int[ArrayLike, " b"],
        *,
        key: jax.Array | None = None,
        eps: Sequence[float] | None = None,
        restarts: int = 1,
        target: Int[ArrayLike, " b"] | None = None,
    ) -> AttackResult:
        """Runs every epsilon of ``eps`` with ``restarts`` random restarts each, as one
        compiled program (``vmap`` over epsilons and restart keys).

        Returns an :class:`AttackResult` with a leading epsilon axis holding, for each
        epsilon and example, the worst case over restarts: the restart with the lowest
        margin (a successful one whenever any succeeded). ``queries`` adds up all restarts.
        ``eps=None`` sweeps only the attack's own epsilon. Attacks that run compacted
        (:class:`~robustjax.attacks.compaction.Segmented`) sweep as a nested search on a
        batch on one device.
        """
        grid = self.check_sweep(classifier, x, y, key, eps, restarts, target)
        static, fields = split_traceable(self)
        return _sweep(static, restarts, classifier, *as_arrays(x, y, target), key, jnp.asarray(grid, jnp.float32),
                      fields)

    def check_sweep(self, classifier, x, y, key, eps, restarts, target) -> np.ndarray | jax.Array:
        """Validates a :meth:`sweep` call; returns its epsilons (a traced array when any is traced)."""
        if not any(f.name == "eps" for f in dataclasses.fields(self)):
            raise ValueError(f"attack {self.name!r} has no eps to sweep")
        grid = (self.eps,) if eps is None else tuple(eps)
        if not grid:
            raise ValueError("eps must list at least one epsilon")
        for value in grid:
            check_nonnegative_float(value, "every eps", traceable=True)
        check_positive_int(restarts, "restarts")
        self.validate(classifier, x, y, key, target)
        if any(isinstance(value, jax.core.Tracer) for value in grid):
            return jnp.asarray(grid, jnp.float32)
        return np.asarray(grid, np.float32)

    @abc.abstractmethod
    def run(self, classifier: Classifier, x, y, key, target) -> AttackResult:
        """The traced attack; inputs are already validated."""

    def params(self) -> dict:
        """Hyperparameters, for reports."""
        return dataclasses.asdict(self)


def as_arrays(x, y, target) -> tuple:
    """Validated inputs as JAX arrays: float32 images (the dtype policy of
    :func:`robustjax.checks.as_images`), int32 labels and targets."""
    return (jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32),
            None if target is None else jnp.asarray(target, jnp.int32))


# Stands for a traceable field's value in the static half of a split attack.
_PASSED_AS_ARGUMENT = "<passed as an argument>"


def split_traceable(attack: Attack) -> tuple[Attack, dict[str, jax.Array | np.float32]]:
    """``attack`` as a hashable static config, equal for any values of its traceable
    fields, plus those that hold numbers as float32 scalars, which the compiled program
    takes as arguments (see ``Attack.traceable``).

    Python and NumPy numbers become NumPy scalars (no device array, so a batch on one
    device stays there), JAX scalars (concrete or traced) float32 JAX scalars.
    """
    fields = {name: jnp.asarray(value, jnp.float32) if isinstance(value, jax.Array) else np.float32(value)
              for name in attack.traceable if (value := getattr(attack, name)) is not None}
    if not fields:
        return attack, {}
    return with_traced_fields(attack, **dict.fromkeys(fields, _PASSED_AS_ARGUMENT)), fields


@functools.partial(jax.jit, static_argnums=0)
def _run(attack: Attack, classifier, x, y, target, key, fields) -> AttackResult:
    """``attack`` with its traced ``fields``, run on the batch. The fields pass an
    optimization barrier: a value that is a constant of a caller's program is then not
    folded into the arithmetic and rounds as where it is an argument (the compacted run),
    a difference that finite-difference estimates would magnify."""
    attack = with_traced_fields(attack, **jax.lax.optimization_barrier(fields))
    run = auto_axes_over_batch(lambda c, x, y, t, k: attack.run(with_fast_convolutions(c), x, y, k, t), x)
    return run(classifier, x, y, target, key)


def with_traced_fields(attack: Attack, **fields) -> Attack:
    """A copy of ``attack`` whose fields hold traced values, for use inside a transformation.

    Host-side validation is skipped: the values are checked before tracing.
    """
    clone = copy.copy(attack)
    for name, value in fields.items():
        object.__setattr__(clone, name, value)
    return clone


@functools.partial(jax.jit, static_argnums=(0, 1))
def _sweep(attack: Attack, restarts: int, classifier, x, y, target, key, grid, fields) -> AttackResult:
    grid, fields = jax.lax.optimization_barrier((grid, fields))  # as in _run
    attack = with_traced_fields(attack, **fields)
    return auto_axes_over_batch(functools.partial(_sweep_grid, attack, restarts), x, batch_dim=1)(
        classifier, x, y, target, key, grid)


def _sweep_grid(attack: Attack, restarts: int, classifier, x, y, target, key, grid) -> AttackResult:
    keys = jax.random.split(key, restarts)

    def one(eps, restart_key):
        return with_traced_fields(attack, eps=eps).run(with_fast_convolutions(classifier), x, y, restart_key, target)

    runs = jax.vmap(lambda eps: jax.vmap(lambda k: one(eps, k))(keys))(grid)  # (eps, restart, batch, ...)
    worst = jnp.argmin(runs.margin, axis=1)  # (eps, batch)

    def pick(values):
        index = worst.reshape(worst.shape[:1] + (1,) + worst.shape[1:] + (1,) * (values.ndim - 3))
        return jnp.take_along_axis(values, index, axis=1)[:, 0]

    return AttackResult(x_adv=pick(runs.x_adv), success=pick(runs.success),
                        queries=runs.queries.sum(axis=1), margin=pick(runs.margin))


# The noise draw of a randomized classifier that judges an attack's result: one no attack
# step queries (steps use ``redraw(step)``), so a point fitted to the draws it was found
# on is not judged by one of them.
CHECK_DRAW = 2**31 - 1


def finalize(classifier: Classifier, x_adv, y, target, queries) -> AttackResult:
    """Re-evaluates ``x_adv`` with the classifier (one more query; a fresh noise draw of a
    randomized one) and packs the result."""
    margin = attack_margin(classifier.redraw(CHECK_DRAW)(x_adv), y, target)
    return AttackResult(x_adv=x_adv, success=margin < 0, queries=queries + 1, margin=margin)


_ATTACKS: Registry[type[Attack]] = Registry("attack")


def register_attack(name: str):
    """Class decorator adding an attack config class to the registry under ``name``."""

    def decorator(cls: type[Attack]) -> type[Attack]:
        _ATTACKS.register(name, cls)
        cls.name = name
        return cls

    return decorator


def names() -> list[str]:
    """Names of the registered attacks, in registration order."""
    return _ATTACKS.names()


def get(name: str) -> type[Attack]:
    """The attack class registered as ``name``."""
    return _ATTACKS.get(name)


def create(name: str, **params) -> Attack:
    """An attack from its registered name and hyperparameters (as in a plan file)."""
    cls = get(name)
    fields = {f.name for f in dataclasses.fields(cls)}
    if unknown := sorted(set(params) - fields):
        raise ValueError(f"attack {name!r} has no parameter(s) {unknown}; its parameters are {sorted(fields)}")
    return cls(**params)
