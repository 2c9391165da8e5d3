"""Drop-path, or stochastic depth (Huang et al., "Deep Networks with Stochastic Depth",
ECCV 2016), as timm's ``DropPath``: in training, the output of a residual branch is zeroed
for each example with probability ``p`` and scaled by ``1 / (1 - p)`` where kept, so its
expectation is unchanged; at evaluation it is the identity.

A layer is built inactive (``rate`` 0) and knows only its ``scale``, its share of the
network's rate: timm's rule raises the rate linearly along depth, block ``i`` of ``n``
dropping with ``drop_path_rate * i / (n - 1)`` (:func:`linear_scales`). Training turns it
on with ``nnx.view(model, drop_path_rate=r)``, which sets each layer's rate to
``r * scale``, and gives each layer a random stream ``rngs``. Blocks add a branch through
:func:`residual`, which skips an inactive layer, so the network's outputs and the features
it exposes are those of a network without drop-path until training turns it on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class DropPath(nnx.Module):
    """Per-example drop of a residual branch with probability ``rate`` (0: identity)."""

    def __init__(self, scale: float):
        self.scale = float(scale)
        self.rate = 0.0
        self.rngs = nnx.data(None)  # an nnx.RngStream while training

    def set_view(self, drop_path_rate: float | None = None):
        """``nnx.view``'s hook: this layer's rate becomes ``drop_path_rate * scale``."""
        if drop_path_rate is not None:
            self.rate = float(drop_path_rate) * self.scale

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        kept = jax.random.bernoulli(self.rngs(), keep, (x.shape[0],) + (1,) * (x.ndim - 1))
        return jnp.where(kept, x / keep, jnp.zeros_like(x))


def residual(x: jax.Array, branch: jax.Array, layer: DropPath) -> jax.Array:
    """``x + layer(branch)``, the inactive layer not called at all."""
    return x + (layer(branch) if layer.rate else branch)


def linear_scales(depth: int) -> list[float]:
    """timm's stochastic-depth decay rule: ``linspace(0, 1, depth)``, block ``i``'s share."""
    return [float(s) for s in np.linspace(0.0, 1.0, depth)]
