"""Data parallelism for evaluation: fixed-size padded batches sharded over local devices,
and for populations of networks a second mesh axis that splits the networks."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset


class DataParallel:
    """Pads batches to a fixed size and shards them over a mesh of every device (of every
    host in a multi-host run, ``robustjax.distributed``), or of ``devices``: ``network_shards``
    x the rest, axes ("networks", "batch"). Examples split over "batch"; a population's
    per-network leaves split over "networks" (its size must then divide by
    ``network_shards``), so each device runs its networks on its examples. Every process
    reads the same examples and places its own devices' shards."""

    def __init__(self, batch_size: int, devices: list | None = None, *, network_shards: int = 1):
        devices = jax.devices() if devices is None else list(devices)
        if isinstance(network_shards, bool) or not isinstance(network_shards, int) or network_shards < 1 \
                or len(devices) % network_shards:
            raise ValueError(f"network_shards must be an integer >= 1 that divides the {len(devices)} devices, "
                             f"got {network_shards!r}")
        self.network_shards = network_shards
        example_shards = len(devices) // network_shards
        self.mesh = jax.make_mesh((network_shards, example_shards), ("networks", "batch"), devices=devices,
                                  axis_types=(AxisType.Auto, AxisType.Auto))
        # Round up so that every device gets the same number of examples.
        self.batch_size = -(-batch_size // example_shards) * example_shards
        self.sharded = NamedSharding(self.mesh, PartitionSpec("batch"))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.by_network = NamedSharding(self.mesh, PartitionSpec("networks"))

    def replicate(self, tree):
        return jax.device_put(tree, self.replicated)

    def place_population(self, params, axes):
        """``params`` on the mesh: leaves with a network axis (``axes`` 0) split over
        "networks", shared ones (None) replicated."""
        if isinstance(axes, tuple):
            return tuple(self.place_population(p, a) for p, a in zip(params, axes))
        if axes is None:
            return self.replicate(params)
        networks = jax.tree.leaves(params)[0].shape[0]
        if networks % self.network_shards:
            raise ValueError(f"a population of {networks} networks does not split over {self.network_shards} "
                             "network shards: make the population size a multiple of it")
        return jax.device_put(params, self.by_network)

    def batches(self, dataset: ImageDataset, limit: int | None) -> Iterator[tuple[jax.Array, jax.Array, np.ndarray]]:
        """Yields sharded ``(x, y)`` and the host mask of real (not padding) examples."""
        for x, y in dataset.batches(self.batch_size, limit=limit):
            real = len(y)
            pad = self.batch_size - real
            if pad:
                x = np.concatenate([x, np.repeat(x[:1], pad, axis=0)])
                y = np.concatenate([y, np.repeat(y[:1], pad, axis=0)])
            mask = np.arange(self.batch_size) < real
            yield jax.device_put(x, self.sharded), jax.device_put(y, self.sharded), mask


@jax.jit
def predict(classifier: Classifier, x: jax.Array) -> jax.Array:
    """Top-1 predicted classes."""
    return jnp.argmax(classifier(x), axis=-1)
