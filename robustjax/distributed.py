"""Multi-host runs: one process per host, every host's devices in one global mesh.

Call :func:`initialize` in every process before anything else touches JAX (``robustjax
evaluate --distributed`` does). Evaluation then shards each batch over the devices of every
host (``evaluation.parallel.DataParallel`` takes ``jax.devices()``, the global list); each
process reads the same examples and keeps only its devices' shards; per-example results are
gathered to every process (:func:`to_host`), so each one builds the same report, and only
the main process (index 0) writes files.

Without arguments :func:`initialize` lets JAX find the cluster (SLURM, Open MPI, Cloud TPU
and the other environments ``jax.distributed`` detects); a plain list of hosts passes the
coordinator's address, the number of processes and this process's index. On CPUs the
processes' collectives go through gloo.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
    """Joins this process to a multi-host run (``jax.distributed.initialize``)."""
    if (coordinator is None) != (num_processes is None) or (coordinator is None) != (process_id is None):
        raise ValueError("give the coordinator's HOST:PORT, the number of processes and this process's index "
                         "together, or none of them (JAX then finds them in a SLURM, MPI or TPU environment)")
    if num_processes is not None and not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)


def is_main() -> bool:
    """Whether this process writes the results (process 0, or the only one)."""
    return jax.process_index() == 0


def to_host(array) -> np.ndarray:
    """``array``'s whole value on this host: gathered from every process when its shards
    lie on other hosts' devices."""
    if isinstance(array, jax.Array) and not (array.is_fully_addressable or array.is_fully_replicated):
        return np.asarray(multihost_utils.process_allgather(array, tiled=True))
    return np.asarray(array)


def share_from_main(payload: bytes) -> bytes:
    """The main process's ``payload``, in every process (what the others pass is ignored)."""
    if jax.process_count() == 1:
        return payload
    size = int(multihost_utils.broadcast_one_to_all(np.int64(len(payload))))
    buffer = np.zeros(size, np.uint8)
    if is_main():
        buffer[:] = np.frombuffer(payload, np.uint8)
    return multihost_utils.broadcast_one_to_all(buffer).astype(np.uint8).tobytes()
