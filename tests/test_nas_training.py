"""Batch-norm recalibration, supernet training (sandwich rule, single path), resuming a killed
run, the embedded digits supernets, and supernet checkpoints of another space."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax.classifier import NNXFeatures
from robustjax.nas.bignas import BigNASSpace


@pytest.fixture(scope="module")
def digits_train():
    return rj.data.digits("train").arrays()


def accuracy(clf: rj.Classifier) -> float:
    x, y = rj.data.digits("test").arrays()
    return float(np.mean(np.asarray(clf(x)).argmax(-1) == y))


def test_recalibrated_statistics_are_those_of_the_calibration_images():
    space = rj.nas.space("nb201_digits")
    network = rj.nas.build_network(space, 11472, key=jax.random.key(0))
    images = np.random.default_rng(0).normal(1.0, 2.0, size=(100, 8, 8, 1)).astype(np.float32)
    # The stem's BatchNorm sees the stem convolution's output, whatever the batches.
    stem = np.asarray(network.stem_conv(images), np.float64)
    for batch_size in (100, 32):
        calibrated = rj.nas.recalibrate(network, images, batch_size=batch_size)
        np.testing.assert_allclose(calibrated.stem_bn.mean[...], stem.mean((0, 1, 2)), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(calibrated.stem_bn.var[...], stem.var((0, 1, 2)), rtol=1e-5, atol=1e-5)
    # In one batch, every BatchNorm's statistics are those of its input in a training-mode pass.
    calibrated = rj.nas.recalibrate(network, images, batch_size=100)
    training = nnx.clone(network)
    training.train()
    graphdef, state = nnx.split(training)
    features = NNXFeatures(graphdef)(state, images)
    for layer in ("cells.0.layers.0.conv", "cells.1.conv_b.conv", "cells.4.layers.2.conv"):
        norm = calibrated.cells[int(layer.split(".")[1])]
        for part in layer.split(".")[2:-1]:
            norm = norm[part] if isinstance(norm, nnx.Dict) else getattr(norm, part)
        inputs = np.asarray(features[layer], np.float64)
        np.testing.assert_allclose(norm.bn.mean[...], inputs.mean((0, 1, 2)), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(norm.bn.var[...], inputs.var((0, 1, 2)), rtol=1e-4, atol=1e-5)
    assert network.stem_bn.mean[...].max() == 0.0  # the network passed in is unchanged
    with pytest.raises(ValueError, match="non-empty"):
        rj.nas.recalibrate(network, images[:0])


TINY = BigNASSpace(  # a small BigNAS space for a short training run in the test suite
    name="tiny_digits", block="basic", widths=((4, 16), (4, 16), (8, 32), (8, 32), (8, 32)),
    depths=((1,), (1, 2), (1,), (1, 2), (1,)), kernels=((3,), (3,), (3,), (3,), (3,)),
    expand_ratios=((0,), (0.5, 1.0), (1.0,), (0.5, 1.0), (1.0,)), resolutions=(8,), strides=(1, 1, 2, 1, 2),
    in_channels=1, num_classes=10, mean=(0.3052,), std=(0.3761,))


def test_sandwich_training_lifts_the_largest_and_smallest_subnets(tmp_path, digits_train):
    settings = rj.nas.TrainSettings(steps=150, batch_size=64, learning_rate=4e-3, checkpoint_every=150)
    supernet = rj.nas.train_supernet(TINY, *digits_train, tmp_path, settings)
    largest = accuracy(supernet.subnet(TINY.largest(), calibration=digits_train[0]))
    smallest = accuracy(supernet.subnet(TINY.smallest(), calibration=digits_train[0]))
    assert largest > 0.8 and smallest > 0.5  # chance is 0.1
    assert largest > smallest


def test_a_killed_training_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path, digits_train):
    space = rj.nas.space("nb201_digits")
    settings = rj.nas.TrainSettings(steps=12, batch_size=32, checkpoint_every=4)
    straight = rj.nas.train_supernet(space, *digits_train, tmp_path / "straight", settings)
    rj.nas.train_supernet(space, *digits_train, tmp_path / "killed", settings, stop_after=7)  # dies after step 7
    resumed = rj.nas.train_supernet(space, *digits_train, tmp_path / "killed", settings)
    for a, b in zip(jax.tree.leaves(straight.state), jax.tree.leaves(resumed.state)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="belong to another run"):
        rj.nas.train_supernet(rj.nas.space("bignas_resnet_basic_digits"), *digits_train, tmp_path / "killed", settings)
    with pytest.raises(ValueError, match="belong to another run"):
        rj.nas.train_supernet(space, *digits_train, tmp_path / "killed", dataclasses.replace(settings, seed=1))


def test_training_refuses_images_of_another_shape(tmp_path, digits_train):
    with pytest.raises(ValueError, match=r"trains on images of shape \(N, \(32, 32, 3\)\)"):
        rj.nas.train_supernet(rj.nas.space("nb201"), *digits_train, tmp_path)


@pytest.mark.parametrize("space_name", ["nb201_digits", "bignas_resnet_basic_digits"])
def test_embedded_supernets_give_accurate_subnets(space_name):
    space = rj.nas.space(space_name)
    largest, smallest = (space.largest(), space.smallest()) if isinstance(space, BigNASSpace) else (11472, 0)
    best = accuracy(rj.zoo.create(f"nas.{space_name}", arch=largest))
    assert best > 0.9
    if isinstance(space, BigNASSpace):
        assert best > accuracy(rj.zoo.create(f"nas.{space_name}", arch=smallest)) > 0.5


def test_the_bundled_supernets_are_public_and_an_unbundled_space_is_named():
    for space_name in ("nb201_digits", "bignas_resnet_basic_digits"):
        assert rj.nas.bundled_supernet(space_name).space == rj.nas.space(space_name)
    with pytest.raises(ValueError, match=r"no supernet is bundled for 'nb201'; the bundled ones are "
                                         r"\['bignas_resnet_basic_digits', 'nb201_digits'\]"):
        rj.nas.bundled_supernet("nb201")


def test_a_supernet_of_another_space_is_refused(tmp_path):
    rj.nas.Supernet.create(rj.nas.space("nb201_digits"), key=jax.random.key(0)).save(tmp_path)
    with pytest.raises(ValueError, match="holds a supernet of nb201_digits.*not of nb201"):
        rj.nas.Supernet.load(tmp_path, space=rj.nas.space("nb201"))
    with pytest.raises(ValueError, match="holds no supernet"):
        rj.nas.Supernet.load(tmp_path / "elsewhere")
