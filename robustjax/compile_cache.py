"""JAX's persistent compilation cache for the commands: compiled programs kept between runs."""

from __future__ import annotations

import os
from pathlib import Path

# Where `evaluate` keeps compiled XLA programs between runs; "off" keeps none.
DEFAULT_COMPILE_CACHE = os.environ.get(
    "ROBUSTJAX_COMPILE_CACHE", str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "robustjax" / "xla"))


def use_compile_cache(directory: str) -> str | None:
    """Keeps JAX's compiled programs in ``directory`` (JAX's persistent compilation cache),
    so that a repeated evaluation skips most compiling (the default digits run: about 120
    s the first time, 70 s after). ``"off"`` disables it, and a cache directory the user
    configured for JAX wins. Returns the directory in use, or None."""
    if directory == "off":
        return None
    import jax  # here, not at the top: the command line's help imports this module

    if configured := jax.config.jax_compilation_cache_dir:
        return configured
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # no writable cache: every program compiles, as without one
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # the many small programs too
    return directory
