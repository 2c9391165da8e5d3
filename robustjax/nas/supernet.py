"""A weight-sharing supernet: one set of weights from which every subnet of a space takes its part.

``Supernet.create(space, key=...)`` initialises one; ``Supernet.load(folder)`` reads one
saved with :meth:`Supernet.save` (orbax weights plus ``supernet.json`` naming its space).
``supernet.subnet(arch, calibration=images)`` is the standalone subnet with its sliced
weights and recalibrated batch norm, as a :class:`~robustjax.Classifier`;
``supernet.classifier(arch, ...)`` runs the subnet through the supernet itself.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from robustjax.checks import read_json_object
from robustjax.classifier import Classifier
from robustjax.nas import build
from robustjax.nas.bignas import BigNASSpace
from robustjax.nas.nb201 import NB201Space
from robustjax.nas.recalibrate import recalibrate
from robustjax.zoo.weights import load_weights, save_weights

_KINDS = {"nb201": NB201Space, "bignas": BigNASSpace}
DESCRIPTION_FILE = "supernet.json"


def describe_space(space: build.Space) -> dict:
    """A JSON-able description that :func:`space_from_description` turns back into the space."""
    kind = next(kind for kind, cls in _KINDS.items() if isinstance(space, cls))
    return {"kind": kind, **dataclasses.asdict(space)}


def space_from_description(description: dict) -> build.Space:
    def tuples(value):
        return tuple(tuples(v) for v in value) if isinstance(value, list) else value

    fields = {k: tuples(v) for k, v in description.items() if k != "kind"}
    return _KINDS[description["kind"]](**fields)


def through_supernet(module: nnx.Module, x: jax.Array, choice: Any) -> jax.Array:
    """Runs the subnet ``choice`` through a supernet module."""
    return module(x, choice)


@dataclasses.dataclass(frozen=True)
class Supernet:
    """A space and its supernet's state (parameters and batch statistics)."""

    space: build.Space
    graphdef: Any
    state: nnx.State

    @classmethod
    def create(cls, space: build.Space, *, key: jax.Array) -> Supernet:
        graphdef, state = nnx.split(build.build_supernet(space, key=key))
        return cls(space, graphdef, state)

    @classmethod
    def from_module(cls, space: build.Space, module: nnx.Module) -> Supernet:
        graphdef, state = nnx.split(module)
        return cls(space, graphdef, state)

    def module(self) -> nnx.Module:
        """A fresh module holding (a copy of) the state."""
        return nnx.merge(self.graphdef, jax.tree.map(lambda a: a, self.state))

    def subnet_module(self, arch: Any) -> nnx.Module:
        """The standalone network of ``arch`` with its sliced weights (batch statistics too)."""
        return build.slice_subnet(self.space, self.module(), arch)

    def subnet(self, arch: Any, *, calibration: np.ndarray | None = None, batch_size: int = 256,
               name: str | None = None) -> Classifier:
        """The standalone subnet ``arch`` as a classifier.

        With ``calibration`` images (float NHWC in [0, 1], e.g. 4,096 training images), its
        batch-norm statistics are recalibrated on them first (see ``nas.recalibrate``);
        without, it keeps the supernet's running statistics.
        """
        config = self.space.resolve(arch)
        module = self.subnet_module(config)
        if calibration is not None:
            module = recalibrate(module, self.prepare(calibration, config), batch_size=batch_size)
        return build.as_classifier(self.space, module, config, name=name or config.arch_id)

    def classifier(self, arch: Any, *, calibration: np.ndarray | None = None, batch_size: int = 256,
                   name: str | None = None) -> Classifier:
        """Subnet ``arch`` run through the supernet (masks or op weights as data), optionally
        with batch norm recalibrated for it; equals :meth:`subnet`'s logits."""
        config = self.space.resolve(arch)
        module = self.module()
        if calibration is not None:
            module = recalibrate(module, self.prepare(calibration, config), batch_size=batch_size,
                                 forward=through_supernet, choice=build.choice(self.space, config))
        return build.supernet_classifier(self.space, module, config, name=name or config.arch_id)

    def prepare(self, images: np.ndarray, arch: Any) -> np.ndarray:
        """[0, 1] images as the network of ``arch`` takes them: normalised and resized."""
        images = np.asarray(images, np.float32)
        if images.ndim != 4 or images.shape[1:] != self.space.input_shape:
            shape = ", ".join(map(str, self.space.input_shape))
            raise ValueError(f"{self.space.name} takes images of shape (N, {shape}), got {images.shape}")
        normalised = (images - np.float32(self.space.mean)) / np.float32(self.space.std)
        return np.asarray(build.resize_to(normalised, build.resolution(self.space, arch)))

    def save(self, folder: str | Path, *, extra: dict | None = None) -> Path:
        """Writes ``weights/`` (orbax) and ``supernet.json`` (the space, and ``extra``)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_weights(folder / "weights", self.state)
        description = {"space": describe_space(self.space), **(extra or {})}
        (folder / DESCRIPTION_FILE).write_text(json.dumps(description, indent=2) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | Path, *, space: build.Space | None = None) -> Supernet:
        """Reads a saved supernet; with ``space``, refuses one saved for another space."""
        folder = Path(folder)
        path = folder / DESCRIPTION_FILE
        if not path.is_file():
            raise ValueError(f"{str(folder)!r} holds no supernet (no {DESCRIPTION_FILE})")
        stored = space_from_description(read_json_object(path, required=("space",))["space"])
        if space is not None and stored != space:
            theirs, ours = describe_space(stored), describe_space(space)
            differ = ", ".join(f"{k}={theirs[k]} (expected {ours.get(k)})" for k in theirs if theirs[k] != ours.get(k))
            raise ValueError(f"{str(folder)!r} holds a supernet of {stored.name}, not of {space.name}: {differ}")
        # built with shapes only: the stored weights replace every array
        graphdef, empty = nnx.split(nnx.eval_shape(lambda: build.build_supernet(stored, key=jax.random.key(0))))
        return cls(stored, graphdef, load_weights(folder / "weights", empty))
