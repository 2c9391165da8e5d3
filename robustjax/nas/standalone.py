"""NAS-Bench-201's standalone trained networks (each cell with its own weights) as one population.

``from_networks(space, archs, networks)`` embeds each network's weights in the supernet's
layout (the inverse of ``nb201_net.subnet_weights``: the ops a cell does not choose get zero
weights and neutral batch-norm statistics) and stacks parameters, batch statistics and op
choices on a leading network axis, so one compiled program runs networks of any cells.
``load_folder(space, folder, archs)`` reads the networks from a folder with one entry per
NAS-Bench-201 index::

    folder/11472/               # `robustjax zoo convert nas.SPACE CKPT --arch 11472 --out folder/11472`
    folder/11472.pth            # or .pt, .bin, .ckpt, .safetensors: an xautodl TinyNetwork state dict

Index names may be zero-padded (``011472.pth``). PyTorch files are read weights-only (no
pickled code runs) and converted with :func:`~robustjax.nas.convert.convert_nb201`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from robustjax.checks import read_json_object
from robustjax.classifier import Classifier
from robustjax.nas import build, nb201_net
from robustjax.nas.bignas import BigNASSpace
from robustjax.nas.convert import convert_nb201
from robustjax.nas.models import DEFAULT_ARCH
from robustjax.nas.nb201 import NB201Config, NB201Space
from robustjax.nas.population import Population, resolve_configs
from robustjax.nas.space import space as get_space
from robustjax.zoo.convert import TORCH_SUFFIXES, TorchWeights, load_state_dict
from robustjax.zoo.weights import check_compatible, load_weights

SUFFIXES = (".safetensors", *TORCH_SUFFIXES)
_SLOTS = {"nor_conv_1x1": "conv1x1", "nor_conv_3x3": "conv3x3"}  # a conv op -> its SuperCell weights


def from_networks(space: build.Space, archs: Sequence[Any], networks: Sequence[Any], *,
                  sequential: bool = False) -> Population:
    """Standalone NB201 networks of cells ``archs`` (same C, N and classes: ``space``'s) as one
    population. ``networks[i]`` holds the weights of ``archs[i]``: an ``NB201Network`` module,
    its state (parameters and batch statistics), a classifier of it (``Supernet.subnet``) or
    its ``nnx.to_pure_dict`` layout (``convert_nb201``, :func:`load_folder`); ``sequential``:
    the networks run one after another, each computing only its own ops (``Population``)."""
    _check_nb201(space, "from_networks")
    configs = resolve_configs(space, archs)
    if len(networks) != len(configs):
        raise ValueError(f"from_networks: {len(configs)} archs but {len(networks)} networks")
    module = nnx.eval_shape(lambda: nb201_net.NB201Supernet(space, rngs=nnx.Rngs(params=jax.random.key(0))))
    module.eval()
    graphdef, state = nnx.split(module)
    layout = nnx.to_pure_dict(state)
    embedded = []
    for position, (config, network) in enumerate(zip(configs, networks)):
        weights = _pure(network, f"network {position} ({config.arch_id})")
        check_network(space, config, weights, f"network {position} ({config.arch_id})")
        embedded.append(embed(weights, config, layout))
    nnx.replace_by_pure_dict(state, jax.tree.map(lambda *leaves: jnp.asarray(np.stack(leaves)), *embedded))
    params, stats = nnx.split_state(state, nnx.Param, nnx.BatchStat)
    choices = jnp.asarray(np.stack([build.choice(space, config, op_indices=sequential) for config in configs]))
    classifier = Classifier(
        params=(params, stats, choices),
        apply_fn=build.Resized(build.SupernetLogits(graphdef), build.resolution(space, configs[0])),
        num_classes=space.num_classes, input_shape=space.input_shape, mean=space.mean, std=space.std,
        name=f"population of standalone {space.name} networks")
    return Population(classifier, (0, 0, 0), tuple(config.arch_id for config in configs), sequential)


def network(space: build.Space, arch: Any, weights: Mapping) -> Classifier:
    """The standalone network of ``arch`` with ``weights`` (a pure dict, :func:`load_folder`'s)
    at its own shapes, as a classifier: what counts its own neurons."""
    config = space.resolve(arch)
    check_network(space, config, _pure(weights, config.arch_id), config.arch_id)
    module = build.build_network(space, config, key=jax.random.key(0))
    state = nnx.state(module)
    nnx.replace_by_pure_dict(state, _like(nnx.to_pure_dict(state), _str_keys(weights)))
    nnx.update(module, state)
    module.eval()
    return build.as_classifier(space, module, config, name=config.arch_id)


def embed(weights: Mapping, config: NB201Config, layout: Mapping) -> dict:
    """A standalone network's weights (``subnet_weights``'s layout) in the supernet's
    ``layout`` (its pure dict): the ops the cell does not choose get zero weights, and
    batch-norm statistics mean 0, variance 1."""
    weights = _str_keys(weights)
    out = {name: _like(part, weights[name]) for name, part in layout.items() if name != "cells"}
    cells = {}
    for index, cell in layout["cells"].items():
        given = weights["cells"].get(str(index), {})
        if "conv_a" in cell:  # a residual reduction block
            cells[index] = _like(cell, given)
            continue
        layers = given.get("layers", {})
        cells[index] = {slot: {edge: _like(part, layers[str(edge)]) if _SLOTS.get(config.ops[edge]) == slot
                               else _neutral(part) for edge, part in edges.items()}
                        for slot, edges in cell.items()}
    out["cells"] = cells
    return out


def check_network(space: NB201Space, config: NB201Config, weights: Mapping, source: str) -> None:
    """Raises a one-line ValueError when ``weights`` (a pure dict) are not those of the
    standalone network of ``config`` in ``space``, naming what was expected and found."""
    weights = _str_keys(weights)
    expected = _expected(space, config)
    found_macro, expected_macro = _describe_macro(weights), _describe_macro(expected)
    if found_macro != expected_macro:
        raise ValueError(f"{source}: expected a network of {space.name} ({expected_macro}), found {found_macro}"
                         f"{_first_difference(expected, weights)}")
    wanted = _describe_convs({edge: nb201_net.CONV_KERNELS[op] for edge, op in enumerate(config.ops)
                              if op in nb201_net.CONV_KERNELS})
    for cell, convs in enumerate(_cell_convs(weights)):
        if _describe_convs(convs) != wanted:
            raise ValueError(f"{source}: the cell {config.arch_string} has convolutions {wanted}, "
                             f"normal cell {cell} of these weights has {_describe_convs(convs)}")
    check_compatible(expected, weights, source)


def load_folder(space: build.Space, folder: str | Path, archs: Sequence[Any]) -> list[dict]:
    """The networks of ``archs`` read from ``folder`` (one entry per NAS-Bench-201 index: a
    ``robustjax zoo convert`` folder ``{index}/`` or a TinyNetwork state dict ``{index}.pth``,
    see the module's docstring), as pure dicts for :func:`from_networks`."""
    _check_nb201(space, "load_folder")
    configs = resolve_configs(space, archs)
    entries = folder_entries(folder)
    check_present(folder, entries, configs)
    return [(_load_converted if entries[config.index].is_dir() else _load_state_dict)(
        space, config, entries[config.index]) for config in configs]


def folder_entries(folder: str | Path) -> dict[int, Path]:
    """The networks of a :func:`load_folder` folder: NAS-Bench-201 index -> its file or folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"no folder at {str(folder)!r}")
    entries: dict[int, Path] = {}
    for path in sorted(folder.iterdir()):
        name = path.name if path.is_dir() else path.stem
        if name.isdigit() and (path.is_dir() or path.suffix in SUFFIXES):
            if int(name) in entries:
                raise ValueError(f"{str(folder)!r} holds index {int(name)} twice: {entries[int(name)].name} "
                                 f"and {path.name}")
            entries[int(name)] = path
    return entries


def check_present(folder: str | Path, entries: Mapping[int, Path], configs: Sequence[NB201Config]) -> None:
    """Refuses, naming how many and the first few, the ``configs`` that ``entries`` (the
    folder's :func:`folder_entries`) lack."""
    missing = [config.index for config in configs if config.index not in entries]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise ValueError(f"{str(folder)!r} lacks {len(missing)} of the {len(configs)} requested architectures "
                         f"(indices {shown}); expected a folder {{index}}/ or a file {{index}}.pth per architecture")


def _load_state_dict(space: NB201Space, config: NB201Config, path: Path) -> dict:
    source = f"{config.arch_id} ({path})"
    try:
        weights = TorchWeights(load_state_dict(path), source)
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None
    converted = convert_nb201(weights)  # its errors, and check_all_used's, name the source
    weights.check_all_used()
    check_network(space, config, converted, source)
    return converted


def _load_converted(space: NB201Space, config: NB201Config, folder: Path) -> dict:
    source = f"{config.arch_id} ({folder})"
    card_path = folder / "card.json"
    if not card_path.is_file():
        raise ValueError(f"{source}: no card.json; write the folder with `robustjax zoo convert nas.{space.name} "
                         f"CHECKPOINT --arch {config.index} --out {folder}`")
    card = read_json_object(card_path, required=("name", "num_classes"))
    options = dict(card.get("build_kwargs") or {})
    arch = options.pop("arch", DEFAULT_ARCH["nb201"])
    try:
        theirs = get_space(str(card["name"]).removeprefix("nas."), num_classes=card["num_classes"], **options)
    except (ValueError, TypeError):
        theirs = None
    if not isinstance(theirs, NB201Space):
        raise ValueError(f"{source}: holds weights of {card['name']!r}, not a NAS-Bench-201 network")
    if _space_macro(theirs) != _space_macro(space):
        raise ValueError(f"{source}: expected a network of {space.name} ({_describe(*_space_macro(space))}), "
                         f"found one of {theirs.name} ({_describe(*_space_macro(theirs))})")
    if theirs.index(arch) != config.index:
        raise ValueError(f"{source}: holds {theirs.resolve(arch).arch_id}, not {config.arch_id}")
    abstract = nnx.state(nnx.eval_shape(lambda: build.build_network(space, config, key=jax.random.key(0))))
    state = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), abstract)
    try:
        return nnx.to_pure_dict(load_weights(folder / "weights", state))
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None


def _check_nb201(space: Any, caller: str) -> None:
    if isinstance(space, BigNASSpace):
        raise ValueError(f"{caller}: {space.name} is a BigNAS space; standalone BigNAS networks of one architecture "
                         "stack with Population.stack (populations of mixed BigNAS shapes are not supported yet)")
    build.check_space(space)


def _pure(network: Any, source: str) -> dict:
    if isinstance(network, Classifier):
        network = network.params
    if isinstance(network, nnx.Module):
        network = nnx.state(network)
    if isinstance(network, nnx.State):
        network = nnx.to_pure_dict(network)
    if not isinstance(network, Mapping):
        raise TypeError(f"{source}: expected an NB201Network, its state or its weights as a dict, "
                        f"got {type(network).__name__}")
    return _str_keys(network)


def _str_keys(tree: Any) -> Any:
    """``tree`` with every dict key a string (orbax and ``nnx.Dict`` write some as strings)."""
    return {str(k): _str_keys(v) for k, v in tree.items()} if isinstance(tree, Mapping) else tree


def _like(layout: Any, given: Any) -> Any:
    """``given`` with the keys and dtypes of ``layout``."""
    if isinstance(layout, Mapping):
        return {key: _like(part, given[str(key)]) for key, part in layout.items()}
    return np.asarray(given, dtype=layout.dtype)


def _neutral(layout: Mapping) -> dict:
    """Zeros in ``layout``'s shapes, but variance 1 for batch norm: an op whose output is 0."""
    return {key: _neutral(part) if isinstance(part, Mapping)
            else (np.ones if key == "var" else np.zeros)(part.shape, part.dtype) for key, part in layout.items()}


@functools.cache
def _expected(space: NB201Space, config: NB201Config) -> dict:
    """The shapes of the standalone network's pure dict, string keys."""
    module = nnx.eval_shape(lambda: build.build_network(space, config, key=jax.random.key(0)))
    return _str_keys(nnx.to_pure_dict(nnx.state(module)))


def _space_macro(space: NB201Space) -> tuple:
    return space.channels, space.cells_per_stage, space.num_classes, space.input_shape[-1]


def _describe(channels: Any, cells: Any, classes: Any, inputs: Any) -> str:
    return f"C={channels}, N={cells}, {classes} classes, {inputs} input channels"


def _describe_macro(weights: Mapping) -> str:
    """C, N, classes and input channels read off a standalone network's weights."""
    def shape(*keys):
        part = weights
        for key in keys:
            if not isinstance(part, Mapping) or key not in part:
                return None
            part = part[key]
        return np.shape(part)

    stem, head = shape("stem_conv", "kernel"), shape("classifier", "kernel")
    cells = weights.get("cells", {}) if isinstance(weights.get("cells"), Mapping) else {}
    reductions = sorted(int(k) for k, cell in cells.items() if isinstance(cell, Mapping) and "conv_a" in cell)
    return _describe(stem[-1] if stem and len(stem) == 4 else "?", reductions[0] if reductions else "?",
                     head[-1] if head and len(head) == 2 else "?", stem[2] if stem and len(stem) == 4 else "?")


def _cell_convs(weights: Mapping) -> list[dict]:
    """Per normal cell, ``{edge: kernel side}`` of its convolutions (none where unreadable)."""
    try:
        cells = weights["cells"]
        reductions = sorted(int(k) for k, cell in cells.items() if "conv_a" in cell)
        normal = [i for i in range(3 * reductions[0] + 2) if i not in reductions]
        return [{int(edge): np.shape(layer["conv"]["kernel"])[0]
                 for edge, layer in cells.get(str(i), {}).get("layers", {}).items()} for i in normal]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return []


def _describe_convs(convs: dict) -> str:
    return ", ".join(f"edge {edge} {side}x{side}" for edge, side in sorted(convs.items())) or "none"


def _first_difference(expected: Mapping, given: Mapping) -> str:
    try:
        check_compatible(expected, given, "")
    except ValueError as error:
        problems = str(error).partition(": ")[2].split("; ")
        order = ("stem_conv.", "classifier.")  # those of C, input channels and classes first
        problems.sort(key=lambda problem: next((i for i, p in enumerate(order) if problem.startswith(p)), 2))
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        return f" ({problems[0]}{more})"
    return ""
