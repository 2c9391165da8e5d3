"""Neuron coverage (DeepGauge): hand-computed values, streaming, merge, monotonicity, errors."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from robustjax.metrics import coverage as cov

# Tiny hand-made activations. Layer "a": 2 neurons, training range [0, 1] and [0, 2];
# layer "b": 1 neuron whose training range is the single point 5 (low = high).
TRAIN = {"a": jnp.array([[0.0, 0.0], [1.0, 2.0]]), "b": jnp.array([[5.0], [5.0]])}
TEST = {"a": jnp.array([[0.2, 2.5], [1.0, -1.0]]), "b": jnp.array([[5.0], [6.0]])}


def bounds_of(values):
    return cov.NeuronBounds.empty(cov._widths(values)).update(values)


def test_hand_computed_values():
    bounds = bounds_of(TRAIN)
    # KMNC, k=2: a0 sections [0, .5], [.5, 1] both hit (0.2 and 1.0 = high goes to the last);
    # a1 hits none (2.5 and -1 are outside [0, 2]); b's k coinciding sections are all hit
    # by 5: 4 of 6 sections.
    assert float(cov.kmnc(TEST, bounds, k=2)) == pytest.approx(4 / 6)
    # Upper = {a1 (2.5 > 2), b (6 > 5)}, Lower = {a1 (-1 < 0)}: NBC = 3 / 6, SNAC = 2 / 3.
    assert float(cov.nbc(TEST, bounds)) == pytest.approx(3 / 6)
    assert float(cov.snac(TEST, bounds)) == pytest.approx(2 / 3)
    # Top-1 per layer: row 0 -> a1, b0; row 1 -> a0, b0.
    assert float(cov.tknc(TEST, k=1)) == pytest.approx(1.0)
    assert float(cov.tknc({n: v[:1] for n, v in TEST.items()}, k=1)) == pytest.approx(2 / 3)
    # Patterns (a's top-1, b's top-1): (1, 0) and (0, 0); a repeated row adds nothing.
    assert int(cov.tknp(TEST, k=1)) == 2
    doubled = {n: jnp.concatenate([v, v]) for n, v in TEST.items()}
    assert int(cov.tknp(doubled, k=1)) == 2
    # k above a layer's width is capped: top-2 of "a" is the set {0, 1} for every row.
    assert int(cov.tknp(TEST, k=2)) == 1


def test_bounds_use_every_batch_not_only_the_first():
    rng = np.random.default_rng(0)
    values = {"a": jnp.asarray(rng.normal(size=(10, 3)), jnp.float32)}
    bounds = cov.NeuronBounds.empty({"a": 3})
    for start in range(0, 10, 4):
        bounds = bounds.update({"a": values["a"][start:start + 4]})
    np.testing.assert_array_equal(bounds.low["a"], values["a"].min(0))
    np.testing.assert_array_equal(bounds.high["a"], values["a"].max(0))
    assert int(bounds.count) == 10


@pytest.fixture(scope="module")
def digits_neurons(digits_clf, digits_batch):
    x = jnp.asarray(digits_batch[0])
    layers = ("block1", "block3", "fc1")
    return cov.classifier_neurons(digits_clf, x, layers)


def accumulators(train, widths):
    bounds = bounds_of(train)
    return {
        "kmnc": cov.KMultisectionCoverage.empty(bounds, 10),
        "boundary": cov.BoundaryCoverage.empty(bounds),
        "tknc": cov.TopKCoverage.empty(widths, 3),
        "tknp": cov.TopKPatterns.empty(widths, 2, capacity=64),
    }


def results(acc):
    return jax.tree.map(np.asarray, acc.compute())


# Jitted verbs (one compile per shape) keep the test fast; test_jit_equals_eager covers eager.
update = jax.jit(lambda acc, values: acc.update(values))
merge = jax.jit(lambda acc, other: acc.merge(other))


def test_streaming_equals_one_shot_and_merge_in_any_order(digits_neurons):
    train = {n: v[:16] for n, v in digits_neurons.items()}
    test = {n: v[16:] for n, v in digits_neurons.items()}
    chunks = [{n: v[i:i + 6] for n, v in test.items()} for i in range(0, 16, 6)]
    for name, empty in accumulators(train, cov._widths(test)).items():
        whole = results(update(empty, test))
        parts = [update(empty, chunk) for chunk in chunks]
        streamed = empty
        for chunk in chunks:
            streamed = update(streamed, chunk)
        jax.tree.map(np.testing.assert_array_equal, results(streamed), whole)
        for order in itertools.permutations(parts):
            merged = order[0]
            for part in order[1:]:
                merged = merge(merged, part)
            jax.tree.map(np.testing.assert_array_equal, results(merged), whole)
        assert int(streamed.count) == 16, name
    bounds = bounds_of(train)
    assert float(cov.kmnc(test, bounds, 10)) == pytest.approx(float(accumulators(train, cov._widths(test))["kmnc"].update(test).compute()["kmnc"]))


def test_coverage_is_monotone_in_the_test_set(digits_neurons):
    train = {n: v[:8] for n, v in digits_neurons.items()}
    test = {n: v[8:] for n, v in digits_neurons.items()}
    accs = accumulators(train, cov._widths(test))
    previous = None
    for end in range(3, 25, 3):  # T_1 within T_2 within ...: stream 3 more examples each time
        chunk = {n: v[end - 3:end] for n, v in test.items()}
        accs = {name: update(acc, chunk) for name, acc in accs.items()}
        now = {name: acc.compute() for name, acc in accs.items()}
        flat = np.array([float(now["kmnc"]["kmnc"]), float(now["boundary"]["nbc"]), float(now["boundary"]["snac"]),
                         float(now["tknc"]["tknc"]), float(now["tknp"]["tknp"])])
        assert np.all((flat[:4] >= 0) & (flat[:4] <= 1))
        assert flat[2] <= 2 * flat[1] + 1e-7  # SNAC <= 2 NBC (canonical)
        assert flat[4] <= end  # TKNP <= N
        if previous is not None:
            assert np.all(flat >= previous)
        previous = flat
    assert previous[0] > 0  # the check is not vacuous


def test_jit_equals_eager(digits_neurons):
    train = {n: v[:16] for n, v in digits_neurons.items()}
    test = {n: v[16:] for n, v in digits_neurons.items()}
    for acc in accumulators(train, cov._widths(test)).values():
        eager = results(acc.update(test))
        jitted = jax.jit(lambda a, v: a.update(v).compute())(acc, test)
        # Counts are integers and identical; the final division may differ by one float32
        # ulp because XLA rewrites division by a constant inside jit.
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-7), jax.tree.map(np.asarray, jitted), eager)


def test_conv_neuron_option(digits_clf, digits_batch):
    x = jnp.asarray(digits_batch[0][:4])
    features = digits_clf.features(x)
    channel = cov.neuron_values(features, ["block1", "fc1"])
    unit = cov.neuron_values(features, ["block1", "fc1"], conv_neuron="unit")
    h, w, c = features["block1"].shape[1:]
    assert channel["block1"].shape == (4, c) and unit["block1"].shape == (4, h * w * c)
    np.testing.assert_allclose(channel["block1"], features["block1"].mean(axis=(1, 2)), rtol=1e-6)
    np.testing.assert_array_equal(channel["fc1"], unit["fc1"])
    default = cov.neuron_values(features)
    assert "logits" not in default and "block1.conv" in default


def test_bad_input():
    with pytest.raises(ValueError, match="not profiled"):
        cov.KMultisectionCoverage.empty(cov.NeuronBounds.empty({"a": 2}))
    with pytest.raises(ValueError, match="not profiled"):
        cov.BoundaryCoverage.empty(cov.NeuronBounds.empty({"a": 2}))
    bounds = bounds_of(TRAIN)
    with pytest.raises(ValueError, match="k must be"):
        cov.kmnc(TEST, bounds, k=0)
    with pytest.raises(ValueError, match="k must be"):
        cov.tknc(TEST, k=0)
    with pytest.raises(ValueError, match="NaN"):
        cov.nbc({"a": jnp.array([[jnp.nan, 0.0]]), "b": jnp.array([[5.0]])}, bounds)
    with pytest.raises(ValueError, match="empty batch"):
        cov.nbc({"a": jnp.zeros((0, 2)), "b": jnp.zeros((0, 1))}, bounds)
    with pytest.raises(ValueError, match="layers"):
        cov.nbc({"a": TEST["a"]}, bounds)
    with pytest.raises(ValueError, match="neurons"):
        cov.nbc({"a": TEST["a"][:, :1], "b": TEST["b"]}, bounds)
    with pytest.raises(ValueError, match="no examples"):
        cov.TopKCoverage.empty({"a": 2}).compute()
    with pytest.raises(ValueError, match="unknown layers"):
        cov.neuron_values({"a": jnp.zeros((1, 2))}, ["z"])
    with pytest.raises(ValueError, match="conv_neuron"):
        cov.neuron_values({"a": jnp.zeros((1, 2))}, conv_neuron="pixel")
    many = {"a": jnp.asarray(np.random.default_rng(0).normal(size=(30, 6)), jnp.float32)}
    with pytest.raises(ValueError, match="capacity"):
        cov.TopKPatterns.empty({"a": 6}, k=1, capacity=2).update(many).compute()
