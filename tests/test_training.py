"""Training (issue 21): adversarial training raises robustness on the digits, the mixing
augmentations produce their documented mixtures, a killed run resumes to the same weights,
EMA and label smoothing equal their closed forms, and bad input is refused early."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import robustjax as rj
from robustjax import training
from robustjax.training import mixing
from robustjax.training.model import TrainModel
from robustjax.training.step import (
    AttackSettings,
    adversarial_examples,
    init_state,
    kl_divergence,
    make_step,
    trades_classifier,
)

EPS = 0.2  # the digits' grey levels are 1/16 apart: 0.2 is about three levels
SHORT = dict(steps=120, batch_size=64, learning_rate=0.1, warmup_from=0.01, ema_decay=None)


def _robust_accuracy(clf: rj.Classifier) -> float:
    x, y = rj.data.digits("test").arrays()
    attack = rj.attacks.PGD(eps=EPS, steps=20, step_size=EPS / 8, early_stop=False)  # one program, no compaction
    return 1.0 - float(attack(clf, x, y, key=jax.random.key(1)).success.mean())


def _train(tmp_path, techniques: str, **recipe) -> rj.Classifier:
    clf = rj.zoo.create("digits_cnn", pretrained=False)
    result = training.train(clf, rj.data.digits("train"), tmp_path / (techniques or "standard"),
                            training.Recipe(**{**SHORT, **recipe}), training.techniques.create(techniques),
                            attack_eps=EPS, attack_steps=5, checkpoint_every=10_000,
                            devices=jax.local_devices()[:1])  # the resume test runs sharded
    return result.classifier


@pytest.fixture(scope="module")
def standard_robust_accuracy(tmp_path_factory) -> float:
    return _robust_accuracy(_train(tmp_path_factory.mktemp("standard"), ""))


def test_pgd_at_raises_robust_accuracy(tmp_path, standard_robust_accuracy):
    """120 steps of batch 64 on the digits train split, PGD-20 at eps 0.2 on the 500 test
    digits: standard training 0.064 robust accuracy, RobustART's PGD-AT (clean and
    adversarial halves, 5 training attack steps) 0.268 (measured on a 2-core CPU, jax 0.10.2)."""
    robust = _robust_accuracy(_train(tmp_path, "pgd_at"))
    assert standard_robust_accuracy < 0.2
    assert robust > standard_robust_accuracy + 0.12, (standard_robust_accuracy, robust)


@pytest.mark.parametrize("technique", ["trades", "fast_at"])
def test_trades_and_fast_at_raise_robust_accuracy(tmp_path, standard_robust_accuracy, technique):
    """Same schedule: TRADES 0.228, fast AT 0.494, against standard training's 0.064."""
    robust = _robust_accuracy(_train(tmp_path, technique))
    assert robust > standard_robust_accuracy + 0.1, (technique, standard_robust_accuracy, robust)


def _constant_images(b: int = 4, side: int = 8) -> tuple[jax.Array, jax.Array]:
    """Image i is constant (i + 1) / 10; its label is one-hot i."""
    x = jnp.broadcast_to(((jnp.arange(b) + 1) / 10)[:, None, None, None], (b, side, side, 1))
    return x, jax.nn.one_hot(jnp.arange(b), b)


def test_trades_inner_attack_ascends_the_kl_divergence():
    """TRADES' examples maximise KL(p(x) || p(x')) in the ball: as high as a signed ascent
    on the KL written out here (from the same start), far above the random start's."""
    clf = rj.zoo.create("digits_cnn")
    x, _ = rj.data.digits("test").arrays(limit=64)
    clean, key, eps = clf(x), jax.random.key(0), 0.1
    settings = AttackSettings(eps, 10, eps / 4)
    x_adv = adversarial_examples(settings, trades_classifier(clf, clean), x, jnp.zeros(len(x), jnp.int32), key)
    assert float(jnp.abs(x_adv - x).max()) <= eps + 1e-6
    start = rj.attacks.threat.random_start(key, jnp.asarray(x), eps, "linf")
    ascent = start
    for _ in range(settings.steps):
        grad = jax.grad(lambda z: kl_divergence(clean, clf(z)).sum())(ascent)
        ascent = jnp.clip(jnp.clip(ascent + settings.step_size * jnp.sign(grad), x - eps, x + eps), 0, 1)
    kl = {name: float(kl_divergence(clean, clf(z)).mean()) for name, z in
          (("trades", x_adv), ("ascent", ascent), ("start", start))}
    assert kl["trades"] >= 0.9 * kl["ascent"] and kl["trades"] > 20 * kl["start"], kl


def test_mixup_is_the_convex_combination_of_pairs():
    x, labels = _constant_images()
    x_mix, mixed = mixing.mixup(jax.random.key(3), x, labels, alpha=0.2)
    assert np.allclose(mixed.sum(1), 1.0)
    paired = (np.asarray(mixed) > 0).sum(1) == 2  # examples the permutation paired with another
    assert paired.sum() >= 2
    lam = np.asarray(mixed)[np.arange(4), np.arange(4)]
    partner = np.argmin(np.where(np.eye(4, dtype=bool) | (np.asarray(mixed) == 0), 2.0, mixed), axis=1)
    partner = np.where(paired, partner, np.arange(4))
    expected = lam[:, None, None, None] * x + (1 - lam)[:, None, None, None] * x[partner]
    assert np.allclose(x_mix, expected, atol=1e-6)
    assert np.allclose(lam[paired], lam[paired][0])  # one lambda per batch


def test_cutmix_pastes_a_box_and_mixes_labels_by_its_area():
    x, labels = _constant_images(side=16)
    x_cut, mixed = mixing.cutmix(jax.random.key(5), x, labels, alpha=1.0)
    own = x[:, 0, 0, 0]
    for i in range(4):
        pasted = ~np.isclose(np.asarray(x_cut[i, ..., 0]), float(own[i]))
        area = pasted.mean()
        assert np.isclose(mixed[i, i], 1 - area, atol=1e-6) or area == 0
        if area:  # the box is a rectangle holding one other image's constant
            rows, cols = np.nonzero(pasted)
            assert pasted[rows.min():rows.max() + 1, cols.min():cols.max() + 1].all()
            values = np.unique(np.asarray(x_cut[i, ..., 0])[pasted])
            assert len(values) == 1 and np.isclose(mixed[i].sum(), 1.0)


def test_augmix_is_the_documented_mixture_of_chains():
    """AugMix (Algorithm 1): m * x + (1 - m) * sum_i w_i chain_i(x), w ~ Dirichlet, m ~ Beta."""
    x = jax.random.uniform(jax.random.key(0), (8, 8, 1))
    key = jax.random.key(7)

    @jax.jit
    def parts(key, x):
        weights_key, chains_key = jax.random.split(key)
        chains = jax.vmap(lambda k: mixing.augmix_chain(k, x))(jax.random.split(chains_key, 3))
        return mixing.augmix_one(key, x), *mixing.augmix_weights(weights_key), chains

    out, w, m, chains = parts(key, x)
    assert np.isclose(w.sum(), 1.0) and 0 <= m <= 1
    assert np.allclose(out, m * x + (1 - m) * sum(wi * c for wi, c in zip(w, chains)), atol=1e-5)
    assert float(out.min()) >= 0 and float(out.max()) <= 1
    assert not np.allclose(chains[0], x)  # a chain applies at least one operation


def test_killed_run_resumes_to_the_uninterrupted_parameters(tmp_path):
    """Stopped after 3 of 6 steps (its last checkpoint at step 2), then restarted: the
    same parameters as a run that never stopped, bit for bit (Mixup and CutMix: random draws
    every step; the batch sharded over the 8 simulated devices)."""
    recipe = training.Recipe(steps=6, batch_size=64, learning_rate=0.05, ema_decay=0.9)
    techniques = training.techniques.create("mixup,cutmix")
    dataset = rj.data.digits("train")

    def run(out, stop_after=None):
        clf = rj.zoo.create("digits_cnn", pretrained=False)
        return training.train(clf, dataset, out, recipe, techniques, checkpoint_every=2, log_every=1,
                              stop_after=stop_after)

    whole = run(tmp_path / "whole")
    assert run(tmp_path / "killed", stop_after=3).steps == 3
    resumed = run(tmp_path / "killed")
    assert resumed.resumed_from == 2
    jax.tree.map(np.testing.assert_array_equal, resumed.classifier.params, whole.classifier.params)
    steps = [json.loads(line)["step"] for line in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # the killed run's step 3 is logged once, by the resumed run


class _Linear(nnx.Module):
    def __init__(self, *, rngs):
        self.linear = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        return self.linear(x.reshape(x.shape[0], -1))


def test_ema_and_label_smoothing_equal_their_closed_forms():
    """Loss: -sum_k q_k log softmax(z)_k with q = (1 - s) onehot + s / K. EMA after T steps of
    parameters p_1..p_T from p_0, with decays d_t = min(d, t / (9 + t)) (TensorFlow's warm-up,
    update t counted from 1): D_0 p_0 + sum_t (1 - d_t) D_t p_t, D_t = prod_{s > t} d_s."""
    clf = rj.Classifier.from_nnx(_Linear(rngs=nnx.Rngs(0)), num_classes=3, input_shape=(2, 2, 1))
    recipe = training.Recipe(steps=4, batch_size=4, learning_rate=0.3, warmup_epochs=0, ema_decay=0.2,
                             label_smoothing=0.2)
    model = TrainModel.from_classifier(clf)
    optimizer, step = make_step(model, recipe, training.techniques.create(""), 4)
    state = init_state(model, optimizer, recipe)
    x = jax.random.uniform(jax.random.key(1), (4, 2, 2, 1))
    y = jnp.array([0, 1, 2, 1])
    logits = clf(x)
    q = (1 - 0.2) * jax.nn.one_hot(y, 3) + 0.2 / 3
    closed_loss = float(jnp.mean(-jnp.sum(q * jax.nn.log_softmax(logits), axis=-1)))
    history = [state.params]
    for t in range(4):
        state, metrics = step(state, x, y, jax.random.key(0))
        if t == 0:
            assert np.isclose(float(metrics["loss"]), closed_loss, rtol=1e-6)
        history.append(state.params)
    steps = 4
    decays = [min(0.2, t / (9 + t)) for t in range(1, steps + 1)]  # 0.1, 0.18, then capped at 0.2
    after = [float(np.prod(decays[t:])) for t in range(steps + 1)]  # D_t: the decays of updates t+1..T
    expected = jax.tree.map(lambda *p: after[0] * p[0] + sum((1 - decays[t - 1]) * after[t] * p[t]
                                                             for t in range(1, steps + 1)), *history)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), state.ema[0], expected)


def test_bad_input_is_refused_before_training(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"unknown technique 'pgd_t' \(did you mean 'pgd_at'\?\).*'trades'"):
        training.techniques.create("pgd_t")
    with pytest.raises(ValueError, match="'pgd_at' and 'mixup' cannot combine"):
        training.techniques.create("pgd_at,mixup")
    with pytest.raises(ValueError, match="'madry' and 'trades' cannot combine"):
        training.techniques.create("madry,trades")
    assert training.techniques.create("cutmix,mixup") == training.techniques.create(["mixup", "cutmix"])
    with pytest.raises(ValueError, match="needs dropout layers"):
        TrainModel.from_classifier(rj.zoo.create("digits_cnn", pretrained=False), dropout=True)
    from robustjax.training.dataset import training_dataset

    with pytest.raises(ValueError, match="no 'validation' split to train on"):
        training_dataset("digits", "validation")
    import tensorflow_datasets as tfds

    class _Info:
        splits = {"test": None}

    class _Builder:
        info = _Info()

    monkeypatch.setattr(tfds, "builder", lambda name, data_dir=None: _Builder())
    with pytest.raises(ValueError, match=r"'imagenet_a' has no 'train' split to train on; its splits: \['test'\]"):
        training_dataset("tfds:imagenet_a")


def test_cli_train_writes_weights_that_evaluate_reads(tmp_path, capsys):
    """A short run through the command line: the card records the recipe and techniques, and
    the zoo loads the weights the way `robustjax evaluate --weights` does."""
    from robustjax.cli import main

    out = tmp_path / "run"
    code = main(["train", "--technique", "no_ema,no_label_smoothing", "--steps", "4", "--batch-size", "64",
                 "--out", str(out), "--quiet"])
    assert code == 0
    assert f"robustjax evaluate --model digits_cnn --weights {out}" in " ".join(capsys.readouterr().out.split())
    card = json.loads((out / "card.json").read_text())
    assert card["training"]["recipe"]["ema_decay"] is None and card["training"]["recipe"]["label_smoothing"] == 0
    assert card["training"]["recipe"]["optimizer"] == "sgd" and card["training"]["steps"] == 4
    assert sorted(card["training"]["techniques"]) == ["no_ema", "no_label_smoothing"]
    loaded = rj.zoo.load("digits_cnn", weights=out)
    x, _ = rj.data.digits("test").arrays(limit=8)
    assert np.isfinite(np.asarray(loaded(x))).all()
    assert main(["train", "--technique", "pgd_at,augmix", "--out", str(tmp_path / "bad")]) == 2
