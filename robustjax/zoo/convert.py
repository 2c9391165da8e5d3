"""Conversion of PyTorch state dicts (torchvision, timm, RobustBench) to zoo weights.

Each family module registers its models with ``convert=``, a function that reads a
:class:`TorchWeights` and returns the model's parameters as a plain nested dict in the
layout of ``nnx.to_pure_dict(nnx.state(module))``. The helpers here do the layout changes
that every family shares: PyTorch convolutions are (out, in, kh, kw) and Flax's are
(kh, kw, in, out); PyTorch linear weights are (out, in) and Flax's (in, out).

Only safe formats are read: safetensors, or ``torch.load(..., weights_only=True)``, which
refuses pickled code. Every tensor that is missing, left over or of the wrong shape is
named in the error.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from robustjax.classifier import Classifier
from robustjax.zoo.abstract import build_abstract
from robustjax.zoo.registry import get as get_model
from robustjax.zoo.weights import check_compatible, save_weights

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
# Wrappers that training scripts put around the state dict, and the prefixes of
# DataParallel and torch.compile, removed before conversion.
CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "net")
KEY_PREFIXES = ("module.", "_orig_mod.", "model.")
# Buffers PyTorch keeps that carry no weights.
IGNORED_SUFFIXES = ("num_batches_tracked",)


class TorchWeights:
    """A PyTorch state dict as NumPy arrays that records which tensors were read.

    ``take(name)`` returns a tensor; a missing one is recorded (and an empty array
    returned) so that all problems are reported together by :meth:`check_all_used`.
    """

    def __init__(self, tensors: Mapping[str, np.ndarray], source: str = "state dict"):
        self.tensors = {k: np.asarray(v) for k, v in tensors.items()}
        self.source = source
        self.used: set[str] = set()
        self.missing: list[str] = []

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str) -> np.ndarray:
        if name not in self.tensors:
            self.missing.append(name)
            return np.zeros((0,), np.float32)
        self.used.add(name)
        return self.tensors[name]

    def conv(self, prefix: str, *, bias: bool | None = None) -> dict:
        """``{"kernel", "bias"?}`` of an ``nnx.Conv`` from ``{prefix}.weight`` / ``.bias``;
        ``bias=None`` takes the bias when the state dict has one."""
        out = {"kernel": conv_kernel(self.take(f"{prefix}.weight"))}
        if bias or (bias is None and f"{prefix}.bias" in self):
            out["bias"] = self.take(f"{prefix}.bias")
        return out

    def linear(self, prefix: str, *, bias: bool | None = None) -> dict:
        """``{"kernel", "bias"?}`` of an ``nnx.Linear`` from a ``torch.nn.Linear``."""
        out = {"kernel": linear_kernel(self.take(f"{prefix}.weight"))}
        if bias or (bias is None and f"{prefix}.bias" in self):
            out["bias"] = self.take(f"{prefix}.bias")
        return out

    def batch_norm(self, prefix: str) -> dict:
        """``{"scale", "bias", "mean", "var"}`` of an ``nnx.BatchNorm``."""
        return {
            "scale": self.take(f"{prefix}.weight"),
            "bias": self.take(f"{prefix}.bias"),
            "mean": self.take(f"{prefix}.running_mean"),
            "var": self.take(f"{prefix}.running_var"),
        }

    def layer_norm(self, prefix: str) -> dict:
        """``{"scale", "bias"}`` of an ``nnx.LayerNorm``."""
        return {"scale": self.take(f"{prefix}.weight"), "bias": self.take(f"{prefix}.bias")}

    def check_all_used(self) -> None:
        """Raises a ValueError naming every missing and every unused tensor."""
        unused = sorted(k for k in self.tensors if k not in self.used and not k.endswith(IGNORED_SUFFIXES))
        problems = [f"missing {name}" for name in self.missing]
        problems += [f"unexpected {name} {tuple(self.tensors[name].shape)}" for name in unused]
        if problems:
            raise ValueError(f"{self.source} does not fit the model: " + "; ".join(problems))


def conv_kernel(weight: np.ndarray) -> np.ndarray:
    """PyTorch (out, in, kh, kw) to Flax (kh, kw, in, out)."""
    return np.transpose(weight, (2, 3, 1, 0)) if weight.ndim == 4 else weight


def linear_kernel(weight: np.ndarray) -> np.ndarray:
    """PyTorch (out, in) to Flax (in, out)."""
    return np.transpose(weight) if weight.ndim == 2 else weight


def load_state_dict(path: str | Path) -> dict[str, np.ndarray]:
    """Reads a state dict from safetensors or a weights-only PyTorch file, as NumPy arrays.

    Training-script wrappers (``{"state_dict": ...}``) and ``module.`` prefixes are removed.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint file at {str(path)!r}")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            tensors = load_file(path)
        except (SafetensorError, OSError, ValueError) as err:
            raise ValueError(f"{path.name} is not a readable safetensors file: {err}") from None
    elif path.suffix in TORCH_SUFFIXES:
        tensors = _load_torch(path)
    else:
        raise ValueError(
            f"{path.name}: unsupported checkpoint format {path.suffix!r}; use .safetensors or a "
            f"PyTorch file ({', '.join(TORCH_SUFFIXES)}) loadable with weights_only=True"
        )
    return strip_wrappers(tensors)


def _load_torch(path: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ValueError(f"{path.name}: reading PyTorch files needs torch; or convert it to safetensors") from err
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError and others for unsafe or unreadable content
        # torch's message spans lines and suggests weights_only=False: keep the global it names,
        # or the unpickler's own complaint about bytes that are no checkpoint
        text = str(err)
        if named := re.search(r"Unsupported global: (GLOBAL \S+)", text):
            raise ValueError(f"{path.name} is not a weights-only PyTorch checkpoint and will not be unpickled "
                             f"(it holds code: {named.group(1)})") from err
        detail = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
        reason = detail.group(1) if detail else (text.splitlines()[0] if text else type(err).__name__)
        raise ValueError(f"{path.name} cannot be read as a weights-only PyTorch checkpoint ({reason}): a truncated "
                         "or corrupt file, or another format") from err
    for key in CONTAINER_KEYS:
        if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
            loaded = loaded[key]
            break
    if not isinstance(loaded, dict):
        raise ValueError(f"{path.name} holds a {type(loaded).__name__}, not a state dict")
    return {k: v.detach().cpu().float().numpy() if v.is_floating_point() else v.cpu().numpy()
            for k, v in loaded.items() if hasattr(v, "detach")}


def strip_wrappers(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Removes a prefix that every key shares (``module.``, ``_orig_mod.``, ``model.``)."""
    tensors = dict(tensors)
    for prefix in KEY_PREFIXES:
        if tensors and all(k.startswith(prefix) for k in tensors):
            tensors = {k[len(prefix):]: v for k, v in tensors.items()}
    return tensors


def from_torch(
    name: str,
    state_dict: Mapping[str, np.ndarray],
    *,
    source: str = "state dict",
    **build_kwargs,
) -> Classifier:
    """The zoo model ``name`` with weights converted from a PyTorch ``state_dict``.

    ``build_kwargs`` (``num_classes``, and any size option of the model's builder) build the
    architecture that the state dict belongs to. The model is built abstractly, so no random
    initialisation is spent on weights that are replaced.
    """
    entry = get_model(name)
    if entry.convert is None:
        raise ValueError(f"model {name!r} has no PyTorch converter")
    classifier = build_abstract(entry.build, **build_kwargs)
    weights = TorchWeights(strip_wrappers(state_dict), source)
    converted = entry.convert(weights)
    weights.check_all_used()
    expected = nnx.to_pure_dict(classifier.params)
    check_compatible(expected, converted, source)
    converted = jax.tree.map(lambda e, c: jax.numpy.asarray(c, dtype=e.dtype), expected, converted)
    state = classifier.params
    nnx.replace_by_pure_dict(state, converted)
    return classifier.replace(params=state)


def convert_checkpoint(name: str, checkpoint: str | Path, out: str | Path, **build_kwargs) -> Path:
    """Converts a PyTorch checkpoint file of zoo model ``name`` and stores it in folder ``out``:
    ``weights/`` (orbax) and ``card.json`` (model, class count, source file and its SHA-256),
    which ``zoo.create(name, weights=out)`` reads back."""
    checkpoint, out = Path(checkpoint), Path(out)
    classifier = from_torch(name, load_state_dict(checkpoint), source=checkpoint.name, **build_kwargs)
    save_weights(out / "weights", classifier.params)
    card = {
        "name": name,
        "num_classes": classifier.num_classes,
        "build_kwargs": {k: v for k, v in build_kwargs.items() if k != "num_classes"},
        "source": {"file": str(checkpoint.resolve()), "sha256": hashlib.sha256(checkpoint.read_bytes()).hexdigest(),
                   "torch_source": get_model(name).torch_source},
    }
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return out
