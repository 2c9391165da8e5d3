"""Where bundled model assets (weights, cards) live.

In a source checkout they are in the top-level ``models/`` folder; an installed wheel
carries them as ``robustjax/_models`` (see ``pyproject.toml``).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

_CHECKOUT_MODELS = Path(__file__).resolve().parents[2] / "models"


def asset_dir(name: str) -> Path:
    """The asset folder of bundled model ``name``."""
    packaged = Path(str(resources.files("robustjax"))) / "_models" / name
    for folder in (packaged, _CHECKOUT_MODELS / name):
        if folder.is_dir():
            return folder
    raise ValueError(f"the assets of model {name!r} are missing (looked in {packaged} and {_CHECKOUT_MODELS / name})")


def read_card(name: str) -> dict:
    """The model card (``card.json``) of bundled model ``name``."""
    return json.loads((asset_dir(name) / "card.json").read_text())
