"""Properties of the attacks that the contract tests leave open: early stop returns exactly
the first successful iterate, random starts have the distributions they promise, attacks
run inside a user's jitted training step and under ``vmap`` over classifiers, and the zoo's
PyTorch conversion reproduces the torch model's logits."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from scipy import stats

import robustjax as rj
from robustjax.attacks import threat
from robustjax.losses import attack_cross_entropy, attack_margin
from tests.helpers import random_linear_classifier

# --- early stop -------------------------------------------------------------------------

EARLY_EPS, EARLY_STEP_SIZE, EARLY_STEPS = 0.1, 0.02, 8


def pgd_iterates_and_margins(classifier, x, y, start, steps):
    """Every iterate of plain linf PGD (no early stop) from ``start``, (steps + 1, b, ...),
    and the margin of each."""

    def step(x_adv, _):
        grad = jax.grad(lambda z: attack_cross_entropy(classifier(z), y, None).sum())(x_adv)
        return threat.ascent_step(x, x_adv, grad, EARLY_STEP_SIZE, EARLY_EPS, "linf", 1), x_adv

    @jax.jit
    def run(start):
        last, earlier = jax.lax.scan(step, start, length=steps)
        iterates = jnp.concatenate([earlier, last[None]])
        return iterates, jax.vmap(lambda z: attack_margin(classifier(z), y, None))(iterates)

    return jax.tree.map(np.asarray, run(start))


@pytest.fixture(scope="module")
def early_stop_case():
    """A linear model, 16 images it classifies correctly, and what early-stopped PGD must
    return for each: the first iterate (among those the loop evaluates, 0 .. steps - 1)
    that is adversarial, or the last iterate; queries are the gradient evaluations up to
    that iterate plus the final check. PGD draws its start with ``threat.random_start``
    from the call's key, so some examples are fooled by the start itself (iterate 0)."""
    clf = random_linear_classifier(seed=3, num_classes=3)
    x = jax.random.uniform(jax.random.key(1), (16, 4, 4, 1), minval=0.2, maxval=0.8)
    y = jnp.argmax(clf(x), -1)
    key = jax.random.key(5)
    start = threat.random_start(key, x, EARLY_EPS, "linf")
    iterates, margins = pgd_iterates_and_margins(clf, x, y, start, EARLY_STEPS)
    margins = margins[:-1]  # the loop checks iterates 0 .. steps - 1; the last one only finalize does
    assert np.abs(margins).min() > 1e-3, "no iterate may sit on the boundary (rounding would decide)"
    fooled = margins < 0
    first = np.where(fooled.any(0), fooled.argmax(0), EARLY_STEPS)  # EARLY_STEPS: never within the loop
    expected_x = iterates[first, np.arange(len(first))]
    expected_queries = np.minimum(first + 1, EARLY_STEPS) + 1
    assert len(np.unique(first)) >= 4 and (first == 0).any() and (first == EARLY_STEPS).any(), "a spread"
    return clf, x, y, key, expected_x, expected_queries


@pytest.mark.parametrize("path", ["compacted", "inside_jit"])
def test_early_stop_returns_the_first_successful_iterate_and_its_query_count(early_stop_case, path):
    """Each example keeps the iterate at which it first became adversarial, not a later one,
    and is charged one gradient evaluation per iterate up to it (plus the final check):
    on concrete arrays (compacted run) and on tracers (the masked one-program loop)."""
    clf, x, y, key, expected_x, expected_queries = early_stop_case
    attack = rj.attacks.PGD(eps=EARLY_EPS, steps=EARLY_STEPS, step_size=EARLY_STEP_SIZE, early_stop=True)
    if path == "compacted":
        result = attack(clf, x, y, key=key)
    else:
        result = jax.jit(lambda c, images, labels, k: attack(c, images, labels, key=k))(clf, x, y, key)
    np.testing.assert_allclose(result.x_adv, expected_x, atol=1e-6)
    np.testing.assert_array_equal(result.queries, expected_queries)


# --- random starts ----------------------------------------------------------------------

random_start = jax.jit(threat.random_start, static_argnums=(2, 3))


def test_linf_random_start_is_uniform_over_the_whole_ball():
    """With x = 0.5 (no clipping at eps = 0.3), the linf start's coordinates are uniform on
    [-eps, eps]: they reach both faces of the ball, average to zero, and pass a KS test."""
    eps = 0.3
    x = jnp.full((64, 16, 16, 1), 0.5)
    delta = np.asarray(random_start(jax.random.key(0), x, eps, "linf") - x).ravel()
    assert np.abs(delta).max() <= eps + 1e-6
    assert delta.min() < -0.999 * eps and delta.max() > 0.999 * eps
    assert abs(delta.mean()) < 4 * eps / np.sqrt(3 * delta.size)  # 4 standard errors
    assert stats.kstest(delta, stats.uniform(loc=-eps, scale=2 * eps).cdf).pvalue > 1e-3


@pytest.mark.parametrize("dim", [2, 3])
def test_l2_random_start_is_uniform_in_the_ball(dim):
    """In d dimensions a uniform point of the eps-ball has P(radius <= r eps) = r^d, so
    (radius / eps)^d is uniform on [0, 1]; its direction is uniform on the sphere (for
    d = 2: a uniform angle)."""
    eps = 0.3
    x = jnp.full((4000, 1, 1, dim), 0.5)
    delta = np.asarray(random_start(jax.random.key(1), x, eps, "l2") - x).reshape(len(x), dim)
    radius = np.linalg.norm(delta, axis=1)
    assert radius.max() <= eps * (1 + 1e-5)
    assert stats.kstest((radius / eps) ** dim, "uniform").pvalue > 1e-3
    if dim == 2:
        angle = np.arctan2(delta[:, 1], delta[:, 0])
        assert stats.kstest(angle, stats.uniform(loc=-np.pi, scale=2 * np.pi).cdf).pvalue > 1e-3


# --- an attack inside a user's jitted training step -------------------------------------


def mlp_apply(params, x):
    hidden = jax.nn.relu(x.reshape(x.shape[0], -1) @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def mlp_classifier(params) -> rj.Classifier:
    return rj.Classifier(params=params, apply_fn=mlp_apply, num_classes=3, input_shape=(4, 4, 1), name="mlp")


def init_mlp(seed: int, hidden: int = 8):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {"w1": jax.random.normal(k1, (16, hidden)) / 4, "b1": jnp.zeros(hidden),
            "w2": jax.random.normal(k2, (hidden, 3)) / 3, "b2": jnp.zeros(3)}


def adversarial_training_step(make_attack, optimizer, traces: list):
    """A user's jitted SGD step on the cross-entropy of ``make_attack(eps)``'s examples,
    crafted on tracers; it counts its traces in ``traces`` and returns the new state, the
    loss, the clean and robust accuracies and the largest linf perturbation."""

    @jax.jit
    def train_step(params, opt_state, x, y, key, eps):
        traces.append(None)
        classifier = mlp_classifier(jax.lax.stop_gradient(params))
        x_adv = make_attack(eps)(classifier, x, y, key=key).x_adv

        def loss_fn(p):
            return optax.softmax_cross_entropy_with_integer_labels(mlp_classifier(p)(x_adv), y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state)
        clean_accuracy = jnp.mean(jnp.argmax(classifier(x), -1) == y)
        robust_accuracy = jnp.mean(jnp.argmax(classifier(x_adv), -1) == y)
        size = jnp.abs(x_adv - x).max()
        return optax.apply_updates(params, updates), opt_state, loss, clean_accuracy, robust_accuracy, size

    return train_step


def train_three_steps(make_attack, eps_values):
    """Three steps of :func:`adversarial_training_step` with new keys, one eps each; returns
    the step function, its trace count and per step (loss, clean - robust accuracy, size)."""
    optimizer, traces = optax.sgd(0.5), []
    train_step = adversarial_training_step(make_attack, optimizer, traces)
    params = init_mlp(0)
    opt_state = optimizer.init(params)
    x = jax.random.uniform(jax.random.key(1), (16, 4, 4, 1))
    y = jnp.argmax(mlp_classifier(init_mlp(1))(x), -1)  # labels a different network gives
    records = []
    for step_key, eps in zip(jax.random.split(jax.random.key(2), 3), eps_values):
        params, opt_state, loss, clean, robust, size = train_step(params, opt_state, x, y, step_key, eps)
        records.append((float(loss), float(clean) - float(robust), float(size)))
    return train_step, len(traces), np.array(records)


def test_pgd_inside_a_jitted_adversarial_training_step_compiles_once():
    """PGD called on tracers inside a user's ``jax.jit`` training step (the attack must not
    try to compact them): three steps with new keys and new parameters trace and compile
    once, the loss moves, and PGD lowers the accuracy."""
    attack = rj.attacks.PGD(eps=0.3, steps=3)
    train_step, traces, records = train_three_steps(lambda _: attack, [0.3] * 3)
    losses, gaps, _ = records.T
    assert traces == 1 and train_step._cache_size() == 1
    assert len(set(losses)) == 3, f"the loss must change from step to step: {losses}"
    assert gaps.min() >= 0 and gaps.max() > 0, f"clean minus robust accuracy per step: {gaps}"


def test_traced_eps_is_an_argument_of_the_jitted_training_step():
    """``PGD(eps=<tracer>)``: three epsilons through one compiled training step, each
    bounding (and reached by) that step's perturbation."""
    eps_values = [0.1, 0.2, 0.3]
    train_step, traces, records = train_three_steps(lambda eps: rj.attacks.PGD(eps=eps, steps=3), eps_values)
    assert traces == 1 and train_step._cache_size() == 1
    np.testing.assert_allclose(records[:, 2], eps_values, rtol=1e-5)
    assert (records[:, 1] >= 0).all()


# --- an attack under vmap over classifiers ----------------------------------------------


def test_pgd_vmapped_over_a_stack_of_classifiers_equals_each_run_alone():
    """``vmap`` over three same-architecture classifiers (the params batched, the attack
    on tracers) gives, row by row, what the attack gives on each classifier alone: each
    row stops early on its own examples."""
    classifiers = [random_linear_classifier(seed=seed, num_classes=3) for seed in range(3)]
    stack = jax.tree.map(lambda *leaves: jnp.stack(leaves), *classifiers)
    x = jax.random.uniform(jax.random.key(1), (16, 4, 4, 1), minval=0.2, maxval=0.8)
    y = jnp.argmax(classifiers[0](x), -1)
    attack, key = rj.attacks.PGD(eps=0.1, steps=5), jax.random.key(3)
    stacked = jax.vmap(lambda c: attack(c, x, y, key=key))(stack)
    assert stacked.x_adv.shape == (3, *x.shape)
    attack_alone = jax.jit(lambda c: attack(c, x, y, key=key))  # one program for the three
    for row, clf in enumerate(classifiers):
        alone = attack_alone(clf)
        np.testing.assert_allclose(stacked.x_adv[row], alone.x_adv, atol=1e-6)
        np.testing.assert_array_equal(stacked.success[row], alone.success)
        np.testing.assert_array_equal(stacked.queries[row], alone.queries)
    success = np.asarray(stacked.success)
    assert 0 < success.mean() < 1 and len({tuple(r) for r in success}) == 3, "rows that differ"


# --- the zoo's PyTorch conversion, checked on values -------------------------------------

TINY_SHAPE = (6, 6, 3)
TINY_MEAN, TINY_STD = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)


class TinyFlaxNet(nnx.Module):
    """conv3x3(3 -> 4) - BN - ReLU - conv3x3(4 -> 4, no bias) - ReLU - mean - LayerNorm - fc."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(3, 4, (3, 3), padding="SAME", rngs=rngs)
        self.bn = nnx.BatchNorm(4, epsilon=1e-5, rngs=rngs)
        self.conv2 = nnx.Conv(4, 4, (3, 3), padding="SAME", use_bias=False, rngs=rngs)
        self.norm = nnx.LayerNorm(4, epsilon=1e-5, rngs=rngs)
        self.fc = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn(self.conv1(x)))
        x = nnx.relu(self.conv2(x)).mean(axis=(1, 2))
        return self.fc(self.norm(x))


def build_tiny(*, key, pretrained=False):
    return rj.Classifier.from_nnx(TinyFlaxNet(rngs=nnx.Rngs(params=key)), num_classes=3, input_shape=TINY_SHAPE,
                                  mean=TINY_MEAN, std=TINY_STD, name="tiny_torch_probe")


def convert_tiny(weights):
    return {"conv1": weights.conv("conv1"), "bn": weights.batch_norm("bn"), "conv2": weights.conv("conv2"),
            "norm": weights.layer_norm("norm"), "fc": weights.linear("fc")}


@pytest.mark.torch
def test_converted_torch_model_gives_torch_logits(monkeypatch, tmp_path):
    """A torch checkpoint (wrapped as training scripts save it) read by ``load_state_dict``
    and converted by ``from_torch`` with the shared layout helpers gives torch's logits on
    random images: kernels, channel order, BatchNorm statistics and LayerNorm are all in
    place (conv2 has as many input as output channels, so a swapped kernel still fits)."""
    torch = pytest.importorskip("torch")
    from robustjax.zoo import convert
    from robustjax.zoo.convert import from_torch, load_state_dict
    from robustjax.zoo.registry import ModelEntry
    from tests.zoo_parity import randomize, torch_input

    class TinyTorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(4)
            self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1, bias=False)
            self.norm = torch.nn.LayerNorm(4)
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            x = torch.relu(self.bn(self.conv1(x)))
            x = torch.relu(self.conv2(x)).mean(dim=(2, 3))
            return self.fc(self.norm(x))

    model = randomize(TinyTorchNet())
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.normal_(0.0, 0.3)
    name = "tiny_torch_probe"  # looked up by from_torch only, never added to the zoo's registry
    entry = ModelEntry(name=name, family="test", build=build_tiny, weights=None, description="a converter probe",
                       convert=convert_tiny, torch_source="TinyTorchNet")
    monkeypatch.setattr(convert, "get_model", {name: entry}.__getitem__)
    torch.save({"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, tmp_path / "tiny.pt")

    clf = from_torch(name, load_state_dict(tmp_path / "tiny.pt"))
    images = np.random.default_rng(0).uniform(size=(4, *TINY_SHAPE)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch_input(clf, images)).numpy()
    assert np.ptp(expected) > 0.5, "logits far enough apart for the comparison to mean something"
    np.testing.assert_allclose(jax.jit(lambda c, z: c(z))(clf, images), expected, atol=1e-5, rtol=0)
