"""The search-space contract and the registry of spaces (``names``, ``get``, ``create``).

A search space is a frozen value: ``len(space)`` networks, numbered ``0 .. len - 1``;
``space.config(i)`` and ``space.index(config)`` map both ways; ``space.sample(key, n)`` draws
configs (optionally inside a FLOPs window); ``space.cost(config)`` gives parameters and
FLOPs. A config is a frozen, hashable dataclass with a stable string ``arch_id``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from robustjax.registry import Registry

# Input normalisations of the spaces' datasets (the networks normalise [0, 1] images).
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CIFAR_MEAN = (125.3 / 255, 123.0 / 255, 113.9 / 255)  # NAS-Bench-201's CIFAR statistics
CIFAR_STD = (63.0 / 255, 62.1 / 255, 66.7 / 255)
DIGITS_MEAN, DIGITS_STD = (0.3052,), (0.3761,)  # the embedded digits' training split


@dataclasses.dataclass(frozen=True)
class Cost:
    """What one forward pass of one image costs.

    ``params`` counts trainable parameters (batch-norm statistics excluded, as PyTorch's
    ``parameters()`` does); ``macs`` counts the multiply-accumulates of convolutions and
    linear layers (the convention of the NAS papers' "MACs"/"FLOPs" columns); ``flops`` is
    ``2 * macs``.
    """

    params: int
    macs: int

    @property
    def flops(self) -> int:
        return 2 * self.macs


@runtime_checkable
class SearchSpace(Protocol):
    """What every search space offers (see the module docstring)."""

    name: str

    def __len__(self) -> int: ...
    def config(self, index: int) -> Any: ...
    def index(self, config: Any) -> int: ...
    def cost(self, config: Any) -> Cost: ...
    def sample(self, key: jax.Array, n: int, *, flops_range: tuple[float, float] | None = None,
               unique: bool = True) -> list[Any]: ...


def check_index(space: SearchSpace, index: Any) -> int:
    """``index`` as a Python int in ``[0, len(space))``, or a ValueError naming the range."""
    if isinstance(index, bool) or not isinstance(index, int | np.integer):
        raise TypeError(f"{space.name}: an architecture index must be an int, got {type(index).__name__}")
    if not 0 <= int(index) < len(space):
        raise ValueError(f"{space.name}: index {int(index)} is out of range [0, {len(space)})")
    return int(index)


def sample_indices(space: SearchSpace, key: jax.Array, n: int, *, flops_range: tuple[float, float] | None,
                   unique: bool, max_draws: int | None = None) -> list[int]:
    """``n`` indices drawn uniformly (without repeats when ``unique``), keeping only networks
    whose FLOPs lie in ``flops_range = (lo, hi)`` (inclusive).

    Draws are made in order from one NumPy generator seeded by ``key``, so the same key
    gives the same list, and a longer list starts with the shorter one.
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if unique and n > len(space):
        raise ValueError(f"{space.name}: cannot draw {n} distinct networks from {len(space)}")
    if flops_range is not None:
        lo, hi = flops_range
        if not lo <= hi:
            raise ValueError(f"flops_range must be (lo, hi) with lo <= hi, got {flops_range}")
    rng = np.random.default_rng(key_seed(key))
    max_draws = max_draws or max(1000, 200 * n)
    chosen: list[int] = []
    seen: set[int] = set()
    for _ in range(max_draws):
        if len(chosen) == n:
            break
        index = int(rng.integers(len(space)))
        if unique and index in seen:
            continue
        seen.add(index)
        if flops_range is not None and not lo <= space.cost(space.config(index)).flops <= hi:
            continue
        chosen.append(index)
    if len(chosen) < n:
        raise ValueError(
            f"{space.name}: found only {len(chosen)} of {n} networks with FLOPs in {flops_range} "
            f"after {max_draws} draws; widen the range"
        )
    return chosen


def key_seed(key: jax.Array) -> list[int]:
    """The words of a JAX PRNG key, to seed host-side (NumPy) draws from it."""
    if isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    words = np.asarray(key)
    if words.dtype != np.uint32:
        raise TypeError(f"expected a JAX PRNG key (jax.random.key(seed)), got {type(key).__name__} {words.dtype}")
    return words.ravel().tolist()


_SPACES: Registry[Callable[..., SearchSpace]] = Registry("search space")


def register_space(name: str):
    """Registers ``factory(**options) -> SearchSpace`` under ``name``."""

    def decorator(factory: Callable[..., SearchSpace]) -> Callable[..., SearchSpace]:
        return _SPACES.register(name, factory)

    return decorator


def names() -> list[str]:
    """Names of the registered search spaces, in registration order."""
    return _SPACES.names()


def get(name: str) -> Callable[..., SearchSpace]:
    """The factory ``factory(**options) -> SearchSpace`` registered as ``name``."""
    return _SPACES.get(name)


def space_doc(name: str) -> str:
    """The description of registered space ``name`` (its factory's docstring)."""
    return (get(name).__doc__ or "").strip()


def create(name: str, **options) -> SearchSpace:
    """The search space ``name`` (``names()`` lists them), built with ``options``."""
    return get(name)(**options)


space = create  # the name the README and the command line build spaces by: rj.nas.space("nb201")
