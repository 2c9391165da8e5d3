"""Stored weights: plain nested dicts of arrays in an orbax checkpoint.

Weights are saved as ``nnx.to_pure_dict(state)`` rather than the NNX state object, so the
files do not depend on Flax's internal state layout. Loading checks every tensor's name
and shape and names each one that is missing, unexpected or of the wrong shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx


def _flat(tree) -> dict[str, Any]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path, simple=True, separator="."): leaf for path, leaf in flat}


def _shape(value) -> tuple[int, ...]:
    """Shape of an array or of an abstract ``jax.ShapeDtypeStruct``."""
    return tuple(getattr(value, "shape", np.shape(value)))


def save_weights(path: str | Path, state: nnx.State) -> None:
    """Writes the state's arrays to ``path`` (a directory, replaced if present)."""
    tree = jax.tree.map(np.asarray, nnx.to_pure_dict(state))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(Path(path).resolve(), tree, force=True)


def check_compatible(expected: dict, given: dict, source: str) -> None:
    """Raises a ValueError naming every missing, unexpected or wrongly shaped tensor."""
    expected, given = _flat(expected), _flat(given)
    problems = [f"missing {name} {_shape(v)}" for name, v in expected.items() if name not in given]
    problems += [f"unexpected {name} {_shape(v)}" for name, v in given.items() if name not in expected]
    problems += [
        f"{name} has shape {_shape(given[name])}, expected {_shape(v)}"
        for name, v in expected.items()
        if name in given and _shape(given[name]) != _shape(v)
    ]
    if problems:
        raise ValueError(f"{source} does not fit the model: " + "; ".join(problems))


def _keys_like(expected, stored):
    """``stored`` with its keys typed as in ``expected``: orbax writes the integer keys of
    list layers (``nnx.List``) as strings."""
    if not isinstance(expected, dict) or not isinstance(stored, dict):
        return stored
    typed = {str(key): key for key in expected}
    return {typed.get(str(k), k): _keys_like(expected.get(typed.get(str(k), k)), v) for k, v in stored.items()}


def load_weights(path: str | Path, state: nnx.State) -> nnx.State:
    """A copy of ``state`` with its arrays replaced by those stored at ``path`` (``state``
    itself is left as it was). ``state`` may be abstract (``jax.ShapeDtypeStruct`` leaves,
    from ``nnx.eval_shape``)."""
    path = Path(path).resolve()
    if not path.is_dir():
        raise ValueError(f"no weights at {str(path)!r}")
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            stored = checkpointer.restore(path)
    except Exception as error:  # orbax's errors for an unreadable folder have no common type
        raise ValueError(f"{str(path)!r} is not a weights checkpoint orbax can read: {error}") from None
    expected = nnx.to_pure_dict(state)
    stored = _keys_like(expected, stored)
    check_compatible(expected, stored, str(path))
    stored = jax.tree.map(lambda e, s: np.asarray(s, dtype=e.dtype), expected, stored)
    restored = jax.tree.map(lambda leaf: leaf, state)  # a new State: the caller's is not modified
    nnx.replace_by_pure_dict(restored, stored)
    return restored
