"""Training-free robustness proxies: input-Jacobian norm, input-Hessian eigenvalue, CLEVER
and the NTK condition number, each against a direct computation on a tiny model, and over
populations of networks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx
from jax.flatten_util import ravel_pytree

import robustjax as rj
from robustjax.losses import cross_entropy
from robustjax.metrics import proxies as px
from tests.helpers import count_compiles, linear_classifier, unchecked_annotations

SHAPE = (4, 4, 1)
DIM = 16
MEAN, STD = (0.4,), (0.5,)  # every proxy differentiates through the normalisation


def mlp_apply(params, x):
    hidden = jnp.tanh(x.reshape(x.shape[0], -1) @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def mlp(seed: int = 0, hidden: int = 8, classes: int = 3) -> rj.Classifier:
    """A one-hidden-layer tanh network of 4x4 grey images, normalised: the smallest model
    with curvature."""
    rng = np.random.default_rng(seed)
    params = {"w1": rng.normal(size=(DIM, hidden)) * 1.5, "b1": rng.normal(size=hidden) * 0.5,
              "w2": rng.normal(size=(hidden, classes)) * 1.5, "b2": rng.normal(size=classes)}
    return rj.Classifier(params=jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params), apply_fn=mlp_apply,
                         num_classes=classes, input_shape=SHAPE, mean=MEAN, std=STD, name="mlp")


@pytest.fixture(scope="module")
def net():
    return mlp(0)


@pytest.fixture(scope="module")
def images():
    x = np.random.default_rng(1).uniform(0, 1, (5, *SHAPE)).astype(np.float32)
    return x, np.array([0, 1, 2, 0, 1], np.int32)


def one_example(clf, z):
    return clf(z[None])[0]


# ----------------------------------------------------------------------------- Jacobian


def test_jacobian_norm_equals_dense_jacobian(net, images):
    x, _ = images
    dense = np.asarray(jax.jit(jax.vmap(jax.jacrev(lambda z: one_example(net, z))))(x), np.float64)  # (B, K, ...)
    expected = np.linalg.norm(dense.reshape(len(x), -1), axis=1)
    np.testing.assert_allclose(px.jacobian_norm(net, x), expected, rtol=1e-5)
    np.testing.assert_allclose(px.jacobian_norm(net, x, class_batch=2), expected, rtol=1e-5)


# ----------------------------------------------------------------------------- Hessian


def dominant_eigenvalues(clf, x, y):
    """The signed eigenvalue of largest magnitude of each example's dense input Hessian (float64 eigh)."""
    loss = lambda z, label: cross_entropy(clf(z[None]), label[None])[0]
    hessians = np.asarray(jax.jit(jax.vmap(jax.hessian(loss)))(x, y), np.float64).reshape(len(x), DIM, DIM)
    eigenvalues = np.linalg.eigh(hessians)[0]
    return eigenvalues[np.arange(len(x)), np.argmax(np.abs(eigenvalues), axis=1)]


def test_hessian_eigenvalue_equals_dense_eigendecomposition(net, images, key):
    x, y = images
    expected = dominant_eigenvalues(net, x, y)
    assert (expected < 0).any() and (expected > 0).any()  # the sign is part of the answer
    found = px.hessian_eigenvalue(net, x, y, key=key, iterations=60, unroll=False)
    np.testing.assert_allclose(found, expected, rtol=1e-4)
    # the default 20 iterations (unrolled on the CPU) is already close on this model
    np.testing.assert_allclose(px.hessian_eigenvalue(net, x, y, key=key), expected, rtol=1e-2)


# ----------------------------------------------------------------------------- NTK


def explicit_ntk(clf, x):
    """J J^T with J the (B, P) Jacobian of the summed logits over the flattened parameters, float64."""
    flat, unravel = ravel_pytree(clf.params)
    jacobian = jax.jit(jax.jacrev(lambda p: jnp.sum(clf.replace(params=unravel(p))(jnp.asarray(x)), axis=-1)))(flat)
    jacobian = np.asarray(jacobian, np.float64)
    return jacobian @ jacobian.T


def test_ntk_equals_explicit_parameter_jacobian(net, images):
    x, _ = images
    kernel = explicit_ntk(net, x)
    np.testing.assert_allclose(px.empirical_ntk(net, x), kernel, rtol=1e-5, atol=1e-5 * np.abs(kernel).max())
    eigenvalues = np.linalg.eigvalsh(kernel)
    assert 2 < eigenvalues[-1] / eigenvalues[0] < 1e4  # a well-posed case for float32
    np.testing.assert_allclose(px.ntk_condition_number(net, x), eigenvalues[-1] / eigenvalues[0], rtol=1e-3)


class NormedNet(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(DIM, 3, rngs=rngs)
        self.norm = nnx.BatchNorm(3, rngs=rngs)

    def __call__(self, x):
        return self.norm(self.linear(x.reshape(x.shape[0], -1)))


def test_ntk_differentiates_parameters_not_batch_statistics(images):
    module = NormedNet(nnx.Rngs(0))
    module.norm.mean[...] = jnp.array([0.1, -0.2, 0.3])
    module.norm.var[...] = jnp.array([0.5, 2.0, 1.5])
    clf = rj.Classifier.from_nnx(module, num_classes=3, input_shape=SHAPE)
    x, _ = images
    trainable, rest = nnx.split_state(clf.params, nnx.Param, ...)
    flat, unravel = ravel_pytree(trainable)
    logits = lambda p: jnp.sum(clf.replace(params=nnx.merge_state(unravel(p), rest))(jnp.asarray(x)), axis=-1)
    jacobian = np.asarray(jax.jit(jax.jacrev(logits))(flat), np.float64)
    np.testing.assert_allclose(px.empirical_ntk(clf, x), jacobian @ jacobian.T, rtol=1e-5, atol=1e-6)
    # a Linen-style variables dict: its batch_stats collection is not differentiated either
    linen_like = rj.Classifier(
        params={"params": {"w": jnp.ones((DIM, 3))}, "batch_stats": {"shift": jnp.ones(3)}},
        apply_fn=lambda v, z: z.reshape(z.shape[0], -1) @ v["params"]["w"] + v["batch_stats"]["shift"] ** 2,
        num_classes=3, input_shape=SHAPE)
    flat_x = x.reshape(len(x), -1).astype(np.float64)
    np.testing.assert_allclose(px.empirical_ntk(linen_like, x), 3 * flat_x @ flat_x.T, rtol=1e-5)


def test_ntk_of_a_repeated_image_is_singular(net, images):
    x, _ = images
    assert px.ntk_condition_number(net, np.concatenate([x[:2], x[:1]])) == np.inf


# ----------------------------------------------------------------------------- CLEVER


def test_uniform_ball_fills_the_ball_uniformly(key):
    count, radius = 4000, 0.3
    sample = jax.jit(px.uniform_ball, static_argnums=(1, 3))
    l2 = np.asarray(sample(key, (count, *SHAPE), radius, "l2"), np.float64).reshape(count, -1)
    lengths = np.linalg.norm(l2, axis=1) / radius
    assert lengths.max() <= 1 + 1e-6
    # uniform in the ball: (|delta| / r)^d is uniform on [0, 1]
    assert scipy.stats.kstest(lengths ** DIM, "uniform").pvalue > 1e-3
    linf = np.asarray(sample(key, (count, *SHAPE), radius, "linf")).ravel()
    assert np.abs(linf).max() <= radius
    assert scipy.stats.kstest(linf, "uniform", args=(-radius, 2 * radius)).pvalue > 1e-3


def normalised_linear(seed=5):
    rng = np.random.default_rng(seed)
    return linear_classifier(rng.normal(size=(DIM, 4)), rng.normal(size=4), SHAPE).replace(mean=MEAN, std=STD)


def linear_clever(clf, x, norm, radius):
    """The exact CLEVER of a linear model: its margin gradients are constant, L_j =
    ||w_c - w_j||_dual / std, and g_j(x0) / L_j is the distance to the boundary with class j."""
    w = np.asarray(clf.params["w"], np.float64) / STD[0]
    logits = np.asarray(clf(jnp.asarray(x)), np.float64)
    c = logits.argmax(1)
    others = np.arange(w.shape[1]) != c[:, None]
    lipschitz = np.linalg.norm(w[:, c].T[:, :, None] - w[None], ord={"l2": 2, "linf": 1}[norm], axis=1)
    margins = logits[np.arange(len(c)), c][:, None] - logits
    distance = np.where(others, margins / np.where(others, lipschitz, 1.0), np.inf).min(1)
    return np.minimum(distance, radius), np.where(others, lipschitz, np.nan), distance


@pytest.mark.parametrize(("norm", "clip"), [("l2", True), ("linf", True), ("l2", False)])
def test_clever_of_a_linear_model_is_the_distance_to_the_boundary(norm, clip, key):
    clf = normalised_linear()
    x = np.random.default_rng(2).uniform(0.2, 0.8, (6, *SHAPE)).astype(np.float32)
    _, lipschitz, distance = linear_clever(clf, x, norm, np.inf)
    radius = float(np.median(distance))  # some examples capped at the radius, some not
    expected, _, _ = linear_clever(clf, x, norm, radius)
    assert (expected == radius).any() and (expected < radius).any()
    result = px.clever(clf, x, key=key, radius=radius, norm=norm, batches=8, samples=16, clip=clip)
    np.testing.assert_allclose(result.lipschitz, lipschitz, rtol=1e-5)
    np.testing.assert_allclose(result.max_gradient_norm, lipschitz, rtol=1e-5)
    np.testing.assert_allclose(result.score, expected, rtol=1e-5)
    np.testing.assert_allclose(result.cheap_score, expected, rtol=1e-5)


def test_reverse_weibull_location_recovers_the_end_point():
    for seed in range(4):
        maxima = scipy.stats.weibull_max.rvs(3.0, loc=2.0, scale=0.5, size=100, random_state=seed)
        estimate = px.reverse_weibull_location(maxima)
        assert estimate >= maxima.max()
        # closer to the true end point than the largest sample is
        assert abs(estimate - 2.0) < 0.75 * (2.0 - maxima.max())
    assert px.reverse_weibull_location(np.full(10, 3.5)) == 3.5


def test_clever_score_is_assembled_from_its_parts(net, images, key):
    x, _ = images
    radius = 0.5
    drawn = px.clever_samples(net, x, key=key, radius=radius, batches=12, samples=16)
    result = px.fit_clever(drawn, radius=radius)
    logits = np.asarray(net(jnp.asarray(x)), np.float64)
    c = logits.argmax(1)
    np.testing.assert_array_equal(result.predicted, c)
    others = np.arange(3) != c[:, None]
    margins = logits[np.arange(len(c)), c][:, None] - logits
    maxima = np.asarray(drawn.maxima)
    np.testing.assert_array_equal(np.moveaxis(maxima, 1, -1)[~others], 0.0)  # g_c = 0
    np.testing.assert_allclose(result.max_gradient_norm[others], maxima.max(1)[others], rtol=1e-6)
    assert np.isnan(result.lipschitz[~others]).all() and np.isnan(result.max_gradient_norm[~others]).all()
    assert (result.lipschitz[others] >= result.max_gradient_norm[others] * (1 - 1e-6)).all()
    for field, constants in (("score", result.lipschitz), ("cheap_score", result.max_gradient_norm)):
        expected = np.where(others, margins / np.where(others, constants, 1.0), np.inf).min(1)
        np.testing.assert_allclose(getattr(result, field), np.minimum(expected, radius), rtol=1e-5)
    assert (result.score <= result.cheap_score + 1e-7).all()


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:Precision loss occurred in moment calculation")  # ART's fit of equal maxima
def test_clever_agrees_with_art_clever_u_on_a_linear_model(key):
    """ART's ``clever_u`` on a torch twin of a linear model (exact for both, whatever their
    samples) gives the same scores."""
    torch = pytest.importorskip("torch")
    from art.estimators.classification import PyTorchClassifier
    from art.metrics import clever_u

    clf = linear_classifier(np.random.default_rng(5).normal(size=(DIM, 3)), np.zeros(3), SHAPE)
    twin = torch.nn.Linear(DIM, 3)
    with torch.no_grad():
        twin.weight.copy_(torch.tensor(np.asarray(clf.params["w"]).T))
        twin.bias.zero_()
    model = torch.nn.Sequential(torch.nn.Flatten(), twin)
    art = PyTorchClassifier(model, loss=torch.nn.CrossEntropyLoss(), input_shape=SHAPE, nb_classes=3,
                            clip_values=(0.0, 1.0))
    x = np.random.default_rng(2).uniform(0.2, 0.8, (3, *SHAPE)).astype(np.float32)
    for norm, art_norm in (("l2", 2), ("linf", np.inf)):
        ours = px.clever(clf, x, key=key, radius=5.0, norm=norm, batches=4, samples=8).score
        theirs = [clever_u(art, image, nb_batches=4, batch_size=8, radius=5.0, norm=art_norm, verbose=False)
                  for image in x]
        np.testing.assert_allclose(ours, theirs, rtol=1e-4)


# ----------------------------------------------------------------------------- populations


def test_population_equals_each_network(images, key):
    x, y = images[0][:2], images[1][:2]
    members = [mlp(seed) for seed in (0, 1, 2)]
    stack = rj.Classifier.stack(members)
    options = dict(key=key, radius=0.5, batches=6, samples=8)
    for proxy, args, kwargs, rtol in ((px.jacobian_norm, (x,), {}, 1e-5),
                                      (px.hessian_eigenvalue, (x, y), dict(key=key, iterations=5, unroll=False), 1e-4),
                                      (px.empirical_ntk, (x,), {}, 1e-4),
                                      (px.ntk_condition_number, (x,), {}, 1e-3),
                                      (px.clever_samples, (x,), options, 1e-5)):
        together = px.population(proxy, stack, *args, **kwargs)
        for i, member in enumerate(members):
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a[i], b, rtol=rtol, err_msg=proxy.__name__),
                         together, proxy(member, *args, **kwargs))
    fitted = px.population(px.clever, stack, x, **options)  # samples in JAX as above, fits on the host
    assert fitted.score.shape == (3, 2) and fitted.lipschitz.shape == (3, 2, 3)
    for i, member in enumerate(members):
        alone = px.clever(member, x, **options)
        for field in ("score", "cheap_score", "max_gradient_norm"):
            np.testing.assert_allclose(getattr(fitted, field)[i], getattr(alone, field), rtol=1e-4)


def test_second_call_does_not_compile(net, images):
    x, y = images
    calls = (lambda x, key: px.jacobian_norm(net, x),
             lambda x, key: px.hessian_eigenvalue(net, x, y, key=key, iterations=3),
             lambda x, key: px.ntk_condition_number(net, x),
             lambda x, key: px.clever_samples(net, x, key=key, radius=float(jax.random.uniform(key)) + 0.1,
                                              batches=2, samples=4))
    for call in calls:
        jax.block_until_ready(call(x, jax.random.key(0)))
        with count_compiles() as compiles:
            jax.block_until_ready(call(1 - x, jax.random.key(1)))  # new images, key and radius
        assert compiles[0] == 0


# ----------------------------------------------------------------------------- bad input


def bad_calls(net, x, y, key):
    clever = lambda **changes: px.clever_samples(net, x, **{**dict(key=key, radius=0.1, batches=2, samples=2),
                                                            **changes})
    return {
        "x must be a batch of images": lambda: px.jacobian_norm(net, x[0]),
        "image shape": lambda: px.ntk_condition_number(net, np.zeros((2, 5, 5, 1), np.float32)),
        r"x must have values in \[0, 1\]": lambda: px.jacobian_norm(net, x + 1),
        r"y must be class indices in \[0, 3\)": lambda: px.hessian_eigenvalue(net, x, y + 1, key=key),
        r"y must have shape \(5,\)": lambda: px.hessian_eigenvalue(net, x, y[:3], key=key),
        "iterations must be an integer >= 1": lambda: px.hessian_eigenvalue(net, x, y, key=key, iterations=0),
        "radius must be > 0": lambda: clever(radius=0.0),
        "radius must be finite and >= 0": lambda: clever(radius=-1.0),
        "norm must be one of": lambda: clever(norm="l1"),
        "batches must be an integer >= 1": lambda: clever(batches=0),
        "samples must be an integer >= 1": lambda: clever(samples=0),
        "class_batch must be an integer >= 1": lambda: px.jacobian_norm(net, x, class_batch=0),
        "leading network axis": lambda: px.population(px.jacobian_norm, net, x),
        "no trainable": lambda: px.empirical_ntk(net.replace(params={}), x),
    }


def test_bad_input_raises_value_errors_naming_the_argument(net, images, key):
    x, y = images
    with unchecked_annotations():
        for message, call in bad_calls(net, x, y, key).items():
            with pytest.raises(ValueError, match=message):
                call()
        with pytest.raises(TypeError, match="clf must be a robustjax.Classifier"):
            px.jacobian_norm(net.apply_fn, x)
        with pytest.raises(TypeError, match="key"):
            px.hessian_eigenvalue(net, x, y, key=0)
