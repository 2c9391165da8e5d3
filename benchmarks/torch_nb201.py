"""NAS-Bench-201 networks in PyTorch (xautodl's ``TinyNetwork``) with robustjax's weights: the
NAS benchmark's peer, the anchors' way of evaluating one cell at a time."""

from __future__ import annotations

import numpy as np


def bn(prefix: str, layer: dict) -> dict:
    return {f"{prefix}.{torch_name}": np.asarray(layer[name]) for name, torch_name in
            (("scale", "weight"), ("bias", "bias"), ("mean", "running_mean"), ("var", "running_var"))}


def conv(prefix: str, layer: dict) -> dict:
    return {f"{prefix}.weight": np.transpose(np.asarray(layer["kernel"]), (3, 2, 0, 1))}


def xautodl_tensors(weights: dict) -> dict:
    """A robustjax ``NB201Network``'s weights (``nnx.to_pure_dict``) in ``TinyNetwork``'s names."""
    def relu_conv_bn(prefix: str, layer: dict) -> dict:
        return conv(f"{prefix}.op.1", layer["conv"]) | bn(f"{prefix}.op.2", layer["bn"])

    tensors = conv("stem.0", weights["stem_conv"]) | bn("stem.1", weights["stem_bn"]) | bn("lastact.0", weights["lastact"])
    tensors |= {"classifier.weight": np.asarray(weights["classifier"]["kernel"]).T,
                "classifier.bias": np.asarray(weights["classifier"]["bias"])}
    for index, cell in weights["cells"].items():
        if "conv_a" in cell:
            tensors |= (relu_conv_bn(f"cells.{index}.conv_a", cell["conv_a"])
                        | relu_conv_bn(f"cells.{index}.conv_b", cell["conv_b"])
                        | conv(f"cells.{index}.downsample.1", cell["downsample"]))
        else:
            for edge, layer in cell.get("layers", {}).items():
                tensors |= relu_conv_bn(f"cells.{index}.layers.{edge}", layer)
    return tensors


def tiny_network(space, config, weights: dict):
    """xautodl's ``TinyNetwork`` of ``config`` holding ``weights``."""
    import torch
    from xautodl.models.cell_infers.tiny_network import TinyNetwork
    from xautodl.models.cell_searchs.genotypes import Structure

    net = TinyNetwork(space.channels, space.cells_per_stage, Structure.str2structure(config.arch_string),
                      space.num_classes)
    if space.input_shape[-1] != 3:  # xautodl's stem takes RGB; the digits are grey
        net.stem[0] = torch.nn.Conv2d(space.input_shape[-1], space.channels, 3, padding=1, bias=False)
    tensors = xautodl_tensors(weights)
    state = net.state_dict()
    missing = [k for k in state if k not in tensors and not k.endswith("num_batches_tracked")]
    if missing or set(tensors) - set(state):
        raise ValueError(f"weights do not fit: missing {missing}, unexpected {sorted(set(tensors) - set(state))}")
    net.load_state_dict({k: torch.from_numpy(np.array(tensors[k])) if k in tensors else v for k, v in state.items()})
    return net
