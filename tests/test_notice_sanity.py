"""Every threshold of the sanity checks, just inside and just outside (issue 36), from the
rules the checks document. At an exact boundary the values are dyadic (k / 64, powers of
two), so the comparison is exact and a ``<`` for a ``<=`` shows."""

import math

import numpy as np
import pytest

from robustjax.evaluation import sanity

EPS32 = float(np.finfo(np.float32).eps)


def _section(name, eps, robust_accuracy, **params):
    return {"name": name, "status": "ok", "robust_accuracy": robust_accuracy,
            "params": {"norm": "linf", "steps": 10, **params, "eps": eps}}


def _report(*sections, num_examples):
    return {"attacks": list(sections), "metrics": None, "dataset": {"num_examples": num_examples}}


def test_accuracy_falls_with_eps_tolerates_two_standard_errors_of_the_pairs_mean_accuracy():
    """A rise from eps_a to eps_b warns beyond ``2 sqrt(p (1 - p) / n)``, ``p`` the mean of
    the two accuracies (and never less than one example)."""
    n, low = 400, 0.5

    def excess(rise):
        mean = low + rise / 2
        return rise - max(2 * math.sqrt(mean * (1 - mean) / n), 1 / n)

    lo, hi = 0.0, 0.5  # the rise at which the tolerance is reached (bisection)
    for _ in range(100):
        lo, hi = (lo, (lo + hi) / 2) if excess((lo + hi) / 2) > 0 else ((lo + hi) / 2, hi)
    for rise, verdict in ((hi * 0.999, "pass"), (hi * 1.001, "warn")):
        report = _report(_section("pgd", 0.1, low), _section("pgd", 0.2, low + rise), num_examples=n)
        assert sanity.accuracy_falls_with_eps(report)["verdict"] == verdict, rise
        # the order of the sections in the report does not matter, only their epsilons
        report["attacks"].reverse()
        assert sanity.accuracy_falls_with_eps(report)["verdict"] == verdict, rise
    falling = _report(_section("pgd", 0.1, low + 2 * hi), _section("pgd", 0.2, low), num_examples=n)
    assert sanity.accuracy_falls_with_eps(falling)["verdict"] == "pass"


@pytest.mark.parametrize("num_examples, white, allowed", [(64, 32 / 64, 1), (100, 0.40, 1), (1000, 0.5, 2)],
                         ids=["one-example", "one-of-100", "0.2%"])
def test_black_box_tolerance_is_the_larger_of_0_2_percent_and_one_example(num_examples, white, allowed):
    """Accuracies are counts of examples: a black-box attack may leave ``allowed`` examples
    fewer correct than the best white-box one (0.40 - 0.39 is not more than 0.01 because a
    float subtraction rounds above it)."""
    for fewer, verdict in ((allowed, "pass"), (allowed + 1, "warn")):
        black = (round(white * num_examples) - fewer) / num_examples
        report = _report(_section("pgd", 0.1, white + 0.125), _section("apgd", 0.1, white),
                         _section("square", 0.1, black), _section("square", 0.2, 0.0),
                         num_examples=num_examples)
        check = sanity.black_box_beats_white_box(report)
        assert check["verdict"] == verdict, fewer
        assert check["value"]["tolerance"] == max(0.002, 1 / num_examples)
        assert [(c["white_box"], c["eps"]) for c in check["value"]["comparisons"]] == [("apgd", 0.1)]


def test_restarts_tolerance_counts_only_the_second_half_of_the_restarts():
    """Robust accuracy after restarts 1 .. R/2 against after all R: the gain may be 1% and
    one example. Many examples first fooled in the first half never count."""
    restarts = 4
    for n, allowed in ((64, 1), (100, 1), (256, 2)):  # max(1%, 1/n): one of 64 or 100, two of 256 (2.56)
        for late, verdict in ((allowed, "pass"), (allowed + 1, "warn")):
            success = np.zeros((restarts, n), bool)
            success[0, :10] = True
            success[1, 10:30] = True  # restart 2 is in the first half
            success[2, 30:30 + late] = True  # restart 3 is in the second half
            success[3, :30 + late] = True  # fooled again: only the first time counts
            check = sanity.restarts_converged(success, 0.1, 10)
            assert check["verdict"] == verdict, (n, late)
            assert check["value"]["gain_of_second_half"] == pytest.approx(late / n)


def test_unbounded_pgd_allows_5_percent_correct():
    for n, correct, verdict in ((100, 4, "pass"), (100, 5, "pass"), (100, 6, "warn"), (20, 1, "pass"),
                                (20, 2, "warn")):  # exactly 5% (1 of 20, 5 of 100) is not more than 5%
        success = np.ones(n, bool)
        success[:correct] = False
        assert sanity.unbounded_pgd(success, 10)["verdict"] == verdict, (n, correct)
    success = np.ones(64, bool)
    success[:3] = False  # 4.7%
    assert sanity.unbounded_pgd(success, 10)["verdict"] == "pass"


@pytest.mark.parametrize("margin", [10.0, 0.25], ids=["margin-scale", "unit-scale"])
def test_a_vanishing_gradient_is_one_grey_level_step_below_float32_resolution_of_the_margin(margin):
    """Vanishing: ``||g||_1 / 255 < eps_float32 * max(|margin|, 1)``."""
    limit = 255 * EPS32 * max(abs(margin), 1.0)
    for scale, vanishing in ((0.99, 1.0), (1.01, 0.0)):
        gradient = np.zeros((2, 4, 4, 1), np.float32)
        gradient[:, 1, 2, 0] = [scale * limit / 2, 1.0]  # the L1 norm split over two entries
        gradient[0, 3, 0, 0] = -scale * limit / 2
        check = sanity.input_gradients(np.array([-margin, margin], np.float32), gradient)
        assert check["value"]["vanishing"] == vanishing / 2
        assert check["verdict"] == ("warn" if vanishing else "pass")


def test_probability_outputs_tolerate_1e_4_in_the_row_sums():
    rows = np.random.default_rng(0).dirichlet(np.ones(10), 8)
    for error, verdict in ((0.5e-4, "warn"), (2e-4, "pass")):
        outputs = rows.copy()
        outputs[3] *= 1 + error  # one row off by `error`
        assert sanity.probability_outputs(outputs)["verdict"] == verdict, error
        log_outputs = np.log(rows)
        log_outputs[5] += math.log1p(error)
        assert sanity.probability_outputs(log_outputs)["verdict"] == verdict, error
    negative = rows.copy()
    negative[0, :2] = [-1e-3, negative[0, :2].sum() + 1e-3]  # one entry below 0, rows still summing to 1
    assert sanity.probability_outputs(negative)["verdict"] == "pass"


def test_deterministic_forward_tolerates_1e_4_of_unit_logit_distance():
    rng = np.random.default_rng(1)
    first = rng.normal(0, 3, (6, 10))
    first[:, 0] += 20  # a clear winner: small changes never flip the prediction
    orthogonal = rng.normal(size=10)
    orthogonal -= orthogonal @ first[4] / (first[4] @ first[4]) * first[4]
    orthogonal *= np.linalg.norm(first[4]) / np.linalg.norm(orthogonal)
    for distance, verdict in ((0.5e-4, "pass"), (2e-4, "warn")):
        again = first.copy()
        again[4] += distance * orthogonal  # unit distance ~ `distance`, on row 4 only
        assert sanity.deterministic_forward(first, again, first[:5].copy())["verdict"] == verdict  # repeated call
        # another batch: the first 5 rows of `first`, computed elsewhere
        assert sanity.deterministic_forward(first, first, again[:5])["verdict"] == verdict
    # a changed prediction warns however small the distance
    tied = np.array([[1.0, 1.0 - 1e-6, 0.0]])
    assert sanity.deterministic_forward(tied, tied[:, [1, 0, 2]], tied)["verdict"] == "warn"


def test_loss_landscape_thresholds_flat_jump_and_share_of_examples():
    sizes = np.linspace(0, 0.2, 5)

    def line(increments, start=4.0):
        return start + np.concatenate([[0.0], np.cumsum(increments)])

    even = [0.25, 0.25, 0.25, 0.25]
    cases = {  # name: (loss along the line, flat, irregular)
        "even": (line(even), False, False),
        "half-in-one-step": (line([0.5, 0.25, 0.125, 0.125]), False, False),
        "more-than-half": (line([0.5 + 2**-10, 0.25, 0.125, 0.125 - 2**-10]), False, True),
        "rise-at-resolution": (line([2**-23] * 4), True, False),  # 4 * eps32 * |4| in all: flat
        "rise-above-resolution": (line([2**-22] * 4), False, False),
        "small-loss-at-resolution": (line([2**-25] * 4, start=0.25), True, False),  # eps32 * max(0.25, 1)
        "small-loss-above-resolution": (line([2**-24] * 4, start=0.25), False, False),
    }
    for name, (loss, flat, irregular) in cases.items():
        value = sanity.loss_landscape(np.stack([loss] * 5, 1), sizes)["value"]
        assert (value["flat"], value["irregular"]) == (float(flat), float(irregular)), name
    # more than 20% of the examples flat or irregular warns: 4 of 20 pass, 5 of 20 warn
    for bad, verdict in ((4, "pass"), (5, "warn")):
        columns = [cases["rise-at-resolution" if i % 2 else "more-than-half"][0] for i in range(bad)]
        loss = np.stack(columns + [cases["even"][0]] * (20 - bad), 1)
        assert sanity.loss_landscape(loss, sizes)["verdict"] == verdict, bad
