"""Carlini-Wagner L2 and DeepFool: closed forms on linear models, contracts, torchattacks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import robustjax as rj
from robustjax.attacks.cw import CWL2
from robustjax.attacks.deepfool import DeepFool
from tests.helpers import count_compiles, linear_classifier, random_linear_classifier


@pytest.fixture(scope="module")
def binary_problem():
    """Logit gap ``z1 - z0 = v.x + b`` with the boundary through 0.5 * ones; examples on
    both sides at known distances, well inside the box, and their labels."""
    rng = np.random.default_rng(0)
    v = rng.normal(size=16)
    unit = v / np.linalg.norm(v)
    signed = np.array([0.3, -0.25, 0.2, -0.15, 0.1, -0.08, 0.05, -0.3])
    jitter = rng.normal(scale=0.05, size=(len(signed), 16))
    jitter -= np.outer(jitter @ unit, unit)
    x = (0.5 + np.outer(signed, unit) + jitter).reshape(-1, 4, 4, 1).astype(np.float32)
    assert 0.25 < x.min() and x.max() < 0.75
    b = -0.5 * v.sum()
    clf = linear_classifier(np.stack([np.zeros(16), v], axis=1), np.array([0.0, b]))
    y = (signed > 0).astype(np.int32)
    gap = x.reshape(len(x), -1).astype(np.float64) @ v + b
    return clf, x, y, v, b, np.abs(gap)


def _perturbation(x_adv, x):
    return (np.asarray(x_adv, np.float64) - np.asarray(x, np.float64)).reshape(len(x), -1)


def _gap(x_adv, v, b):
    return np.asarray(x_adv, np.float64).reshape(len(x_adv), -1) @ v + b


# Closed forms on the binary linear model.


def test_deepfool_l2_lands_on_the_closest_boundary_point(binary_problem):
    """Minimal L2 perturbation: |v.x + b| / ||v||_2, reached on the boundary."""
    clf, x, y, v, b, gap = binary_problem
    result = DeepFool(norm="l2", overshoot=0.0)(clf, x, y, key=jax.random.key(0))
    distance = np.linalg.norm(_perturbation(result.x_adv, x), axis=1)
    np.testing.assert_allclose(distance, gap / np.linalg.norm(v), rtol=1e-4)
    # On the boundary (to float32 rounding of the logits) with the minimal norm: the
    # Euclidean projection onto the hyperplane, the unique closest point.
    np.testing.assert_allclose(_gap(result.x_adv, v, b), 0.0, atol=1e-5)


def test_deepfool_linf_lands_on_the_closest_boundary_point(binary_problem):
    """Minimal Linf perturbation: |v.x + b| / ||v||_1, along sign(v)."""
    clf, x, y, v, b, gap = binary_problem
    result = DeepFool(norm="linf", overshoot=0.0)(clf, x, y, key=jax.random.key(0))
    delta = _perturbation(result.x_adv, x)
    np.testing.assert_allclose(np.abs(delta).max(axis=1), gap / np.abs(v).sum(), rtol=1e-4)
    np.testing.assert_allclose(_gap(result.x_adv, v, b), 0.0, atol=1e-5)


def test_deepfool_overshoot_scales_the_total_perturbation(binary_problem):
    clf, x, y, v, b, gap = binary_problem
    result = DeepFool(norm="l2", overshoot=0.02)(clf, x, y, key=jax.random.key(0))
    assert bool(result.success.all())
    distance = np.linalg.norm(_perturbation(result.x_adv, x), axis=1)
    np.testing.assert_allclose(distance, 1.02 * gap / np.linalg.norm(v), rtol=1e-4)
    # One query at x, one at the (successful) first step, one final check.
    np.testing.assert_array_equal(result.queries, 3)


def test_cw_l2_is_within_a_few_percent_of_the_minimal_perturbation(binary_problem):
    clf, x, y, v, b, gap = binary_problem
    result = CWL2()(clf, x, y, key=jax.random.key(0))
    assert bool(result.success.all())
    ratio = np.linalg.norm(_perturbation(result.x_adv, x), axis=1) / (gap / np.linalg.norm(v))
    assert ratio.min() >= 1 - 1e-4, "a successful perturbation cannot beat the minimum"
    assert ratio.max() <= 1.02, ratio


def test_cw_confidence_buys_a_margin_at_its_minimal_price(binary_problem):
    """With confidence kappa the minimum is (|v.x + b| + kappa) / ||v||_2."""
    clf, x, y, v, b, gap = binary_problem
    kappa = 2.0
    result = CWL2(confidence=kappa)(clf, x, y, key=jax.random.key(0))
    assert float(result.margin.max()) <= -kappa
    minimum = (gap + kappa) / np.linalg.norm(v)
    ratio = np.linalg.norm(_perturbation(result.x_adv, x), axis=1) / minimum
    assert ratio.min() >= 1 - 1e-4 and ratio.max() <= 1.03, ratio


def test_cw_binary_search_raises_c_until_it_succeeds_and_never_returns_failures(binary_problem):
    clf, x, y, v, b, gap = binary_problem
    far = gap / np.linalg.norm(v) >= 0.1
    x, y = x[far], y[far]
    # c = 1e-4 with no search cannot pay for moving 0.1 or more: every example fails and
    # the original image comes back.
    config = dict(initial_const=1e-4, steps=50)
    stuck = CWL2(binary_search_steps=1, **config)(clf, x, y, key=jax.random.key(0))
    assert not bool(stuck.success.any())
    np.testing.assert_array_equal(stuck.x_adv, x)
    # Five more search steps reach c = 10 (x10 each time while there is no upper bound).
    searched = CWL2(binary_search_steps=6, **config)(clf, x, y, key=jax.random.key(0))
    assert bool(searched.success.all())
    assert int(searched.queries.max()) <= 6 * 50 + 1


def test_targeted_cw_reaches_the_target():
    clf = random_linear_classifier(seed=1, num_classes=3)
    x = jax.random.uniform(jax.random.key(2), (16, 4, 4, 1), minval=0.3, maxval=0.7)
    y = jnp.argmax(clf(x), -1)
    target = (y + 1) % 3
    result = CWL2(binary_search_steps=5, steps=50)(clf, x, y, key=jax.random.key(0), target=target)
    predicted = np.argmax(clf(result.x_adv), -1)
    np.testing.assert_array_equal(result.success, predicted == target)
    assert bool(result.success.all())


def test_deepfool_candidates_restrict_the_classes():
    clf = random_linear_classifier(seed=3, num_classes=5)
    x = jax.random.uniform(jax.random.key(4), (16, 4, 4, 1), minval=0.3, maxval=0.7)
    y = jnp.argmax(clf(x), -1)
    every = DeepFool()(clf, x, y, key=jax.random.key(0))
    top_all = DeepFool(num_candidates=5)(clf, x, y, key=jax.random.key(0))
    np.testing.assert_allclose(top_all.x_adv, every.x_adv, atol=1e-6)
    np.testing.assert_array_equal(top_all.queries, every.queries + 1)  # the ranking pass
    # With two candidates only the runner-up class is attacked, and it is what succeeds.
    runner_up = np.argsort(np.asarray(clf(x)), -1)[:, -2]
    pair = DeepFool(num_candidates=2)(clf, x, y, key=jax.random.key(0))
    assert bool(pair.success.all())
    np.testing.assert_array_equal(np.argmax(clf(pair.x_adv), -1), runner_up)


# Contracts on the digits CNN.

CONTRACT_ATTACKS = [
    CWL2(initial_const=1.0, binary_search_steps=2, steps=10, learning_rate=0.1),
    DeepFool(norm="l2", steps=10),
    DeepFool(norm="linf", steps=10, num_candidates=4),
]


@pytest.fixture(scope="module")
def small_batch(digits_batch):
    x, y = digits_batch
    return x[:8], y[:8]


@pytest.mark.parametrize("attack", CONTRACT_ATTACKS, ids=repr)
def test_attack_contract(attack, digits_clf, small_batch, key):
    x, y = small_batch
    result = attack(digits_clf, x, y, key=key)
    assert result.x_adv.shape == x.shape and result.x_adv.dtype == x.dtype
    assert result.success.shape == result.queries.shape == result.margin.shape == y.shape
    assert bool(jnp.all(jnp.isfinite(result.x_adv)))
    assert float(result.x_adv.min()) >= 0.0 and float(result.x_adv.max()) <= 1.0
    np.testing.assert_array_equal(result.success, np.argmax(digits_clf(result.x_adv), -1) != y)
    np.testing.assert_array_equal(result.success, result.margin < 0)
    assert bool(result.success.any())
    budget = attack.binary_search_steps * attack.steps if isinstance(attack, CWL2) else attack.steps
    budget += getattr(attack, "num_candidates", None) is not None
    assert 2 <= int(result.queries.min()) and int(result.queries.max()) <= budget + 1
    again = attack(digits_clf, x, y, key=key)
    np.testing.assert_array_equal(again.x_adv, result.x_adv)
    with count_compiles() as compiles:
        attack(digits_clf, x, y, key=jax.random.key(7))
    assert compiles[0] == 0, "a second call with a new key must not recompile"


@pytest.mark.parametrize("attack", [CWL2(binary_search_steps=2, steps=5), DeepFool(steps=5)],
                         ids=repr)
def test_sharded_batch_gives_the_same_result(attack, binary_problem, key):
    """The loops skip a step when the whole batch is done: a decision across devices."""
    clf, x, y, *_ = binary_problem
    mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Auto,))
    shard = NamedSharding(mesh, PartitionSpec("batch"))
    local = attack(clf, x, y, key=key)
    sharded = attack(clf, jax.device_put(x, shard), jax.device_put(y, shard), key=key)
    np.testing.assert_allclose(sharded.x_adv, local.x_adv, atol=1e-5)
    np.testing.assert_array_equal(sharded.queries, local.queries)


@pytest.mark.parametrize("make", [lambda u: CWL2(binary_search_steps=2, steps=3, unroll=u),
                                  lambda u: DeepFool(steps=3, unroll=u)])
def test_rolled_and_unrolled_loops_agree(make, binary_problem, key):
    clf, x, y, *_ = binary_problem
    rolled, unrolled = make(False)(clf, x, y, key=key), make(True)(clf, x, y, key=key)
    np.testing.assert_allclose(rolled.x_adv, unrolled.x_adv, atol=1e-6)
    np.testing.assert_array_equal(rolled.queries, unrolled.queries)


def test_deepfool_refuses_a_target(digits_clf, small_batch, key):
    x, y = small_batch
    with pytest.raises(ValueError, match="no targeted mode"):
        DeepFool()(digits_clf, x, y, key=key, target=(y + 1) % 10)


def test_registered_names():
    assert rj.attacks.get("cw_l2") is CWL2 and rj.attacks.get("deepfool") is DeepFool
    assert rj.attacks.create("deepfool", norm="linf") == DeepFool(norm="linf")


@pytest.mark.parametrize(
    "make_attack, message",
    [
        (lambda: CWL2(confidence=-1.0), "confidence must be finite and >= 0"),
        (lambda: CWL2(steps=0), "steps must be an integer >= 1"),
        (lambda: CWL2(binary_search_steps=0), "binary_search_steps must be an integer >= 1"),
        (lambda: CWL2(learning_rate=0.0), "learning_rate must be > 0"),
        (lambda: CWL2(learning_rate=-0.01), "learning_rate must be finite and >= 0"),
        (lambda: CWL2(initial_const=0.0), "initial_const must be > 0"),
        (lambda: CWL2(unroll=0), "unroll"),
        (lambda: DeepFool(norm="l1"), "norm must be one of"),
        (lambda: DeepFool(steps=0), "steps must be an integer >= 1"),
        (lambda: DeepFool(overshoot=-0.1), "overshoot must be finite and >= 0"),
        (lambda: DeepFool(num_candidates=1), "num_candidates must be None or an integer >= 2"),
    ],
)
def test_bad_hyperparameters_are_refused(make_attack, message):
    with pytest.raises(ValueError, match=message):
        make_attack()


# Against torchattacks, same weights, same 64 test digits.


@pytest.fixture(scope="module")
def torch_setup(digits_clf):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchattacks")
    from benchmarks.torch_models import digits_cnn_to_torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the per-example loops of torchattacks run faster unthreaded
    yield digits_cnn_to_torch(digits_clf)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def batch64():
    return rj.data.digits("test").arrays(limit=64)


def _success_and_l2(clf, x, y, x_adv):
    """Both libraries' outputs judged by the same (JAX) classifier."""
    success = np.argmax(np.asarray(clf(x_adv)), -1) != y
    distance = np.linalg.norm(_perturbation(x_adv, x), axis=1)
    return success, distance


def _theirs(attack, x, y):
    import torch

    from benchmarks.torch_models import to_nchw, to_nhwc

    return to_nhwc(attack(to_nchw(x), torch.from_numpy(y).long()))


@pytest.mark.torch
def test_cw_l2_beats_torchattacks_cw(digits_clf, torch_setup, batch64):
    import torchattacks

    x, y = batch64
    theirs = _theirs(torchattacks.CW(torch_setup, c=1, kappa=0, steps=100, lr=0.01), x, y)
    # Three search steps (the default is nine), the first with their c, to keep this fast.
    ours = CWL2(initial_const=1.0, binary_search_steps=3, steps=100, learning_rate=0.01)(
        digits_clf, x, y, key=jax.random.key(0))
    ours_success, ours_l2 = _success_and_l2(digits_clf, x, y, ours.x_adv)
    theirs_success, theirs_l2 = _success_and_l2(digits_clf, x, y, theirs)
    np.testing.assert_array_equal(ours_success, ours.success)
    assert ours_success.mean() >= theirs_success.mean()
    assert np.median(ours_l2[ours_success]) <= np.median(theirs_l2[theirs_success])
    both = ours_success & theirs_success
    assert np.median(ours_l2[both]) <= np.median(theirs_l2[both])


@pytest.mark.torch
def test_deepfool_matches_torchattacks_deepfool(digits_clf, torch_setup, batch64):
    import torchattacks

    x, y = batch64
    theirs = _theirs(torchattacks.DeepFool(torch_setup, steps=50, overshoot=0.02), x, y)
    ours = DeepFool(norm="l2", steps=50, overshoot=0.02)(digits_clf, x, y, key=jax.random.key(0))
    ours_success, ours_l2 = _success_and_l2(digits_clf, x, y, ours.x_adv)
    theirs_success, theirs_l2 = _success_and_l2(digits_clf, x, y, theirs)
    assert ours_success.mean() >= theirs_success.mean()
    assert np.median(ours_l2[ours_success]) <= 1.1 * np.median(theirs_l2[theirs_success])
    # Where both succeed, ours is at most the 2% overshoot (and rounding) longer.
    both = ours_success & theirs_success & (theirs_l2 > 0)
    assert np.all(ours_l2[both] <= 1.05 * theirs_l2[both])
