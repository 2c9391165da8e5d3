"""``Registry``: the named values of one kind, with one duplicate check, one listing and one
"did you mean" error.

Every named family offers the same three verbs, backed by a ``Registry``: ``names()`` (in
registration order), ``get(name)`` (the registered entry) and ``create(name, ...)`` (the
configured value):

- attacks: ``robustjax.attacks`` (the attack class; an attack config);
- corruptions: ``robustjax.noise`` (a ``Corruption``; its pure ``(x, key)`` function);
- models: ``robustjax.zoo`` (a ``ModelEntry``; a ``Classifier``);
- search spaces: ``robustjax.nas`` (the space's factory; a ``SearchSpace``);
- built-in plans: ``robustjax.builtin_plans`` (the TOML text; a ``Plan``);
- training techniques: ``robustjax.training.techniques`` (a ``Technique``; ``Techniques``);
- perturbation sequences: ``robustjax.noise.sequences`` (a ``Perturbation``; its pure
  ``(x, key)`` function).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


def unknown_name(kind: str, name: object, known: Iterable[str]) -> ValueError:
    """The error for ``name`` not among the ``known`` names of a ``kind``: it suggests the
    closest names (``difflib``) and lists all of them, sorted."""
    known = sorted(known)
    close = difflib.get_close_matches(str(name), known, n=3)
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    return ValueError(f"unknown {kind} {name!r}{hint}; known {kind}s: {known}")


class Registry(Generic[T]):
    """Values registered under unique names, in registration order.

    ``kind`` names what it holds (``"attack"``) in its error messages.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._values: dict[str, T] = {}

    def register(self, name: str, value: T) -> T:
        """Adds ``value`` under ``name`` and returns it; a name is registered only once."""
        if name in self._values:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._values[name] = value
        return value

    def get(self, name: str) -> T:
        """The value registered as ``name``; a ValueError suggests close names otherwise."""
        if not isinstance(name, str) or name not in self._values:
            raise unknown_name(self.kind, name, self._values)
        return self._values[name]

    __getitem__ = get

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._values)

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)
