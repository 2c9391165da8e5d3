"""XLA settings robustjax applies by default, because they make its programs faster.

``--xla_cpu_experimental_ynn_fusion_type=`` (empty) keeps XLA's CPU backend from handing
convolutions to YNNPACK, so they run on XLA's own Eigen path: PGD-20 on the digits CNN
went from 610 to 975 images/s and a ResNet-18 gradient step from 533 to 442 ms on a 2-core
AVX-512 CPU (benchmarks/README.md). The flag only concerns the CPU backend.

Flags are read when JAX creates its backends, at the first computation, so they are added
to ``XLA_FLAGS`` when robustjax is imported; a flag the user already set is left alone,
and ``ROBUSTJAX_KEEP_XLA_FLAGS=1`` turns the whole mechanism off.
"""

from __future__ import annotations

import os

DEFAULT_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=",)


def apply_default_flags() -> None:
    """Appends each default flag to ``XLA_FLAGS`` unless it is already set there."""
    if os.environ.get("ROBUSTJAX_KEEP_XLA_FLAGS"):
        return
    flags = os.environ.get("XLA_FLAGS", "")
    for flag in DEFAULT_FLAGS:
        if flag.split("=")[0] not in flags:
            flags = f"{flags} {flag}".strip()
    os.environ["XLA_FLAGS"] = flags
