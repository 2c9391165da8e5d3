"""robustjax against torchattacks on the same digits CNN with the same weights."""

import jax
import numpy as np
import pytest

import robustjax as rj

torch = pytest.importorskip("torch")
torchattacks = pytest.importorskip("torchattacks")
from benchmarks.torch_models import digits_cnn_to_torch, to_nchw, to_nhwc  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def twin(digits_clf):
    return digits_cnn_to_torch(digits_clf)


@pytest.fixture(scope="module")
def batch():
    return rj.data.digits("test").arrays(limit=64)


def test_twin_has_the_same_logits(digits_clf, twin, batch):
    x, _ = batch
    np.testing.assert_allclose(twin(to_nchw(x)).detach().numpy(), digits_clf(x), atol=1e-4)


def _compare(ours: rj.attacks.Attack, theirs, digits_clf, batch, only=slice(None), atol=1e-5):
    x, y = batch
    expected = to_nhwc(theirs(to_nchw(x), torch.from_numpy(y).long()))
    result = ours(digits_clf, x, y, key=jax.random.key(0))
    np.testing.assert_allclose(np.asarray(result.x_adv)[only], expected[only], atol=atol)


def test_fgsm_matches(digits_clf, twin, batch):
    _compare(rj.attacks.FGSM(eps=0.1), torchattacks.FGSM(twin, eps=0.1), digits_clf, batch)


@pytest.mark.parametrize("eps, steps", [(0.1, 10), (0.2, 5)])
def test_pgd_linf_matches(eps, steps, digits_clf, twin, batch):
    alpha = 2.5 * eps / steps
    ours = rj.attacks.PGD(eps=eps, steps=steps, step_size=alpha, random_start=False, early_stop=False)
    theirs = torchattacks.PGD(twin, eps=eps, alpha=alpha, steps=steps, random_start=False)
    _compare(ours, theirs, digits_clf, batch)


@pytest.mark.parametrize("decay", [1.0, 0.5])
def test_mifgsm_matches(decay, digits_clf, twin, batch):
    ours = rj.attacks.MIFGSM(eps=0.15, steps=10, step_size=0.03, decay=decay, early_stop=False)
    theirs = torchattacks.MIFGSM(twin, eps=0.15, alpha=0.03, steps=10, decay=decay)
    _compare(ours, theirs, digits_clf, batch)


def test_pgd_l2_matches(digits_clf, twin, batch):
    # torchattacks divides the batch-mean gradient by its norm + 1e-10. For confidently
    # classified examples that norm is ~1e-8 / batch size, so the 1e-10 shortens their
    # step (up to half on this model); a negligible constant gives the plain L2 step.
    ours = rj.attacks.PGD(eps=1.0, norm="l2", steps=10, step_size=0.2, random_start=False, early_stop=False)
    # Examples classified with probability 1.0 in float32 have gradients of ~1e-9 made of
    # rounding residue, whose direction differs between any two implementations.
    x, y = batch
    grad = jax.grad(lambda images: rj.losses.cross_entropy(digits_clf(images), y).sum())(x)
    determined = np.linalg.norm(np.asarray(grad).reshape(len(x), -1), axis=1) > 1e-7
    assert determined.sum() >= 48
    theirs = torchattacks.PGDL2(twin, eps=1.0, alpha=0.2, steps=10, random_start=False, eps_for_division=1e-30)
    # Unlike sign steps, normalised-gradient steps carry the two conv implementations'
    # float32 rounding from step to step, hence a looser tolerance after 10 steps.
    _compare(ours, theirs, digits_clf, batch, only=determined, atol=5e-5)
