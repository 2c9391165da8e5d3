"""The corruption registry (``names``, ``get``, ``create``) and ``corrupt``, the one entry
point for natural noise.

A corruption is a pure, batched function ``apply(x, c, key) -> x'`` on float32 NHWC
images in [0, 1], where ``c`` holds the constants of one severity. Each corruption is
registered with five severities of constants for two presets:

- ``"imagenet"``: the ImageNet-C constants (Hendrycks & Dietterich, ICLR 2019, and the
  ``imagecorruptions`` package, which extends them to any image size);
- ``"cifar"``: the CIFAR-10-C constants (the same authors' ``make_cifar_c.py``).

``corrupt`` picks the preset from the image size unless told, validates its input on the
host and runs one jitted program per (corruption, severity, preset, shape); the key is a
traced argument, so new keys never recompile.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal

import jax
from jaxtyping import Array, ArrayLike, Float

from robustjax.checks import as_images, check_choice, check_key
from robustjax.registry import Registry
from robustjax.sharding import auto_axes_over_batch

Preset = Literal["imagenet", "cifar"]
PRESETS: tuple[str, ...] = ("imagenet", "cifar")
SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
FAMILIES: tuple[str, ...] = ("noise", "blur", "weather", "digital", "extra")
# Images no larger than this on their longer side get the CIFAR-10-C constants by default.
CIFAR_MAX_SIZE = 64

ApplyFn = Callable[[Float[Array, "b h w c"], Any, jax.Array], Float[Array, "b h w c"]]


@dataclasses.dataclass(frozen=True)
class Corruption:
    """A registered corruption.

    Attributes:
      name: registry name, as in ImageNet-C (``"gaussian_noise"``).
      family: one of ``FAMILIES``.
      apply: ``apply(x, c, key)``, batched and jit-able; ``c`` is one severity's constants.
      constants: preset name -> five per-severity constants (hashable: numbers or tuples).
      stochastic: whether the output depends on the key.
    """

    name: str
    family: str
    apply: ApplyFn
    constants: dict[str, tuple]
    stochastic: bool

    def severity_constants(self, severity: int, preset: str) -> Any:
        return self.constants[preset][severity - 1]


_CORRUPTIONS: Registry[Corruption] = Registry("corruption")


def register_corruption(name: str, *, family: str, imagenet: tuple, cifar: tuple, stochastic: bool):
    """Registers ``apply(x, c, key)`` under ``name`` with five severities per preset."""
    check_choice(family, FAMILIES, "family")

    def decorator(apply: ApplyFn) -> ApplyFn:
        for preset, constants in (("imagenet", imagenet), ("cifar", cifar)):
            if len(constants) != len(SEVERITIES):
                raise ValueError(f"{name}: {preset} needs {len(SEVERITIES)} severities, got {len(constants)}")
        constants_by_preset = {"imagenet": tuple(imagenet), "cifar": tuple(cifar)}
        _CORRUPTIONS.register(name, Corruption(name, family, apply, constants_by_preset, stochastic))
        return apply

    return decorator


def names(family: str | None = None) -> list[str]:
    """Registered corruption names, in registration order, optionally of one family."""
    if family is not None:
        check_choice(family, FAMILIES, "family")
    return [name for name in _CORRUPTIONS if family is None or _CORRUPTIONS[name].family == family]


def get(name: str) -> Corruption:
    """The corruption registered as ``name``."""
    return _CORRUPTIONS.get(name)


def default_preset(image_shape: tuple[int, ...]) -> str:
    """``"cifar"`` for images up to ``CIFAR_MAX_SIZE`` pixels on a side, else ``"imagenet"``."""
    return "cifar" if max(image_shape[:2]) <= CIFAR_MAX_SIZE else "imagenet"


def check_severity(severity) -> None:
    if isinstance(severity, bool) or not isinstance(severity, int) or severity not in SEVERITIES:
        raise ValueError(f"severity must be an integer from 1 to 5, got {severity!r}")


def corrupt(
    x: Float[ArrayLike, "b h w c"],
    name: str,
    severity: int,
    key: jax.Array,
    *,
    preset: Preset | None = None,
) -> Float[Array, "b h w c"]:
    """Applies corruption ``name`` at ``severity`` (1-5) to a batch of images.

    Args:
      x: float32 images (B, H, W, C) in [0, 1]; C is 1 or 3.
      name: a registered corruption (``names()`` lists them).
      severity: 1 (mildest) to 5.
      key: PRNG key; deterministic corruptions ignore it.
      preset: ``"imagenet"`` or ``"cifar"`` constants; by default chosen from the image size.

    Returns:
      The corrupted images, float32, same shape, in [0, 1].
    """
    get(name)
    check_severity(severity)
    x = as_images(x)
    check_key(key)
    if x.shape[-1] not in (1, 3):
        raise ValueError(f"x must have 1 or 3 channels, got shape {tuple(x.shape)}")
    preset = default_preset(tuple(x.shape[1:3])) if preset is None else preset
    check_choice(preset, PRESETS, "preset")
    return _corrupt_jit(name, severity, preset, x, key)


def create(name: str, severity: int, preset: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The pure ``(x, key) -> x'`` of one corruption and severity, to compose inside other
    jitted code (it does not validate ``x``: :func:`corrupt` does)."""
    corruption = get(name)
    check_severity(severity)
    check_choice(preset, PRESETS, "preset")
    constants = corruption.severity_constants(severity, preset)

    def apply(x: jax.Array, key: jax.Array) -> jax.Array:
        return jax.numpy.clip(corruption.apply(x, constants, key), 0.0, 1.0).astype(x.dtype)

    return lambda x, key: auto_axes_over_batch(apply, x)(x, key)




@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _corrupt_jit(name: str, severity: int, preset: str, x: jax.Array, key: jax.Array) -> jax.Array:
    return create(name, severity, preset)(x, key)
