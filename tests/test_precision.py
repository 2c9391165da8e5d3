"""Mixed precision: a bfloat16 network inside float32 attacks and evaluation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import robustjax as rj
from robustjax.evaluation import evaluate
from robustjax.evaluation.plan import plan_from_dict
from robustjax.precision import with_precision


def test_the_network_computes_in_bfloat16_and_returns_float32(digits_clf, digits_batch):
    x, _ = digits_batch
    half = with_precision(digits_clf, "bfloat16")
    assert {leaf.dtype for leaf in jax.tree.leaves(half.params)} == {jnp.dtype(jnp.bfloat16)}
    assert half(x).dtype == jnp.float32
    assert with_precision(half, "bfloat16") is half and with_precision(digits_clf, "float32") is digits_clf
    np.testing.assert_allclose(np.asarray(half(x)), np.asarray(digits_clf(x)), atol=0.1, rtol=0.05)
    supernet_net = rj.nas.bundled_supernet("nb201_digits").classifier(11472)
    masked = with_precision(supernet_net, "bfloat16")  # integer op choices stay integers
    assert [leaf.dtype for leaf in jax.tree.leaves(masked.params) if not jnp.issubdtype(leaf.dtype, jnp.floating)] \
        == [leaf.dtype for leaf in jax.tree.leaves(supernet_net.params) if not jnp.issubdtype(leaf.dtype, jnp.floating)]
    with pytest.raises(ValueError, match=r"precision must be one of \['bfloat16', 'float32'\], got 'float16'"):
        with_precision(digits_clf, "float16")
    with pytest.raises(ValueError, match="plan: precision must be one of"):
        plan_from_dict({"precision": "fp8"})


def test_bfloat16_pgd_robust_accuracy_is_within_half_a_point_of_float32(digits_clf):
    """The digits plan's PGD-Linf-10 on all 500 test digits. Measured: 91.6 / 68.2 / 4.8% in
    float32 and 91.8 / 68.4 / 4.2% in bfloat16 at eps 0.05 / 0.1 / 0.2; at eps 0.2, where
    almost nothing is robust, bfloat16's coarser loss surface lets PGD fool 3 more of the
    500 examples, so that epsilon is held to one point."""
    dataset = rj.data.digits("test")
    raw = {"batch_size": 250, "sanity": {"enabled": False},
           "attacks": [{"name": "pgd", "norm": "linf", "eps": [0.05, 0.1, 0.2], "steps": 10}]}
    full = evaluate(digits_clf, dataset, plan_from_dict(raw))
    half = evaluate(digits_clf, dataset, plan_from_dict({**raw, "precision": "bfloat16"}))
    assert half["plan"]["precision"] == "bfloat16" and full["plan"]["precision"] == "float32"
    assert abs(half["clean"]["accuracy"] - full["clean"]["accuracy"]) <= 0.005
    gaps = [abs(h["robust_accuracy"] - f["robust_accuracy"]) for h, f in zip(half["attacks"], full["attacks"])]
    assert gaps[0] <= 0.005 and gaps[1] <= 0.005 and gaps[2] <= 0.01, gaps
    for section in half["attacks"]:  # the attack itself stays float32: inside the ball
        assert section["perturbation"]["linf_mean"] <= section["params"]["eps"] + 1e-6
