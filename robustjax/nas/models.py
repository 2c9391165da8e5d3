"""NAS networks in the model zoo: ``zoo.create("nas.SPACE", arch=...)`` for every search space.

``arch`` is whatever the space accepts: an id, a config, an NAS-Bench-201 arch string or a
RobustART subnet name. The digits spaces come with embedded supernets trained here
(``models/train_nas.py``): ``pretrained=True`` slices the subnet out and recalibrates its
batch norm on the digits training images. The other spaces have no weights bundled; their
networks convert from PyTorch (xautodl's NAS-Bench-201 ``TinyNetwork``, RobustART's BigNAS
ResNets) with ``zoo.from_torch`` or ``robustjax zoo convert``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax

from robustjax.classifier import Classifier
from robustjax.nas import build
from robustjax.nas.bignas import NAMED_SUBNETS, BigNASSpace
from robustjax.nas.convert import convert_bignas, convert_nb201
from robustjax.nas.nb201 import NB201Space
from robustjax.nas.space import space as get_space
from robustjax.nas.supernet import Supernet
from robustjax.zoo.assets import asset_dir
from robustjax.zoo.registry import register_model

# Embedded supernets: space -> asset folder under models/.
EMBEDDED = {"nb201_digits": "nas_nb201_digits", "bignas_resnet_basic_digits": "nas_bignas_resnet_basic_digits"}
DEFAULT_ARCH = {"nb201": 11472}  # NAS-Bench-201's ResNet cell; BigNAS spaces default to a named subnet or the smallest
TORCH_SOURCES = {"nb201": "xautodl.models.cell_infers.tiny_network.TinyNetwork",
                 "bignas": "RobustART prototype.model.bignas_resnet_{basicblock,bottleneck}.BigNAS_ResNet_*"}


def arch_label(space: build.Space, config: Any) -> str:
    """A short name of a network of ``space``: the NB201 id, a RobustART subnet's name, or
    the config's id."""
    if not isinstance(space, BigNASSpace):
        return str(config.index)
    named = [name for name, named_config in NAMED_SUBNETS.items() if named_config == config]
    return named[0] if named else config.arch_id.partition(":")[2]


def default_arch(space: build.Space) -> Any:
    if not isinstance(space, BigNASSpace):
        return DEFAULT_ARCH["nb201"]
    named = space.named_subnets()
    return named[0] if named else space.smallest()


@functools.cache
def network_card(space, arch: Any) -> dict:
    """What one network of a space is: its id, config, strings and costs."""
    config = space.resolve(arch)
    cost = space.cost(config)
    card = {"space": space.name, "index": space.index(config), "arch_id": config.arch_id,
            "zoo": {"model": f"nas.{space.name}", "arch": arch_label(space, config)},
            "params": cost.params, "macs": cost.macs, "flops": cost.flops}
    if isinstance(space, NB201Space):
        card |= {"arch_string": config.arch_string, "canonical_index": space.canonical(config),
                 "ops": list(config.ops)}
    else:
        card |= {"config": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()},
                 "named": [n for n, c in NAMED_SUBNETS.items() if c == config]}
    return card


def zoo_card(spec: str) -> dict | None:
    """The network card of zoo model ``spec`` when it is a NAS network (``nas.SPACE``, which
    builds the space's default network), else None."""
    space_name = spec.removeprefix("nas.")
    if space_name == spec or space_name not in REGISTERED:
        return None
    space = get_space(space_name)
    return network_card(space, default_arch(space))


def bundled_supernet(space_name: str) -> Supernet:
    """The trained supernet bundled with robustjax for a digits space (``"nb201_digits"``,
    ``"bignas_resnet_basic_digits"``): its subnets are the zoo's ``nas.SPACE`` models."""
    if space_name not in EMBEDDED:
        raise ValueError(f"no supernet is bundled for {space_name!r}; the bundled ones are {sorted(EMBEDDED)} "
                         "(train one with rj.nas.train_supernet, or load a folder with rj.nas.Supernet.load)")
    return Supernet.load(asset_dir(EMBEDDED[space_name]), space=get_space(space_name))


@functools.cache
def _calibration_images():
    from robustjax.data import (
        digits,  # data sits below the zoo; imported late to keep `import` light
    )

    return digits("train").arrays()[0]


def _register(space_name: str) -> None:
    model_name = f"nas.{space_name}"
    family = "nas_bignas" if space_name.startswith("bignas") else "nas_nb201"
    embedded = space_name in EMBEDDED
    space_doc = get_space(space_name).__class__.__name__

    @register_model(model_name, family=family, convert=convert_bignas if family == "nas_bignas" else convert_nb201,
                    torch_source=TORCH_SOURCES[family.removeprefix("nas_")],
                    weights=f"trained here: models/train_nas.py {space_name}" if embedded else None,
                    description=f"A network of the {space_name} search space ({space_doc}), chosen by arch=.")
    def build_nas(*, key: jax.Array, pretrained: bool = embedded, arch: Any = None, **space_options) -> Classifier:
        space = get_space(space_name, **space_options)
        config = space.resolve(default_arch(space) if arch is None else arch)
        name = f"{model_name}:{arch_label(space, config)}"
        if pretrained:
            if space != get_space(space_name):
                raise ValueError(f"the embedded {space_name} supernet was trained with the space's own options; "
                                 f"pass pretrained=False to change {sorted(space_options)}")
            return bundled_supernet(space_name).subnet(config, calibration=_calibration_images(), name=name)
        return build.as_classifier(space, build.build_network(space, config, key=key), config, name=name)


# The spaces whose networks the zoo builds as ``nas.SPACE``.
REGISTERED = ("nb201", "nb201_digits", "bignas_resnet_basic", "bignas_resnet_bottleneck", "bignas_resnet_basic_cifar",
              "bignas_resnet_bottleneck_cifar", "bignas_resnet_basic_digits")
for _space_name in REGISTERED:
    _register(_space_name)
