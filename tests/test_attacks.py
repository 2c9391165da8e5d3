import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import robustjax as rj
from robustjax.attacks import threat
from tests.helpers import count_compiles, linear_classifier, random_linear_classifier

# One quick configuration per registered attack, on images in [0, 1]. Attacks without
# an eps are minimal-norm attacks: unbounded, they only promise the [0, 1] box.
CONFIGS = {
    "fgsm": dict(eps=0.1),
    "pgd": dict(eps=0.1, steps=5),
    "mifgsm": dict(eps=0.1, steps=5),
    "cw_l2": dict(initial_const=1.0, binary_search_steps=2, steps=10, learning_rate=0.1),
    "deepfool": dict(steps=10),
    "apgd": dict(eps=0.1, steps=5),
    "fab": dict(eps=0.1, steps=5, num_target_classes=2),
    "square": dict(eps=0.1, max_queries=20),
    "spsa": dict(eps=0.1, samples=2, learning_rate=0.1, max_queries=60),
    "nes": dict(eps=0.1, samples=2, max_queries=60),
    "simba": dict(max_queries=20),
    "hop_skip_jump": dict(max_queries=200, max_iter=2, init_eval=20, max_eval=40),
    "boundary": dict(max_queries=200, sample_size=5),
    "sign_opt": dict(max_queries=200, k=10),
    "rays": dict(max_queries=100),
    "autoattack": dict(eps=0.1, steps=3, target_classes=2, square_queries=20),
}
NORM_OF = {"fgsm": "linf"}


def test_every_registered_attack_has_a_contract_config():
    assert set(rj.attacks.names()) == set(CONFIGS)


def _attack_variants():
    for name in rj.attacks.names():  # every registered attack runs through the contract
        config = CONFIGS.get(name, {})
        yield name, config
        if name in ("square", "nes"):
            yield name, {**config, "norm": "l2", "eps": 0.5}
        if name in ("pgd", "mifgsm", "apgd", "fab"):
            yield name, {**config, "norm": "l2", "eps": 0.5}
            yield name, {**config, "norm": "l1", "eps": 2.0}


@pytest.mark.parametrize("name, config", list(_attack_variants()))
def test_attack_contract(name, config, digits_clf, digits_batch, key):
    x, y = digits_batch
    attack = rj.attacks.create(name, **config)
    assert isinstance(attack, rj.attacks.get(name)) and attack.name == name
    result = attack(digits_clf, x, y, key=key)
    assert result.x_adv.shape == x.shape and result.x_adv.dtype == x.dtype
    assert result.success.shape == result.queries.shape == result.margin.shape == y.shape
    assert bool(jnp.all(jnp.isfinite(result.x_adv)))
    assert float(result.x_adv.min()) >= 0.0 and float(result.x_adv.max()) <= 1.0
    if "eps" in config:
        norm = config.get("norm", NORM_OF.get(name, "linf"))
        assert float(threat.per_example_norm(result.x_adv - x, norm).max()) <= config["eps"] * (1 + 1e-5)
    # Success is what the classifier says about the returned images.
    predicted = np.argmax(digits_clf(result.x_adv), -1)
    np.testing.assert_array_equal(result.success, predicted != y)
    np.testing.assert_array_equal(result.success, result.margin < 0)
    assert int(result.queries.min()) >= 2
    again = attack(digits_clf, x, y, key=key)
    np.testing.assert_array_equal(again.x_adv, result.x_adv)
    with count_compiles() as compiles:
        attack(digits_clf, x, y, key=jax.random.key(7))
    assert compiles[0] == 0, "a second call with a new key must not recompile"


@pytest.mark.parametrize("name", sorted(n for n in CONFIGS if rj.attacks.get(n).supports_targeted))
def test_targeted_attacks_reach_the_target(name, key):
    clf = random_linear_classifier(seed=1, num_classes=3)
    x = jax.random.uniform(jax.random.key(2), (16, 4, 4, 1), minval=0.3, maxval=0.7)
    y = jnp.argmax(clf(x), -1)
    target = (y + 1) % 3
    config = {**CONFIGS[name], "eps": 0.3} if "eps" in CONFIGS[name] else CONFIGS[name]
    attack = rj.attacks.create(name, **config)
    result = attack(clf, x, y, key=key, target=target)
    predicted = np.argmax(clf(result.x_adv), -1)
    np.testing.assert_array_equal(result.success, predicted == target)
    assert float(result.success.mean()) >= 0.9


def test_fgsm_equals_eps_times_sign_of_the_analytic_gradient():
    """For logits z = Wx + b, d CE / dx = W (softmax(z) - onehot(y))."""
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(16, 4)), rng.normal(size=4)
    clf = linear_classifier(w, b)
    x = rng.uniform(0.2, 0.8, (8, 4, 4, 1)).astype(np.float32)
    y = rng.integers(0, 4, 8).astype(np.int32)
    logits = x.reshape(8, -1) @ w + b
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    grad = (probs - np.eye(4)[y]) @ w.T
    eps = 0.05
    expected = np.clip(x + eps * np.sign(grad).reshape(x.shape), 0, 1)
    result = rj.attacks.FGSM(eps=eps)(clf, x, y, key=jax.random.key(0))
    np.testing.assert_allclose(result.x_adv, expected, atol=1e-7)


def test_pgd_l2_succeeds_exactly_below_the_linear_margin():
    """Binary linear model: the minimal L2 perturbation is |w.x + b| / ||w||."""
    rng = np.random.default_rng(1)
    direction = rng.normal(size=16)
    w = np.stack([np.zeros(16), direction], axis=1)  # logit gap z1 - z0 = direction . x
    clf = linear_classifier(w, np.zeros(2))
    eps = 0.2
    distances = np.array([0.5, 0.8, 0.95, 1.05, 1.3, 2.0]) * eps
    unit = direction / np.linalg.norm(direction)
    x = 0.5 + np.outer(distances, unit)  # the boundary passes through 0.5 * ones shifted
    x -= np.outer((0.5 * np.ones(16)) @ unit, unit)  # remove the component of the 0.5 offset
    x = x.reshape(-1, 4, 4, 1).astype(np.float32)
    assert 0 < x.min() and x.max() < 1
    margin = x.reshape(len(x), -1) @ direction / np.linalg.norm(direction)
    np.testing.assert_allclose(margin, distances, rtol=1e-5)
    y = np.ones(len(x), np.int32)
    result = rj.attacks.PGD(eps=eps, norm="l2", steps=20, random_start=False)(clf, x, y, key=jax.random.key(0))
    np.testing.assert_array_equal(result.success, distances < eps)


def _minimal_l1_distance(x_flat, direction, margin_value):
    """Smallest l1 perturbation that moves ``direction . x`` down by ``margin_value`` inside
    [0, 1]: spend on the coordinates with the largest |direction| first (greedy is exact)."""
    order = np.argsort(-np.abs(direction))
    room = np.where(direction > 0, x_flat, 1 - x_flat)[order]  # how far each coordinate can go down
    gain = np.abs(direction)[order]
    total, needed = 0.0, margin_value
    for r, g in zip(room, gain):
        if g * r >= needed:
            return total + needed / g
        total, needed = total + r, needed - g * r
    return np.inf


def test_pgd_l1_succeeds_exactly_below_the_box_aware_l1_distance():
    rng = np.random.default_rng(4)
    direction = rng.normal(size=16)
    clf = linear_classifier(np.stack([np.zeros(16), direction], axis=1), np.zeros(2))
    x = rng.uniform(0.05, 0.95, (40, 16))
    margin_values = x @ direction
    x, margin_values = x[margin_values > 0], margin_values[margin_values > 0]  # predicted class 1
    distances = np.array([_minimal_l1_distance(row, direction, m) for row, m in zip(x, margin_values)])
    eps = float(np.median(distances))
    clear = np.abs(distances - eps) > 0.1 * eps  # leave out borderline cases
    images = x.reshape(-1, 4, 4, 1).astype(np.float32)
    labels = np.ones(len(x), np.int32)
    # One coordinate per step (k = 1 of 16) is the exact l1 steepest-ascent direction.
    attack = rj.attacks.PGD(eps=eps, norm="l1", steps=100, l1_sparsity=1 / 16, random_start=False)
    result = attack(clf, images, labels, key=jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(result.success)[clear], (distances < eps)[clear])
    assert clear.sum() >= 10


def test_early_stop_keeps_the_first_successful_iterate(digits_clf, digits_batch, key):
    x, y = digits_batch
    stopped = rj.attacks.PGD(eps=0.2, steps=10)(digits_clf, x, y, key=key)
    assert bool(stopped.success.any())
    assert int(stopped.queries[stopped.success].min()) < 11  # stopped before the last step
    assert int(stopped.queries.max()) <= 11
    full = rj.attacks.PGD(eps=0.2, steps=10, early_stop=False)(digits_clf, x, y, key=key)
    assert bool(jnp.all(full.queries == 11))
    assert float(stopped.success.mean()) >= float(full.success.mean())


def test_rolled_and_unrolled_loops_agree(digits_clf, digits_batch, key):
    x, y = digits_batch
    rolled = rj.attacks.PGD(eps=0.1, steps=4, unroll=False)(digits_clf, x, y, key=key)
    unrolled = rj.attacks.PGD(eps=0.1, steps=4, unroll=True)(digits_clf, x, y, key=key)
    np.testing.assert_allclose(rolled.x_adv, unrolled.x_adv, atol=1e-6)


def test_sharded_batch_gives_the_same_result(digits_clf, digits_batch, key):
    assert jax.device_count() == 8
    x, y = digits_batch
    attack = rj.attacks.PGD(eps=0.1, steps=3)
    local = attack(digits_clf, x, y, key=key)
    sharded = attack(digits_clf, *_sharded(x, y), key=key)
    np.testing.assert_allclose(sharded.x_adv, local.x_adv, atol=1e-6)
    np.testing.assert_array_equal(sharded.success, local.success)


def test_l2_random_start_is_inside_the_ball_and_not_crowded_at_the_centre():
    x = jnp.full((4000, 4, 4, 1), 0.5)
    start = threat.random_start(jax.random.key(0), x, 0.3, "l2")
    radius = np.asarray(threat.per_example_norm(start - x, "l2"))
    assert radius.max() <= 0.3 + 1e-6
    # Uniform in a 16-dimensional ball: P(r < eps/2) = 2^-16.
    assert (radius < 0.15).mean() < 0.01


@pytest.mark.parametrize(
    "make_attack, message",
    [
        (lambda: rj.attacks.PGD(norm="l3"), "norm must be one of"),
        (lambda: rj.attacks.PGD(eps=-0.1), "eps must be finite and >= 0"),
        (lambda: rj.attacks.PGD(eps=float("nan")), "eps must be finite"),
        (lambda: rj.attacks.FGSM(eps=float("inf")), "eps must be finite"),
        (lambda: rj.attacks.PGD(steps=0), "steps must be an integer >= 1"),
        (lambda: rj.attacks.PGD(unroll=0), "unroll"),
        (lambda: rj.attacks.PGD(norm="l1", l1_sparsity=1.5), r"l1_sparsity must be in \(0, 1\]"),
        (lambda: rj.attacks.MIFGSM(decay=-1.0), "decay must be finite and >= 0"),
        (lambda: rj.attacks.create("pgdd"), "did you mean 'pgd'"),
        (lambda: rj.attacks.create("pgd", epsilon=0.1), r"no parameter\(s\) \['epsilon'\]"),
    ],
)
def test_bad_hyperparameters_are_refused(make_attack, message):
    with pytest.raises(ValueError, match=message):
        make_attack()


@pytest.mark.parametrize(
    "change, error, message",
    [
        (dict(x=lambda x: x.at[0, 0, 0, 0].set(np.nan)), ValueError, "NaN"),
        (dict(x=lambda x: x * 2), ValueError, r"\[0, 1\]"),
        (dict(x=lambda x: np.asarray(x * 255, np.uint8)), TypeError, "divide uint8 images by 255"),
        (dict(x=lambda x: x[:, :4]), ValueError, "classifier expects"),
        (dict(y=lambda y: y.at[0].set(10)), ValueError, r"\[0, 10\)"),
        (dict(y=lambda y: y[:3]), ValueError, "must have shape"),
        (dict(target=lambda y: y), ValueError, "target equals the true label"),
        (dict(target=lambda y: (y + 1) % 10 + 10), ValueError, r"target must be class indices"),
        (dict(key=lambda k: 0), TypeError, "PRNG key"),
    ],
)
def test_bad_inputs_fail_before_tracing(change, error, message, digits_clf, digits_batch):
    x, y = (jnp.asarray(a) for a in digits_batch)
    args = dict(x=x, y=y, key=jax.random.key(0), target=None)
    for name, modify in change.items():
        args[name] = modify(y if name == "target" else args[name])
    with pytest.raises(error, match=message):
        rj.attacks.PGD(eps=0.1, steps=2)(digits_clf, args["x"], args["y"], key=args["key"], target=args["target"])


def test_attacks_are_hashable_frozen_configs():
    a, b = rj.attacks.PGD(eps=0.1), rj.attacks.PGD(eps=0.1)
    assert a == b and hash(a) == hash(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.eps = 0.2
    assert a.params()["eps"] == 0.1


def _sharded(*arrays):
    mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Auto,))
    return tuple(jax.device_put(a, NamedSharding(mesh, PartitionSpec("batch"))) for a in arrays)


def test_one_program_sweep_equals_separate_runs_and_keeps_the_worst_restart(digits_clf, digits_batch, key):
    x, y = _sharded(*digits_batch)  # a batch over several devices runs the sweep as one program
    attack = rj.attacks.PGD(eps=0.1, steps=5, random_start=False)
    grid = [0.05, 0.1, 0.2]
    swept = attack.sweep(digits_clf, x, y, key=key, eps=grid)
    assert swept.x_adv.shape == (3, *x.shape) and swept.success.shape == (3, len(y))
    for i, eps in enumerate(grid):
        single = rj.attacks.PGD(eps=eps, steps=5, random_start=False)(digits_clf, x, y, key=key)
        np.testing.assert_allclose(swept.x_adv[i], single.x_adv, atol=1e-6)
        np.testing.assert_array_equal(swept.success[i], single.success)
    restarted = rj.attacks.PGD(eps=0.1, steps=5).sweep(digits_clf, x, y, key=key, restarts=4)
    keys = jax.random.split(key, 4)
    margins = np.stack([rj.attacks.PGD(eps=0.1, steps=5).run(digits_clf, x, y, k, None).margin for k in keys])
    np.testing.assert_allclose(restarted.margin[0], margins.min(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(restarted.success[0], (margins < 0).any(axis=0))
    assert float(threat.per_example_norm(restarted.x_adv[0] - x, "linf").max()) <= 0.1 + 1e-6


def test_sweep_on_one_device_nests_the_epsilons(digits_clf, digits_batch, key):
    x, y = digits_batch
    grid = [0.1, 0.02, 0.05]  # run in increasing order whatever the order given
    swept = rj.attacks.PGD(eps=0.1, steps=5, random_start=False).sweep(digits_clf, x, y, key=key, eps=grid)
    fooled_before = np.zeros(len(y), bool)
    previous = None
    for i in np.argsort(grid):
        single = rj.attacks.PGD(eps=grid[i], steps=5, random_start=False)(digits_clf, x, y, key=key)
        # An example fooled at a smaller epsilon keeps that point, at no further query.
        np.testing.assert_array_equal(swept.success[i], fooled_before | np.asarray(single.success))
        np.testing.assert_array_equal(swept.queries[i], np.where(fooled_before, 0, single.queries))
        carried = swept.x_adv[previous][fooled_before] if previous is not None else x[:0]
        np.testing.assert_array_equal(swept.x_adv[i][fooled_before], carried)
        np.testing.assert_allclose(swept.x_adv[i][~fooled_before], np.asarray(single.x_adv)[~fooled_before], atol=1e-6)
        assert float(threat.per_example_norm(swept.x_adv[i] - x, "linf").max()) <= grid[i] + 1e-6
        fooled_before, previous = np.asarray(swept.success[i]), i
    assert 0 < fooled_before.sum() < len(y), "the grid should fool some examples, not all"


def test_sweep_on_one_device_keeps_the_first_successful_restart(digits_clf, digits_batch, key):
    x, y = digits_batch
    attack = rj.attacks.PGD(eps=0.1, steps=5)
    restarted = attack.sweep(digits_clf, x, y, key=key, restarts=3)
    first = attack(digits_clf, x, y, key=jax.random.split(key, 3)[0])  # the first restart runs on the whole batch
    success = np.asarray(restarted.success[0])
    assert success[np.asarray(first.success)].all()
    np.testing.assert_array_equal(restarted.x_adv[0][np.asarray(first.success)], np.asarray(first.x_adv)[np.asarray(first.success)])
    np.testing.assert_array_equal(restarted.queries[0][np.asarray(first.success)], np.asarray(first.queries)[np.asarray(first.success)])
    robust = ~np.asarray(first.success)
    assert (restarted.queries[0][robust] > np.asarray(first.queries)[robust]).all(), "later restarts ran on the rest"
    assert (restarted.margin[0][robust] <= np.asarray(first.margin)[robust]).all()
    assert float(threat.per_example_norm(restarted.x_adv[0] - x, "linf").max()) <= 0.1 + 1e-6


def test_compacted_attacks_equal_the_one_program_run(digits_clf, key):
    x, y = rj.data.digits("test").arrays(limit=64)
    for attack in (rj.attacks.PGD(eps=0.1, steps=6), rj.attacks.PGD(eps=1.0, norm="l2", steps=6),
                   rj.attacks.MIFGSM(eps=0.1, steps=4, random_start=True)):
        compacted = attack(digits_clf, x, y, key=key)
        whole = jax.jit(attack.run, static_argnums=())(digits_clf, jnp.asarray(x), jnp.asarray(y), key, None)
        assert 0 < np.mean(whole.success) < 1 and np.ptp(np.asarray(whole.queries)) > 0, "some finish early"
        np.testing.assert_allclose(compacted.x_adv, whole.x_adv, atol=1e-6)  # batch size may reassociate sums
        np.testing.assert_array_equal(compacted.success, whole.success)
        np.testing.assert_array_equal(compacted.queries, whole.queries)


def test_sweep_compiles_once_and_refuses_bad_grids(digits_clf, digits_batch, key):
    x, y = digits_batch
    attack = rj.attacks.FGSM()
    attack.sweep(digits_clf, x, y, key=key, eps=[0.1, 0.2])
    with count_compiles() as compiles:
        attack.sweep(digits_clf, x, y, key=jax.random.key(3), eps=[0.3, 0.01])
    assert compiles[0] == 0, "new epsilons of the same grid size must not recompile"
    with pytest.raises(ValueError, match="every eps must be finite and >= 0"):
        attack.sweep(digits_clf, x, y, key=key, eps=[0.1, -1.0])
    with pytest.raises(ValueError, match="at least one epsilon"):
        attack.sweep(digits_clf, x, y, key=key, eps=[])
    with pytest.raises(ValueError, match="restarts must be an integer >= 1"):
        attack.sweep(digits_clf, x, y, key=key, restarts=0)
