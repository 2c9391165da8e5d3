"""A training's orbax checkpoints, opened where a killed run resumes, refused when they belong
to another run (``robustjax train``, ``train_population``, ``nas train``)."""

from __future__ import annotations

from pathlib import Path

import orbax.checkpoint as ocp


def open_checkpoints(out: Path, meta: dict, kind: str, same: str) -> tuple[ocp.CheckpointManager, int]:
    """The checkpoints of ``out/checkpoints`` and the step the latest reached (0: none);
    checkpoints whose JSON ``meta`` differs, those of another ``kind`` of training, are
    refused, naming what differs and asking for another folder or ``same``."""
    manager = ocp.CheckpointManager(Path(out).resolve() / "checkpoints",
                                    options=ocp.CheckpointManagerOptions(max_to_keep=2))
    start = manager.latest_step() or 0
    if start:
        stored = manager.restore(start, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        if stored != meta:
            manager.close()
            differences = [f"{key}: {stored.get(key)!r}, not {meta[key]!r}" for key in meta
                           if stored.get(key) != meta[key]]
            raise ValueError(f"{out}: its checkpoints belong to another {kind} "
                             f"({', '.join(differences) or 'another layout'}); use another folder, or {same}")
    return manager, start
