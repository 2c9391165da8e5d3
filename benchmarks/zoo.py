"""Zoo throughput, robustjax against PyTorch: forward and forward+backward images/s.

    python -m benchmarks.zoo [--models NAME,...] [--batch-size N] [--repeats N] [--out DIR]

Each model is built in PyTorch from its registered ``torch_source`` (``torchvision.models.X``
or ``timm:X``; models with another source are skipped), randomly initialised, and converted
to robustjax with ``zoo.from_torch``, so both run the same weights on the same random images
at the model's own input size.
"forward" is inference logits; "backward" is the gradient of the true-class logit with respect
to the input, what gradient attacks compute at every step. One JSON file:
results/zoo.BACKEND.json.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch

import robustjax as rj
from benchmarks.common import (
    RESULTS,
    machine_facts,
    report,
    seconds_per_call,
    synchronized,
    torch_device,
)
from benchmarks.torch_models import to_nchw

# One model per family by default.
DEFAULT_MODELS = ("resnet50", "densenet121", "regnetx_400m", "shufflenet_v2_x1_0", "mobilenet_v2_x1_0",
                  "efficientnet_b0", "vit_base_patch16_224", "deit_small_patch16_224", "mixer_b16_224",
                  "swin_tiny_patch4_window7_224")
SOURCE = re.compile(r"^(?:timm:(?P<timm>\w+)|torchvision\.models\.(?P<tv>\w+)(?:\((?P<kwargs>[^)]*)\))?)$")


def torch_model(source: str | None) -> torch.nn.Module | None:
    """The PyTorch model a ``torch_source`` names, randomly initialised; None if not buildable here."""
    match = SOURCE.match(source or "")
    if match is None:
        return None
    if match["timm"]:
        import timm

        return timm.create_model(match["timm"], pretrained=False)
    import torchvision

    kwargs = {}
    for item in filter(None, (match["kwargs"] or "").split(",")):
        key, value = item.split("=")
        kwargs[key.strip()] = ast.literal_eval(value.strip())
    return getattr(torchvision.models, match["tv"])(weights=None, **kwargs)


def measure(name: str, batch_size: int, repeats: int) -> list[dict] | None:
    entry = rj.zoo.get(name)
    twin = torch_model(entry.torch_source)
    if twin is None:
        print(f"skipping {name}: no torchvision/timm source ({entry.torch_source})")
        return None
    twin.eval()
    state = {k: v.detach().numpy() for k, v in twin.state_dict().items()}
    clf = rj.zoo.from_torch(name, state)
    shape = clf.input_shape
    x = np.random.default_rng(0).uniform(size=(batch_size, *shape)).astype(np.float32)
    y = np.zeros(batch_size, np.int32)
    twin = twin.to(torch_device())
    mean = torch.tensor(clf.mean).view(1, -1, 1, 1).to(torch_device())
    std = torch.tensor(clf.std).view(1, -1, 1, 1).to(torch_device())
    x_torch = to_nchw(x).to(torch_device())

    forward = jax.jit(lambda c, images: c(images))
    backward = jax.jit(jax.grad(lambda images, c: jnp.sum(c(images)[jnp.arange(batch_size), y]), argnums=0))

    def torch_forward():
        with torch.no_grad():
            out = twin((x_torch - mean) / std)
        return synchronized(out)

    def torch_backward():
        images = x_torch.clone().requires_grad_(True)
        twin((images - mean) / std)[:, 0].sum().backward()
        return synchronized(images.grad)

    rows = {}
    for kind, ours, theirs in (("forward", lambda: forward(clf, x).block_until_ready(), torch_forward),
                               ("backward", lambda: backward(x, clf).block_until_ready(), torch_backward)):
        first, ours_s = seconds_per_call(ours, repeats)
        _, theirs_s = seconds_per_call(theirs, repeats)
        rows[kind] = (first, ours_s, theirs_s)
    return [{
        "name": f"{name} {kind}",
        "params": {"family": entry.family, "image_shape": list(shape), "torch_source": entry.torch_source},
        "robustjax_images_per_s": batch_size / ours_s,
        "peer_images_per_s": batch_size / theirs_s,
        "ratio": theirs_s / ours_s,
        "robustjax_compile_s": max(first - ours_s, 0.0),
    } for kind, (first, ours_s, theirs_s) in rows.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo names")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after the first (median taken)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    names = args.models.split(",")
    for name in names:
        rj.zoo.get(name)  # unknown names fail before any work
    rows = [row for name in names for row in (measure(name, args.batch_size, args.repeats) or [])]
    settings = {"batch_size": args.batch_size, "repeats": args.repeats,
                "peer": "torch", "torch_threads": torch.get_num_threads(), "torch_device": torch_device()}
    report("zoo", rows, machine_facts(("torch", "torchvision", "timm")), settings, args.out)


if __name__ == "__main__":
    main()
