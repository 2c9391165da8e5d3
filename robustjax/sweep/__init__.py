"""Sweeps over many networks: a plan times a list of networks, with results in a SQLite
store that a killed run resumes from (``store``), evaluated locally or on a Ray cluster
(``engine``, ``ray_executor``), exported and analysed as RobustART does (``export``,
``analyze``)."""

from robustjax.sweep.engine import Context, Sweep, open_store, run_local
from robustjax.sweep.store import Store, SweepMismatch

__all__ = ["Context", "Store", "Sweep", "SweepMismatch", "open_store", "run_local"]
