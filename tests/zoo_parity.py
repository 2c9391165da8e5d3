"""Helpers for zoo parity tests: random BatchNorm statistics, state dicts as NumPy, logit and
activation comparison, parameter counting."""

from __future__ import annotations

import jax
import numpy as np
import torch

import robustjax as rj


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-trivial BatchNorm statistics and affine parameters, and a head large enough that
    logits are far from zero; returns the model in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0.0, 0.2, generator=generator)
                module.running_var.uniform_(0.5, 1.5, generator=generator)
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.normal_(0.0, 0.1, generator=generator)
            elif isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, 4.0 / module.in_features**0.5, generator=generator)
                module.bias.normal_(0.0, 0.1, generator=generator)
    return model.eval()


def state_dict(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def torch_input(classifier: rj.Classifier, images: np.ndarray) -> torch.Tensor:
    """NHWC images in [0, 1] normalised as the classifier does, as an NCHW tensor."""
    normalized = (images - np.asarray(classifier.mean, np.float32)) / np.asarray(classifier.std, np.float32)
    return torch.from_numpy(np.ascontiguousarray(normalized.transpose(0, 3, 1, 2), np.float32))


def assert_parity(classifier: rj.Classifier, model: torch.nn.Module, images: np.ndarray, layers: tuple[str, ...]):
    """Same logits and the same activations at ``layers`` (torch module names = feature keys).

    Logits: max abs difference < 1e-4, or 1e-5 of the largest logit when logits exceed 10:
    float32 round-off is relative, and the two backends sum in different orders (observed
    ~2e-6 relative on a full ResNet-18 at 224x224). Activations: 1e-5 of each layer's scale.
    """
    captured = {}

    def hook(name):
        # clone: torchvision's in-place ReLU would otherwise overwrite a captured bn output
        return lambda _, __, out: captured.__setitem__(name, out.detach().clone().permute(0, 2, 3, 1).numpy())

    handles = [model.get_submodule(name).register_forward_hook(hook(name)) for name in layers]
    with torch.no_grad():
        logits = model(torch_input(classifier, images)).numpy()
    for handle in handles:
        handle.remove()
    assert np.abs(logits).max() > 0.5  # a non-degenerate comparison
    ours = np.asarray(jax.jit(lambda c, x: c(x))(classifier, images))
    np.testing.assert_allclose(ours, logits, atol=max(1e-4, 1e-5 * float(np.abs(logits).max())), rtol=0)
    features = classifier.features(images)
    for name in layers:
        scale = max(float(np.abs(captured[name]).max()), 1.0)
        np.testing.assert_allclose(features[name], captured[name], atol=1e-5 * scale, rtol=0, err_msg=name)


def count_torch(model: torch.nn.Module) -> int:
    """Scalars in the state dict (parameters and buffers such as BatchNorm running stats)."""
    return sum(v.numel() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked"))


def count_flax(name: str, **kwargs) -> int:
    """Scalars in the registered model's state, built abstractly (nothing allocated)."""
    entry = rj.zoo.get(name)
    shapes = jax.eval_shape(lambda key: entry.build(key=key, **kwargs), jax.random.key(0))
    return sum(leaf.size for leaf in jax.tree.leaves(shapes.params))
