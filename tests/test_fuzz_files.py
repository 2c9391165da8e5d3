"""Property-based fuzzing of what robustjax reads: datasets (arrays, .npz files, image
folders) and evaluation plans (dicts, TOML and JSON files). Malformed content ends in a
ValueError or TypeError that names the offending file, array or plan entry; well-formed
content reads back exactly.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image

import robustjax as rj
from robustjax.evaluation import plan as plans
from tests.test_fuzz import assert_refused

# ---------------------------------------------------------------------------------- data


@st.composite
def malformed_dataset_arrays(draw):
    """(images, labels, num_classes, the argument at fault) of an invalid dataset."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    images, labels, num_classes = rng.integers(0, 256, (4, 8, 8, 1), dtype=np.uint8), np.arange(4) % 2, None
    fault = draw(st.sampled_from(["images", "labels", "num_classes"]))
    if fault == "images":
        kind = draw(st.sampled_from(["dtype", "rank", "empty", "pixel"]))
        if kind == "dtype":
            images = images.astype(draw(st.sampled_from([np.int16, np.int64, np.bool_, np.complex64, object])))
        elif kind == "rank":
            images = images.reshape(draw(st.sampled_from([(256,), (4, 64), (4, 8, 8, 1, 1)])))
        elif kind == "empty":
            images, labels = images[:0], labels[:0]
        else:
            images = images.astype(draw(st.sampled_from([np.float16, np.float32, np.float64]))) / 255
            images.flat[draw(st.integers(0, images.size - 1))] = draw(st.sampled_from([math.nan, math.inf, -1e-3, 2]))
    elif fault == "labels":
        kind = draw(st.sampled_from(["dtype", "shape", "range"]))
        if kind == "dtype":
            labels = labels.astype(draw(st.sampled_from([np.float32, np.bool_, np.complex64, object])))
        elif kind == "shape":
            labels = labels.reshape(draw(st.sampled_from([(2, 2), (4, 1)]))) if draw(st.booleans()) else labels[:3]
        else:
            labels[draw(st.integers(0, 3))] = draw(st.sampled_from([-1, -(2**40)]))
    else:
        num_classes = draw(st.sampled_from([0, -2, 1, 1.5, True, "2", math.nan]))
        if num_classes in (0, -2, 1):  # too few classes for the labels 0 and 1
            labels = np.arange(4) % 2
    return images, labels, num_classes, fault


@settings(max_examples=60)
@given(case=malformed_dataset_arrays())
def test_from_arrays_refuses_malformed_data(case):
    images, labels, num_classes, fault = case
    assert_refused(lambda: rj.data.from_arrays(images, labels, num_classes=num_classes), fault)


@settings(max_examples=25)
@given(case=malformed_dataset_arrays(), keys=st.sampled_from([("images", "labels"), ("x", "y")]))
def test_from_npz_refuses_malformed_files(case, keys):
    """The same faults in an .npz file; object arrays there are refused, not unpickled."""
    images, labels, num_classes, fault = case
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "data.npz"
        np.savez(path, **dict(zip(keys, (images, labels))))
        refused = fault if fault != "num_classes" else "num_classes"
        if images.dtype == object or labels.dtype == object:
            refused = "data.npz"
        assert_refused(lambda: rj.data.from_npz(path, num_classes=num_classes), refused)


@settings(max_examples=25)
@given(content=st.one_of(st.binary(max_size=64), st.sampled_from([b"PK\x03\x04garbage", b"\x93NUMPY\x01\x00"])),
       keys=st.sampled_from([("images",), ("pixels", "classes"), ("x", "labels")]))
def test_from_npz_refuses_unreadable_files_and_missing_keys(content, keys):
    with tempfile.TemporaryDirectory() as folder:
        broken, unnamed = Path(folder) / "broken.npz", Path(folder) / "unnamed.npz"
        broken.write_bytes(content)
        assert_refused(lambda: rj.data.from_npz(broken), "broken.npz")
        np.savez(unnamed, **{key: np.zeros((2, 8, 8), np.uint8) for key in keys})
        assert_refused(lambda: rj.data.from_npz(unnamed), "unnamed.npz")


@settings(max_examples=10)
@given(seed=st.integers(0, 2**16), dtype=st.sampled_from([np.uint8, np.float16, np.float32, np.float64]))
def test_datasets_read_valid_arrays_back_exactly(seed, dtype):
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (3, 8, 8, 1), dtype=np.uint8)
    images = pixels if dtype == np.uint8 else (pixels / 255).astype(dtype)
    labels = rng.integers(0, 4, 3)
    with tempfile.TemporaryDirectory() as folder:
        np.savez(Path(folder) / "data.npz", images=images, labels=labels)
        for dataset in (rj.data.from_arrays(images, labels, num_classes=4),
                        rj.data.load(str(Path(folder) / "data.npz"))):
            read_images, read_labels = dataset.arrays()
            assert read_images.dtype == np.float32 and read_labels.dtype == np.int32
            expected = pixels / np.float32(255) if dtype == np.uint8 else images.astype(np.float32)
            np.testing.assert_array_equal(read_images, expected)
            np.testing.assert_array_equal(read_labels, labels)


@settings(max_examples=20)
@given(sizes=st.lists(st.sampled_from([(8, 8), (9, 8), (1, 1)]), min_size=1, max_size=3),
       garbage=st.one_of(st.none(), st.binary(max_size=32)), extension=st.sampled_from([".png", ".jpg", ".bmp"]),
       batch_size=st.sampled_from([1, 2]))
def test_image_folders_refuse_unreadable_or_mismatched_images(sizes, garbage, extension, batch_size):
    """A folder of images of mixed sizes, maybe with a corrupt file: reading names the
    file at fault; otherwise every image reads back exactly."""
    with tempfile.TemporaryDirectory() as folder:
        files = []
        for i, (width, height) in enumerate(sizes):
            image = Image.fromarray(np.full((height, width), 10 * i, np.uint8))
            files.append(Path(folder) / f"class{i % 2}" / f"{i}.png")
            files[-1].parent.mkdir(exist_ok=True)
            image.save(files[-1])
        if garbage is not None:
            (Path(folder) / "class0" / f"corrupt{extension}").write_bytes(garbage)
        try:
            dataset = rj.data.from_folder(folder, channels=1)
            list(dataset.batches(batch_size))
        except ValueError as error:
            message = str(error)
            assert "corrupt" in message or "pass image_size" in message, message
            assert garbage is not None or len(set(sizes)) > 1, message
        else:
            assert garbage is None and len(set(sizes)) == 1


@settings(max_examples=10)
@given(batch_size=st.sampled_from([0, -1, 1.5, True, None, "2"]))
def test_dataset_batches_refuse_a_bad_batch_size(batch_size):
    dataset = rj.data.from_arrays(np.zeros((3, 8, 8), np.uint8), np.arange(3))
    assert_refused(lambda: list(dataset.batches(batch_size)), "batch_size")


# --------------------------------------------------------------------------------- plans

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=True),
              st.text(max_size=8), st.sampled_from(["pgd", "fgsm", "linf", "all", "imagenet-c", "cifar"])),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text(max_size=6), children, max_size=3)),
    max_leaves=6)
ATTACK_FIELD_NAMES = sorted({"name", "restarts", "eps", "steps", "norm", "step_size", "max_queries", "random_start"})
ATTACK_ENTRIES = st.dictionaries(st.sampled_from(ATTACK_FIELD_NAMES), JSON_VALUES, max_size=4) | st.fixed_dictionaries(
    {"name": st.sampled_from(["fgsm", "pgd", "square", "nope"])},
    optional={field: JSON_VALUES for field in ATTACK_FIELD_NAMES if field != "name"})
SECTION_KEYS = {"corruptions": plans.CORRUPTION_KEYS, "sequences": plans.SEQUENCE_KEYS,
                "system_noise": plans.SYSTEM_NOISE_KEYS,
                "metrics": {"attack", "layers", "reference", "kmnc_sections", "rgb_sigma", "ric_quality",
                            "corruptions", "mce_baseline", "toolkit_compat", "ebd2_step"}}
PLAN_DICTS = st.fixed_dictionaries({}, optional={
    "batch_size": JSON_VALUES, "num_examples": JSON_VALUES, "seed": JSON_VALUES,
    "attacks": st.one_of(st.lists(ATTACK_ENTRIES, max_size=2), JSON_VALUES),
    **{section: st.one_of(st.dictionaries(st.sampled_from(sorted(keys)), JSON_VALUES, max_size=3), JSON_VALUES)
       for section, keys in SECTION_KEYS.items()},
    "bogus": JSON_VALUES})


@settings(max_examples=80)
@example(raw={"metrics": {"layers": "conv1"}})  # a string is a sequence, of letters
@given(raw=PLAN_DICTS)
def test_plans_from_malformed_dicts_fail_with_a_plan_error(raw):
    """Any parsed TOML/JSON either validates into a Plan or fails with a ValueError that
    names the plan entry at fault (``plan: ...``), never another exception."""
    try:
        plan = plans.plan_from_dict(raw)
    except ValueError as error:
        assert str(error).startswith("plan"), str(error)
    else:
        assert isinstance(plan.as_dict(), dict)
        layers = None if plan.metrics is None else plan.metrics.layers
        assert layers is None or isinstance(layers, tuple) and all(isinstance(name, str) for name in layers)


@settings(max_examples=40)
@given(content=st.one_of(st.binary(max_size=64), st.text(max_size=64),
                         st.sampled_from(['attacks = "pgd"', "[[attacks]]\nname = 3", '{"attacks": [1]}', "seed = nan",
                                          "batch_size = 1e400", "\udcff", "[[attacks]]\nname = 'pgd'\neps = -1"])),
       suffix=st.sampled_from([".toml", ".json"]))
def test_malformed_plan_files_fail_naming_the_file_or_entry(content, suffix):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"plan{suffix}"
        if isinstance(content, str):
            path.write_text(content, errors="surrogateescape")
        else:
            path.write_bytes(content)
        try:
            plans.load_plan(path)
        except ValueError as error:
            assert str(error).startswith("plan"), str(error)
            assert str(path) in str(error) or str(error).startswith("plan: "), str(error)
