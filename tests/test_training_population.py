"""Training populations (issue 39): every network of a population trained in one program ends
with the weights it gets trained alone (robustjax train's loop, same seed and technique), in
each layout; a network that diverges stops alone; a killed population resumes bit for bit;
populations that cannot train as one are refused before anything compiles."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax import training
from robustjax.nas.trainable import standalone_network, trainable

SPACE = rj.nas.space("nb201_digits")
CELLS = ("|nor_conv_3x3~0|+|nor_conv_1x1~0|avg_pool_3x3~1|+|skip_connect~0|none~1|nor_conv_3x3~2|",
         "|avg_pool_3x3~0|+|skip_connect~0|nor_conv_1x1~1|+|nor_conv_1x1~0|nor_conv_3x3~1|none~2|",
         "|skip_connect~0|+|none~0|avg_pool_3x3~1|+|nor_conv_3x3~0|skip_connect~1|nor_conv_1x1~2|")
SEEDS = (3, 11, 7)
RECIPE = training.Recipe(steps=4, batch_size=16, learning_rate=0.05, warmup_from=0.01, ema_decay=0.9)
TECHNIQUES = training.techniques.create("pgd_at")
ATTACK = dict(attack_eps=0.2, attack_steps=2)


def _population(seeds=SEEDS, *, broken: int | None = None, layout: str = "vmap") -> list[rj.Classifier]:
    """The cells initialised as `robustjax train` initialises them: at their own shapes
    (layout "unrolled") or in the supernet's (``trainable``)."""
    if layout == "unrolled":
        networks = [_standalone(cell, seed) for cell, seed in zip(CELLS, seeds)]
    else:
        networks = [trainable(SPACE, cell, key=jax.random.key(seed), sequential=layout == "sequential")
                    for cell, seed in zip(CELLS, seeds)]
    if broken is not None:  # its classifier's bias infinite: a non-finite loss at the first step
        params = nnx.to_pure_dict(networks[broken].params)
        classifier = params["supernet"]["classifier"] if "supernet" in params else params["classifier"]
        classifier["bias"] = jnp.full_like(classifier["bias"], jnp.inf)
        state = networks[broken].params
        nnx.replace_by_pure_dict(state, params)
        networks[broken] = networks[broken].replace(params=state)
    return networks


def _standalone(cell: str, seed: int) -> rj.Classifier:
    return rj.zoo.create("nas.nb201_digits", pretrained=False, key=jax.random.key(seed), arch=cell)


def _train(out, networks, seeds=SEEDS, **options) -> training.PopulationResult:
    return training.train_population(networks, rj.data.digits("train"), out, RECIPE, TECHNIQUES, seeds=list(seeds),
                                     **ATTACK, **options)


def _weights(classifier: rj.Classifier) -> dict:
    return nnx.to_pure_dict(classifier.params)


@pytest.fixture(scope="module")
def solo(tmp_path_factory) -> list[dict]:
    """Each cell trained alone as `robustjax train` trains it (zoo network, recipe seed)."""
    out = []
    for cell, seed in zip(CELLS, SEEDS):
        result = training.train(_standalone(cell, seed), rj.data.digits("train"), tmp_path_factory.mktemp("solo"),
                                dataclasses.replace(RECIPE, seed=seed), TECHNIQUES, **ATTACK)
        out.append(_weights(result.classifier))
    return out


@pytest.fixture(scope="module")
def population(tmp_path_factory) -> training.PopulationResult:
    return _train(tmp_path_factory.mktemp("population"), _population())


def test_each_network_ends_with_its_solo_weights(solo, population):
    """Three cells (convolutions, pools, skips, zeros), PGD-AT with EMA: each network's
    parameters and batch statistics equal its solo run's to 1e-5."""
    assert population.steps == RECIPE.steps and population.stopped == (None, None, None)
    for i, (cell, expected) in enumerate(zip(CELLS, solo)):
        got = _weights(standalone_network(SPACE, cell, population.classifiers[i]))
        assert jax.tree.structure(got) == jax.tree.structure(expected)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0, err_msg=f"network {i}"),
                     got, expected)
    untrained = _weights(standalone_network(SPACE, CELLS[0], _population()[0]))
    assert not np.allclose(untrained["classifier"]["kernel"], solo[0]["classifier"]["kernel"], atol=1e-3)


def test_one_after_another_each_cell_ends_with_its_solo_weights(tmp_path, solo):
    """The sequential layout (the networks in turn, each edge switching to its op, so each
    cell computes only its own ops): the solo weights to 1e-5 as well."""
    result = _train(tmp_path, _population(layout="sequential"), layout="sequential")
    for i, (cell, expected) in enumerate(zip(CELLS, solo)):
        got = _weights(standalone_network(SPACE, cell, result.classifiers[i]))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0, err_msg=f"network {i}"),
                     got, expected)


@pytest.fixture(scope="module")
def unrolled(tmp_path_factory) -> training.PopulationResult:
    return _train(tmp_path_factory.mktemp("unrolled"), _population(layout="unrolled"), layout="unrolled")


def test_unrolled_each_cell_at_its_own_shapes_ends_with_its_solo_weights(solo, unrolled):
    """The unrolled layout (each cell's own step, at its own shapes, in one program): the
    solo weights to 1e-5, the population's networks being of three different graphs."""
    assert unrolled.steps == RECIPE.steps and unrolled.stopped == (None, None, None)
    for i, expected in enumerate(solo):
        got = _weights(unrolled.classifiers[i])
        assert jax.tree.structure(got) == jax.tree.structure(expected)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0, err_msg=f"network {i}"),
                     got, expected)


def test_unrolled_a_diverging_network_stops_and_a_killed_run_resumes_bit_for_bit(tmp_path, solo, unrolled):
    """Unrolled: network 1 stops after 0 steps with its initial weights, 0 and 2 equal their
    solo runs; stopped after 3 of 4 steps and restarted, the uninterrupted weights bit for bit."""
    networks = _population(broken=1, layout="unrolled")
    result = _train(tmp_path / "broken", networks, layout="unrolled")
    assert result.stopped == (None, 0, None)
    jax.tree.map(np.testing.assert_array_equal, _weights(result.classifiers[1]), _weights(networks[1]))
    for i in (0, 2):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0), _weights(result.classifiers[i]),
                     solo[i])
    killed = _train(tmp_path / "killed", _population(layout="unrolled"), checkpoint_every=2, stop_after=3,
                    layout="unrolled")
    assert killed.steps == 3
    resumed = _train(tmp_path / "killed", _population(layout="unrolled"), checkpoint_every=2, layout="unrolled")
    assert resumed.resumed_from == 2
    for got, expected in zip(resumed.classifiers, unrolled.classifiers):
        jax.tree.map(np.testing.assert_array_equal, _weights(got), _weights(expected))


def test_a_diverging_network_stops_and_the_others_go_on(tmp_path, solo):
    """Network 1 has a non-finite loss at its first step: it is recorded as stopped after 0
    steps and keeps its initial weights; networks 0 and 2 equal their solo runs."""
    networks = _population(broken=1)
    result = _train(tmp_path, networks)
    assert result.stopped == (None, 0, None)
    jax.tree.map(np.testing.assert_array_equal, _weights(result.classifiers[1]), _weights(networks[1]))
    for i in (0, 2):
        got = _weights(standalone_network(SPACE, CELLS[i], result.classifiers[i]))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0), got, solo[i])
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["stopped"] == [1] and last["loss"][1] is None and last["loss"][0] is not None


def test_a_killed_population_resumes_bit_for_bit(tmp_path, population):
    """Stopped after 3 of 4 steps (last checkpoint at 2), restarted: the uninterrupted weights,
    bit for bit; the log holds each step once."""
    assert _train(tmp_path, _population(), checkpoint_every=2, log_every=1, stop_after=3).steps == 3
    resumed = _train(tmp_path, _population(), checkpoint_every=2, log_every=1)
    assert resumed.resumed_from == 2
    for got, expected in zip(resumed.classifiers, population.classifiers):
        jax.tree.map(np.testing.assert_array_equal, _weights(got), _weights(expected))
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"belong to another population \(seeds: \[3, 11, 7\], not \[3, 11, 8\]\)"):
        _train(tmp_path, _population(), seeds=(3, 11, 8))


def test_unrolled_networks_of_different_architectures_end_with_their_solo_weights(tmp_path):
    """Two zoo architectures and a BigNAS subnet, trained with cutmix (a random box per step
    and network) in one unrolled program: each network ends with the weights it ends with
    trained alone, to 1e-5."""
    recipe, cutmix = dataclasses.replace(RECIPE, steps=2, seed=0), training.techniques.create("cutmix")
    smallest = rj.nas.space("bignas_resnet_basic_digits").smallest()
    builds = [("digits_cnn", {}), ("digits_mlp", {}), ("nas.bignas_resnet_basic_digits", {"arch": smallest})]
    seeds = [5, 6, 7]

    def networks():
        return [rj.zoo.create(name, pretrained=False, key=jax.random.key(seed), **options)
                for (name, options), seed in zip(builds, seeds)]

    together = training.train_population(networks(), rj.data.digits("train"), tmp_path / "together", recipe, cutmix,
                                         seeds=seeds, layout="unrolled")
    for i, (network, seed) in enumerate(zip(networks(), seeds)):
        alone = training.train(network, rj.data.digits("train"), tmp_path / str(i),
                               dataclasses.replace(recipe, seed=seed), cutmix)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=0, err_msg=f"network {i}"),
                     _weights(together.classifiers[i]), _weights(alone.classifier))


def test_populations_that_cannot_train_as_one_are_refused(tmp_path):
    networks = _population()
    digits_cnn = rj.zoo.create("digits_cnn", pretrained=False)
    with pytest.raises(ValueError, match=r"network 1 \(digits_cnn\) is not of network 0's graph.*'unrolled'"):
        _train(tmp_path, [networks[0], digits_cnn], seeds=(0, 1))
    with pytest.raises(ValueError, match="layout must be one of vmap, sequential, unrolled; got 'masks'"):
        _train(tmp_path, networks, layout="masks")
    wider = trainable(rj.nas.space("nb201_digits", channels=16), CELLS[1], key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"network 1 \(.*\) is not of network 0's graph"):
        _train(tmp_path, [networks[0], wider], seeds=(0, 1))
    cifar = trainable(rj.nas.space("nb201", channels=4, cells_per_stage=1), CELLS[0], key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"network 1 \(.*\) takes \(32, 32, 3\) images and 10 classes, network 0 "):
        _train(tmp_path, [networks[0], cifar], seeds=(0, 1))
    cifar_alone = rj.zoo.create("nas.nb201", pretrained=False, arch=CELLS[0], channels=4, cells_per_stage=1)
    with pytest.raises(ValueError, match=r"network 1 \(.*\) takes \(32, 32, 3\) images and 10 classes, network 0 "):
        _train(tmp_path, [_standalone(CELLS[0], 0), cifar_alone], seeds=(0, 1), layout="unrolled")
    with pytest.raises(ValueError, match=r"network 0 \(.*\): technique 'dropout' needs dropout layers"):
        training.train_population(networks, rj.data.digits("train"), tmp_path, RECIPE,
                                  training.techniques.create("dropout"), seeds=list(SEEDS))
    with pytest.raises(ValueError, match="3 networks but 2 seeds"):
        _train(tmp_path, networks, seeds=(0, 1))
    with pytest.raises(ValueError, match=r"network 2 \(.*\): seed must be an int"):
        _train(tmp_path, networks, seeds=(0, 1, -1))
    with pytest.raises(TypeError, match="NAS-Bench-201 cells; got the space 'bignas_resnet_basic_digits'"):
        trainable(rj.nas.space("bignas_resnet_basic_digits"), "smallest", key=jax.random.key(0))
    assert not (tmp_path / "checkpoints").exists()
