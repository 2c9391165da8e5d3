"""Natural distribution shift (issue 20): the released-set readers, the class lists and masks,
OOD detection on masked logits against scikit-learn, the plan table, and one small evaluation."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image
from rich.console import Console
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

import robustjax as rj
from robustjax.data import shift
from robustjax.evaluation import evaluate, natural_shift
from robustjax.evaluation.items import check_population_plan
from robustjax.evaluation.plan import plan_from_dict
from robustjax.evaluation.resume import ItemStore
from robustjax.report import html, natural_shift_table, schema

# ---------------------------------------------------------------------------------------------
# Class lists and masks


def test_class_lists_are_the_published_ones():
    imagenet = shift.wnids("imagenet")
    assert len(imagenet) == 1000 and list(imagenet) == sorted(imagenet) and len(set(imagenet)) == 1000
    # The same order as tfds' imagenet_a labels (an independent copy of the 1,000 wnids).
    assert tuple(tfds.builder("imagenet_a").info.features["label"].names) == imagenet
    for name in ("imagenet-a", "imagenet-o", "imagenet-r"):
        subset = shift.wnids(name)
        assert len(subset) == len(set(subset)) == 200 and list(subset) == sorted(subset)
        indices = shift.class_indices(name)
        assert list(indices) == sorted(indices) and [imagenet[i] for i in indices] == list(subset)
    # hendrycks/natural-adv-examples eval.py: thousand_k_to_200 maps 6 -> 0, 11 -> 1, ..., 988 -> 199.
    a = shift.class_indices("imagenet-a")
    assert a[:5] == (6, 11, 13, 15, 17) and a[-1] == 988 and shift.wnids("imagenet-a")[0] == "n01498041"
    assert "n01443537" in shift.wnids("imagenet-o") and shift.class_indices("imagenet-o")[0] == 1  # goldfish
    assert shift.class_indices("imagenet-r")[:3] == (1, 2, 4) and "n02085620" in shift.wnids("imagenet-r")  # Chihuahua
    assert set(shift.wnids("imagenet-a")) != set(shift.wnids("imagenet-o"))
    with pytest.raises(ValueError, match="unknown class list"):
        shift.wnids("imagenet-x")


# ---------------------------------------------------------------------------------------------
# Metrics on masked logits


def test_ood_detection_on_masked_logits_matches_sklearn():
    rng = np.random.default_rng(0)
    subset = np.array([1, 4, 5, 9, 13])
    in_logits = rng.normal(size=(40, 16)) + 3.0 * np.eye(16)[rng.choice(subset, 40)]  # confident in-distribution
    out_logits = rng.normal(size=(25, 16))
    in_logits[:3, subset] = 0.0  # ties among the masked logits
    out_logits[:2, subset] = 0.0
    score = jax.jit(rj.metrics.shift.subset_anomaly_score)
    in_scores, out_scores = (np.asarray(score(jnp.asarray(x, jnp.float32), subset)) for x in (in_logits, out_logits))
    # the score is -max softmax over the masked logits only
    masked = in_logits[:, subset]
    softmax = np.exp(masked - masked.max(1, keepdims=True))
    np.testing.assert_allclose(in_scores, -(softmax / softmax.sum(1, keepdims=True)).max(1), rtol=1e-5)
    measures = rj.metrics.calibration.ood_detection(in_scores, out_scores)
    labels = np.r_[np.ones(25), np.zeros(40)]
    scores = np.r_[out_scores, in_scores]
    np.testing.assert_allclose(measures["auroc"], roc_auc_score(labels, scores), rtol=1e-6)
    np.testing.assert_allclose(measures["aupr"], average_precision_score(labels, scores), rtol=1e-6)
    fpr, tpr, _ = roc_curve(labels, scores)
    np.testing.assert_allclose(measures["fpr_at_tpr"], fpr[tpr >= 0.95].min(), rtol=1e-6)


def test_subset_predictions_are_in_the_models_label_space():
    logits = jnp.array([[9.0, 1.0, 2.0, 3.0], [0.0, 5.0, 1.0, 4.0]])
    subset = jnp.array([2, 3])
    np.testing.assert_array_equal(rj.metrics.shift.subset_predictions(logits, subset), [3, 3])
    np.testing.assert_array_equal(rj.metrics.shift.subset_predictions(logits, None), [0, 1])
    confidence, prediction = rj.metrics.shift.subset_outputs(logits, subset)
    np.testing.assert_allclose(confidence, jax.nn.softmax(logits[:, 2:], axis=-1).max(-1), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Readers


def _coded(label: int, size: tuple[int, int] = (12, 9)) -> np.ndarray:
    """A constant image whose colour encodes ``label`` (survives resizing)."""
    return np.broadcast_to(np.array([label // 256, label % 256, 7], np.uint8), (*size, 3)).copy()


def _label_of(x: jax.Array) -> jax.Array:
    pixel = jnp.round(x[:, 0, 0, :2] * 255)
    return (pixel[:, 0] * 256 + pixel[:, 1]).astype(jnp.int32)


def imagenet_model() -> rj.Classifier:
    """1,000 classes on 8x8x3: logit 2 on the class the image encodes, 5 on class 0, which no
    200-class set has, so only a masked prediction can be right."""
    def apply(params, x):
        return 2.0 * jax.nn.one_hot(_label_of(x), 1000) + params["bias"]

    return rj.Classifier(params={"bias": jnp.zeros(1000).at[0].set(5.0)}, apply_fn=apply, num_classes=1000,
                         input_shape=(8, 8, 3), name="coded")


def _mock_source(labels: list[int]):
    def as_data_source(self, split=None, **kwargs):
        return [{"image": _coded(label, (12 + i % 3, 9)), "label": label, "file_name": f"{i}.jpg"}
                for i, label in enumerate(labels)]
    return as_data_source


def test_imagenet_a_from_tfds_mock_is_masked(tmp_path):
    labels = list(shift.class_indices("imagenet-a")[::25])  # 8 of its classes
    with tfds.testing.mock_data(as_data_source_fn=_mock_source(labels)):
        loaded = shift.load_shift("imagenet-a", data_dir=tmp_path, image_size=8)
        assert (loaded.kind, loaded.source, loaded.subset) == ("classification", "tfds:imagenet_a/test",
                                                                shift.class_indices("imagenet-a"))
        x, y = loaded.dataset.arrays()
        assert x.shape == (8, 8, 8, 3) and list(y) == labels
        confidence, prediction = rj.metrics.shift.subset_outputs(imagenet_model()(x), np.asarray(loaded.subset))
        assert list(prediction) == labels and (np.asarray(jnp.argmax(imagenet_model()(x), -1)) == 0).all()
        with pytest.raises(ValueError, match="varying size"):
            shift.load_shift("imagenet-r", data_dir=tmp_path)
    with tfds.testing.mock_data(as_data_source_fn=_mock_source([0, 6])):  # class 0 is not ImageNet-A's
        loaded = shift.load_shift("imagenet-a", data_dir=tmp_path, image_size=8)
        with pytest.raises(ValueError, match="label 0 is not one of its 200 classes"):
            loaded.dataset.arrays()


def test_cifar10_c_from_tfds_mock_and_imagenet_c_config_names(tmp_path):
    with tfds.testing.mock_data(num_examples=3):
        loaded = shift.load_shift("cifar10-c", data_dir=tmp_path, corruptions=("fog", "snow"), severities=(1, 5))
        assert loaded.source == "tfds:cifar10_corrupted/test" and sorted(loaded.corrupted) == [
            ("fog", 1), ("fog", 5), ("snow", 1), ("snow", 5)]
        assert loaded.corrupted["fog", 5].name == "cifar10_corrupted/fog_5/test"
        x, _ = loaded.corrupted["snow", 1].arrays()
        assert x.shape == (3, 32, 32, 3)
        imagenet_c = shift.load_shift("imagenet-c", data_dir=tmp_path, corruptions=("contrast",), severities=(2,))
        assert imagenet_c.corrupted["contrast", 2].image_shape == (224, 224, 3)
        with pytest.raises(ValueError, match="evaluated as stored"):
            shift.load_shift("imagenet-c", data_dir=tmp_path, image_size=160, corruptions=("contrast",), severities=(2,))


def test_unprepared_sets_name_the_command_and_folder(tmp_path):
    with pytest.raises(ValueError) as error:
        shift.load_shift("imagenet-a", data_dir=tmp_path)
    message = str(error.value)
    assert "\n" not in message and str(tmp_path / "imagenet-a") in message and "tfds build imagenet_a" in message
    with pytest.raises(ValueError, match=r"imagenet-o.tar.*imagenet-o/<wnid>"):
        shift.load_shift("imagenet-o", data_dir=tmp_path)
    with pytest.raises(ValueError, match=r"tfds build imagenet2012_corrupted/fog_1.*ILSVRC2012_img_val.tar"):
        shift.load_shift("imagenet-c", data_dir=tmp_path, corruptions=("fog",))
    with pytest.raises(ValueError, match=r"did you mean 'imagenet-a'"):
        shift.load_shift("imagenet-aa")


def _write_cifar10_c(root, corruptions=("fog", "gaussian_noise"), per_severity=20):
    """A CIFAR-10-C-layout set of 8x8x1 digits: severity s of a file adds (s - 1) grey levels."""
    folder = root / "CIFAR-10-C"
    folder.mkdir(parents=True)
    x, y = rj.data.digits("test").arrays(limit=per_severity)
    images = np.round(x * 200).astype(np.uint8)
    for corruption in corruptions:
        np.save(folder / f"{corruption}.npy", np.concatenate([images + s for s in range(5)]))
    np.save(folder / "labels.npy", np.tile(y, 5).astype(np.uint8))
    return x, y


def test_cifar10_c_released_npy_layout(tmp_path):
    x, y = _write_cifar10_c(tmp_path)
    loaded = shift.load_shift("cifar10-c", data_dir=tmp_path, corruptions=("fog",), severities=(1, 3))
    assert loaded.source == str(tmp_path / "CIFAR-10-C") and loaded.num_classes == 10
    for severity in (1, 3):
        part = loaded.corrupted["fog", severity]
        images, labels = part.arrays()
        assert part.num_examples == 20 and part.image_shape == (8, 8, 1)
        np.testing.assert_array_equal(np.round(images * 255), np.round(x * 200) + severity - 1)
        np.testing.assert_array_equal(labels, y)
    with pytest.raises(ValueError, match=r"no file .*snow.npy"):
        shift.load_shift("cifar10-c", data_dir=tmp_path, corruptions=("snow",))
    np.save(tmp_path / "CIFAR-10-C" / "fog.npy", np.zeros((7, 8, 8, 1), np.uint8))
    with pytest.raises(ValueError, match="5 severities of equal size"):
        shift.load_shift("cifar10-c", data_dir=tmp_path, corruptions=("fog",))


def _image_tree(root, layout: dict[str, list[tuple[int, int]]]):
    for folder, sizes in layout.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i, size in enumerate(sizes):
            Image.fromarray(np.full((*size, 3), 40 * i, np.uint8)).save(root / folder / f"{i}.png")


def test_released_folders_imagenet_o_and_c(tmp_path):
    o = shift.wnids("imagenet-o")
    _image_tree(tmp_path / "imagenet-o", {o[0]: [(8, 8)] * 2, o[5]: [(8, 8)]})
    loaded = shift.load_shift("imagenet-o", data_dir=tmp_path)
    assert loaded.kind == "ood" and loaded.subset == shift.class_indices("imagenet-o")
    _, labels = loaded.dataset.arrays()
    assert list(labels) == [shift.class_indices("imagenet-o")[0]] * 2 + [shift.class_indices("imagenet-o")[5]]
    _image_tree(tmp_path / "imagenet-o", {"n01440764": [(8, 8)]})  # tench: not an ImageNet-O class
    with pytest.raises(ValueError, match=r"'n01440764'.* not among its 200"):
        shift.load_shift("imagenet-o", data_dir=tmp_path)
    _image_tree(tmp_path / "ImageNet-C", {f"fog/{s}/{w}": [(8, 8)] for s in (1, 2) for w in ("n01440764", "n15075141")})
    c = shift.load_shift("imagenet-c", data_dir=tmp_path, corruptions=("fog",), severities=(1, 2))
    assert list(c.corrupted["fog", 2].arrays()[1]) == [0, 999]
    with pytest.raises(ValueError, match=r"no folder .*fog/3"):
        shift.load_shift("imagenet-c", data_dir=tmp_path, corruptions=("fog",), severities=(3,))


def test_ood_folder_of_mixed_sizes_is_resized_or_refused(tmp_path):
    _image_tree(tmp_path / "ood", {"a": [(8, 8), (8, 8)], "b/c": [(10, 12)]})
    with pytest.raises(ValueError, match="different sizes.*--image-size"):
        shift.image_files_folder(tmp_path / "ood", num_classes=10)
    dataset = shift.image_files_folder(tmp_path / "ood", num_classes=10, image_size=8, channels=1)
    assert dataset.arrays()[0].shape == (3, 8, 8, 1)
    with pytest.raises(ValueError, match="no folder of out-of-distribution images"):
        shift.image_files_folder(tmp_path / "missing", num_classes=10)


# ---------------------------------------------------------------------------------------------
# Plan and model checks


def test_plan_table_is_validated():
    plan = plan_from_dict({"natural_shift": {"datasets": ["imagenet-a", "cifar10-c"], "ood": "folder:/x",
                                             "corruptions": ["fog"], "severities": [1, 2], "image_size": 224}})
    run = plan.natural_shift
    assert (run.datasets, run.ood, run.corruptions, run.severities, run.image_size) == (
        ("imagenet-a", "cifar10-c"), ("folder:/x",), ("fog",), (1, 2), 224)
    assert plan.as_dict()["natural_shift"]["ood"] == ["folder:/x"]
    assert len(plan_from_dict({"natural_shift": {"datasets": ["imagenet-c"]}}).natural_shift.corruptions) == 15
    for raw, match in (({"dataset": ["imagenet-a"]}, "did you mean 'datasets'"),
                       ({"datasets": ["imagenet_a"]}, "did you mean 'imagenet-a'"),
                       ({"ood": "/some/folder"}, "folder:PATH"),
                       ({}, "needs datasets"),
                       ({"datasets": ["cifar10-c"], "corruptions": ["fgo"]}, "fgo"),
                       ({"datasets": ["imagenet-a"], "image_size": 0}, "image_size")):
        with pytest.raises(ValueError, match=match):
            plan_from_dict({"natural_shift": raw})
    with pytest.raises(ValueError, match=r"plan sections \[.natural_shift.\] run per network.*robustjax sweep run"):
        check_population_plan(plan)


def test_a_model_of_other_classes_is_refused(tmp_path, digits_clf):
    _write_cifar10_c(tmp_path)
    run = plan_from_dict({"natural_shift": {"datasets": ["cifar10-c"], "data_dir": str(tmp_path),
                                            "corruptions": ["fog"]}}).natural_shift
    with pytest.raises(ValueError, match=r"cifar10-c needs a model of 10 classes .* model 'coded' predicts 1000"):
        natural_shift.load_sets(run, imagenet_model())
    with tfds.testing.mock_data(as_data_source_fn=_mock_source([6])):
        run = plan_from_dict({"natural_shift": {"datasets": ["imagenet-a"], "data_dir": str(tmp_path),
                                                "image_size": 8}}).natural_shift
        with pytest.raises(ValueError, match=r"imagenet-a needs a model of 1000 classes \(its labels and class mask"):
            natural_shift.load_sets(run, digits_clf)


# ---------------------------------------------------------------------------------------------
# End to end


def test_imagenet_a_and_o_through_evaluate(tmp_path):
    """ImageNet-A (tfds mock) accuracy is 100% only because the logits are masked; ImageNet-O's
    in-distribution side is the evaluated examples of its classes."""
    o_classes = shift.class_indices("imagenet-o")
    _image_tree(tmp_path / "imagenet-o", {shift.wnids("imagenet-o")[3]: [(8, 8)] * 3})
    in_labels = np.array([o_classes[0], o_classes[1], 3, 2, o_classes[7], 5])
    in_images = np.stack([_coded(int(label), (8, 8)) for label in in_labels])
    in_distribution = rj.data.from_arrays(in_images, in_labels, name="val", num_classes=1000)
    plan = plan_from_dict({"batch_size": 8, "sanity": {"enabled": False},
                           "natural_shift": {"datasets": ["imagenet-a", "imagenet-o"], "data_dir": str(tmp_path),
                                             "image_size": 8}})
    labels = list(shift.class_indices("imagenet-a")[:5])
    with tfds.testing.mock_data(as_data_source_fn=_mock_source(labels)):
        report = evaluate(imagenet_model(), in_distribution, plan)
    a, o = report["natural_shift"]["results"]
    assert report["status"] == "complete" and report["clean"]["accuracy"] == 0.0  # unmasked: class 0 wins
    assert (a["name"], a["num_examples"], a["num_classes"], a["accuracy"]) == ("imagenet-a", 5, 200, 1.0)
    assert (o["num_ood"], o["num_in_distribution"], o["num_classes"]) == (3, 3, 200)
    jsonschema.validate(json.loads(json.dumps(report)), schema())


def test_cifar10_c_and_ood_folder_end_to_end_with_resume(tmp_path, digits_clf):
    _write_cifar10_c(tmp_path / "data")
    _image_tree(tmp_path / "ood", {"noise": [(8, 8)] * 5})
    plan = plan_from_dict({"batch_size": 16, "num_examples": 20, "sanity": {"enabled": False},
                           "natural_shift": {"datasets": ["cifar10-c"], "ood": f"folder:{tmp_path / 'ood'}",
                                             "data_dir": str(tmp_path / "data"), "corruptions": ["fog", "gaussian_noise"],
                                             "severities": [1, 5]}})
    dataset = rj.data.digits("test")
    events = []
    with ItemStore.open(tmp_path / "items", {"run": 1}) as store:
        report = evaluate(digits_clf, dataset, plan, store=store, on_step=events.append)
    section = report["natural_shift"]
    assert report["status"] == "complete" and section["status"] == "ok" and not section["failed"]
    c, ood = section["results"]
    assert (c["kind"], c["num_examples"], len(c["results"]), c["mce"]) == ("corruptions", 20, 4, None)
    assert [(r["name"], r["severity"]) for r in c["results"]] == [("fog", 1), ("fog", 5), ("gaussian_noise", 1),
                                                                 ("gaussian_noise", 5)]
    # severity 1 of the file is the clean images (rounded to 200 grey levels)
    assert abs(c["results"][0]["accuracy"] - report["clean"]["accuracy"]) <= 0.1
    assert c["mean_error"] == pytest.approx(1 - c["mean_accuracy"], abs=1e-6)
    assert (ood["kind"], ood["num_ood"], ood["num_in_distribution"], ood["num_classes"]) == ("ood", 5, 20, 10)
    assert 0 <= ood["auroc"] <= 1 and 0 <= ood["fpr_at_95_tpr"] <= 1
    steps = {event.step: event for event in events if event.status == "finished"}
    assert steps["natural shift cifar10-c fog"].total == 2 * 2  # batches x severities, advanced per batch
    assert steps[f"natural shift folder:{tmp_path / 'ood'}"].done == 2 + 1
    jsonschema.validate(json.loads(json.dumps(report)), schema())
    console = Console(record=True, width=160)
    console.print(natural_shift_table(report))
    assert "cifar10-c: 2 corruptions x 2 severities" in console.export_text()
    page = html.render_html(report)
    shown = page[page.index("<section id=natural_shift>"):]
    shown = shown[:shown.index("</section>")]
    assert shown.count("<svg") == 2 and "AUROC" in shown and "gaussian_noise" in shown  # bars, heatmap, tables
    # a rerun reads every item back
    events.clear()
    with ItemStore.open(tmp_path / "items", {"run": 1}) as store:
        again = evaluate(digits_clf, dataset, plan, store=store, on_step=events.append)
    assert again["natural_shift"]["results"] == section["results"]
    assert {e.status for e in events if e.step.startswith("natural shift") and e.status != "running"} == {"reused"}


def _linear_imagenet_model(seed: int = 0) -> rj.Classifier:
    """1,000 classes on 8x8x3: random linear logits, larger on brighter images (so the
    confidences of bright and dark images differ, with some overlap)."""
    w = np.random.default_rng(seed).normal(0.0, 0.6, (8 * 8 * 3, 1000)).astype(np.float32)

    def apply(params, x):
        return x.reshape(x.shape[0], -1) @ params["w"]

    return rj.Classifier(params={"w": jnp.asarray(w)}, apply_fn=apply, num_classes=1000, input_shape=(8, 8, 3),
                         name="linear1000")


def test_ood_figures_of_the_report_are_sklearns_on_the_models_scores(tmp_path):
    """ImageNet-O and an OOD folder through ``evaluate``: AUROC, AUPR and FPR at 95% TPR of
    the report equal scikit-learn's on scores computed here from the definition (OOD
    positive, score ``-max softmax``; ImageNet-O: the logits masked to its 200 classes and
    only the evaluated examples of those classes as in-distribution; the folder: every
    evaluated example, all logits). 30 evaluated examples in batches of 8 (the last padded)."""
    rng = np.random.default_rng(1)
    clf = _linear_imagenet_model()
    o_classes, o_wnids = np.array(shift.class_indices("imagenet-o")), shift.wnids("imagenet-o")
    in_images = rng.integers(100, 256, (30, 8, 8, 3), dtype=np.uint8)  # brighter: more confident
    in_labels = np.where(np.arange(30) % 3 == 0, rng.choice(np.setdiff1d(np.arange(1000), o_classes), 30),
                         rng.choice(o_classes, 30))  # a third not among ImageNet-O's classes
    o_images = rng.integers(0, 150, (12, 8, 8, 3), dtype=np.uint8)
    folder_images = rng.integers(0, 150, (9, 8, 8, 3), dtype=np.uint8)
    for i, image in enumerate(o_images):
        (tmp_path / "imagenet-o" / o_wnids[i % 4]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(tmp_path / "imagenet-o" / o_wnids[i % 4] / f"{i}.png")
    for i, image in enumerate(folder_images):
        (tmp_path / "ood" / str(i % 2)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(tmp_path / "ood" / str(i % 2) / f"{i}.png")
    in_distribution = rj.data.from_arrays(in_images, in_labels, name="val", num_classes=1000)
    plan = plan_from_dict({"batch_size": 8, "sanity": {"enabled": False},
                           "natural_shift": {"datasets": ["imagenet-o"], "ood": f"folder:{tmp_path / 'ood'}",
                                             "data_dir": str(tmp_path)}})  # 8x8 images: no resizing
    report = evaluate(clf, in_distribution, plan)
    o_entry, folder_entry = report["natural_shift"]["results"]

    def scores(images, subset=None):
        logits = np.asarray(clf(jnp.asarray(images / 255.0, jnp.float32)), np.float64)
        logits = logits if subset is None else logits[:, subset]
        softmax = np.exp(logits - logits.max(1, keepdims=True))
        return -(softmax / softmax.sum(1, keepdims=True)).max(1)

    in_o = np.isin(in_labels, o_classes)
    cases = [(o_entry, scores(in_images[in_o], o_classes), scores(o_images, o_classes)),
             (folder_entry, scores(in_images), scores(folder_images))]
    for entry, in_scores, out_scores in cases:
        assert (entry["num_in_distribution"], entry["num_ood"]) == (in_scores.size, out_scores.size)
        labels = np.r_[np.ones(out_scores.size), np.zeros(in_scores.size)]
        both = np.r_[out_scores, in_scores]
        fpr, tpr, _ = roc_curve(labels, both)
        expected = {"auroc": roc_auc_score(labels, both), "aupr": average_precision_score(labels, both),
                    "fpr_at_95_tpr": fpr[tpr >= 0.95].min()}
        assert 0.6 < expected["auroc"] < 0.99 and 0 < expected["fpr_at_95_tpr"] < 1  # not degenerate
        for name, value in expected.items():
            assert entry[name] == pytest.approx(value, abs=1e-6), (entry["name"], name)
