"""ImageNet-C's ``jpeg_compression`` corruption: the libjpeg-exact round trip of
:mod:`robustjax.ops.jpeg` at each severity's quality."""

from __future__ import annotations

import jax
from jaxtyping import Array, Float

from robustjax.noise.registry import register_corruption
from robustjax.ops.jpeg import round_trip


@register_corruption(
    "jpeg_compression",
    family="digital",
    imagenet=(25, 18, 15, 10, 7),  # imagecorruptions / make_imagenet_c.py
    cifar=(80, 65, 58, 50, 40),  # make_cifar_c.py
    stochastic=False,
)
def jpeg_compression(x: Float[Array, "b h w c"], quality: int, key: jax.Array) -> Float[Array, "b h w c"]:
    """ImageNet-C ``jpeg_compression``: a JPEG round trip at the severity's quality."""
    del key
    return round_trip(x, quality)
