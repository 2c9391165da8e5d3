"""The accelerator benchmark: one prepared script, every row beside torch (+ torchattacks) on
the same device, with images/s, model FLOP utilisation (MFU) and compile time.

    python -m benchmarks.accelerator [--smoke] [--rows NAME,...] [--resnet-batch N]
                                     [--peer-wheel PATH] [--budget-s S] [--out DIR]

Rows (random weights everywhere: throughput only, accuracies mean nothing):

- ``resnet50_pgd{10,20}_{float32,bfloat16}``: Linf PGD (eps 4/255, every step, no early
  stop) on a torchvision ResNet-50 at 224 converted with ``zoo.from_torch`` (both libraries
  hold the same weights), at ``--resnet-batch`` images (256 by default; halved until it fits
  when the device runs out of memory). bfloat16 is ``rj.precision.with_precision``; the torch
  peer runs under ``torch.autocast(bfloat16)``.
- ``wrn28_10_{cw_l2,apgd_ce,square}``: CW-L2 (one binary-search step of 100 Adam steps, c 1),
  APGD-CE (100 steps) and Square (Linf 8/255, 1,000 queries) on a CIFAR WRN-28-10
  (RobustBench's layout, ``benchmarks/torch_wrn.py`` as the twin).
- ``wrn28_10_autoattack``: AutoAttack standard (published budgets) on the same WRN, on arrays
  (each component on the examples still robust, as torchattacks runs it).
- ``imagenet_c_15``: the 15 ImageNet-C corruptions (severity 3, ImageNet constants) at 224 in
  one jitted program; images/s counts an image once through all 15. Peer: ``imagecorruptions``
  on the CPU, one image at a time, when it is importable; n/a otherwise.
- ``nb201_population_pgd10``: one PGD-10 step of ``rj.nas`` populations: a population of
  NAS-Bench-201 subnets (C=16, N=5, one set of supernet weights, per-network op choices) attacks
  one batch of CIFAR-size images in one program; networks/s. No peer.
- ``nb201_training_population``: NAS-Bench-201 cells (C=16, N=5, CIFAR-size random images)
  trained as one population (side by side) with NAS-RobBench-201's PGD-7 adversarial
  training (``benchmarks/training_population.py``), against xautodl's ``TinyNetwork`` with
  torchattacks trained one network at a time on the same GPU; networks/s counts network
  training steps, and the row projects NAS-RobBench-201's 58k networks (50 epochs of CIFAR's
  50,000 images at batch 256 each) in GPU-hours against the 107k it reported.
- ``nb201_sweep_vs_torch``: ``benchmarks/nas.py`` at full CIFAR size (its ``--scale cifar``
  on a CPU): 64 NB201 subnets (C=16, N=5, random weights) recalibrated on 1,024 images and
  evaluated with clean, FGSM and PGD-10 on 256 random images as one population, against
  xautodl's ``TinyNetwork`` with torchattacks one network at a time on the same GPU
  (xautodl's wheel carried in ``benchmarks/wheels`` like torchattacks'); networks/s, the
  peer's networks/s in ``peer_images_per_s``, compiles included.

MFU = the model FLOPs a row needs / its seconds / the device's peak. A row's model FLOPs are
counted from XLA's cost analysis of the compiled forward pass and input gradient of its model
at its batch and precision (``jax.jit(f).lower(...).compile().cost_analysis()``), times the
passes the attack spent (its ``queries``: one gradient per step and a last forward pass; one
forward pass per Square query). The whole attack program's own cost analysis would count the
body of a rolled loop once, whatever its trip count. torch's MFU uses the same model FLOPs for
the rows where torchattacks runs a fixed number of steps. Peaks are dense tensor-core peaks
from ``PEAKS`` (float32 rows against TF32, which XLA and cuDNN use for float32 convolutions by
default on these GPUs); on a CPU or an unknown device, the measured peak of a large jitted
matrix product in the row's precision. Compile time is the XLA backend compile seconds of the
row's robustjax calls (``jax.monitoring``).

The GPU machine has no network: torch, torchvision and timm are there, torchattacks is not.
``--peer-wheel`` (default: ``benchmarks/wheels/torchattacks-*.whl``) is put on ``sys.path``
(a pure-Python wheel is an importable zip). A missing peer leaves its columns empty with the
reason in ``peer``. ``--budget-s`` (default 420 s, from the process start) skips the rows
left once it is spent, so the script finishes within 8 minutes; the JSON is rewritten after
every row (``results/accelerator.DEVICE.json``). ``--smoke`` runs every row at tiny sizes
(ResNet-18 at 32x32, WRN-10-1, a few steps) on the CPU in well under a minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

# Before JAX's backend starts: JAX grows its GPU memory as needed, up to 60% of the device,
# so that the torch peer in the same process has room.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import robustjax as rj  # noqa: E402
from benchmarks.common import (  # noqa: E402
    RESULTS,
    compiled,
    compiled_flops,
    machine_facts,
    matmul_peak_gflops,
    model_pass_flops,
)

START = time.perf_counter()
WHEELS = Path(__file__).resolve().parent / "wheels"

# Dense (no sparsity) peaks in TFLOP/s, by a substring of jax's device_kind, first match wins;
# "float32" is the TF32 tensor-core peak on NVIDIA GPUs, "float32_simt" the plain FP32 one.
PEAKS = (
    ("H200", {"bfloat16": 989.4, "float32": 494.7, "float32_simt": 67.0}),
    ("H100 PCIe", {"bfloat16": 756.0, "float32": 378.0, "float32_simt": 51.0}),
    ("H100", {"bfloat16": 989.4, "float32": 494.7, "float32_simt": 67.0}),
    ("A100", {"bfloat16": 312.0, "float32": 156.0, "float32_simt": 19.5}),
    ("TPU v4", {"bfloat16": 275.0, "float32": 275.0}),
    ("TPU v5 lite", {"bfloat16": 197.0, "float32": 197.0}),
    ("TPU v5e", {"bfloat16": 197.0, "float32": 197.0}),
    ("TPU v5p", {"bfloat16": 459.0, "float32": 459.0}),
    ("TPU v6", {"bfloat16": 918.0, "float32": 918.0}),
)

IMAGENET_C = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
              "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
              "jpeg_compression")


@dataclasses.dataclass(frozen=True)
class Sizes:
    resnet: str = "resnet50"
    resnet_layers: tuple[int, ...] | None = None  # None: the model's own
    resnet_classes: int = 1000
    image_size: int = 224
    resnet_batch: int = 256
    pgd_steps: tuple[int, ...] = (10, 20)
    eps: float = 8 / 255  # Linf radius of the WRN and population rows
    wrn: tuple[int, int] = (28, 10)
    wrn_batch: int = 128
    cw_steps: int = 100
    apgd_steps: int = 100
    square_queries: int = 1000
    autoattack_batch: int = 64
    autoattack_steps: int = 100
    autoattack_queries: int = 5000
    corruption_size: int = 224
    corruption_batch: int = 64
    peer_corruption_images: int = 2
    nb201: tuple[int, int] = (16, 5)  # channels, cells per stage
    networks: int = 32
    population_batch: int = 128
    population_steps: int = 10
    sweep_networks: int = 64  # the nb201_sweep_vs_torch row: networks, examples, calibration images, torch networks
    sweep_examples: int = 256
    sweep_calibration: int = 1024
    sweep_torch: int = 2
    training_networks: int = 32  # the nb201_training_population row: cells, batch, timed steps, torch cells
    training_batch: int = 256
    training_steps: int = 2
    training_torch: int = 2
    training_attack_steps: int = 7  # NAS-RobBench-201's PGD-7
    repeats: int = 2
    peer_repeats: int = 1
    matmul_size: int = 8192


SMOKE = Sizes(resnet="resnet18", resnet_layers=(1, 1, 1, 1), resnet_classes=10, image_size=32, resnet_batch=4,
              pgd_steps=(1, 2), eps=0.25, wrn=(10, 1), wrn_batch=4, cw_steps=3, apgd_steps=3, square_queries=10,
              autoattack_batch=2, autoattack_steps=2, autoattack_queries=10, corruption_size=32,
              corruption_batch=2, peer_corruption_images=1, nb201=(4, 1), networks=2, population_batch=4,
              population_steps=1, sweep_networks=2, sweep_examples=8, sweep_calibration=8,
              sweep_torch=1, training_networks=2, training_batch=4, training_steps=1, training_torch=1,
              training_attack_steps=1, repeats=1,
              peer_repeats=0, matmul_size=512)


# --- measurement helpers -------------------------------------------------------------------


class CompileSeconds:
    """Sums XLA backend compile seconds while ``active``."""

    def __init__(self):
        self.active, self.seconds = False, 0.0
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **_):
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.seconds += duration

    def measure(self, call: Callable[[], object]):
        """(``call()``, its compile seconds)."""
        self.active, self.seconds = True, 0.0
        try:
            return call(), self.seconds
        finally:
            self.active = False


COMPILES: CompileSeconds | None = None


def timed(call: Callable[[], object], repeats: int) -> tuple[float, float, object]:
    """(first call's seconds, median of ``repeats`` later calls, the last output); blocks."""
    start = time.perf_counter()
    out = call()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times) if times else first, out


def is_out_of_memory(error: BaseException) -> bool:
    text = f"{type(error).__name__} {error}".lower()
    return "resource_exhausted" in text or "out of memory" in text or "outofmemory" in text


def device_peaks(sizes: Sizes) -> dict:
    """Peak TFLOP/s per precision: the table's for a known device, else measured (a jitted
    square matrix product). Both are recorded; MFU uses the table where it knows the device."""
    kind = jax.devices()[0].device_kind
    measured = {dtype: matmul_peak_gflops(sizes.matmul_size, repeats=5, dtype=dtype) / 1e3
                for dtype in ("float32", "bfloat16")}
    table = next((peaks for pattern, peaks in PEAKS if pattern.lower() in kind.lower()), None)
    used = dict(table) if table else dict(measured)
    return {"device_kind": kind, "source": "table (dense)" if table else "measured matmul",
            "tflops": used, "measured_matmul_tflops": measured}


# --- peers ---------------------------------------------------------------------------------


def import_torchattacks(wheel: Path | None):
    """torchattacks, from the environment or from ``wheel`` put on sys.path; (module, None)
    or (None, reason)."""
    try:
        import torch  # noqa: F401
    except ImportError as error:
        return None, f"n/a: torch not importable ({error})"
    if wheel is not None and str(wheel) not in sys.path:
        sys.path.insert(0, str(wheel))
    try:
        import torchattacks
    except Exception as error:  # noqa: BLE001 - any failure leaves the peer out, not the row
        return None, f"n/a: torchattacks not importable ({type(error).__name__}: {error})"
    return torchattacks, None


def torch_twin(module, mean, std, precision: str):
    """``module`` taking [0, 1] NCHW images (normalised inside), on the benchmark's device,
    under ``torch.autocast(bfloat16)`` for the bfloat16 rows; float32 logits out."""
    import torch

    from benchmarks.common import torch_device

    class Twin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = module
            self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
            self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

        def forward(self, x):
            x = (x - self.mean) / self.std
            if precision == "bfloat16":
                with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
                    return self.net(x).float()
            return self.net(x)

    return Twin().to(torch_device()).eval()


def run_peer(make_attacks: Callable, twin, x: np.ndarray, y: np.ndarray, repeats: int) -> dict:
    """Times torchattacks' ``make_attacks(twin)`` (run one after the other) on ``x``."""
    import torch

    from benchmarks.common import synchronized
    from benchmarks.torch_models import to_nchw

    device = next(twin.parameters()).device
    images, labels = to_nchw(x).to(device), torch.from_numpy(np.asarray(y)).long().to(device)
    attacks = make_attacks(twin)
    _, seconds, adversarial = timed(lambda: synchronized([attack(images, labels) for attack in attacks]), repeats)
    with torch.no_grad():
        success = float(np.mean([(twin(adv).argmax(1).cpu().numpy() != y) for adv in adversarial]))
    return {"peer_images_per_s": len(y) / seconds, "peer_s": seconds, "peer_success_rate": success}


def release_torch_memory() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


# --- models --------------------------------------------------------------------------------


@dataclasses.dataclass
class Model:
    """A robustjax classifier and the torch module holding the same weights (or None)."""

    clf: rj.Classifier
    torch_module: object | None
    torch_reason: str | None = None


def resnet_model(sizes: Sizes) -> Model:
    """torchvision's ResNet, randomly initialised, converted; the robustjax-only fallback
    (random JAX weights) when torchvision is missing."""
    reduced = {"image_size": sizes.image_size, "num_classes": sizes.resnet_classes}
    if sizes.resnet_layers:
        reduced["layers"] = sizes.resnet_layers
    try:
        import torch
        import torchvision

        torch.manual_seed(0)
        build = getattr(torchvision.models, sizes.resnet)
        if sizes.resnet_layers:  # a reduced version (smoke): the builder's block type, fewer blocks
            block = torchvision.models.resnet.BasicBlock if sizes.resnet in ("resnet18", "resnet34") else \
                torchvision.models.resnet.Bottleneck
            module = torchvision.models.resnet.ResNet(block, list(sizes.resnet_layers), num_classes=sizes.resnet_classes)
        else:
            module = build(weights=None, num_classes=sizes.resnet_classes)
        state = {k: v.detach().numpy() for k, v in module.state_dict().items()}
        clf = rj.zoo.from_torch(sizes.resnet, state, **reduced)
        return Model(clf, module.eval())
    except ImportError as error:
        clf = rj.zoo.create(sizes.resnet, pretrained=False, **reduced)
        return Model(clf, None, f"n/a: torchvision not importable ({error})")


def wrn_model(sizes: Sizes) -> Model:
    depth, width = sizes.wrn
    try:
        import torch

        from benchmarks.torch_wrn import wide_resnet

        torch.manual_seed(0)
        module = wide_resnet(depth, width).eval()
        state = {k: v.detach().numpy() for k, v in module.state_dict().items()}
        return Model(rj.zoo.from_torch("wrn_28_10", state, depth=depth, widen_factor=width), module)
    except ImportError as error:
        return Model(rj.zoo.create("wrn_28_10", pretrained=False, depth=depth, widen_factor=width), None,
                     f"n/a: torch not importable ({error})")


def random_batch(clf: rj.Classifier, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Uniform random images labelled with the model's own predictions (float32 model)."""
    x = np.random.default_rng(seed).uniform(size=(batch, *clf.input_shape)).astype(np.float32)
    y = np.array(jax.jit(lambda c, images: c(images).argmax(-1))(clf, x), np.int32)
    return x, y


# --- rows ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AttackRow:
    name: str
    model: str  # "resnet" or "wrn"
    precision: str
    ours: Callable[[Sizes], rj.attacks.Attack]
    peer: Callable[[object, Sizes], Callable] | None  # (torchattacks, sizes) -> twin -> [attacks]
    jit: bool = True  # one jitted program; False: called on arrays (the attack's default path)
    forward_only: bool = False  # queries are forward passes (Square)
    fixed_work: bool = True  # torchattacks spends every step on every example


def pgd_row(steps_index: int, precision: str) -> AttackRow:
    eps = 4 / 255

    def ours(sizes):
        return rj.attacks.PGD(eps=eps, steps=sizes.pgd_steps[steps_index], early_stop=False)

    def peer(ta, sizes):
        steps = sizes.pgd_steps[steps_index]
        return lambda twin: [ta.PGD(twin, eps=eps, alpha=2.5 * eps / steps, steps=steps)]

    return AttackRow(f"resnet50_pgd{(10, 20)[steps_index]}_{precision}", "resnet", precision, ours, peer)


ATTACK_ROWS = (
    pgd_row(0, "float32"), pgd_row(1, "float32"), pgd_row(0, "bfloat16"), pgd_row(1, "bfloat16"),
    AttackRow("wrn28_10_cw_l2", "wrn", "float32",
              lambda s: rj.attacks.CWL2(initial_const=1.0, binary_search_steps=1, steps=s.cw_steps, abort_early=False),
              lambda ta, s: lambda twin: [ta.CW(twin, c=1.0, kappa=0, steps=s.cw_steps, lr=0.01)]),
    AttackRow("wrn28_10_apgd_ce", "wrn", "float32",
              lambda s: rj.attacks.APGD(eps=s.eps, loss="ce", steps=s.apgd_steps),
              lambda ta, s: lambda twin: [ta.APGD(twin, eps=s.eps, steps=s.apgd_steps, loss="ce", n_restarts=1)]),
    AttackRow("wrn28_10_square", "wrn", "float32",
              lambda s: rj.attacks.Square(eps=s.eps, max_queries=s.square_queries),
              lambda ta, s: lambda twin: [ta.Square(twin, eps=s.eps, n_queries=s.square_queries, n_restarts=1,
                                                    p_init=0.8, seed=0)],
              jit=False, forward_only=True, fixed_work=False),
)


def torch_autoattack(ta, sizes: Sizes, num_classes: int) -> Callable:
    def make(twin):
        attack = ta.AutoAttack(twin, norm="Linf", eps=sizes.eps, version="standard", n_classes=num_classes, seed=0)
        for component in attack._autoattack.attacks:  # the published budgets, as ours
            if hasattr(component, "steps"):
                component.steps = sizes.autoattack_steps
            if hasattr(component, "n_queries"):
                component.n_queries = sizes.autoattack_queries
        return [attack]
    return make


def attack_row(row: AttackRow, model: Model, batch: int, sizes: Sizes, peaks: dict, ta, ta_reason) -> dict:
    clf = rj.precision.with_precision(model.clf, row.precision)
    x, y = random_batch(model.clf, batch)
    attack = row.ours(sizes) if row.name != "wrn28_10_autoattack" else rj.attacks.AutoAttack(
        eps=sizes.eps, steps=sizes.autoattack_steps, square_queries=sizes.autoattack_queries)
    key = jax.random.key(0)
    forward, gradient = model_pass_flops(clf, x, y)
    if row.jit:
        program = jax.jit(lambda c, images, labels, k: attack(c, images, labels, key=k))
        call = lambda: jax.block_until_ready(program(clf, x, y, key))  # noqa: E731
    else:
        call = lambda: jax.block_until_ready(attack(clf, x, y, key=key))  # noqa: E731
    # AutoAttack, minutes at full size in torchattacks, runs once after its first call (peer: once).
    repeats = min(sizes.repeats, 1) if row.name == "wrn28_10_autoattack" else sizes.repeats
    (first, seconds, result), compile_s = COMPILES.measure(lambda: timed(call, repeats))
    queries = np.asarray(result.queries, np.float64)
    # A gradient attack: one input gradient per query but the last (a forward pass).
    work = queries.sum() * forward if row.forward_only else (queries - 1).clip(0).sum() * gradient + len(y) * forward
    peak = peaks["tflops"][row.precision] * 1e12
    out = {
        "name": row.name, "kind": "attack", "model": model.clf.name, "precision": row.precision, "batch": batch,
        "params": attack.params(), "form": "jit" if row.jit else "arrays",
        "robustjax_images_per_s": batch / seconds, "robustjax_s": seconds,
        "robustjax_compile_s": compile_s, "robustjax_first_call_s": first,
        "forward_gflop_per_image": forward / 1e9, "gradient_gflop_per_image": gradient / 1e9,
        "mean_queries": float(queries.mean()), "model_tflop": work / 1e12,
        "robustjax_tflops": work / seconds / 1e12, "mfu": work / seconds / peak, "peak_tflops": peak / 1e12,
        "robustjax_success_rate": float(np.mean(result.success)),
    }
    PARTIAL(out | {"peer": "not finished", "peer_images_per_s": None, "ratio": None})
    if row.name == "wrn28_10_autoattack":
        out["mfu_note"] = "upper bound: every query counted as a gradient (Square's are forward passes)"
    out |= peer_columns(row, model, x, y, sizes, ta, ta_reason, work if row.fixed_work else None, peak)
    return out


def peer_columns(row, model, x, y, sizes, ta, ta_reason, work, peak) -> dict:
    reason = model.torch_reason or ta_reason
    if reason or time.perf_counter() - START > BUDGET_S:
        return {"peer": reason or "skipped: time budget spent", "peer_images_per_s": None, "ratio": None}
    make = (torch_autoattack(ta, sizes, model.clf.num_classes) if row.name == "wrn28_10_autoattack"
            else row.peer(ta, sizes))
    twin = torch_twin(model.torch_module, model.clf.mean, model.clf.std, row.precision)
    try:
        peer = run_peer(make, twin, x, y, 0 if row.name == "wrn28_10_autoattack" else sizes.peer_repeats)
    except Exception as error:  # noqa: BLE001 - torch out of memory or a torchattacks failure
        return {"peer": f"failed: {type(error).__name__}: {error}"[:300], "peer_images_per_s": None, "ratio": None}
    finally:
        del twin
        release_torch_memory()
    peer["peer"] = "torchattacks " + ("(torch.autocast bfloat16)" if row.precision == "bfloat16" else "(float32)")
    if work is not None:
        peer["peer_tflops"] = work / peer["peer_s"] / 1e12
        peer["peer_mfu"] = work / peer["peer_s"] / peak
    return peer


def with_ratio(row: dict) -> dict:
    if row.get("peer_images_per_s"):
        key = "robustjax_networks_per_s" if "robustjax_networks_per_s" in row else "robustjax_images_per_s"
        row["ratio"] = row[key] / row["peer_images_per_s"]
    return row


def corruption_row(sizes: Sizes, peaks: dict) -> dict:
    """The 15 ImageNet-C corruptions in one jitted program (each on the whole batch)."""
    size = sizes.corruption_size
    x = np.random.default_rng(0).uniform(size=(sizes.corruption_batch, size, size, 3)).astype(np.float32)
    functions = [rj.noise.create(name, 3, "imagenet") for name in IMAGENET_C]

    def suite(images, key):
        return [fn(images, k) for fn, k in zip(functions, jax.random.split(key, len(functions)), strict=True)]

    key = jax.random.key(0)
    flops, compile_s, program = compiled(suite, x, key)
    first, seconds, _ = timed(lambda: jax.block_until_ready(program(x, key)), sizes.repeats)
    peak = peaks["tflops"]["float32"] * 1e12
    out = {"name": "imagenet_c_15", "kind": "corruptions", "model": None, "precision": "float32",
           "batch": len(x), "params": {"corruptions": list(IMAGENET_C), "severity": 3, "size": size},
           "form": "jit", "robustjax_images_per_s": len(x) / seconds, "robustjax_s": seconds,
           "robustjax_compile_s": compile_s, "robustjax_first_call_s": first, "model_tflop": flops / 1e12,
           "robustjax_tflops": flops / seconds / 1e12, "mfu": flops / seconds / peak, "peak_tflops": peak / 1e12,
           "mfu_note": "the program's own FLOPs (cost analysis); corruptions are bound by memory, not FLOPs"}
    try:
        from benchmarks.noise import reference_corruptions, time_reference

        reference = reference_corruptions()
    except Exception as error:  # noqa: BLE001
        return out | {"peer": f"n/a: imagecorruptions not importable ({type(error).__name__})",
                      "peer_images_per_s": None, "ratio": None}
    if time.perf_counter() - START > BUDGET_S:
        return out | {"peer": "skipped: time budget spent", "peer_images_per_s": None, "ratio": None}
    images = np.round(x[:sizes.peer_corruption_images] * 255).astype(np.uint8)
    per_image = sum(time_reference(name, images, 3, reference) for name in IMAGENET_C)
    return out | {"peer": f"imagecorruptions on the CPU, one image at a time ({len(images)} images)",
                  "peer_images_per_s": 1 / per_image, "peer_s": per_image * len(x)}


def population_row(sizes: Sizes, peaks: dict) -> dict:
    """One PGD step of a population of NB201 subnets: every network attacks the same batch."""
    from robustjax.nas.population import Population, from_supernet

    channels, cells = sizes.nb201
    space = rj.nas.NB201Space(channels=channels, cells_per_stage=cells)
    supernet = rj.nas.Supernet.create(space, key=jax.random.key(0))
    networks = sizes.networks
    while True:
        archs = space.sample(jax.random.key(1), networks)
        population = from_supernet(supernet, archs)
        rng = np.random.default_rng(0)
        x = rng.uniform(size=(sizes.population_batch, *space.input_shape)).astype(np.float32)
        y = rng.integers(0, space.num_classes, len(x)).astype(np.int32)
        attack = rj.attacks.PGD(eps=sizes.eps, steps=sizes.population_steps, early_stop=False)

        def members(params):
            return Population(population.classifier.replace(params=params), population.axes, population.arch_ids)

        def step(params, images, labels, key):
            return members(params).map(lambda c, i, lab: attack(c, i, lab, key=key), images, labels)

        def loss(images, c):
            return -jnp.sum(jax.nn.log_softmax(c(images))[jnp.arange(len(y)), y])

        params = population.classifier.params
        try:
            forward = compiled_flops(lambda p, i: members(p).map(lambda c, im: c(im), i), params, x)
            gradient = compiled_flops(lambda p, i: members(p).map(lambda c, im: jax.grad(loss)(im, c), i), params, x)
            program = jax.jit(step)
            key = jax.random.key(0)
            (first, seconds, result), compile_s = COMPILES.measure(
                lambda: timed(lambda: jax.block_until_ready(program(params, x, y, key)), sizes.repeats))
            break
        except Exception as error:
            if not is_out_of_memory(error) or networks <= 1:
                raise
            networks //= 2
            print(f"out of memory: population of {networks} networks", flush=True)
    queries = np.asarray(result.queries, np.float64)  # (networks, batch)
    work = (queries - 1).clip(0).sum() * gradient / len(y) / networks + queries.shape[0] * forward / networks
    peak = peaks["tflops"]["float32"] * 1e12
    return {"name": "nb201_population_pgd10", "kind": "population", "model": f"nb201 C={channels} N={cells}",
            "precision": "float32", "batch": len(y), "networks": networks, "params": attack.params(),
            "form": "jit", "robustjax_networks_per_s": networks / seconds,
            "robustjax_images_per_s": networks * len(y) / seconds, "robustjax_s": seconds,
            "robustjax_compile_s": compile_s, "robustjax_first_call_s": first,
            "forward_gflop_per_network": forward / networks / 1e9,
            "gradient_gflop_per_network": gradient / networks / 1e9,
            "model_tflop": work / 1e12, "robustjax_tflops": work / seconds / 1e12, "mfu": work / seconds / peak,
            "peak_tflops": peak / 1e12, "mfu_note": "masks layout: the supernet's FLOPs (every op of every edge)",
            "peer": "n/a: no torch population (benchmarks/nas.py times xautodl networks one at a time)",
            "peer_images_per_s": None, "ratio": None}


def sweep_row(sizes: Sizes, peaks: dict) -> dict:
    """``benchmarks.nas`` over NB201 subnets of ``sizes.nb201``: a population against xautodl
    and torchattacks one network at a time (``benchmarks.nas.measure``, no warm rows)."""
    from benchmarks import nas

    for wheel in sorted(WHEELS.glob("xautodl-*.whl"))[-1:]:  # the GPU machine has no registry
        if importlib.util.find_spec("xautodl") is None and str(wheel) not in sys.path:
            sys.path.insert(0, str(wheel))
    channels, cells = sizes.nb201
    space = rj.nas.NB201Space(channels=channels, cells_per_stage=cells)
    plan = nas.PLAN | {"num_examples": sizes.sweep_examples, "batch_size": sizes.sweep_examples}
    measured, compile_s = COMPILES.measure(lambda: nas.measure(
        space, networks=sizes.sweep_networks, alone=1, torch=sizes.sweep_torch, population_size=sizes.sweep_networks,
        plan=plan, calibration_images=sizes.sweep_calibration, warm=False))
    rows = measured["results"]
    per_s = rows["population"]["networks_per_hour"] / 3600
    flop_per_network = rows["machine_ceiling"]["gflop_per_network"] * 1e9
    peak = peaks["tflops"]["float32"] * 1e12
    return {"name": "nb201_sweep_vs_torch", "kind": "population", "model": f"nb201 C={channels} N={cells}",
            "precision": "float32", "batch": sizes.sweep_examples, "networks": sizes.sweep_networks,
            "params": {"plan": plan, "calibration_images": sizes.sweep_calibration}, "form": "evaluate_population",
            "robustjax_networks_per_s": per_s, "robustjax_images_per_s": per_s * sizes.sweep_examples,
            "robustjax_s": rows["population"]["seconds"], "robustjax_compile_s": compile_s,
            "mfu": per_s * flop_per_network / peak, "peak_tflops": peak / 1e12,
            "mfu_note": "model FLOPs: each subnet's own MACs (the supernet layout runs more)",
            "peer": "xautodl TinyNetwork + torchattacks, one network at a time (networks/s)",
            "peer_images_per_s": rows["torch"]["networks_per_hour"] / 3600, "nas": measured}


# NAS-RobBench-201 (Wu et al., ICLR 2024): 6,466 cells x 3 datasets x 3 seeds, 50 epochs of
# CIFAR-10's 50,000 images at batch 256 each, about 107k T4-hours.
NAS_ROBBENCH_NETWORKS, NAS_ROBBENCH_STEPS, NAS_ROBBENCH_GPU_HOURS = 58_194, 50 * 196, 107_000


def training_row(sizes: Sizes, peaks: dict) -> dict:
    """NB201 cells trained side by side as one population (``benchmarks.training_population``)
    against torch one network at a time; networks/s are network training steps per second."""
    from benchmarks import training_population as tp

    for wheel in sorted(WHEELS.glob("xautodl-*.whl"))[-1:]:  # the GPU machine has no registry
        if importlib.util.find_spec("xautodl") is None and str(wheel) not in sys.path:
            sys.path.insert(0, str(wheel))
    channels, cells_per_stage = sizes.nb201
    space = rj.nas.NB201Space(channels=channels, cells_per_stage=cells_per_stage)
    rng = np.random.default_rng(0)
    examples = 4 * sizes.training_batch
    data = rj.data.from_arrays(rng.integers(0, 256, (examples, *space.input_shape), dtype=np.uint8),
                               rng.integers(0, space.num_classes, examples), num_classes=space.num_classes)
    cells = [int(i) for i in rng.choice(len(space), sizes.training_networks, replace=False)]
    batch = sizes.training_batch
    steps = sizes.training_attack_steps
    mine, compile_s = COMPILES.measure(lambda: tp.ours(space, cells, data, sizes.training_steps, "masks", batch, steps))
    torch_step_s = tp.theirs(space, cells[:sizes.training_torch], data, sizes.training_steps, os.cpu_count() or 1,
                             batch, steps)
    flops = tp.step_flops(space, cells, data, "masks", batch, steps)
    steps_per_s = len(cells) / mine["step_s"]
    per_gpu_hour = 3600 * steps_per_s / NAS_ROBBENCH_STEPS
    projected = NAS_ROBBENCH_NETWORKS / per_gpu_hour
    return {"name": "nb201_training_population", "kind": "population", "model": f"nb201 C={channels} N={cells_per_stage}",
            "precision": "float32", "batch": batch, "networks": len(cells), "form": "train_population (side by side)",
            "params": {"techniques": str(tp.TECHNIQUES), "eps": tp.EPS, "attack_steps": steps},
            "robustjax_networks_per_s": steps_per_s, "robustjax_images_per_s": steps_per_s * batch,
            "robustjax_s": mine["step_s"], "robustjax_compile_s": compile_s,
            "mfu": flops["own_step_gflops"] * 1e9 / mine["step_s"] / (peaks["tflops"]["float32"] * 1e12),
            "peak_tflops": peaks["tflops"]["float32"], "executed_over_own": flops["executed_over_own"],
            "mfu_note": "model FLOPs: each cell's own training step (the side-by-side layout runs every op)",
            "peer": "xautodl TinyNetwork + torchattacks, one network at a time (network steps/s)",
            "peer_images_per_s": 1 / torch_step_s, "networks_per_gpu_hour_nas_robbench": per_gpu_hour,
            "projected_gpu_hours_58k": projected, "share_of_107k_gpu_hours": projected / NAS_ROBBENCH_GPU_HOURS}


# --- driver --------------------------------------------------------------------------------

BUDGET_S = float("inf")
PARTIAL: Callable[[dict], None] = lambda row: None  # noqa: E731 - writes a row whose peer is still running
ROW_NAMES = (*(r.name for r in ATTACK_ROWS), "wrn28_10_autoattack", "imagenet_c_15", "nb201_population_pgd10",
             "nb201_sweep_vs_torch", "nb201_training_population")
# Run order: the rows with performance targets first, so that a spent budget skips the others.
# AutoAttack, the longest (its torch peer above all), comes last.
PRIORITY = ("resnet50_pgd10_bfloat16", "resnet50_pgd20_bfloat16", "resnet50_pgd10_float32",
            "resnet50_pgd20_float32", "wrn28_10_apgd_ce", "wrn28_10_cw_l2", "wrn28_10_square", "imagenet_c_15",
            "nb201_population_pgd10", "nb201_sweep_vs_torch", "nb201_training_population", "wrn28_10_autoattack")


def default_wheel() -> Path | None:
    wheels = sorted(WHEELS.glob("torchattacks-*.whl"))
    return wheels[-1] if wheels else None


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="every row at tiny sizes (CPU, for a test)")
    parser.add_argument("--rows", default=",".join(ROW_NAMES), help="comma-separated rows")
    parser.add_argument("--resnet-batch", type=int, default=None,
                        help="first ResNet batch tried (halved on out-of-memory); default 256 (smoke: 4)")
    parser.add_argument("--repeats", type=int, default=None, help="timed robustjax calls after the first")
    parser.add_argument("--peer-wheel", type=Path, default=None,
                        help="a torchattacks wheel to import from (default: benchmarks/wheels/torchattacks-*.whl)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds from the start after which rows left are skipped (default 420; smoke: none)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    if unknown := sorted(set(args.rows.split(",")) - set(ROW_NAMES)):
        parser.error(f"unknown rows {unknown}; known: {list(ROW_NAMES)}")
    return args


def device_slug() -> str:
    return re.sub(r"[^a-z0-9]+", "-", jax.devices()[0].device_kind.lower()).strip("-") or jax.default_backend()


def write(path: Path, facts: dict, settings: dict, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "benchmark": "accelerator",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": facts, "settings": settings, "results": rows}, indent=2, default=str) + "\n")


def print_row(row: dict) -> None:
    def number(value, digits=1):
        return "-" if value is None else f"{value:,.{digits}f}"

    if "skipped" in row or "error" in row:
        print(f"{row['name']:26s} {row.get('skipped') or row.get('error')}", flush=True)
        return
    rate = row.get("robustjax_networks_per_s") or row["robustjax_images_per_s"]
    unit = "net/s" if "robustjax_networks_per_s" in row else "img/s"
    print(f"{row['name']:26s} {number(rate):>10s} {unit}  MFU {100 * row['mfu']:5.1f}%  "
          f"compile {row['robustjax_compile_s']:6.1f} s  peer {number(row.get('peer_images_per_s')):>9s}  "
          f"ratio {number(row.get('ratio'), 2):>6s}  ({row.get('peer')})", flush=True)


def main() -> None:
    global BUDGET_S, COMPILES, PARTIAL
    args = parse_arguments()
    sizes = SMOKE if args.smoke else Sizes()
    if args.resnet_batch or args.repeats is not None:
        sizes = dataclasses.replace(sizes, resnet_batch=args.resnet_batch or sizes.resnet_batch,
                                    repeats=sizes.repeats if args.repeats is None else args.repeats)
    BUDGET_S = args.budget_s if args.budget_s is not None else (float("inf") if args.smoke else 420.0)
    COMPILES = CompileSeconds()
    wheel = args.peer_wheel or default_wheel()
    ta, ta_reason = import_torchattacks(wheel)
    facts = machine_facts(("torch", "torchvision", "timm", "torchattacks", "imagecorruptions"))
    if ta is not None:
        facts["versions"]["torchattacks"] = getattr(ta, "__version__", None) or facts["versions"]["torchattacks"]
        facts["torchattacks_from"] = getattr(ta, "__file__", None)
    peaks = device_peaks(sizes)
    facts["peaks"] = peaks
    try:
        import torch

        from benchmarks.common import torch_device

        facts["torch_device"], facts["torch_threads"] = torch_device(), torch.get_num_threads()
        facts["torch_cuda"] = torch.version.cuda
    except ImportError:
        pass
    path = args.out / f"accelerator.{device_slug()}.json"
    settings = {"smoke": args.smoke, "sizes": dataclasses.asdict(sizes), "budget_s": BUDGET_S,
                "weights": "random (throughput only)", "eps_linf": {"resnet": 4 / 255, "wrn_and_population": sizes.eps}}
    print(f"{peaks['device_kind']}: peaks {peaks['tflops']} TFLOP/s ({peaks['source']}); "
          f"torchattacks: {ta_reason or 'ok'}", flush=True)

    def partial(row: dict) -> None:
        write(path, facts, settings | {"elapsed_s": time.perf_counter() - START},
              [done.get(n) or row for n in ROW_NAMES if n in done or n == row["name"]])

    PARTIAL = partial
    chosen = [name for name in PRIORITY if name in args.rows.split(",")]
    models: dict[str, Model] = {}
    done: dict[str, dict] = {}
    batches = {"resnet": sizes.resnet_batch, "wrn": sizes.wrn_batch}
    for name in chosen:
        if time.perf_counter() - START > BUDGET_S:
            done[name] = {"name": name, "skipped": f"time budget of {BUDGET_S:.0f} s spent"}
            print_row(done[name])
            continue
        row_start = time.perf_counter()
        try:
            if name == "imagenet_c_15":
                row = corruption_row(sizes, peaks)
            elif name == "nb201_population_pgd10":
                row = population_row(sizes, peaks)
            elif name == "nb201_sweep_vs_torch":
                row = sweep_row(sizes, peaks)
            elif name == "nb201_training_population":
                row = training_row(sizes, peaks)
            else:
                spec = next((r for r in ATTACK_ROWS if r.name == name), None) or AttackRow(
                    name, "wrn", "float32", None, None, jit=False, fixed_work=False)
                if spec.model not in models:
                    models[spec.model] = resnet_model(sizes) if spec.model == "resnet" else wrn_model(sizes)
                batch = sizes.autoattack_batch if name == "wrn28_10_autoattack" else batches[spec.model]
                while True:
                    try:
                        row = attack_row(spec, models[spec.model], batch, sizes, peaks, ta, ta_reason)
                        break
                    except Exception as error:
                        if not is_out_of_memory(error) or batch <= 1:
                            raise
                        batch //= 2
                        if name != "wrn28_10_autoattack":
                            batches[spec.model] = batch  # the largest batch that fits, for the next rows
                        print(f"{name}: out of memory, batch {batch}", flush=True)
            done[name] = with_ratio(row) | {"row_wall_s": time.perf_counter() - row_start}
        except Exception as error:  # noqa: BLE001 - one failed row must not lose the others
            traceback.print_exc()
            done[name] = {"name": name, "error": f"{type(error).__name__}: {error}"[:500]}
        print_row(done[name])
        write(path, facts, settings | {"elapsed_s": time.perf_counter() - START},
              [done[n] for n in ROW_NAMES if n in done])
    print(f"written to {path} in {time.perf_counter() - START:.0f} s")


if __name__ == "__main__":
    main()
