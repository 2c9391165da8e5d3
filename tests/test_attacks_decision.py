"""Decision-based attacks: convergence to the closed-form boundary distance of a linear
model, exact query counts, budgets, determinism, and parity with ART."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import robustjax as rj
from robustjax.attacks.boundary import Boundary
from robustjax.attacks.decision import PLACEHOLDER
from robustjax.attacks.hsja import HopSkipJump
from robustjax.attacks.rays import RayS
from robustjax.attacks.signopt import SignOPT
from tests.helpers import count_compiles, linear_apply

BATCH, SHAPE = 8, (8, 8, 1)
DIM = int(np.prod(SHAPE))

# Rows each example sent to the model, from a host callback in the classifier: the batch
# is (B * n) candidate images, example-major; PLACEHOLDER rows are not queries.
_ROWS = collections.Counter()


def _record(images):
    images = np.asarray(images)
    if len(images) < BATCH:  # the host-side probability probe of validate(), not a query
        return
    per_example = images.reshape(BATCH, -1, images[0].size)
    real = ~np.all(per_example == PLACEHOLDER, axis=-1)
    for i, count in enumerate(real.sum(axis=1)):
        _ROWS[i] += int(count)


def counting_apply(params, x):
    jax.debug.callback(_record, x)
    return linear_apply(params, x)


def counting_linear(w, b) -> rj.Classifier:
    return rj.Classifier(params={"w": jnp.asarray(w, jnp.float32), "b": jnp.asarray(b, jnp.float32)},
                         apply_fn=counting_apply, num_classes=2, input_shape=SHAPE, name="counting_linear")


def binary_problem(seed=0):
    """A binary linear model ``z1 - z0 = w.(x - 0.5)`` and images whose closest boundary
    points are well inside the box: ``x = 0.5 + u + s m sign(w)`` with linf margin ``m``."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=DIM)
    clf = counting_linear(np.stack([np.zeros(DIM), w], 1), [0.0, -0.5 * w.sum()])
    side = rng.choice([-1.0, 1.0], BATCH)
    m = rng.uniform(0.05, 0.15, BATCH)
    x = 0.5 + rng.uniform(-0.15, 0.15, (BATCH, DIM)) + (side * m)[:, None] * np.sign(w)
    gap = (x - 0.5) @ w
    y = (gap > 0).astype(np.int32)
    y[-1] = 1 - y[-1]  # the last example is misclassified from the start
    distances = {"l2": np.abs(gap) / np.linalg.norm(w), "linf": np.abs(gap) / np.abs(w).sum()}
    return clf, x.reshape((BATCH,) + SHAPE).astype(np.float32), y, distances


# (attack, norm, factor): at these budgets every correctly classified example ends within
# ``factor`` of the minimal distance (measured, key 0: HSJA-l2 1.040, HSJA-linf 1.078,
# Boundary 1.002, Sign-OPT 1.001, RayS 1.001 at worst; the factors leave room for other keys).
CASES = {
    "hsja_l2": (HopSkipJump(norm="l2", max_queries=3000), "l2", 1.1),
    "hsja_linf": (HopSkipJump(norm="linf", max_queries=3000), "linf", 1.15),
    "boundary": (Boundary(max_queries=5000), "l2", 1.05),
    "sign_opt": (SignOPT(max_queries=3000), "l2", 1.1),
    "rays": (RayS(max_queries=1500), "linf", 1.05),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_converges_to_the_linear_boundary_with_exact_query_counts(case):
    attack, norm, factor = CASES[case]
    clf, x, y, distances = binary_problem()
    _ROWS.clear()
    result = attack(clf, x, y, key=jax.random.key(0))
    queries = np.asarray(result.queries)
    np.testing.assert_array_equal(queries, [_ROWS[i] for i in range(BATCH)])
    assert queries.max() <= attack.max_queries
    # Already misclassified: reported as a success, not attacked (clean + final check).
    assert bool(result.success[-1]) and queries[-1] == 2
    np.testing.assert_array_equal(result.x_adv[-1], x[-1])
    attacked = slice(0, BATCH - 1)
    assert bool(result.success[attacked].all())
    reached = np.asarray(rj.attacks.threat.per_example_norm(result.x_adv - x, norm))[attacked]
    minimal = distances[norm][attacked]
    assert np.all(reached >= minimal * (1 - 1e-4)), "closer than the closed-form minimum"
    assert np.all(reached <= factor * minimal), reached / minimal

    # Same key, same result; a new key does not recompile.
    again = attack(clf, x, y, key=jax.random.key(0))
    np.testing.assert_array_equal(again.x_adv, result.x_adv)
    with count_compiles() as compiles:
        attack(clf, x, y, key=jax.random.key(1))
    assert compiles[0] == 0


@pytest.mark.parametrize("case", ["hsja_l2", "boundary"])
def test_no_adversarial_point_found_returns_the_clean_image(case):
    attack = CASES[case][0]
    clf = counting_linear(np.zeros((DIM, 2)), [2.0, 0.0])  # predicts class 0 everywhere
    x = np.full((BATCH,) + SHAPE, 0.5, np.float32)
    result = attack(clf, x, np.zeros(BATCH, np.int32), key=jax.random.key(0))
    assert not bool(result.success.any())
    np.testing.assert_array_equal(result.x_adv, x)
    # clean check, init_size noise draws, final check
    np.testing.assert_array_equal(result.queries, 1 + attack.init_size + 1)


def test_bad_hyperparameters_and_probabilities():
    with pytest.raises(ValueError, match="max_queries must be an integer >= 1"):
        HopSkipJump(max_queries=0)
    with pytest.raises(ValueError, match="max_queries must be >= 3"):
        Boundary(max_queries=2)
    with pytest.raises(ValueError, match="norm must be one of"):
        HopSkipJump(norm="l1")
    with pytest.raises(ValueError, match="init_eval"):
        HopSkipJump(init_eval=200, max_eval=100)
    with pytest.raises(ValueError, match="step_adapt"):
        Boundary(step_adapt=1.5)
    with pytest.raises(ValueError, match="no targeted mode"):
        clf, x, y, _ = binary_problem()
        RayS()(clf, x, y, key=jax.random.key(0), target=1 - y)
    softmax = rj.Classifier(params={"w": jnp.zeros((DIM, 2)), "b": jnp.zeros(2)},
                            apply_fn=lambda p, x: jax.nn.softmax(linear_apply(p, x)), num_classes=2,
                            input_shape=SHAPE, name="softmax")
    with pytest.warns(UserWarning, match="probabilities"):
        RayS(max_queries=3)(softmax, np.full((2,) + SHAPE, 0.5, np.float32), np.zeros(2, np.int32),
                            key=jax.random.key(0))


# ---------------------------------------------------------------------------------------
# Against ART on the digits CNN (its torch twin), at the same per-example budget.

torch = pytest.importorskip("torch")
art = pytest.importorskip("art")


def _art_run(make_attack, model, x, y):
    """ART's adversarial examples and the queries it spent on each example (rows sent to
    the model while that example was attacked, its clean prediction included)."""
    from art.estimators.classification import PyTorchClassifier

    from benchmarks.torch_models import to_nchw, to_nhwc

    rows = []

    def count_and_cast(_, args):  # ART's HopSkipJump interpolates in float64
        rows.append(len(args[0]))
        return (args[0].float(),)

    hook = model.register_forward_pre_hook(count_and_cast)
    classifier = PyTorchClassifier(model, loss=torch.nn.CrossEntropyLoss(), input_shape=(1,) + SHAPE[:2],
                                   nb_classes=10, clip_values=(0.0, 1.0))
    adversarial, spent = [], []
    for i in range(len(x)):
        rows.clear()
        adversarial.append(make_attack(classifier).generate(to_nchw(x[i:i + 1]).numpy(), y=y[i:i + 1]))
        spent.append(sum(rows))
    hook.remove()
    return to_nhwc(torch.from_numpy(np.concatenate(adversarial))), np.array(spent)


@pytest.mark.parametrize("name", ["hop_skip_jump", "boundary"])
def test_no_worse_than_art_at_the_same_budget(name, digits_clf):
    from art.attacks.evasion import BoundaryAttack
    from art.attacks.evasion import HopSkipJump as ArtHopSkipJump

    from benchmarks.torch_models import digits_cnn_to_torch, to_nchw

    x, y = rj.data.digits("test").arrays(limit=16)
    correct = np.asarray(jnp.argmax(digits_clf(x), -1)) == y
    x, y = x[correct][:8], y[correct][:8]
    model = digits_cnn_to_torch(digits_clf)
    np.random.seed(0)
    if name == "hop_skip_jump":
        make = lambda c: ArtHopSkipJump(c, max_iter=5, max_eval=1000, init_eval=100, verbose=False)
    else:
        make = lambda c: BoundaryAttack(c, targeted=False, max_iter=60, verbose=False)
    theirs, spent = _art_run(make, model, x, y)
    # Our budget: the fewest queries ART spent on any example (plus our final check).
    budget = int(spent.min()) + 1
    attack = rj.attacks.create(name, max_queries=budget)
    # Three keys (one compile): at this budget the starting noise moves an example's
    # distance by up to ~40%, so a single run of 8 examples is a noisy median.
    runs = [attack(digits_clf, x, y, key=jax.random.key(seed)) for seed in range(3)]
    assert max(int(run.queries.max()) for run in runs) <= budget
    with torch.no_grad():
        theirs_success = model(to_nchw(theirs)).argmax(1).numpy() != y

    def l2(adv):
        return np.linalg.norm((np.asarray(adv) - x).reshape(len(x), -1), axis=1)

    ours_success = np.mean([np.asarray(run.success) for run in runs], axis=0)
    ours_l2 = np.median([np.where(run.success, l2(run.x_adv), np.inf) for run in runs], axis=0)
    # Success rate no lower; median l2 of the successful examples no more than 10% larger.
    assert ours_success.mean() >= theirs_success.mean()
    ours_median, theirs_median = np.median(ours_l2), np.median(l2(theirs)[theirs_success])
    assert ours_median <= 1.1 * theirs_median, (ours_median, theirs_median, budget)
