"""The layers of robustjax, as README.md's Layout section draws them: a module imports
only from the layers below its own, and from a sibling of its own layer only where
``STANDS_ON`` says that sibling is below it; no module takes a private name (``_x``) of
another. Read from the source with ``ast`` (imports inside functions count too), and,
for each package of the middle layer, from what importing it loads in a fresh process."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "robustjax"

# Bottom to top. A unit is a top-level module or sub-package of robustjax; ``robustjax`` is
# the package's face (its __init__, which hands every sub-package on).
LAYERS = (
    # the Classifier and the data, and the low-level ops beneath everything
    ("builtin_plans", "checkpoints", "checks", "classifier", "compile_cache", "data", "distributed", "fast_conv",
     "files", "losses", "ops", "output_folder", "precision", "registry", "sharding", "xla_flags"),
    # attacks, noise, metrics, zoo and NAS
    ("attacks", "certify", "metrics", "nas", "noise", "zoo"),
    # training, evaluation, plans and sweeps
    ("evaluation", "sweep", "training"),
    # the command line and reports
    ("cli", "report", "robustjax"),
)
# Within a layer, the siblings each unit may import: they stand below it.
STANDS_ON = {
    "builtin_plans": {"registry"},
    "checks": {"distributed"},
    "classifier": {"checks"},
    "data": {"checks"},
    "fast_conv": {"classifier", "ops"},
    "ops": {"checks", "sharding"},
    "precision": {"checks", "classifier"},
    "nas": {"zoo"},
    "evaluation": {"training"},
    "sweep": {"evaluation", "training"},
    "cli": {"report"},
}
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """``robustjax.zoo.layers`` -> ``zoo``; ``robustjax`` -> ``robustjax``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def may_import(importer: str, imported: str) -> bool:
    return (importer == imported or LAYER[imported] < LAYER[importer]
            or imported in STANDS_ON.get(importer, ()))


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def imports(path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` of each robustjax import in ``path``, anywhere in it: ``name``
    is what ``from module import name`` takes (None for ``import module``). ``import
    robustjax`` counts as an import of each ``robustjax.X`` the module then reads."""
    module = module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    face_names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "robustjax":
                    face_names.add(alias.asname or alias.name)
                elif alias.name.startswith("robustjax."):
                    found.append((node.lineno, alias.name, None))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the importer's package, or from one above it
                parts = module.split(".")
                base = parts[: len(parts) + (path.name == "__init__.py") - node.level]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source != "robustjax" and not source.startswith("robustjax."):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.append((node.lineno, submodule, None) if is_module(submodule) else
                             (node.lineno, source, alias.name))
    for node in ast.walk(tree):  # robustjax.X.Y read through the face
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in face_names
                and is_module(f"robustjax.{node.attr}")):
            found.append((node.lineno, f"robustjax.{node.attr}", None))
    return found


def private_attributes(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of each ``X._name`` where ``X`` is bound by a robustjax import."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {alias.asname or alias.name.split(".")[0] for alias in node.names
                      if alias.name.split(".")[0] == "robustjax"}
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "robustjax"):
            bound |= {alias.asname or alias.name for alias in node.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                found.append((node.lineno, ast.unparse(node)))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_unit_has_a_layer():
    units = {unit(module_name(path)) for path in SOURCES}
    assert units - LAYER.keys() == set(), "give these a layer in LAYERS (and in README.md's Layout section)"
    assert LAYER.keys() - units == set(), "these are gone: take them out of LAYERS"
    for importer, below in STANDS_ON.items():
        assert all(LAYER[sibling] == LAYER[importer] for sibling in below), f"{importer}: siblings only"
    remaining = {importer: set(below) for importer, below in STANDS_ON.items()}
    while remaining:  # within a layer, who stands on whom must not run in a circle
        ready = {importer for importer, below in remaining.items() if not below & remaining.keys()}
        assert ready, f"STANDS_ON runs in a circle among {sorted(remaining)}"
        for importer in ready:
            del remaining[importer]


def test_no_module_imports_a_layer_above_it_or_a_sibling_that_does_not_stand_below_it():
    upward = []
    for path in SOURCES:
        importer = module_name(path)
        for line, module, _ in imports(path):
            if not may_import(unit(importer), unit(module)):
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module} "
                              f"({unit(importer)}, layer {LAYER[unit(importer)]} -> {unit(module)}, "
                              f"layer {LAYER[unit(module)]})")
    assert not upward, "\n".join(upward)


def test_no_module_takes_a_private_name_of_another():
    taken = []
    for path in SOURCES:
        importer = module_name(path)
        for line, module, name in imports(path):
            if name is not None and is_private(name) and module != importer:
                taken.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name} from {module}")
        taken += [f"{path.relative_to(PACKAGE.parent)}:{line} reads {text}" for line, text in private_attributes(path)]
    assert not taken, "\n".join(taken)


@pytest.mark.parametrize("package", LAYERS[1])
def test_importing_a_middle_layer_package_loads_nothing_above_it(package):
    """``import robustjax.attacks`` loads no zoo, NAS or evaluation; ``import robustjax.zoo``
    no NAS: what the static graph says, as Python runs it."""
    code = f"import sys, robustjax.{package}; print(' '.join(m for m in sys.modules if m.startswith('robustjax.')))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert run.returncode == 0, run.stderr
    loaded = run.stdout.split()
    assert f"robustjax.{package}" in loaded
    above = [m for m in loaded if not may_import(package, unit(m))]
    assert not above, f"importing robustjax.{package} loads {above}"
