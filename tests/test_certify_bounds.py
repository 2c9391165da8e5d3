"""IBP and CROWN bounds (robustjax.certify.bounds): sound on sampled points and vertices of the
eps-ball, CROWN no looser than IBP, equal to a dense-matrix CROWN written from the paper,
below every attack, and refusing what they cannot bound."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax import certify
from robustjax.zoo.layers import max_pool_2x2


class Tiny(nnx.Module):
    """Every layer kind the bounds know: conv, batch norm (eval), ReLU, a residual add,
    2x2 max pooling (reduce_max), overlapping max pooling (reduce_window_max), average
    pooling, dense."""

    def __init__(self, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 4, (3, 3), padding="SAME", rngs=rngs)
        self.norm = nnx.BatchNorm(4, rngs=rngs)
        self.conv2 = nnx.Conv(4, 4, (3, 3), padding="SAME", rngs=rngs)
        self.hidden = nnx.Linear(16, 8, rngs=rngs)
        self.head = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        h = nnx.relu(self.norm(self.conv1(x)))
        h = max_pool_2x2(h + nnx.relu(self.conv2(h)))
        h = nnx.max_pool(h, (2, 2), strides=(1, 1)) + nnx.avg_pool(h, (2, 2), strides=(1, 1))
        return self.head(nnx.relu(self.hidden(h.reshape(h.shape[0], -1))))


def tiny_classifier(seed: int = 0) -> rj.Classifier:
    module = Tiny(nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    module.norm.mean.value = jnp.asarray(rng.normal(0, 0.3, 4), jnp.float32)
    module.norm.var.value = jnp.asarray(rng.uniform(0.5, 2.0, 4), jnp.float32)
    module.norm.scale.value = jnp.asarray(rng.uniform(0.5, 1.5, 4), jnp.float32)
    return rj.Classifier.from_nnx(module, num_classes=3, input_shape=(6, 6, 1), mean=(0.4,), std=(0.3,),
                                  name="tiny")


def points_in_ball(x, eps, count, key, norm="linf"):
    """Uniform points of the eps-ball and points on its boundary (vertices for L-infinity,
    every pixel at +-eps; the sphere for L2), clipped to [0, 1] (a clipped point stays in
    the ball)."""
    uniform_key, boundary_key = jax.random.split(key)
    shape = (count // 2,) + x.shape
    if norm == "linf":
        inside = jax.random.uniform(uniform_key, shape, minval=-eps, maxval=eps)
        boundary = eps * jax.random.rademacher(boundary_key, shape, dtype=jnp.float32)
    else:
        directions = jax.random.normal(boundary_key, shape)
        axes = tuple(range(1, directions.ndim))
        boundary = eps * directions / jnp.sqrt(jnp.sum(directions**2, axis=axes, keepdims=True))
        inside = boundary * jax.random.uniform(uniform_key, (count // 2,) + (1,) * x.ndim) ** (1 / x[0].size)
    return jnp.clip(x[None] + jnp.concatenate([inside, boundary]), 0.0, 1.0)


@pytest.fixture(scope="module")
def tiny_case():
    clf = tiny_classifier()
    x = jnp.asarray(np.random.default_rng(1).uniform(0.1, 0.9, (3, 6, 6, 1)), jnp.float32)
    return clf, x


@pytest.mark.parametrize("eps", [0.02, 0.1])
def test_bounds_contain_every_sampled_logit_and_crown_is_no_looser_than_ibp(tiny_case, eps):
    clf, x = tiny_case
    ibp = certify.logit_bounds(clf, x, eps, method="ibp")
    crown = certify.logit_bounds(clf, x, eps, method="crown")
    crown_ibp = certify.logit_bounds(clf, x, eps, method="crown-ibp")
    logits = jax.vmap(clf)(points_in_ball(x, eps, 10_000, jax.random.key(2)))
    for bounds in (ibp, crown, crown_ibp):
        assert bool(jnp.all(logits >= bounds.lower - 1e-5)) and bool(jnp.all(logits <= bounds.upper + 1e-5))
    for tighter in (crown, crown_ibp):
        assert bool(jnp.all(tighter.lower >= ibp.lower - 1e-5)) and bool(jnp.all(tighter.upper <= ibp.upper + 1e-5))
    # not vacuous: CROWN is strictly tighter somewhere, and the bounds hug the sampled range
    assert float(jnp.sum(crown.upper - crown.lower)) < float(jnp.sum(ibp.upper - ibp.lower))
    zero = certify.logit_bounds(clf, x, 0.0, method="crown")
    np.testing.assert_allclose(zero.lower, clf(x), atol=1e-5)
    np.testing.assert_allclose(zero.upper, clf(x), atol=1e-5)


def test_l2_bounds_contain_every_sampled_logit_and_are_tighter_than_the_box_around_the_ball(tiny_case):
    clf, x = tiny_case
    eps = 0.3
    logits = jax.vmap(clf)(points_in_ball(x, eps, 10_000, jax.random.key(3), norm="l2"))
    box = certify.logit_bounds(clf, x, eps, method="crown")
    for method in ("ibp", "crown-ibp", "crown"):
        bounds = certify.logit_bounds(clf, x, eps, method=method, norm="l2")
        assert bool(jnp.all(logits >= bounds.lower - 1e-5)) and bool(jnp.all(logits <= bounds.upper + 1e-5))
    assert bool(jnp.all(bounds.lower >= box.lower - 1e-5)) and bool(jnp.all(bounds.upper <= box.upper + 1e-5))
    assert float(jnp.sum(bounds.upper - bounds.lower)) < float(jnp.sum(box.upper - box.lower))


@pytest.mark.parametrize("method", ["ibp", "crown"])
def test_max_pooling_alone_is_bounded_by_its_exact_hull(method):
    """The maximum over a window of independent values in [l_i, u_i] ranges over exactly
    [max l, max u] (the negated maximum needs the upper end as its lower bound). Pixels
    scaled by different factors have different widths: in the top-left window the largest
    lower end ([0.6, 0.8]) and the largest upper end ([0.36, 0.96]) sit on different
    pixels; the top-right window has a dominant value; the bottom-right one has four values
    tied at their lower end 0 (clipped) with different upper ends."""
    def pooled(v):
        return jnp.concatenate([max_pool_2x2(v).reshape(v.shape[0], -1),
                                nnx.max_pool(v, (2, 2), strides=(1, 1)).reshape(v.shape[0], -1)], axis=1)

    def apply(scale, x):
        values = pooled(x * scale)
        return jnp.concatenate([values, -values], axis=1)

    x = np.array([[0.7, 0.22, 0.7, 0.2], [0.2, 0.2, 0.2, 0.9], [0.5, 0.3, 0.05, 0.08], [0.6, 0.4, 0.05, 0.08]],
                 np.float32).reshape(1, 4, 4, 1)
    scale = np.array([[1, 3, 1, 0.5], [0.5, 0.5, 0.5, 2], [1, 1, 0.5, 1], [1, 1, 0.5, 1]],
                     np.float32).reshape(4, 4, 1)
    clf = rj.Classifier(params=scale, apply_fn=apply, num_classes=26, input_shape=(4, 4, 1), name="pool")
    eps = 0.1
    bounds = certify.logit_bounds(clf, x, eps, method=method)
    hull_low, hull_up = pooled(np.clip(x - eps, 0, 1) * scale)[0], pooled(np.clip(x + eps, 0, 1) * scale)[0]
    np.testing.assert_allclose(bounds.lower[0], np.concatenate([hull_low, -hull_up]), atol=1e-5)
    np.testing.assert_allclose(bounds.upper[0], np.concatenate([hull_up, -hull_low]), atol=1e-5)


def dense_network(seed=0):
    """conv 3x3 (4x4x1 -> 4x4x2), ReLU, dense 32 -> 6, ReLU, dense 6 -> 3, as a classifier and
    as explicit (W, b) matrices acting on flattened images."""
    rng = np.random.default_rng(seed)
    kernel = rng.normal(0, 0.6, (3, 3, 1, 2)).astype(np.float32)
    conv_bias = rng.normal(0, 0.2, 2).astype(np.float32)
    w2, b2 = rng.normal(0, 0.4, (32, 6)).astype(np.float32), rng.normal(0, 0.2, 6).astype(np.float32)
    w3, b3 = rng.normal(0, 0.4, (6, 3)).astype(np.float32), rng.normal(0, 0.2, 3).astype(np.float32)

    def conv(x):
        return jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def apply(params, x):
        h = jax.nn.relu(conv(x) + params["conv_bias"])
        h = jax.nn.relu(h.reshape(x.shape[0], -1) @ params["w2"] + params["b2"])
        return h @ params["w3"] + params["b3"]

    params = dict(conv_bias=conv_bias, w2=w2, b2=b2, w3=w3, b3=b3)
    clf = rj.Classifier(params=params, apply_fn=apply, num_classes=3, input_shape=(4, 4, 1), name="dense")
    w1 = np.asarray(jax.jacobian(lambda v: conv(v.reshape(1, 4, 4, 1)).reshape(-1))(jnp.zeros(16)), np.float64)
    layers = [(w1, np.tile(conv_bias, 16).astype(np.float64)), (w2.T.astype(np.float64), b2.astype(np.float64)),
              (w3.T.astype(np.float64), b3.astype(np.float64))]
    return clf, layers


def ibp_reference(layers, lower, upper):
    """Interval bounds of every pre-activation z_k (centre and radius through |W|)."""
    bounds = []
    for w, b in layers:
        centre, radius = w @ (lower + upper) / 2 + b, np.abs(w) @ (upper - lower) / 2
        bounds.append((centre - radius, centre + radius))
        lower, upper = np.maximum(centre - radius, 0), np.maximum(centre + radius, 0)
    return bounds


def crown_reference(layers, lower, upper, spec, full=True, ball=None):
    """CROWN (Zhang et al. 2018, Theorem 3.2) on explicit matrices z_k = W_k a_{k-1} + b_k,
    a_k = relu(z_k), a_0 = x in [lower, upper]: the lower and upper bounds of spec @ z_L,
    with every pre-activation bounded the same way first (``full``) or by IBP (CROWN-IBP);
    lower slopes adaptive (1 when u > -l); every bound intersected with IBP's, as
    robustjax documents. ``ball`` (centre, eps): an L2 ball inside the box, where a linear
    bound a.x is also bounded by a.centre - eps |a|_2."""
    intervals = ibp_reference(layers, lower, upper)
    pre_bounds = [] if full else intervals

    def lower_bound(k, rows):
        a, offset = rows, np.zeros(len(rows))
        for j in range(k, -1, -1):
            w, b = layers[j]
            offset, a = offset + a @ b, a @ w
            if j == 0:
                break
            lo, up = pre_bounds[j - 1]
            unstable = (lo < 0) & (up > 0)
            slope_up = np.where(unstable, up / np.where(unstable, up - lo, 1), lo >= 0)
            slope_low = np.where(unstable, up > -lo, lo >= 0)
            positive, negative = np.maximum(a, 0), np.minimum(a, 0)
            offset = offset + negative @ np.where(unstable, -slope_up * lo, 0)
            a = positive * slope_low + negative * slope_up
        crown = offset + np.maximum(a, 0) @ lower + np.minimum(a, 0) @ upper
        if ball is not None:
            crown = np.maximum(crown, offset + a @ ball[0] - ball[1] * np.linalg.norm(a, axis=1))
        ibp_lower, ibp_upper = intervals[k]
        return np.maximum(crown, np.maximum(rows, 0) @ ibp_lower + np.minimum(rows, 0) @ ibp_upper)

    for k in range(len(layers) - 1 if full else 0):
        eye = np.eye(len(layers[k][1]))
        pre_bounds.append((lower_bound(k, eye), -lower_bound(k, -eye)))
    return lower_bound(len(layers) - 1, spec), -lower_bound(len(layers) - 1, -spec)


@pytest.mark.parametrize("eps, norm", [(0.05, "linf"), (0.2, "linf"), (0.4, "l2")])
def test_crown_equals_a_dense_matrix_crown_and_ibp_a_dense_ibp(eps, norm):
    clf, layers = dense_network()
    x = np.random.default_rng(3).uniform(0, 1, (4, 4, 4, 1)).astype(np.float32)
    crown = certify.logit_bounds(clf, x, eps, method="crown", norm=norm)
    crown_ibp = certify.logit_bounds(clf, x, eps, method="crown-ibp", norm=norm)
    ibp = certify.logit_bounds(clf, x, eps, method="ibp", norm=norm)
    for i, image in enumerate(x.reshape(4, -1).astype(np.float64)):
        lower, upper = np.clip(image - eps, 0, 1), np.clip(image + eps, 0, 1)
        ball = (image, eps) if norm == "l2" else None
        for bounds, full in ((crown, True), (crown_ibp, False)):
            expected = crown_reference(layers, lower, upper, np.eye(3), full, ball)
            np.testing.assert_allclose(bounds.lower[i], expected[0], rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(bounds.upper[i], expected[1], rtol=1e-4, atol=1e-4)
        low, up = ibp_reference(layers, lower, upper)[-1]
        np.testing.assert_allclose(ibp.lower[i], low, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ibp.upper[i], up, rtol=1e-4, atol=1e-4)
    y = np.asarray(jnp.argmax(clf(x), axis=1))
    margins = certify.margin_lower_bounds(clf, x, y, eps, method="crown", norm=norm)
    for i, image in enumerate(x.reshape(4, -1).astype(np.float64)):
        spec = np.eye(3)[y[i]][None] - np.eye(3)
        ball = (image, eps) if norm == "l2" else None
        expected = crown_reference(layers, np.clip(image - eps, 0, 1), np.clip(image + eps, 0, 1), spec, True, ball)[0]
        np.testing.assert_allclose(margins[i], expected, rtol=1e-4, atol=1e-4)


def test_verified_examples_resist_pgd_and_verified_accuracy_is_below_robust_accuracy():
    clf = rj.zoo.create("digits_mlp")
    x, y = rj.data.digits("test").arrays(limit=32)
    for eps in (0.01, 0.03):
        crown = np.asarray(certify.verified(clf, x, y, eps, method="crown"))
        ibp = np.asarray(certify.verified(clf, x, y, eps, method="ibp"))
        attacked = rj.attacks.PGD(eps=eps, steps=20)(clf, jnp.asarray(x), jnp.asarray(y), key=jax.random.key(0))
        robust = ~np.asarray(attacked.success) & (np.asarray(jnp.argmax(clf(x), axis=1)) == y)
        assert crown.sum() > 0
        assert not (crown & ~robust).any() and not (ibp & ~robust).any()
        assert not (ibp & ~crown).any()


def test_unsupported_layers_are_refused_by_name(tiny_case):
    _, x = tiny_case

    def classifier(activation):
        def apply(params, images):
            return activation(images.reshape(images.shape[0], -1) @ params) @ params.T[:, :3]
        return rj.Classifier(params=jnp.ones((36, 36)) / 36, apply_fn=apply, num_classes=3, input_shape=(6, 6, 1),
                             name="odd")

    with pytest.raises(ValueError, match=r"odd: IBP cannot bound the step `(integer_pow|mul)`"):
        certify.logit_bounds(classifier(lambda h: h * h), x, 0.01, method="ibp")
    with pytest.raises(ValueError, match=r"odd: CROWN cannot bound the step `tanh`"):
        certify.logit_bounds(classifier(jnp.tanh), x, 0.01, method="crown")
    # IBP bounds tanh (monotone), and soundly
    bounds = certify.logit_bounds(classifier(jnp.tanh), x, 0.05, method="ibp")
    logits = jax.vmap(classifier(jnp.tanh))(points_in_ball(x, 0.05, 1000, jax.random.key(0)))
    assert bool(jnp.all(logits >= bounds.lower - 1e-5)) and bool(jnp.all(logits <= bounds.upper + 1e-5))
    with pytest.raises(ValueError, match=r"`erfc`"):
        certify.logit_bounds(classifier(lambda h: jax.nn.gelu(h, approximate=False)), x, 0.01, method="ibp")


def test_bad_input_is_refused_with_one_clear_line(tiny_case):
    clf, x = tiny_case
    with pytest.raises(ValueError, match="eps=1 covers the whole"):
        certify.logit_bounds(clf, x, 1.0)
    with pytest.raises(ValueError, match=r"eps=6 covers the whole \[0, 1\] image box \(l2 diameter 6\)"):
        certify.logit_bounds(clf, x, 6.0, norm="l2")
    with pytest.raises(ValueError, match="norm"):
        certify.logit_bounds(clf, x, 0.1, norm="l1")
    with pytest.raises(ValueError, match="eps"):
        certify.logit_bounds(clf, x, -0.1)
    with pytest.raises(ValueError, match="method"):
        certify.logit_bounds(clf, x, 0.1, method="lp")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        certify.logit_bounds(clf, x + 2.0, 0.1)
    with pytest.raises(ValueError, match="y"):
        certify.verified(clf, x, jnp.array([0, 1, 7]), 0.1)
