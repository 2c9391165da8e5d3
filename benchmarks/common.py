"""Shared pieces of the benchmarks: timing, machine facts, the ratio table and JSON output."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_facts(peers: tuple[str, ...]) -> dict:
    devices = jax.devices()
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "versions": {name: version(name) for name in ("jax", "jaxlib", "flax", *peers)},
        "python": platform.python_version(),
    }


def torch_device() -> str:
    """The torch peer runs where JAX runs: on the GPU when JAX's backend is one."""
    import torch

    return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def synchronized(value):
    """``value``, once queued GPU work is done, so that torch timings cover it."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return value


def seconds_per_call(call: Callable[[], object], repeats: int, min_sample_s: float = 0.1) -> tuple[float, float]:
    """(first call, median of ``repeats`` samples of the seconds per later call); ``call``
    must block. A call shorter than ``min_sample_s`` is timed over enough calls in a row to
    last that long, so the timer's and the scheduler's noise stay small beside a sample."""

    def seconds(calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - start) / calls

    first = seconds(1)
    if repeats < 1:
        return first, first
    probe = seconds(1)
    calls = max(1, math.ceil(min_sample_s / max(probe, 1e-9)))
    samples = [probe] if calls == 1 else []
    samples += [seconds(calls) for _ in range(repeats - len(samples))]
    return first, statistics.median(samples)


def timed(call: Callable[[], object], repeats: int) -> tuple[float, float, object]:
    """:func:`seconds_per_call` that also returns the last call's output."""
    last = []

    def keep():
        last[:] = [call()]

    first, median = seconds_per_call(keep, repeats)
    return first, median, last[0]


def matmul_peak_gflops(size: int = 2048, repeats: int = 10, dtype: str = "float32") -> float:
    """The machine's practical float32 (or ``dtype``) peak: the best GFLOP/s of a jitted
    ``size``-square matrix product on the default device (XLA's most efficient kernel; small
    convolutions reach a fraction of it)."""
    import jax.numpy as jnp

    a = jnp.ones((size, size), dtype)
    product = jax.jit(lambda a: a @ a)
    product(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        product(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def compiled(fn: Callable, *args) -> tuple[float, float, Callable]:
    """(FLOPs from XLA's cost analysis of the compiled program, compile seconds, the compiled
    program) of ``fn(*args)``. The analysis counts the body of a rolled loop once, whatever
    its trip count."""
    start = time.perf_counter()
    program = jax.jit(fn).lower(*args).compile()
    seconds = time.perf_counter() - start
    analysis = program.cost_analysis()
    if isinstance(analysis, list | tuple):  # older jax: one dict per program
        analysis = analysis[0]
    return float(analysis.get("flops", 0.0)), seconds, program


def compiled_flops(fn: Callable, *args) -> float:
    return compiled(fn, *args)[0]


_PASS_FLOPS: dict = {}


def model_pass_flops(clf, x, y) -> tuple[float, float]:
    """(forward, input gradient) FLOPs per image of classifier ``clf`` at ``x``'s batch,
    from XLA's cost analysis, cached per architecture and image shape (a float32 and a
    bfloat16 run share one count: the same convolutions and products)."""
    import jax.numpy as jnp

    cache_key = (clf.name, x.shape[1:], tuple(leaf.shape for leaf in jax.tree.leaves(clf.params)))
    if cache_key not in _PASS_FLOPS:
        def loss(images, c):
            logits = c(images).astype(jnp.float32)
            return -jnp.sum(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])

        forward = compiled_flops(lambda c, images: c(images), clf, x)
        gradient = compiled_flops(jax.grad(loss), x, clf)
        _PASS_FLOPS[cache_key] = forward / len(y), gradient / len(y)
    return _PASS_FLOPS[cache_key]


def arguments(description: str, batch_size: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls after the first (median taken)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    return parser.parse_args()


def report(name: str, rows: list[dict], facts: dict, settings: dict, out: Path) -> Path:
    """Prints the table of images/s and ratios, and writes the JSON results."""
    flops = all("robustjax_gflops" in row for row in rows)
    print(f"{'benchmark':34s} {'robustjax img/s':>16s} {'peer img/s':>11s} {'ratio':>6s} {'compile s':>10s}"
          + (f" {'GFLOP/s: robustjax':>19s} {'peer':>6s} {'peak':>6s}" if flops else ""))
    for row in rows:
        print(f"{row['name']:34s} {row['robustjax_images_per_s']:16.1f} {row['peer_images_per_s']:11.1f} "
              f"{row['ratio']:6.2f} {row['robustjax_compile_s']:10.2f}"
              + (f" {row['robustjax_gflops']:19.1f} {row['peer_gflops']:6.1f} {row['peak_gflops']:6.0f}"
                 if flops else ""))
    return write_json(name, rows, facts, settings, out)


def write_json(name: str, rows: list[dict], facts: dict, settings: dict, out: Path) -> Path:
    """Writes a benchmark's JSON results to ``out/NAME.BACKEND.json`` and says where."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.{facts['backend']}.json"
    payload = {
        "benchmark": name,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": facts,
        "settings": settings,
        "results": rows,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"written to {path}")
    return path
