"""The Ray executor: one task per population batch on a Ray cluster (the ``ray`` extra).

The driver claims chunks from the store as the local executor does, keeps one task in
flight per worker slot (a GPU each, or a CPU each on a cluster without GPUs), and commits
each item's rows as a task yields them (a streaming task): the store's only writer is the
driver, and a driver that dies loses at most the items running. A task whose
worker dies is retried by Ray (``max_retries``); a task that still fails has its claims
released, so a later run takes its networks up again.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Sequence

from robustjax.compile_cache import use_compile_cache
from robustjax.sweep.engine import Sweep, chunk_size, context
from robustjax.sweep.store import Store

CONNECT_TIMEOUT_S = 5.0


def _evaluate_task(sweep: Sweep, arch_ids: list[str], missing: dict[str, list[str]], pad_to: int,
                   worker: str, compile_cache: str) -> Iterator[list[dict]]:
    """On a Ray worker: the missing (network, item) rows of one population batch, yielded
    item by item (a streaming task), with the driver's persistent compile cache
    (``compile_cache``; a folder every worker can reach)."""
    use_compile_cache(compile_cache)
    yield from context(sweep).evaluate(arch_ids, missing, pad_to=pad_to, worker=worker)


def check_executable(sweep: Sweep) -> None:
    """Refuses a sweep that trains networks: training runs where the local executor runs."""
    if sweep.training:
        raise ValueError("a sweep with a [training] table trains its networks on this machine: run it without "
                         "--ray (the Ray executor does not train)")


def check_reachable(address: str) -> None:
    """Fails fast, naming ``address``, when no Ray head answers at ``host:port``."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not port.isdigit():
        raise ValueError(f"--ray takes 'auto' or HOST:PORT of a Ray head, got {address!r}")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise ConnectionError(f"no Ray cluster answers at {address} ({error}); start one with `ray start --head` "
                              "or check the address") from None


def connect(address: str):
    """``ray`` connected to the cluster at ``address`` ("auto": the one this machine runs)."""
    try:
        import ray
    except ImportError:
        raise ImportError("the Ray executor needs ray: pip install 'robustjax[ray]'") from None
    if address != "auto":
        check_reachable(address)
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False, include_dashboard=False)
        except ConnectionError as error:
            raise ConnectionError(f"cannot join the Ray cluster at {address}: {error}") from None
    return ray


def run_ray(sweep: Sweep, store: Store, selection: Sequence[str], *, address: str, worker: str,
            lease_s: float = 1800.0, max_retries: int = 3, on_chunk: Callable[[list[str]], None] | None = None,
            log: Callable[[str], None] | None = None, compile_cache: str = "off") -> None:
    """Evaluates the chunks of ``selection`` as Ray tasks until none is left to claim; the
    workers keep their compiled programs in ``compile_cache`` (``compile_cache.use_compile_cache``)."""
    check_executable(sweep)
    ray = connect(address)
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    slots = gpus or max(1, int(resources.get("CPU", 1)))
    task = ray.remote(num_gpus=1 if gpus else 0, num_cpus=0 if gpus else 1, max_retries=max_retries,
                      num_returns="streaming")(_evaluate_task)
    size_of = chunk_size(sweep, store, selection)
    in_flight: dict = {}  # a task's stream of rows -> its chunk
    remaining = list(selection)
    with store.heartbeat(worker, lease_s):  # the claims live while the tasks run
        while True:
            while len(in_flight) < slots:
                chunk = store.claim(worker, remaining, lease_s, size_of)
                if not chunk:
                    break
                stream = task.remote(sweep, chunk, store.missing(chunk), size_of(chunk[0]), worker, compile_cache)
                in_flight[stream] = chunk
            if not in_flight:
                return
            (ready,), _ = ray.wait(list(in_flight), num_returns=1)
            chunk = in_flight[ready]
            try:
                store.commit(ray.get(next(ready)))  # one item's rows, as the worker finishes it
                continue
            except StopIteration:  # the task has yielded every item
                pass
            except ray.exceptions.RayError as error:  # retries spent: a later run takes these networks up again
                remaining = [arch_id for arch_id in remaining if arch_id not in chunk]
                if log is not None:
                    log(f"task for {len(chunk)} networks failed after {max_retries} retries: {error}")
            del in_flight[ready]
            store.release(worker, chunk)
            if on_chunk is not None:
                on_chunk(chunk)
