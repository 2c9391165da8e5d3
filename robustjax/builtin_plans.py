"""The plans that ship with robustjax (``robustjax/evaluation/plans/NAME.toml``): ``names()``
and ``get(name)`` (the TOML text), found without importing the evaluation code, so that the
command line's help can list them cheaply. The plan family's ``create(name)``, which reads and
validates one into a ``Plan``, is ``robustjax.evaluation.plan.create``, a layer above."""

from __future__ import annotations

import functools
import tomllib
from importlib import resources

from robustjax.registry import Registry


@functools.cache
def _plans() -> Registry[str]:
    """The built-in plans' TOML texts, registered in the order of their names."""
    plans: Registry[str] = Registry("plan")
    folder = resources.files("robustjax").joinpath("evaluation", "plans")
    for entry in sorted(folder.iterdir(), key=lambda entry: entry.name):
        if entry.name.endswith(".toml"):
            plans.register(entry.name.removesuffix(".toml"), entry.read_text(encoding="utf-8"))
    return plans


def names() -> list[str]:
    """Names of the built-in plans, sorted."""
    return _plans().names()


def get(name: str) -> str:
    """The TOML text of built-in plan ``name``."""
    return _plans().get(name)


def evaluation_plans() -> list[str]:
    """The built-in plans ``robustjax evaluate`` runs: those without a ``[training]`` table
    (which only a sweep over models runs)."""
    return [name for name in names() if "training" not in tomllib.loads(get(name))]
