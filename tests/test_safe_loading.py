"""No loader unpickles: a malicious pickle (its ``__reduce__`` creates a marker file),
saved under every name a loader accepts, is refused by every public loading path with a
clear ValueError, and the marker is never created.

The paths: zoo checkpoint conversion (``load_state_dict``, ``convert_checkpoint``,
``robustjax zoo convert``), converted weights (``zoo.load(..., weights=)``, ``robustjax
evaluate --weights``), datasets (``data.load``, ``from_npz``, ``from_folder``), supernets
(``nas.Supernet.load``, ``--supernet``) and plan files (``load_plan``).
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import robustjax as rj
from robustjax import cli
from robustjax.evaluation import load_plan
from robustjax.zoo.convert import TORCH_SUFFIXES, load_state_dict

CHECKPOINT_SUFFIXES = (*TORCH_SUFFIXES, ".safetensors", ".pkl", ".pickle", ".npy", ".npz")


class CreatesMarker:
    """Unpickling this runs ``open(marker, "w")``: the file appears only if a loader unpickles."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def write_payloads(folder: Path, marker: Path, stem: str, suffixes) -> list[Path]:
    """The malicious object under ``stem`` with each suffix, in every container that
    could carry it: a bare pickle, a ``torch.save`` archive (also holding a tensor, as a
    state dict would), a NumPy object array (.npy / .npz)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix in suffixes:
        bare = folder / f"{stem}{suffix}"
        if suffix == ".npy":
            np.save(bare, np.array([CreatesMarker(marker)], dtype=object), allow_pickle=True)
        elif suffix == ".npz":
            np.savez(bare, images=np.array([CreatesMarker(marker)], dtype=object), labels=np.zeros(1, np.int64))
        else:
            bare.write_bytes(pickle.dumps(CreatesMarker(marker)))
        paths.append(bare)
        if suffix in TORCH_SUFFIXES:
            archive = folder / f"{stem}_torch{suffix}"
            torch.save({"conv.weight": torch.zeros(1), "payload": CreatesMarker(marker)}, archive)
            paths.append(archive)
    return paths


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / "unpickled"


def assert_refused_safely(call, marker: Path, *named: str) -> None:
    with pytest.raises(ValueError) as caught:
        call()
    assert not marker.exists(), "the malicious pickle was unpickled"
    for name in named:
        assert name in str(caught.value), f"{name!r} not named in: {caught.value}"


def test_the_payloads_are_live(tmp_path, marker):
    """The payloads do run when unpickled, so the tests below would see an unsafe loader."""
    for path in write_payloads(tmp_path / "files", marker, "payload", [".pkl", ".npy", ".pt"]):
        if path.suffix == ".npy":
            np.load(path, allow_pickle=True)
        elif path.name.endswith("_torch.pt"):
            torch.load(path, weights_only=False)
        else:
            pickle.loads(path.read_bytes())
        assert marker.exists(), path.name
        marker.unlink()


def test_checkpoint_conversion_refuses_pickles(tmp_path, marker):
    for path in write_payloads(tmp_path / "files", marker, "checkpoint", CHECKPOINT_SUFFIXES):
        assert_refused_safely(lambda: load_state_dict(path), marker, path.name)
        assert_refused_safely(lambda: rj.zoo.convert_checkpoint("digits_cnn", path, tmp_path / "out"), marker,
                              path.name)
    assert not (tmp_path / "out").exists()


def test_the_convert_command_refuses_pickles(tmp_path, marker, capsys):
    for path in write_payloads(tmp_path / "files", marker, "checkpoint", [".pt", ".safetensors", ".pkl"]):
        assert cli.main(["zoo", "convert", "digits_cnn", str(path), "--out", str(tmp_path / "out")]) == 2
        assert not marker.exists()
        assert path.name in capsys.readouterr().err


def converted_weights_with_payloads(tmp_path: Path, marker: Path) -> list[Path]:
    """Folders laid out as ``zoo convert`` writes them whose card or whose orbax files are
    malicious pickles, and the bare pickle files themselves."""
    files = write_payloads(tmp_path / "files", marker, "weights", [".pkl", ".pt", ".npy"])
    folders = []
    for i, payload in enumerate(files):
        folder = tmp_path / f"converted{i}"
        (folder / "weights").mkdir(parents=True)
        if i % 2:  # a pickle in place of the card
            shutil.copy(payload, folder / "card.json")
        else:  # a good card, pickles in place of orbax's files
            (folder / "card.json").write_text(json.dumps({"name": "digits_cnn", "num_classes": 10}))
            for name in ("_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt", "checkpoint", "_sharding"):
                shutil.copy(payload, folder / "weights" / name)
        folders.append(folder)
    return files + folders


def test_converted_weights_refuse_pickles(tmp_path, marker):
    """Refused with a message naming the file or folder, whether the pickle is the weights
    file, the card or orbax's files."""
    for weights in converted_weights_with_payloads(tmp_path, marker):
        assert_refused_safely(lambda: rj.zoo.load("digits_cnn", weights=weights), marker, weights.name)


def test_evaluate_with_weights_refuses_pickles(tmp_path, marker, capsys):
    for weights in converted_weights_with_payloads(tmp_path, marker)[::3]:
        assert cli.main(["evaluate", "--model", "digits_cnn", "--weights", str(weights)]) == 2
        assert not marker.exists()
        assert "error" in capsys.readouterr().err


def test_datasets_refuse_pickles(tmp_path, marker):
    for path in write_payloads(tmp_path / "files", marker, "data", [".npz", ".npy", ".pkl"]):
        assert_refused_safely(lambda: rj.data.load(str(path)), marker, path.name)
        assert_refused_safely(lambda: rj.data.from_npz(path), marker, path.name)
    images = tmp_path / "images"
    for class_name in ("cats", "dogs"):
        for path in write_payloads(images / class_name, marker, "image", [".png", ".jpg", ".npy"]):
            path.rename(path.with_name(f"{path.stem}_as{path.suffix}.png"))  # every file an image by name
    assert_refused_safely(lambda: rj.data.load(str(images)).arrays(), marker, "image_as")


def supernets_with_payloads(tmp_path: Path, marker: Path) -> list[Path]:
    """Supernet folders whose ``supernet.json`` or orbax files are malicious pickles."""
    folders = []
    for i, payload in enumerate(write_payloads(tmp_path / "files", marker, "supernet", [".pkl", ".pt", ".npy"])):
        description, weights = tmp_path / f"supernet{i}" / "supernet.json", tmp_path / f"supernet{i}" / "weights"
        weights.mkdir(parents=True)
        shutil.copy(payload, description)
        for name in ("_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt"):
            shutil.copy(payload, weights / name)
        folders.append(description.parent)
    return folders


def test_supernets_refuse_pickles(tmp_path, marker):
    for folder in supernets_with_payloads(tmp_path, marker):
        assert_refused_safely(lambda: rj.nas.Supernet.load(folder), marker, folder.name)


def test_plans_refuse_pickles(tmp_path, marker):
    for path in write_payloads(tmp_path / "files", marker, "plan", [".toml", ".json", ".pkl"]):
        assert_refused_safely(lambda: load_plan(path), marker, str(path))
