"""The Classifier contract: a pytree of parameters with a pure forward function.

A :class:`Classifier` holds its parameters (and batch statistics) as pytree leaves and
everything else (the forward function, class count, input shape, normalisation, name) as
static metadata. Because of that, ``jax.jit`` over a classifier compiles once per
architecture, and ``jax.vmap`` over a stack of same-architecture classifiers just works.

Images entering a classifier are float32 NHWC in [0, 1]; the classifier applies its own
mean/std normalisation before the network sees them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, ArrayLike, Float

from robustjax.checks import check_image_batch, check_key

ApplyFn = Callable[[Any, jax.Array], jax.Array]
FeaturesFn = Callable[[Any, jax.Array], Mapping[str, jax.Array]]


@dataclasses.dataclass(frozen=True)
class NNXLogits:
    """``apply_fn`` of a Flax NNX architecture: ``nnx.merge`` then call.

    Equal graph definitions give equal (and equally hashed) instances, so classifiers of
    one architecture share every compiled program.
    """

    graphdef: Any

    def __call__(self, params: Any, x: jax.Array) -> jax.Array:
        return nnx.merge(self.graphdef, params, copy=True)(x)


@dataclasses.dataclass(frozen=True)
class NNXFeatures:
    """``features_fn`` of a Flax NNX architecture.

    Returns the output of every submodule, keyed by its dotted attribute path
    (``"block1.conv"``), every value a layer recorded with
    ``self.sow(nnx.Intermediate, name, value)`` (keyed by that name), and the network
    output as ``"logits"``. A module called several times reports its last call.
    """

    graphdef: Any

    def __call__(self, params: Any, x: jax.Array) -> dict[str, jax.Array]:
        model = nnx.merge(self.graphdef, params)
        _, captured = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(x)
        features = {}
        for path, variable in nnx.to_flat_state(captured):
            parts = [str(part) for part in path if part != "__call__"]
            features[".".join(parts) or "logits"] = variable.get_value()[-1]
        return features


@dataclasses.dataclass(frozen=True)
class LinenLogits:
    """``apply_fn`` of a Flax Linen module: ``module.apply(variables, x, **kwargs)``.

    Linen modules are dataclasses, so equal modules (and keyword arguments) give equal,
    equally hashed instances: classifiers of one architecture share every compiled program.
    """

    module: Any
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __call__(self, variables: Any, x: jax.Array) -> jax.Array:
        return self.module.apply(variables, x, **dict(self.kwargs))


@dataclasses.dataclass(frozen=True)
class LinenFeatures(LinenLogits):
    """``features_fn`` of a Flax Linen module: the output of every submodule call (Linen's
    ``capture_intermediates``), keyed by its dotted path (``"Conv_0"``, ``"block.Dense_1"``),
    and the network output as ``"logits"``. A module called several times reports its last
    call."""

    def __call__(self, variables: Any, x: jax.Array) -> dict[str, jax.Array]:
        logits, state = self.module.apply(variables, x, **dict(self.kwargs), capture_intermediates=True,
                                          mutable=["intermediates"])
        features = {}
        for path, value in jax.tree_util.tree_flatten_with_path(state["intermediates"],
                                                                is_leaf=lambda v: isinstance(v, tuple))[0]:
            parts = [str(p.key) for p in path if getattr(p, "key", "__call__") != "__call__"]
            if parts:
                features[".".join(parts)] = value[-1]
        return features | {"logits": logits}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NoisyParams:
    """The parameters of a randomized classifier: the model's ``weights`` and the PRNG
    ``key`` of its next forward pass's noise (see :meth:`Classifier.randomized`)."""

    weights: Any
    key: jax.Array


@dataclasses.dataclass(frozen=True)
class RandomizedLogits:
    """``apply_fn`` of a randomized classifier: ``forward(weights, x, key)`` on
    :class:`NoisyParams`, so wrappers of ``apply_fn(params, x)`` apply unchanged."""

    forward: Callable[[Any, jax.Array, jax.Array], jax.Array]

    def __call__(self, params: NoisyParams, x: jax.Array) -> jax.Array:
        return self.forward(params.weights, x, params.key)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Classifier:
    """An image classifier as a pytree: ``params`` are leaves, the rest is static.

    Attributes:
      params: parameters and batch statistics, any pytree.
      apply_fn: pure ``apply_fn(params, x_normalised) -> logits`` of shape (B, num_classes).
      num_classes: number of output classes.
      input_shape: (H, W, C) of one image.
      mean, std: per-channel normalisation applied to [0, 1] inputs before ``apply_fn``.
      name: a readable name, used in reports. Like ``apply_fn`` it is static, part of the
        compiled programs' cache key: a renamed classifier (or one wrapping a new ``lambda``)
        compiles anew, so name and wrap a model once, outside loops.
      features_fn: optional pure ``features_fn(params, x_normalised) -> {layer: activations}``.
    """

    params: Any
    apply_fn: ApplyFn = dataclasses.field(metadata=dict(static=True))
    num_classes: int = dataclasses.field(metadata=dict(static=True))
    input_shape: tuple[int, int, int] = dataclasses.field(metadata=dict(static=True))
    mean: tuple[float, ...] = dataclasses.field(default=(0.0,), metadata=dict(static=True))
    std: tuple[float, ...] = dataclasses.field(default=(1.0,), metadata=dict(static=True))
    name: str = dataclasses.field(default="classifier", metadata=dict(static=True))
    features_fn: FeaturesFn | None = dataclasses.field(
        default=None, metadata=dict(static=True)
    )

    def __post_init__(self):
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, (int, np.integer)) \
                or self.num_classes < 2:
            raise ValueError(f"num_classes must be an int >= 2, got {self.num_classes!r}")
        object.__setattr__(self, "num_classes", int(self.num_classes))
        shape = tuple(self.input_shape) if isinstance(self.input_shape, Sequence) else ()
        if len(shape) != 3 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0
                                      for d in shape):
            raise ValueError(f"input_shape must be (H, W, C) positive ints, got {self.input_shape!r}")
        shape = tuple(int(d) for d in shape)
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a string, got {type(self.name).__name__}")
        if not callable(self.apply_fn):
            raise TypeError(f"apply_fn must be a function (params, x) -> logits, got {type(self.apply_fn).__name__}")
        if self.features_fn is not None and not callable(self.features_fn):
            raise TypeError(f"features_fn must be a function or None, got {type(self.features_fn).__name__}")
        channels = shape[-1]
        for field in ("mean", "std"):
            try:
                value = tuple(float(v) for v in getattr(self, field))
            except (TypeError, ValueError):
                raise TypeError(f"{field} must be a sequence of numbers, got {getattr(self, field)!r}") from None
            if len(value) not in (1, channels):
                raise ValueError(
                    f"{field} must have 1 or {channels} (channel) values, got {len(value)}"
                )
            if not all(math.isfinite(v) for v in value):
                raise ValueError(f"{field} must be finite, got {value}")
            object.__setattr__(self, field, value)
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std must be positive, got {self.std}")
        object.__setattr__(self, "input_shape", shape)

    @classmethod
    def from_nnx(
        cls,
        module: nnx.Module,
        *,
        num_classes: int,
        input_shape: tuple[int, int, int],
        mean: tuple[float, ...] = (0.0,),
        std: tuple[float, ...] = (1.0,),
        name: str | None = None,
        batch_statistics: bool = False,
    ) -> Classifier:
        """Wraps a Flax NNX module as a pure classifier; ``module`` itself is left as it was.

        By default the classifier is the module in evaluation mode (batch norm with its
        running averages, dropout off). With ``batch_statistics`` batch norm normalises
        with the statistics of each batch it sees, as in training (dropout stays off, so
        the classifier is still a deterministic function): the mode in which adversarial
        training attacks a batch-norm network. Running averages are never updated through
        a classifier; the training step updates them with its own forward pass.

        Layers that call ``self.sow(nnx.Intermediate, name, value)`` become available
        through :meth:`features`.
        """
        view = nnx.view(module, deterministic=True, use_running_average=not batch_statistics,
                        raise_if_not_found=False)
        graphdef, state = nnx.split(view)
        return cls(
            params=state,
            apply_fn=NNXLogits(graphdef),
            features_fn=NNXFeatures(graphdef),
            num_classes=num_classes,
            input_shape=input_shape,
            mean=mean,
            std=std,
            name=name or type(module).__name__,
        )

    @classmethod
    def randomized(
        cls,
        forward: Callable[[Any, jax.Array, jax.Array], jax.Array],
        weights: Any,
        *,
        key: jax.Array,
        num_classes: int,
        input_shape: tuple[int, int, int],
        mean: tuple[float, ...] = (0.0,),
        std: tuple[float, ...] = (1.0,),
        name: str = "randomized classifier",
    ) -> Classifier:
        """A classifier whose forward pass is random: ``forward(weights, x_normalised, key)
        -> logits`` draws its noise (input noise, random resizing, stochastic activations)
        from ``key``.

        A call is a pure function of the classifier: calling it twice gives the same draw.
        :meth:`redraw` gives the classifier of another draw; attacks with
        ``eot_samples`` (Expectation over Transformation, Athalye et al. 2018) average their
        gradients over fresh draws at every step, and AutoAttack's ``rand`` version runs
        them. Attacks without EOT see one fixed draw per call.
        """
        check_key(key, "key")
        return cls(params=NoisyParams(weights, key), apply_fn=RandomizedLogits(forward), num_classes=num_classes,
                   input_shape=input_shape, mean=mean, std=std, name=name)

    @property
    def is_randomized(self) -> bool:
        """Whether the forward pass draws noise (built by :meth:`randomized`)."""
        return isinstance(self.params, NoisyParams)

    def redraw(self, index: int | jax.Array) -> Classifier:
        """The classifier of another noise draw, the ``index``-th from this one's key
        (``jax.random.fold_in``); a deterministic classifier is returned as it is."""
        if not self.is_randomized:
            return self
        return self.replace(params=NoisyParams(self.params.weights, jax.random.fold_in(self.params.key, index)))

    @classmethod
    def from_linen(
        cls,
        module: Any,
        variables: Any,
        *,
        num_classes: int,
        input_shape: tuple[int, int, int],
        mean: tuple[float, ...] = (0.0,),
        std: tuple[float, ...] = (1.0,),
        name: str | None = None,
        **apply_kwargs: Any,
    ) -> Classifier:
        """Wraps a Flax Linen module and its ``variables`` (what ``module.init`` returns:
        ``params`` and any collections such as ``batch_stats``) as a pure classifier, called
        as ``module.apply(variables, x, **apply_kwargs)``: pass what puts the module in
        evaluation mode (``train=False``, ``deterministic=True``); the values must be
        hashable. Every submodule's output is available through :meth:`features`."""
        if isinstance(module, nnx.Module) or not callable(getattr(module, "apply", None)):
            raise TypeError(f"module must be a Flax Linen module (with .apply), got {type(module).__name__}"
                            + ("; wrap an NNX module with Classifier.from_nnx" if isinstance(module, nnx.Module) else ""))
        kwargs = tuple(sorted(apply_kwargs.items()))
        try:
            hash(kwargs)
        except TypeError:
            raise TypeError(f"the keyword arguments passed to module.apply must be hashable (they key the compiled "
                            f"programs), got {dict(kwargs)!r}") from None
        return cls(params=variables, apply_fn=LinenLogits(module, kwargs), features_fn=LinenFeatures(module, kwargs),
                   num_classes=num_classes, input_shape=input_shape, mean=mean, std=std,
                   name=name or type(module).__name__)

    def normalize(self, x: Float[ArrayLike, "b h w c"]) -> Float[Array, "b h w c"]:
        x = jnp.asarray(x)  # float64 becomes JAX's default float (float32 unless x64 is enabled)
        mean = jnp.asarray(self.mean, x.dtype)
        std = jnp.asarray(self.std, x.dtype)
        return (x - mean) / std

    def __call__(self, x: Float[ArrayLike, "b h w c"]) -> Float[Array, "b k"]:
        """Logits for images ``x`` in [0, 1].

        ``x`` must be a float (B, H, W, C) batch with the classifier's channel count; its
        values are not looked at (a call may be traced), and H and W may differ from
        ``input_shape`` for networks that take any size.
        """
        check_image_batch(x, channels=self.input_shape[-1])
        return self.apply_fn(self.params, self.normalize(x))

    def features(self, x: Float[ArrayLike, "b h w c"]) -> dict[str, jax.Array]:
        """Intermediate activations per layer, for coverage and neuron metrics (``x`` as
        in :meth:`__call__`)."""
        if self.features_fn is None:
            raise ValueError(f"classifier {self.name!r} does not expose intermediate activations")
        check_image_batch(x, channels=self.input_shape[-1])
        return dict(self.features_fn(self.params, self.normalize(x)))

    def replace(self, **changes) -> Classifier:
        return dataclasses.replace(self, **changes)

    @classmethod
    def stack(cls, classifiers: Sequence[Classifier], *, name: str | None = None) -> Classifier:
        """Classifiers of one architecture as one whose parameters gain a leading axis,
        to ``jax.vmap`` over (one row per classifier).

        Every static field but ``name`` must agree; the stack is called ``name``, or the
        common name, or ``"<n> classifiers"`` when the names differ.
        """
        classifiers = list(classifiers)
        if not classifiers or not all(isinstance(c, Classifier) for c in classifiers):
            raise TypeError("stack needs a non-empty sequence of robustjax.Classifier")
        first = classifiers[0]
        structure = jax.tree.structure(first.params)
        for i, other in enumerate(classifiers[1:], start=1):
            for field in ("apply_fn", "num_classes", "input_shape", "mean", "std", "features_fn"):
                if getattr(other, field) != getattr(first, field):
                    raise ValueError(f"cannot stack classifier {i} ({other.name!r}) on classifier 0 ({first.name!r}): "
                                     f"their {field} differ ({getattr(other, field)!r} vs {getattr(first, field)!r})")
            if jax.tree.structure(other.params) != structure:
                raise ValueError(f"cannot stack classifier {i} ({other.name!r}) on classifier 0 ({first.name!r}): "
                                 "their parameter trees differ")
        names = {c.name for c in classifiers}
        stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(c.params for c in classifiers))
        default = first.name if len(names) == 1 else f"{len(classifiers)} classifiers"
        return first.replace(params=stacked, name=name or default)
