"""Evaluations that resume: each finished report item is kept on disk, so a rerun skips it.

``robustjax evaluate --out DIR`` keeps, beside ``DIR/report.json``, the folder ``DIR/items``:

- ``fingerprint.json``: what every stored result depends on besides the plan
  (:func:`fingerprint`: the store's format, the model's weights, the evaluated examples, the
  metrics' reference model and profiling set, the environment). A store whose fingerprint
  differs from the run's is refused, naming what differs, unless the run asks to start afresh;
- one ``NAME.npz`` per finished item (the clean pass, each ``[[attacks]]`` entry, each
  corruption at each severity, each sequence perturbation, each system-noise variant, the
  metrics, the checks): its per-example records (``items.ItemRunner.records``: correctness
  under the item and, for an attack, success, queries and perturbation norms; the
  transferred examples' outcome, the metrics' accumulator states) and a JSON ``section``
  (the seconds it took; the metrics' and checks' report sections), read back with
  ``allow_pickle=False``. ``NAME`` holds a hash of the item's settings
  (``items.record_name``, the key of the item's rows in a sweep's store, or
  :func:`content_name`), so a rerun after an edit to the plan reuses every item the edit
  left unchanged.

Every file is written to a temporary file in the same folder, flushed to disk and moved into
place with ``os.replace``, so a run killed at any moment leaves only whole items. An item
whose computation raised is not stored: the next run tries it again. One process at a time
writes a store (an ``flock`` on ``DIR/items/lock``, released when the process ends).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import io
import json
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import jax
import numpy as np

from robustjax.classifier import Classifier
from robustjax.data.dataset import ImageDataset
from robustjax.evaluation.plan import Plan
from robustjax.files import write_atomically
from robustjax.output_folder import LOCK_FILE

FINGERPRINT_FILE = "fingerprint.json"
SECTION_KEY = "section"
# Room an evaluation needs on disk beyond its per-example masks: the report and item sections.
DISK_MARGIN_BYTES = 4 << 20
# The layout of a store's items; a store of another format is refused, naming --fresh.
STORE_FORMAT = 3


class StoreMismatch(ValueError):
    """The item store holds results of another evaluation."""


@dataclasses.dataclass(frozen=True)
class Finished:
    """A finished item: its report section (JSON-ready) and named per-example arrays."""

    section: dict
    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def _digest(arrays: Iterable[np.ndarray]) -> str:
    """SHA-256 of the arrays' dtypes, shapes and bytes, in order."""
    hashed = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        hashed.update(f"{array.dtype.str}{array.shape}".encode())
        hashed.update(array.tobytes())
    return hashed.hexdigest()


def examples_digest(dataset: ImageDataset, limit: int | None) -> str:
    """SHA-256 of the evaluated images and labels, in order (the same at any read batch size)."""
    hashed = hashlib.sha256()
    for x, y in dataset.batches(1024, limit=limit):
        hashed.update(np.ascontiguousarray(x, np.float32).tobytes())
        hashed.update(np.ascontiguousarray(y, np.int32).tobytes())
    return hashed.hexdigest()


def weights_digest(classifier: Classifier) -> str:
    """SHA-256 of the classifier's weights (every array leaf: dtype, shape and bytes), in order."""
    return _digest(np.asarray(leaf) for leaf in jax.tree.leaves(classifier))


def _model(classifier: Classifier) -> dict:
    return {"name": classifier.name, "weights": weights_digest(classifier)}


def fingerprint(classifier: Classifier, dataset: ImageDataset, plan: Plan, environment: dict, *,
                profile: ImageDataset | None = None, reference: Classifier | None = None) -> dict:
    """What the results of an evaluation depend on besides the plan, whose settings name each
    item (:func:`content_name`). The profiling set (a training split, possibly large) counts
    by its name and size; every other input by a hash of its content."""
    return {
        "format": STORE_FORMAT,
        "model": _model(classifier),
        "data": {"name": dataset.name, "examples": examples_digest(dataset, plan.num_examples)},
        "reference": None if reference is None else _model(reference),
        "profile": None if profile is None else {"name": profile.name, "num_examples": profile.num_examples},
        "environment": environment,
    }


def expected_bytes(plan: Plan, num_examples: int) -> int:
    """A small over-estimate of the disk an evaluation writes: per example, 6 bytes for each
    item that classifies images (the clean pass, each corruption severity and system-noise
    variant: correct, confidence, finite), 22 for each attack epsilon (correct, success,
    queries and four norms), 8 for each perturbation (flip rate, top-5 distance); and a
    margin for the report and sections."""
    classified = 1
    if plan.corruptions is not None:
        classified += len(plan.corruptions.names) * len(plan.corruptions.severities)
    if plan.system_noise is not None:
        classified += len(plan.system_noise.variants())
    perturbations = 0 if plan.sequences is None else len(plan.sequences.names)
    return DISK_MARGIN_BYTES + num_examples * (6 * classified + 22 * plan.num_attack_entries + 8 * perturbations)


def check_output_folder(folder: str | Path) -> Path:
    """Creates ``folder`` and makes sure, before any work, that results can be written there:
    raises OSError with one clear line when it is (or lies under) a regular file or cannot
    be written."""
    folder = Path(folder)
    for path in (folder, *folder.parents):
        if path.exists():
            if not path.is_dir():
                raise OSError(f"cannot write results to {folder}: {path} is a file, not a folder; choose another "
                              "--out")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise OSError(f"cannot write results to {folder}: {error.strerror or error}; choose another --out") from None
    return folder


def check_free_space(folder: Path, needed_bytes: int) -> None:
    """Raises OSError with one clear line when the disk of ``folder`` has less than
    ``needed_bytes`` free."""
    free = shutil.disk_usage(folder).free
    if free < needed_bytes:
        raise OSError(f"cannot write results to {folder}: {free / 2**20:.1f} MiB free on its disk, the evaluation "
                      f"needs about {needed_bytes / 2**20:.1f} MiB; free some space or choose another folder")


class ItemStore:
    """The finished items of one evaluation, in a folder (see the module's docstring).
    ``ItemStore.open`` creates it or checks that it holds the same evaluation."""

    def __init__(self, folder: Path, lock):
        self.folder, self._lock = folder, lock

    @classmethod
    def open(cls, folder: str | Path, fingerprint: dict, *, fresh: bool = False) -> ItemStore:
        """The store in ``folder``. With ``fresh``, results stored there are discarded first;
        without, a store of another evaluation raises :class:`StoreMismatch`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / LOCK_FILE, "w")  # noqa: SIM115 (held, and so locked, as long as the store lives)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise OSError(f"another robustjax evaluate is writing to {folder}; wait for it to end or choose "
                          "another folder") from None
        store = cls(folder, lock)
        for leftover in folder.glob(".*.tmp"):  # temporary files of a killed run
            leftover.unlink()
        stored = store._fingerprint()
        expected = json.loads(json.dumps(fingerprint))  # as JSON would give it back
        if fresh or stored is None:
            store._discard()
            write_atomically(folder / FINGERPRINT_FILE, lambda f: f.write(json.dumps(expected, indent=1).encode()))
        elif stored.get("format") != expected.get("format"):
            store.close()
            raise StoreMismatch(f"{folder} holds items in an older store format (before format {STORE_FORMAT}), "
                                "which this version cannot reuse; rerun with --fresh to discard them and start over, "
                                "or choose another output folder")
        elif stored != expected:
            store.close()
            differ = ", ".join(sorted(k for k in stored.keys() | expected.keys() if stored.get(k) != expected.get(k)))
            raise StoreMismatch(f"{folder} holds the results of another evaluation (its {differ} differ from this "
                                "run's); rerun with --fresh to discard them and start over, or choose another "
                                "output folder")
        return store

    def _fingerprint(self) -> dict | None:
        path = self.folder / FINGERPRINT_FILE
        return json.loads(path.read_text()) if path.exists() else None

    def _discard(self) -> None:
        for path in self.folder.glob("*.npz"):
            path.unlink()
        (self.folder / FINGERPRINT_FILE).unlink(missing_ok=True)

    def close(self) -> None:
        self._lock.close()

    def __enter__(self) -> ItemStore:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def names(self) -> list[str]:
        """The finished items, by name."""
        return sorted(path.stem for path in self.folder.glob("*.npz"))

    def load(self, name: str) -> Finished | None:
        """Item ``name`` as stored, or None when it is not (or cannot be read back whole)."""
        return _read_item(self.folder / f"{name}.npz")

    def snapshot(self) -> bytes:
        """Every finished item's file, in one ``.npz`` (what :class:`ReplicaStore` reads)."""
        return _snapshot({name: (self.folder / f"{name}.npz").read_bytes() for name in self.names()})

    def save(self, name: str, finished: Finished) -> None:
        data = _item_bytes(finished)
        write_atomically(self.folder / f"{name}.npz", lambda f: f.write(data))


class MemoryStore:
    """Finished items kept in memory (a sweep's ``report`` item collects a network's items
    so), with :meth:`snapshot` in :class:`ReplicaStore`'s format."""

    def __init__(self):
        self._items: dict[str, Finished] = {}

    def names(self) -> list[str]:
        return sorted(self._items)

    def load(self, name: str) -> Finished | None:
        return self._items.get(name)

    def save(self, name: str, finished: Finished) -> None:
        self._items[name] = finished

    def snapshot(self) -> bytes:
        return _snapshot({name: _item_bytes(finished) for name, finished in self._items.items()})


def _item_bytes(finished: Finished) -> bytes:
    """One item as its ``.npz`` file holds it."""
    if SECTION_KEY in finished.arrays:
        raise ValueError(f"{SECTION_KEY!r} is reserved for the section, not an array name")
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **{SECTION_KEY: np.array(json.dumps(finished.section, allow_nan=False))},
             **finished.arrays)
    return buffer.getvalue()


def _snapshot(files: dict[str, bytes]) -> bytes:
    """Items' files (name -> bytes) in one ``.npz``."""
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **{name: np.frombuffer(data, np.uint8) for name, data in files.items()})
    return buffer.getvalue()


class ReplicaStore(ItemStore):
    """The main process's finished items, in the other processes of a multi-host run: read
    back as the main process reads them, so that every process skips the same items; the
    main process alone writes (``ItemStore.snapshot`` is what it shares)."""

    def __init__(self, snapshot: bytes):
        super().__init__(folder=None, lock=None)
        with np.load(io.BytesIO(snapshot), allow_pickle=False) as files:
            self._files = {name: files[name].tobytes() for name in files.files}

    def close(self) -> None:
        """Nothing: no folder is held."""

    def names(self) -> list[str]:
        return sorted(self._files)

    def load(self, name: str) -> Finished | None:
        return _read_item(io.BytesIO(self._files[name])) if name in self._files else None

    def save(self, name: str, finished: Finished) -> None:
        """Nothing: the main process keeps the item."""


def _read_item(file) -> Finished | None:
    """A stored item (a path or a file object), or None when it cannot be read back whole."""
    try:
        with np.load(file, allow_pickle=False) as stored:
            return Finished(json.loads(str(stored[SECTION_KEY])),
                            {key: stored[key] for key in stored.files if key != SECTION_KEY})
    except (OSError, ValueError, KeyError):  # not there, or unreadable: computed (again)
        return None


def content_name(kind: str, settings: dict) -> str:
    """``KIND-<16 hex digits>``: a stored item's name, from a hash of the JSON of the
    ``settings`` its outcome depends on."""
    text = json.dumps(settings, sort_keys=True)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


class Scoped:
    """A view of ``store`` in which item ``NAME`` is stored as ``content_name(NAME, settings)``:
    for sections that name their items by position, ``settings`` being what else they depend on."""

    def __init__(self, store: ItemStore, settings: dict):
        self.store, self.settings = store, settings

    def load(self, name: str) -> Finished | None:
        return self.store.load(content_name(name, self.settings))

    def save(self, name: str, finished: Finished) -> None:
        self.store.save(content_name(name, self.settings), finished)


def scoped(store: ItemStore | None, settings: dict) -> Scoped | None:
    """``store`` seen through :class:`Scoped` (None without a store)."""
    return None if store is None else Scoped(store, settings)


def run_item(store: ItemStore | Scoped | None, name: str, compute: Callable[[], Finished]) -> Finished:
    """Item ``name`` from ``store`` when it is there; else ``compute()``, stored once it
    returns (an exception propagates and stores nothing). Without a store, ``compute()``."""
    if store is not None and (finished := store.load(name)) is not None:
        return finished
    finished = compute()
    if store is not None:
        store.save(name, finished)
    return finished
