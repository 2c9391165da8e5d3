"""A sweep's store as a table: one row per network, with its config columns (the search
dimensions), its cost and every figure; written as CSV, JSON lines or Parquet (pyarrow).

Search dimensions: an NB201 cell's op on each edge (``edge_1<-0`` ...); a BigNAS subnet's
resolution and, per stage or block, ``width_i``, ``depth_i``, ``kernel_i``, ``expand_i``; a
trained network's ``model`` and ``techniques`` (its set, e.g. ``fast_at,no_ema``).
Figures are means over the evaluated examples, recomputed from the stored per-example
outcomes: ``clean``, each attack entry's robust accuracy, each corruption and system-noise
variant's accuracy, and for every threat model (norm, epsilon) that two or more attacks
share, the worst case over them (``worst linf eps=0.1``: an example counts as robust only
if every attack failed on it); each ImageNet-P perturbation's flip probability and top-5
distance are columns too, but not figures of the analysis, which takes accuracies. The
``report`` item (a plan's [metrics], [natural_shift], enabled [sanity]) adds its figures as
they were recorded: ``metric NAME`` per metric and ``sanity NAME`` per check (1 for a
warning) as columns, ``shift NAME`` per natural-shift set also as figures of the analysis.
A figure whose item failed or has not run is empty.

NB201 rows carry NAS-Bench-201's own ``index`` (and the ``canonical_index`` of the
isomorphism class), so they join the published datasets by id (``join``).
"""

from __future__ import annotations

import csv
import itertools
import json
import operator
from pathlib import Path

import numpy as np

from robustjax.evaluation.items import REPORT, VALUE_KINDS
from robustjax.nas.nb201 import EDGES
from robustjax.sweep.analyze import Table
from robustjax.sweep.store import Store

FORMATS = ("csv", "jsonl", "parquet")
BIGNAS_DIMENSIONS = {"widths": "width", "depths": "depth", "kernels": "kernel", "expand_ratios": "expand"}


# A trained cell's training, as its card records it once trained (``trained_cells.summary``).
TRAINING_COLUMNS = ("train_steps", "train_loss", "train_accuracy", "diverged_at")


def config_columns(card: dict) -> dict:
    """The search-dimension columns of a network card."""
    if "ops" in card:  # a trained cell's also its techniques
        return ({f"edge_{node}<-{source}": op for (node, source), op in zip(EDGES, card["ops"])}
                | ({"techniques": card["techniques"]} if "techniques" in card else {}))
    if "config" in card:
        columns = {"resolution": card["config"]["resolution"]}
        for field, name in BIGNAS_DIMENSIONS.items():
            columns.update({f"{name}_{i}": value for i, value in enumerate(card["config"][field])})
        return columns
    if "techniques" in card:
        return {"model": card["model"], "techniques": card["techniques"]}
    return {}


def _worst_cases(items: list[dict], outcomes: dict[str, np.ndarray]) -> dict[str, float]:
    """Per (norm, eps) shared by two or more attack figures: the accuracy of the examples no
    attack fooled."""
    budgets: dict[tuple, list[str]] = {}
    for item in items:
        if item["kind"] != "attack":
            continue
        norm = item["settings"]["params"].get("norm", "linf")
        eps_list = item["settings"]["eps"]
        for label, eps in zip(item["labels"], eps_list):
            budgets.setdefault((norm, eps), []).append(label)
    worst = {}
    for (norm, eps), labels in budgets.items():
        if len(labels) > 1:
            present = [outcomes[label] for label in labels if label in outcomes]
            key = f"worst {norm} eps={eps:g}"
            worst[key] = float(np.logical_and.reduce(present).mean()) if len(present) == len(labels) else None
    return worst


def table(store: Store) -> Table:
    """The sweep as an analysis table: one row per network, in the sweep's order. The
    per-example outcomes are read one network at a time, so memory holds the figures, not
    the outcomes (``benchmarks.export_memory``: 15,625 networks x 100 figures x 1,000
    examples export in 268 MiB above what importing robustjax takes; 1,877 MiB before)."""
    items = store.items()
    labels = [label for item in items for label in item["labels"]]
    found = {arch_id: _network_figures(list(rows), items, labels)
             for arch_id, rows in itertools.groupby(store.results(), key=operator.itemgetter("arch_id"))}
    # Flip probabilities and top-5 distances are columns, but not accuracies to analyse.
    values = {label for item in items if item["kind"] in VALUE_KINDS for label in item["labels"]}
    # The metrics and the checks are columns too; of the report item, the analysis takes the
    # natural-shift accuracies (and AUROCs).
    values |= {label for item in items if item["kind"] == REPORT for label in item["labels"]
               if not label.startswith("shift ")}
    rows, dimensions = [], {}
    for arch_id, _, card in store.networks():
        figures, errors = found[arch_id] if arch_id in found else _network_figures([], items, labels)
        dims = config_columns(card)
        dimensions.update(dict.fromkeys(dims))
        rows.append({"arch_id": arch_id, **{k: card[k] for k in ("index", "canonical_index", "arch_string")
                                             if k in card},
                     **dims, "params": card.get("params"), "macs": card.get("macs"), "flops": card.get("flops"),
                     **{k: card.get(k) for k in TRAINING_COLUMNS if "ops" in card and "techniques" in card},
                     **figures, "errors": errors})
    figure_names = [*(label for label in labels if label not in values),
                    *(k for k in (rows[0] if rows else {}) if k.startswith("worst "))]
    predictors = tuple(label for item in items if item["kind"] == "proxy" for label in item["labels"])
    return Table(rows=rows, dimensions=tuple(dimensions), figures=tuple(figure_names), context=describe(store),
                 predictors=predictors)


def describe(store: Store) -> str:
    """What the sweep in ``store`` evaluated, in a sentence: its networks and its data (empty
    for a store that ``robustjax sweep run`` did not write, which lacks them)."""
    definition = store.meta("definition")
    networks, data = definition.get("networks"), definition.get("dataset")
    if not isinstance(networks, dict) or not isinstance(data, dict):
        return ""
    if "space" in networks:
        space = dict(networks["space"])
        kind = space.pop("kind")
        settings = ", ".join(f"{key}={value}" for key, value in space.items() if not isinstance(value, dict | list))
        origin = "standalone networks" if "standalone" in networks else "subnets of its supernet"
        if "trained" in networks:
            origin = "its cells trained from scratch by the plan's [training] table"
        swept = f"NAS space {kind} ({settings}), {origin}"
    elif "models" in networks:
        swept = f"models {', '.join(networks['models'])}"
    else:
        swept = "zoo models trained by the plan's [training] table"
    return (f"Swept: {swept}; each network on {data['examples']} examples of {data['name']} ({data['split']} "
            f"split), under the plan's {len(definition['items'])} items.")


def _network_figures(rows: list[dict], items: list[dict], labels: list[str]) -> tuple[dict, str]:
    """One network's figures (every label's, then its worst cases) and its errors, from its
    result rows: a mean over the stored outcome, or the ``report`` item's figure as recorded."""
    by_key = {item["item_key"]: item for item in items}
    outcomes: dict[str, np.ndarray] = {}
    reported: dict[str, float | None] = {}
    errors = []
    for row in rows:
        item = by_key[row["item_key"]]
        if row["status"] == "ok" and item["kind"] == REPORT:
            reported = row["figures"]
        elif row["status"] == "ok":
            outcomes.update(zip(item["labels"], row["outcome"]))
        else:
            errors.append(f"{', '.join(item['labels'])}: {row['error']}")
    figures = {label: float(outcomes[label].mean()) if label in outcomes else reported.get(label)
               for label in labels}
    return figures | _worst_cases(items, outcomes), "; ".join(errors)


def join(rows: list[dict], path: str | Path, on: str = "index", prefix: str = "published_") -> tuple[list[dict], int]:
    """``rows`` with the columns of a published table (CSV or JSON lines, e.g. NAS-Bench-201's
    or NAS-RobBench-201's per-architecture figures) whose ``on`` column matches, prefixed;
    and how many rows matched. Keys match by value (``42``, ``42.0`` and ``"42"`` are one
    key); a CSV's columns of numbers become numbers. Refuses a file without the column, a
    key that two of its rows share, and a join where nothing matches."""
    path = Path(path)
    with path.open() as file:
        theirs = [json.loads(line) for line in file if line.strip()] if path.suffix == ".jsonl" \
            else _typed(list(csv.DictReader(file)))
    if theirs and on not in theirs[0]:
        raise ValueError(f"{path} has no {on!r} column to join on (its columns: {sorted(theirs[0])})")
    if rows and on not in rows[0]:
        raise ValueError(f"the sweep's rows have no {on!r} column to join on (networks of a NAS space have index; "
                         f"pass --join-on with one of {sorted(rows[0])[:12]}...)")
    by_key: dict[str | None, dict] = {}
    for row in theirs:
        key = _key(row[on])
        if key in by_key:
            raise ValueError(f"{path}: two rows have {on} = {row[on]!r}; keep one row per network (e.g. one dataset "
                             "and seed) before joining")
        by_key[key] = row
    joined = [{**row, **{f"{prefix}{k}": v for k, v in by_key.get(_key(row.get(on)), {}).items() if k != on}}
              for row in rows]
    matched = sum(_key(row.get(on)) in by_key for row in rows)
    if rows and not matched:
        raise ValueError(f"no network matched a row of {path} on {on!r}: the sweep's values look like "
                         f"{[row.get(on) for row in rows[:3]]}, the file's like {[row[on] for row in theirs[:3]]}")
    return joined, matched


def _key(value: object) -> str | None:
    """A join key by value: numbers as their shortest text (``42.0`` is ``"42"``), text stripped."""
    if value is None:
        return None
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        return text
    return str(int(number)) if number.is_integer() else repr(number)


def _typed(rows: list[dict[str, str]]) -> list[dict]:
    """CSV rows with each column whose every non-empty cell is a number as numbers (ints
    when all are whole), empty cells as None, other columns as text."""
    columns = {column: [row[column] for row in rows] for column in (rows[0] if rows else {})}
    for column, cells in columns.items():
        try:
            numbers = [None if cell in ("", None) else float(cell) for cell in cells]
        except ValueError:
            continue
        whole = all(n is None or (n.is_integer() and "." not in cell and "e" not in cell.lower())
                    for n, cell in zip(numbers, cells))
        for row, number in zip(rows, numbers):
            row[column] = None if number is None else int(number) if whole else number
    return rows


def write(rows: list[dict], path: str | Path, fmt: str) -> Path:
    """Writes ``rows`` as ``fmt`` (csv, jsonl or parquet)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    path = Path(path)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows]), path)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, columns)
            writer.writeheader()
            writer.writerows(rows)
    return path
