"""Host-side validation of the public contracts, run before anything is traced.

Every check raises ``ValueError`` or ``TypeError`` naming what was expected and what was
given. Checks run on concrete arrays only; inside a trace they check shapes and dtypes and
skip value checks (a traced array has no values to look at).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from robustjax.distributed import to_host


def concrete_values(a) -> np.ndarray | None:
    """The values of ``a``, or None when ``a`` is being traced."""
    if isinstance(a, jax.core.Tracer):
        return None
    return to_host(a)


def check_image_batch(x, *, name: str = "x", channels: int | None = None) -> None:
    """``x`` must be a floating-point (B, H, W, C) array, with ``channels`` channels when
    given: the checks that need no values, so they hold for traced arrays as well."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be an array of images, got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"{name} must be a batch of images (B, H, W, C), got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        hint = " (divide uint8 images by 255)" if jnp.issubdtype(x.dtype, jnp.integer) else ""
        raise TypeError(f"{name} must be floating-point images in [0, 1], got dtype {x.dtype}{hint}")
    if channels is not None and x.shape[-1] != channels:
        raise ValueError(f"{name} has {x.shape[-1]} channels, the classifier expects {channels}")


def check_images(x, *, name: str = "x", input_shape: tuple[int, ...] | None = None) -> None:
    """Images must be floating-point NHWC with values in [0, 1] and no NaN.

    Any floating dtype passes (float16, bfloat16, float32, float64); :func:`as_images`
    casts them to float32, the dtype robustjax computes in.
    """
    check_image_batch(x, name=name)
    if x.shape[0] == 0:
        raise ValueError(f"{name} is an empty batch (shape {x.shape})")
    if input_shape is not None and tuple(x.shape[1:]) != tuple(input_shape):
        raise ValueError(
            f"{name} has image shape {tuple(x.shape[1:])}, the classifier expects {tuple(input_shape)}"
        )
    values = concrete_values(x)
    if values is None:
        return
    if np.isnan(values).any():
        raise ValueError(f"{name} contains NaN")
    lo, hi = float(values.min()), float(values.max())
    if lo < 0.0 or hi > 1.0:
        raise ValueError(f"{name} must have values in [0, 1], got range [{lo:.4g}, {hi:.4g}]")


def as_images(x, *, name: str = "x", input_shape: tuple[int, ...] | None = None) -> jax.Array:
    """``x`` checked by :func:`check_images` and cast to a float32 array.

    The dtype policy of every public entry point: images of any floating dtype are
    accepted and computed on in float32 (a bfloat16 step of 8/255 near 1 would be 16
    rounding units wide); what comes back is float32.
    """
    check_images(x, name=name, input_shape=input_shape)
    return jnp.asarray(x, jnp.float32)


def check_labels(y, *, num_classes: int | None, batch_size: int, name: str = "y") -> None:
    """Labels must be integers of shape (B,) in [0, num_classes) (from 0 when ``num_classes``
    is None); an error lists the offending values."""
    if not hasattr(y, "shape") or not hasattr(y, "dtype"):
        raise TypeError(f"{name} must be an int array of labels, got {type(y).__name__}")
    if y.shape != (batch_size,):
        raise ValueError(f"{name} must have shape ({batch_size},), got {tuple(y.shape)}")
    if not np.issubdtype(y.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, got dtype {y.dtype}")
    values = concrete_values(y)
    if values is None or values.size == 0:
        return
    if values.min() >= 0 and (num_classes is None or values.max() < num_classes):
        return
    bad = values < 0 if num_classes is None else (values < 0) | (values >= num_classes)
    found, counts = np.unique(values[bad], return_counts=True)
    pairs = zip(found[:5].tolist(), counts[:5].tolist())
    listed = [f"{value} ({count} label{'s' * (count > 1)})" for value, count in pairs]
    if found.size > 5:
        listed.append(f"{found.size - 5} more value{'s' * (found.size > 6)}")
    *first, last = listed
    found_text = f"{', '.join(first)} and {last}" if first else last
    expected = "from 0" if num_classes is None else f"in [0, {num_classes})"
    raise ValueError(f"{name} must be class indices {expected}, found {found_text}")


def check_precision(classifier) -> None:
    """Refuses a classifier with float64 parameters (``jax_enable_x64``): attacks and noise
    compute on float32 images, in float32 or bfloat16 (``robustjax.precision``)."""
    wide = sorted({str(np.dtype(leaf.dtype)) for leaf in jax.tree.leaves(classifier.params) if hasattr(leaf, "dtype")
                   and jnp.issubdtype(leaf.dtype, jnp.floating) and np.dtype(leaf.dtype).itemsize > 4})
    if wide:
        raise TypeError(f"model {classifier.name!r} has {wide[0]} parameters; robustjax computes on float32 images, "
                        "in float32 or bfloat16: cast the model first, e.g. classifier.replace(params=jax.tree.map("
                        "lambda p: p.astype(jnp.float32) if jnp.issubdtype(p.dtype, jnp.floating) else p, "
                        "classifier.params))")


def check_batch(classifier, x, y, target=None) -> None:
    """Validates the classifier's precision, and images, labels and optional attack targets
    against it."""
    check_precision(classifier)
    check_images(x, input_shape=classifier.input_shape)
    check_labels(y, num_classes=classifier.num_classes, batch_size=x.shape[0])
    if target is None:
        return
    check_labels(target, num_classes=classifier.num_classes, batch_size=x.shape[0], name="target")
    labels, targets = concrete_values(y), concrete_values(target)
    if labels is not None and targets is not None and (same := np.flatnonzero(labels == targets)).size:
        raise ValueError(
            f"target equals the true label for {same.size} example(s), first at index {same[0]}"
        )


# Counts (steps, queries, sizes) become int32 loop bounds and shapes in the compiled program.
LARGEST_COUNT = 2**31 - 1


def check_positive_int(value, name: str) -> None:
    """``value`` must be an integer from 1 to LARGEST_COUNT (a Python or numpy integer, not an array)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= LARGEST_COUNT:
        raise ValueError(f"{name} must be an integer >= 1 and <= {LARGEST_COUNT}, got {value!r}")


def check_unroll(unroll) -> None:
    """A loop's ``unroll``: None (chosen per backend), True, False or a factor >= 1."""
    if unroll is None or isinstance(unroll, bool):
        return
    check_positive_int(unroll, "unroll")


def _number(value, name: str, traceable: bool) -> float | None:
    """The value of a scalar hyperparameter, or None when it is traced.

    Python and numpy numbers pass. A 0-d JAX array passes only where ``traceable`` (a
    hyperparameter the program takes as an argument, so new values do not recompile).
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    if isinstance(value, jax.Array):
        if not traceable:
            raise TypeError(f"{name} must be a Python number (it is fixed when the program compiles), got a JAX array")
        if value.shape != () or not jnp.issubdtype(value.dtype, jnp.number):
            raise TypeError(f"{name} must be a scalar number, got an array of shape {value.shape} and dtype {value.dtype}")
        values = concrete_values(value)
        return None if values is None else float(values)
    raise TypeError(f"{name} must be a number, got {type(value).__name__}")


# Hyperparameters are computed on in float32, whose largest value is 3.4e38: a larger one
# would overflow to inf in the program (and 0 * inf makes NaN images), and arithmetic on
# one near that limit (PGD's 2.5 * eps / steps) overflows too. No radius or step needs
# more: the L1 diameter of the [0, 1] box of a 4096 x 4096 x 3 image is 5e7.
LARGEST_HYPERPARAMETER = 1e30


def check_nonnegative_float(value, name: str, *, traceable: bool = False) -> float | None:
    """``value`` must be a finite number in [0, LARGEST_HYPERPARAMETER] (see :func:`_number`
    for ``traceable``); returns its value (None when traced)."""
    number = _number(value, name, traceable)
    if number is not None and (not math.isfinite(number) or number < 0):
        raise ValueError(f"{name} must be finite and >= 0, got {number!r}")
    if number is not None and number > LARGEST_HYPERPARAMETER:
        raise ValueError(f"{name} must be at most {LARGEST_HYPERPARAMETER:g} (it is computed on in float32), "
                         f"got {number!r}")
    return number


def check_positive_float(value, name: str, *, traceable: bool = False) -> None:
    if check_nonnegative_float(value, name, traceable=traceable) == 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def check_in_interval(
    value, name: str, low: float, high: float, *, closed_low: bool = False, closed_high: bool = False
) -> None:
    """``value`` must be a number in the interval from ``low`` to ``high`` (open unless closed)."""
    number = _number(value, name, traceable=False)
    above = number >= low if closed_low else number > low
    below = number <= high if closed_high else number < high
    if not (math.isfinite(number) and above and below):
        interval = f"{'[' if closed_low else '('}{low}, {high}{']' if closed_high else ')'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")


def check_choice(value, choices, name: str) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")


def check_bool(value, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_key(key, name: str = "key") -> None:
    """``key`` must be one PRNG key: ``jax.random.key(seed)``, or a legacy uint32 (2,) key."""
    if not isinstance(key, jax.Array):
        raise TypeError(f"{name} must be a JAX PRNG key (jax.random.key(seed)), got {type(key).__name__}")
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if not (typed and key.shape == () or key.dtype == jnp.uint32 and key.shape == (2,)):
        raise TypeError(f"{name} must be one JAX PRNG key (jax.random.key(seed)), got an array of shape "
                        f"{tuple(key.shape)} and dtype {key.dtype}")


def check_flags(flags, name: str, shape: tuple[int, ...] | None = None) -> None:
    """``flags`` must be a boolean (or 0/1 integer) array, of ``shape`` when given, not empty."""
    if not hasattr(flags, "shape") or not hasattr(flags, "dtype"):
        raise TypeError(f"{name} must be a boolean array, got {type(flags).__name__}")
    if flags.dtype != np.bool_ and not np.issubdtype(flags.dtype, np.integer):
        raise TypeError(f"{name} must be boolean (or 0/1 integers), got dtype {flags.dtype}")
    if shape is not None and tuple(flags.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(flags.shape)}")
    if flags.size == 0:
        raise ValueError(f"{name} is empty (shape {tuple(flags.shape)})")
    values = concrete_values(flags)
    if values is not None and values.dtype != np.bool_ and not np.isin(values, (0, 1)).all():
        raise ValueError(f"{name} must hold only 0 and 1, got values {np.unique(values)[:5]}")


def check_examples_seen(count, what: str) -> None:
    """An accumulator's ``count`` must be above 0 (checked on concrete values only)."""
    values = concrete_values(count)
    if values is not None and not (values > 0).all():
        raise ValueError(f"{what}: no examples seen yet (update it with at least one batch)")


def check_layer_widths(widths) -> None:
    """``widths`` must map at least one layer name to a number of neurons >= 1."""
    if not widths:
        raise ValueError("widths must name at least one layer")
    for name, width in widths.items():
        check_positive_int(width, f"width of layer {name!r}")


def read_json_object(path, required: tuple[str, ...] = ()) -> dict:
    """The JSON object stored at ``path``, holding every key of ``required``; anything else
    (binary content, invalid JSON, another type, a missing key) is a ValueError naming the file."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{str(path)!r} is not a JSON file: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object, holds {type(value).__name__}")
    missing = [key for key in required if key not in value]
    if missing:
        raise ValueError(f"{str(path)!r} lacks {', '.join(map(repr, missing))}")
    return value
