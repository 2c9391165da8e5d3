"""Data parallelism for evaluation: fixed-size padded batches sharded over local devices."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset


class DataParallel:
    """Pads batches to a fixed size and shards them over a 1-D mesh of the local devices
    (or of ``devices``)."""

    def __init__(self, batch_size: int, devices: list | None = None):
        devices = jax.local_devices() if devices is None else list(devices)
        self.mesh = jax.make_mesh((len(devices),), ("batch",), devices=devices, axis_types=(AxisType.Auto,))
        # Round up so that every device gets the same number of examples.
        self.batch_size = -(-batch_size // len(devices)) * len(devices)
        self.sharded = NamedSharding(self.mesh, PartitionSpec("batch"))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())

    def replicate(self, tree):
        return jax.device_put(tree, self.replicated)

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
