"""Evaluation plans: which attacks to run, on how many examples, in what batches.

A plan file is TOML or JSON::

    batch_size = 250          # examples per compiled batch (default 128)
    num_examples = 1000       # optional: evaluate only the first N examples
    seed = 0                  # PRNG seed for the attacks' randomness

    [[attacks]]
    name = "pgd"              # a registered attack (robustjax.attacks.names())
    eps = [0.05, 0.1, 0.2]    # a list of epsilons runs as one vmapped sweep
    restarts = 1              # random restarts, vmapped; the per-example worst case is kept
    steps = 10                # any other field of the attack's config

Every attack config is built (and so validated) when the plan is read, before anything
runs, so a malformed plan fails at once with a message naming the bad entry.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from importlib import resources
from pathlib import Path

from robustjax import attacks
from robustjax.attacks.base import Attack

PLAN_KEYS = {"batch_size", "num_examples", "seed", "attacks"}


@dataclasses.dataclass(frozen=True)
class AttackRun:
    """One plan entry: an attack, the epsilons it sweeps (empty: its own) and its restarts."""

    attack: Attack
    eps: tuple[float, ...] = ()
    restarts: int = 1

    @property
    def swept(self) -> bool:
        return len(self.eps) > 1 or self.restarts > 1

    def entries(self) -> list[dict]:
        """The parameters of each report entry this run produces, one per epsilon."""
        params = {**self.attack.params(), "restarts": self.restarts}
        return [{**params, "eps": eps} for eps in self.eps] if self.eps else [params]


@dataclasses.dataclass(frozen=True)
class Plan:
    """A validated evaluation plan."""

    runs: tuple[AttackRun, ...]
    batch_size: int = 128
    num_examples: int | None = None
    seed: int = 0

    def __post_init__(self):
        _positive_int(self.batch_size, "batch_size")
        _positive_int(self.num_examples, "num_examples", allow_none=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"plan: seed must be an integer >= 0, got {self.seed!r}")

    def as_dict(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "num_examples": self.num_examples,
            "seed": self.seed,
            "attacks": [{"name": run.attack.name, **params} for run in self.runs for params in run.entries()],
        }


def _positive_int(value, where: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"plan: {where} must be an integer >= 1, got {value!r}")


def _attack_run(index: int, entry) -> AttackRun:
    where = f"attacks[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise ValueError(f"plan: {where} must be a table with a string 'name', got {entry!r}")
    params = {k: v for k, v in entry.items() if k not in ("name", "restarts")}
    restarts = entry.get("restarts", 1)
    _positive_int(restarts, f"{where}.restarts")
    grid = params.get("eps")
    if isinstance(grid, list):
        if not grid:
            raise ValueError(f"plan: {where}.eps is an empty list")
        params["eps"] = grid[0]
    try:
        attack = attacks.make(entry["name"], **params)
        for eps in grid if isinstance(grid, list) else []:
            attacks.make(entry["name"], **{**params, "eps": eps})  # validates every epsilon
    except (TypeError, ValueError) as error:
        raise ValueError(f"plan: {where} ({entry['name']}): {error}") from None
    has_eps = any(f.name == "eps" for f in dataclasses.fields(attack))
    if restarts > 1 and not has_eps:
        raise ValueError(f"plan: {where} ({entry['name']}): restarts need an attack with an eps")
    eps = tuple(grid) if isinstance(grid, list) else (attack.eps,) if has_eps else ()
    return AttackRun(attack=attack, eps=eps, restarts=restarts)


def plan_from_dict(raw: dict) -> Plan:
    """A :class:`Plan` from parsed TOML/JSON, validating every field."""
    if not isinstance(raw, dict):
        raise ValueError(f"plan: expected a table at the top level, got {type(raw).__name__}")
    if unknown := sorted(set(raw) - PLAN_KEYS):
        raise ValueError(f"plan: unknown key(s) {unknown}; allowed keys are {sorted(PLAN_KEYS)}")
    entries = raw.get("attacks", [])
    if not isinstance(entries, list):
        raise ValueError(f"plan: 'attacks' must be a list of tables, got {type(entries).__name__}")
    runs = tuple(_attack_run(i, entry) for i, entry in enumerate(entries))
    settings = {key: raw[key] for key in ("batch_size", "num_examples", "seed") if key in raw}
    return Plan(runs=runs, **settings)


def builtin_plans() -> list[str]:
    """Names of the plans that ship with robustjax (``robustjax/evaluation/plans``)."""
    folder = resources.files("robustjax.evaluation").joinpath("plans")
    return sorted(entry.name.removesuffix(".toml") for entry in folder.iterdir() if entry.name.endswith(".toml"))


def load_plan(spec: str | Path) -> Plan:
    """Reads a ``.toml`` or ``.json`` plan file, or a built-in plan by name (``whitebox``)."""
    path = Path(spec)
    if path.is_file():
        text, source, is_json = path.read_text(), str(path), path.suffix == ".json"
    elif str(spec) in builtin_plans():
        text = resources.files("robustjax.evaluation").joinpath("plans", f"{spec}.toml").read_text()
        source, is_json = f"built-in plan {spec!r}", False
    else:
        raise ValueError(f"no plan file at {str(spec)!r}, and no built-in plan of that name ({builtin_plans()})")
    try:
        raw = json.loads(text) if is_json else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"plan {source}: not valid {'JSON' if is_json else 'TOML'}: {error}") from None
    return plan_from_dict(raw)


def default_plan(dataset_name: str) -> Plan:
    """The built-in plan: ``digits`` for the embedded digits, ``default`` otherwise."""
    return load_plan("digits" if dataset_name.startswith("digits") else "default")
