"""The sweep store: one SQLite file (the standard library's sqlite3, WAL journal) that is
the truth of a sweep.

Tables:
- ``meta``: the sweep's definition (plan, space or models, weights and data hashes) and
  the environment that made it, written once;
- ``networks``: the networks of the sweep, in order, with their cards (config and cost)
  and the shape bucket that decides which share a compiled program;
- ``items``: the plan's items (``evaluation.items``) with their figure labels;
- ``results``: one row per (network, item, data), keyed by arch id, item hash and data
  hash, written in one transaction per item and population: ``ok`` with the figures and
  the per-example outcome (correctness bit-packed with ``numpy.packbits``; a sequence
  item's per-example rates as float32; a ``report`` item's record, the network's
  evaluation items as ``evaluation.resume`` snapshots them), or ``failed`` with the error;
- ``claims``: which worker holds which networks, until when (a lease). A claim whose lease
  has expired, or whose worker process on this host is gone, is free again.

Every write is a transaction with ``synchronous=FULL``, so a sweep killed at any moment
(SIGKILL, power loss) keeps every committed row and no half-written one; rows are
inserted only where none exists, so nothing is counted twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from robustjax.evaluation.items import REPORT, outcome_dtype

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS networks (
    arch_id TEXT PRIMARY KEY, position INTEGER NOT NULL, bucket TEXT NOT NULL, card TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    item_key TEXT PRIMARY KEY, position INTEGER NOT NULL, kind TEXT NOT NULL, settings TEXT NOT NULL,
    labels TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (
    arch_id TEXT NOT NULL, item_key TEXT NOT NULL, data_key TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
    figures TEXT, outcome BLOB, examples INTEGER, error TEXT, seconds REAL NOT NULL, worker TEXT NOT NULL,
    finished REAL NOT NULL,
    PRIMARY KEY (arch_id, item_key, data_key));
CREATE TABLE IF NOT EXISTS claims (arch_id TEXT PRIMARY KEY, worker TEXT NOT NULL, expires REAL NOT NULL);
"""
# Room a sweep needs on disk beyond its rows before it starts (journal, checkpoints of the WAL).
DISK_MARGIN_BYTES = 16 << 20


class SweepMismatch(ValueError):
    """The database holds another sweep."""


def _rate(finished: list[float]) -> float | None:
    """Networks per hour from the times networks finished: the networks finished after the
    first moment one did, over the time since that moment (a population's networks finish
    together, so counting the first ones would credit the first interval with work done
    before it); None before a second moment."""
    if not finished:
        return None
    first = min(finished)
    later = [t for t in finished if t > first]
    return len(later) / (max(later) - first) * 3600 if later else None


def worker_id() -> str:
    """``host:pid:nonce``: unique per process, and tells a claim's process on this host."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


def _worker_gone(worker: str) -> bool:
    """Whether ``worker`` ran on this host and its process no longer exists."""
    host, _, rest = worker.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def pack(outcome: np.ndarray) -> bytes:
    """(figures, examples) outcome -> bytes: bool 1 bit per example, values as float32."""
    outcome = np.asarray(outcome)
    if outcome.dtype == np.bool_:
        return np.packbits(outcome, axis=-1).tobytes()
    return np.ascontiguousarray(outcome, np.float32).tobytes()


def unpack(blob: bytes, figures: int, examples: int, dtype: type = np.bool_) -> np.ndarray:
    """Inverse of :func:`pack` for an outcome of ``dtype`` (``items.outcome_dtype``)."""
    if dtype != np.bool_:
        return np.frombuffer(blob, np.float32).reshape(figures, examples).copy()
    packed = np.frombuffer(blob, np.uint8).reshape(figures, -1)
    return np.unpackbits(packed, axis=-1, count=examples).astype(bool)


class Store:
    """A sweep's SQLite database. ``Store.open`` creates it, or checks that it holds the
    same sweep (``definition``); it fails before any work when the file cannot be written
    or the disk lacks room for ``expected_bytes``."""

    def __init__(self, path: Path, connection: sqlite3.Connection):
        self.path, self._db = path, connection

    @classmethod
    def open(cls, path: str | Path, definition: dict, *, environment: dict | None = None,
             expected_bytes: int = 0) -> Store:
        path = Path(path)
        folder = path.resolve().parent
        if not folder.is_dir():
            raise FileNotFoundError(f"--db {path}: folder {folder} does not exist")
        free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
        if free < expected_bytes + DISK_MARGIN_BYTES:
            raise OSError(f"--db {path}: {free / 2**20:.0f} MiB free on its disk, the sweep needs about "
                          f"{(expected_bytes + DISK_MARGIN_BYTES) / 2**20:.0f} MiB; free some space or put the "
                          "database elsewhere")
        try:
            connection = sqlite3.connect(path, timeout=60, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            connection.executescript(SCHEMA)
            store = cls(path, connection)
            with store._transaction():
                store._check_definition(definition, environment or {})
        except sqlite3.OperationalError as error:
            raise OSError(f"--db {path}: cannot write the sweep database ({error}); check the file's permissions "
                          "and the disk") from None
        except sqlite3.DatabaseError as error:  # another kind of file
            raise ValueError(f"--db {path} is not a robustjax sweep database ({error}); pass a new --db") from None
        return store

    @classmethod
    def read(cls, path: str | Path) -> Store:
        """An existing sweep database, for status, export and analysis."""
        connection = sqlite3.connect(path, timeout=60, isolation_level=None)
        try:
            connection.execute("SELECT value FROM meta WHERE key = 'definition'").fetchone()[0]
        except (sqlite3.DatabaseError, TypeError):
            connection.close()
            raise ValueError(f"{path} is not a robustjax sweep database") from None
        return cls(Path(path), connection)

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE: workers queue, never deadlock)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _check_definition(self, definition: dict, environment: dict) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'definition'").fetchone()
        if row is None:
            self._db.executemany("INSERT INTO meta VALUES (?, ?)", [
                ("definition", json.dumps(definition, sort_keys=True)),
                ("environment", json.dumps(environment, sort_keys=True)),
                ("created", json.dumps(time.time()))])
            return
        stored = json.loads(row[0])
        if stored != json.loads(json.dumps(definition, sort_keys=True)):
            differ = sorted(k for k in set(stored) | set(definition) if stored.get(k) != definition.get(k))
            raise SweepMismatch(f"{self.path} holds another sweep: its {', '.join(differ)} differ from this run's. "
                                f"Pass a new --db to start anew (or delete {self.path}), or rerun the sweep that made "
                                "it to resume it")

    def meta(self, key: str):
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    @property
    def data_key(self) -> str:
        return self.meta("definition")["data_key"]

    def add_networks(self, networks: Iterable[tuple[str, str, dict]]) -> None:
        """Adds ``(arch_id, bucket, card)`` rows that are not there yet, after the others."""
        with self._transaction() as db:
            start = db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM networks").fetchone()[0]
            db.executemany("INSERT OR IGNORE INTO networks VALUES (?, ?, ?, ?)",
                           [(a, start + i, b, json.dumps(c)) for i, (a, b, c) in enumerate(networks)])

    def annotate(self, arch_id: str, fields: dict) -> None:
        """Adds ``fields`` to network ``arch_id``'s card (a trained cell's training figures)."""
        with self._transaction() as db:
            (card,) = db.execute("SELECT card FROM networks WHERE arch_id = ?", (arch_id,)).fetchone()
            db.execute("UPDATE networks SET card = ? WHERE arch_id = ?", (json.dumps(json.loads(card) | fields), arch_id))

    def set_items(self, items: Iterable[tuple[str, str, dict, tuple[str, ...]]]) -> None:
        """Records the plan's ``(item_key, kind, settings, labels)`` (fixed by the definition)."""
        with self._transaction() as db:
            db.executemany("INSERT OR IGNORE INTO items VALUES (?, ?, ?, ?, ?)",
                           [(k, i, kind, json.dumps(s), json.dumps(list(labels)))
                            for i, (k, kind, s, labels) in enumerate(items)])

    def item_keys(self) -> list[str]:
        return [k for (k,) in self._db.execute("SELECT item_key FROM items ORDER BY position")]

    def _done_counts(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT arch_id, COUNT(*) FROM results WHERE data_key = ? GROUP BY arch_id",
                                     (self.data_key,)))

    def done(self) -> set[str]:
        """The networks that have a row for every item."""
        wanted = len(self.item_keys())
        return {arch_id for arch_id, count in self._done_counts().items() if count == wanted}

    def claim(self, worker: str, selection: list[str], lease_s: float, size_of: Callable[[str], int]) -> list[str]:
        """Claims networks of ``selection`` that still miss an item and that no live worker
        holds, all of one bucket: the first such network's, up to ``size_of(that network)``."""
        now = time.time()
        with self._transaction() as db:
            for holder, in db.execute("SELECT DISTINCT worker FROM claims").fetchall():
                if _worker_gone(holder):
                    db.execute("DELETE FROM claims WHERE worker = ?", (holder,))
            db.execute("DELETE FROM claims WHERE expires < ?", (now,))
            held = {a for (a,) in db.execute("SELECT arch_id FROM claims")}
            done, wanted = self._done_counts(), len(self.item_keys())
            buckets = dict(db.execute("SELECT arch_id, bucket FROM networks"))
            pending = [a for a in selection if a not in held and done.get(a, 0) < wanted]
            if not pending:
                return []
            bucket = buckets[pending[0]]
            chunk = [a for a in pending if buckets[a] == bucket][:size_of(pending[0])]
            db.executemany("INSERT INTO claims VALUES (?, ?, ?)", [(a, worker, now + lease_s) for a in chunk])
        return chunk

    @contextlib.contextmanager
    def heartbeat(self, worker: str, lease_s: float) -> Iterator[None]:
        """Renews ``worker``'s claims every quarter of ``lease_s`` while the block runs (from a
        thread with a connection of its own), so an item longer than the lease keeps its
        networks; a worker that dies stops renewing and its claims expire."""
        stop = threading.Event()

        def beat() -> None:
            store = Store.read(self.path)
            try:
                while not stop.wait(lease_s / 4):
                    store.renew(worker, lease_s)
            finally:
                store.close()

        thread = threading.Thread(target=beat, name=f"lease of {worker}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def renew(self, worker: str, lease_s: float) -> None:
        with self._transaction() as db:
            db.execute("UPDATE claims SET expires = ? WHERE worker = ?", (time.time() + lease_s, worker))

    def release(self, worker: str, arch_ids: Iterable[str]) -> None:
        with self._transaction() as db:
            db.executemany("DELETE FROM claims WHERE worker = ? AND arch_id = ?", [(worker, a) for a in arch_ids])

    def missing(self, arch_ids: list[str]) -> dict[str, list[str]]:
        """Per item key, the networks of ``arch_ids`` that have no row for it yet."""
        have = set(self._db.execute(
            f"SELECT arch_id, item_key FROM results WHERE data_key = ? AND arch_id IN ({','.join('?' * len(arch_ids))})",
            (self.data_key, *arch_ids)))
        return {item: [a for a in arch_ids if (a, item) not in have] for item in self.item_keys()}

    def commit(self, rows: Iterable[dict]) -> int:
        """Inserts result rows (one transaction); a row that exists already is left as it is.
        Returns how many were new. Rows committed together share their finishing time."""
        now = time.time()
        with self._transaction() as db:
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO results VALUES (:arch_id, :item_key, :data_key, :status, :figures, :outcome, "
                ":examples, :error, :seconds, :worker, :finished)",
                [{**row, "data_key": self.data_key, "figures": json.dumps(row.get("figures")),
                  "outcome": row.get("outcome"), "examples": row.get("examples"), "error": row.get("error"),
                  "finished": now} for row in rows])
            return db.total_changes - before

    def forget_failed(self, arch_ids: Iterable[str]) -> int:
        """Deletes the failed rows of ``arch_ids``, so that their items run again; returns how many."""
        with self._transaction() as db:
            before = db.total_changes
            db.executemany("DELETE FROM results WHERE status = 'failed' AND arch_id = ?", [(a,) for a in arch_ids])
            return db.total_changes - before

    def failures(self, arch_ids: Iterable[str]) -> list[tuple[list[str], str, int]]:
        """Per item and error among the failed rows of ``arch_ids``: the item's figure labels,
        the error, and on how many of those networks it failed; the most frequent first."""
        arch_ids = set(arch_ids)
        counts: dict[tuple[str, str], int] = {}
        for arch_id, item_key, error in self._db.execute(
                "SELECT arch_id, item_key, error FROM results WHERE status = 'failed' AND data_key = ?",
                (self.data_key,)):
            if arch_id in arch_ids:
                counts[(item_key, error)] = counts.get((item_key, error), 0) + 1
        labels = {item["item_key"]: item["labels"] for item in self.items()}
        return [(labels[key], error, count) for (key, error), count in
                sorted(counts.items(), key=lambda entry: -entry[1])]

    def status(self) -> dict:
        """Networks in the sweep, done (every item has a row), with a failed item, held by a
        worker now; rows; the rate over the last hour of rows."""
        wanted = len(self.item_keys())
        networks = [a for (a,) in self._db.execute("SELECT arch_id FROM networks ORDER BY position")]
        failed = {a for (a,) in self._db.execute("SELECT DISTINCT arch_id FROM results WHERE status = 'failed'")}
        claims = self._db.execute("SELECT worker, COUNT(*) FROM claims WHERE expires >= ? GROUP BY worker",
                                  (time.time(),)).fetchall()
        finished = [t for (t,) in self._db.execute(
            "SELECT MAX(finished) FROM results WHERE data_key = ? GROUP BY arch_id HAVING COUNT(*) = ?",
            (self.data_key, wanted))]
        return {"networks": len(networks), "done": len(self.done() & set(networks)),
                "with_failures": len(failed), "items": wanted,
                "rows": int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0]),
                "claimed": {w: n for w, n in claims if not _worker_gone(w)},
                "networks_per_hour": _rate([t for t in finished if t > time.time() - 3600])}

    def networks(self) -> list[tuple[str, str, dict]]:
        return [(a, b, json.loads(c)) for a, b, c in
                self._db.execute("SELECT arch_id, bucket, card FROM networks ORDER BY position")]

    def items(self) -> list[dict]:
        return [{"item_key": k, "kind": kind, "settings": json.loads(s), "labels": json.loads(labels)}
                for k, kind, s, labels in
                self._db.execute("SELECT item_key, kind, settings, labels FROM items ORDER BY position")]

    def record(self, arch_id: str, item_key: str) -> bytes | None:
        """The stored outcome of one finished row (a ``report`` item's record), or None."""
        row = self._db.execute("SELECT outcome FROM results WHERE arch_id = ? AND item_key = ? AND data_key = ? "
                               "AND status = 'ok'", (arch_id, item_key, self.data_key)).fetchone()
        return None if row is None else row[0]

    def results(self) -> Iterator[dict]:
        """Every result row of the current data, with its outcome unpacked ((figures, examples):
        bool, or float32 for a sequence item; None for a ``report`` item, see :meth:`record`);
        a network's rows one after another (ordered by arch id), each unpacked as it is read."""
        for arch_id, item_key, kind, status, figures, outcome, examples, error, seconds, worker in self._db.execute(
                "SELECT r.arch_id, r.item_key, i.kind, r.status, r.figures, r.outcome, r.examples, r.error, "
                "r.seconds, r.worker FROM results r JOIN items i USING (item_key) WHERE r.data_key = ? "
                "ORDER BY r.arch_id", (self.data_key,)):
            figures = json.loads(figures)
            yield {"arch_id": arch_id, "item_key": item_key, "status": status, "figures": figures, "error": error,
                   "seconds": seconds, "worker": worker,
                   "outcome": None if outcome is None or kind == REPORT else unpack(
                       outcome, len(figures), examples, outcome_dtype(kind))}
