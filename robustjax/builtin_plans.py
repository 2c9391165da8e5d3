"""The plans that ship with robustjax (``robustjax/evaluation/plans/NAME.toml``), found without
importing the evaluation code, so that the command line's help can list them cheaply."""

from __future__ import annotations

import tomllib
from importlib import resources


def _folder():
    return resources.files("robustjax").joinpath("evaluation", "plans")


def builtin_plans() -> list[str]:
    """Names of the built-in plans, sorted."""
    return sorted(entry.name.removesuffix(".toml") for entry in _folder().iterdir() if entry.name.endswith(".toml"))


def evaluation_plans() -> list[str]:
    """The built-in plans ``robustjax evaluate`` runs: those without a ``[training]`` table
    (which only a sweep over models runs)."""
    return [name for name in builtin_plans() if "training" not in tomllib.loads(builtin_plan_text(name))]


def builtin_plan_text(name: str) -> str:
    """The TOML text of built-in plan ``name``."""
    return _folder().joinpath(f"{name}.toml").read_text(encoding="utf-8")
