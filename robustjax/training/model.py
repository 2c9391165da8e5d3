"""A zoo classifier (or NAS subnet) opened up for training: its parameters, batch
statistics and the rest of its state, and pure forward passes in each mode.

Training-mode passes normalise with each batch's statistics and update the running ones;
with dropout or drop-path on, each pass draws its masks from the key it is given. Attacks see the
network as a :class:`~robustjax.Classifier`: in eval mode (running statistics, as RobustART
makes its training examples) or with batch statistics (as Madry et al. do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from robustjax.classifier import Classifier, NNXLogits
from robustjax.zoo.drop_path import DropPath

State = Any


def _unwrap(apply_fn) -> tuple[Any, Callable[[jax.Array], jax.Array], Callable]:
    """The NNX graph definition under ``apply_fn``, the input transform applied before it
    (a NAS subnet's resize), and how to wrap another graph definition the same way."""
    if isinstance(apply_fn, NNXLogits):
        return apply_fn.graphdef, lambda x: x, NNXLogits
    from robustjax.nas.build import Resized, resize_to  # NAS subnets resize inside apply_fn

    if isinstance(apply_fn, Resized) and isinstance(apply_fn.inner, NNXLogits):
        side = apply_fn.resolution
        return apply_fn.inner.graphdef, lambda x: resize_to(x, side), lambda g: Resized(NNXLogits(g), side)
    raise TypeError(f"training needs a Flax NNX classifier (zoo models and NAS subnets are), got apply_fn "
                    f"{type(apply_fn).__name__}")


@dataclasses.dataclass(frozen=True, eq=False)
class TrainModel:
    """How to run a trainable classifier in each mode (its weights live in the training state).

    Equal for classifiers of one architecture, whatever their weights, so the training step
    of an architecture and settings compiles once per process."""

    classifier: Classifier  # eval form, initial weights
    train_graphdef: Any
    attack_graphdef: Any  # batch-statistics mode, dropout and drop-path off
    prepare: Callable
    wrap: Callable
    has_dropout: bool
    dropout: bool
    drop_path: float  # the network's drop-path rate in training (0: off)

    @classmethod
    def from_classifier(cls, classifier: Classifier, *, dropout: bool = False, drop_path: float = 0.0) -> TrainModel:
        """``dropout``: the model's dropout layers active in training; ``drop_path``: its
        drop-path layers' rate (each layer's share of it, see :mod:`robustjax.zoo.drop_path`)."""
        graphdef, prepare, wrap = _unwrap(classifier.apply_fn)
        module = nnx.merge(graphdef, classifier.params)
        layers = [m for _, m in nnx.iter_modules(module)]
        has_dropout = any(isinstance(m, nnx.Dropout) for m in layers)
        if dropout and not has_dropout:
            raise ValueError(f"technique 'dropout' needs dropout layers, and {classifier.name} has none")
        if not 0.0 <= drop_path < 1.0:
            raise ValueError(f"the drop-path rate must lie in [0, 1), got {drop_path}")
        if drop_path and not any(isinstance(m, DropPath) for m in layers):
            raise ValueError(f"technique 'drop_path' needs drop-path (stochastic depth) layers, and {classifier.name} "
                             "has none; the zoo's vit, deit, swin, mlp_mixer and efficientnet models have them")
        train = nnx.view(module, deterministic=not dropout, use_running_average=False, drop_path_rate=drop_path,
                         raise_if_not_found=False)
        attack = nnx.view(module, deterministic=True, use_running_average=False, drop_path_rate=0.0,
                          raise_if_not_found=False)
        return cls(classifier, nnx.graphdef(train), nnx.graphdef(attack), prepare, wrap, has_dropout, dropout,
                   drop_path)

    def _key(self) -> tuple:
        c = self.classifier
        return (self.train_graphdef, self.attack_graphdef, self.dropout, self.drop_path, c.apply_fn, c.num_classes,
                c.input_shape, c.mean, c.std)

    def __eq__(self, other) -> bool:  # the weights are not part of the identity: one compile per architecture
        return isinstance(other, TrainModel) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def split(self, state: State) -> tuple[State, State, State]:
        """``(params, batch_stats, other)`` of a classifier's state."""
        return nnx.split_state(state, nnx.Param, nnx.BatchStat, ...)

    @staticmethod
    def join(params: State, stats: State, other: State) -> State:
        return nnx.merge_state(params, stats, other)

    def train_logits(self, params, stats, other, x_normalised, key) -> tuple[jax.Array, State]:
        """Logits in training mode and the updated batch statistics."""
        module = nnx.merge(self.train_graphdef, params, stats, other, copy=True)
        if self.dropout or self.drop_path:
            for i, (_, sub) in enumerate(nnx.iter_modules(module)):
                if isinstance(sub, (nnx.Dropout, DropPath)):
                    sub.rngs = nnx.Rngs(dropout=jax.random.fold_in(key, i))["dropout"]
        logits = module(self.prepare(x_normalised))
        return logits, nnx.state(module, nnx.BatchStat)

    def eval_classifier(self, state: State) -> Classifier:
        """The network in eval mode (running statistics, no dropout or drop-path)."""
        return self.classifier.replace(params=state)

    def batch_stats_classifier(self, state: State) -> Classifier:
        """The network normalising with each batch's statistics, dropout and drop-path off."""
        return self.classifier.replace(params=state, apply_fn=self.wrap(self.attack_graphdef), features_fn=None)
