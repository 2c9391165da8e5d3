"""Batch-norm recalibration's image subset is the seeded random subset it documents (issue 36)."""

import numpy as np

import robustjax as rj


def _numbered(total: int) -> np.ndarray:
    """Images whose every pixel holds their index / 255 (to read back which were chosen)."""
    return np.broadcast_to(np.arange(total, dtype=np.float32)[:, None, None, None] / 255, (total, 2, 2, 1)).copy()


def _chosen(images: np.ndarray) -> list[int]:
    return np.round(np.asarray(images)[:, 0, 0, 0] * 255).astype(int).tolist()


def test_calibration_subset_is_a_seeded_uniform_random_subset_of_the_whole_set():
    """n of the N images, without repeats, the same for one seed, from the whole set: over
    seeds each image is chosen about n / N of the time (the first n images, or a subset of
    any fixed part, would be chosen always or never). An array and a dataset of the same
    images give the same subset."""
    total, n, seeds = 20, 5, 400
    images = _numbered(total)
    dataset = rj.data.from_arrays(images, np.zeros(total, np.int32), name="numbered", num_classes=2)
    counts = np.zeros(total)
    for seed in range(seeds):
        chosen = _chosen(rj.nas.calibration_subset(images, n, seed=seed))
        assert len(chosen) == len(set(chosen)) == n
        counts[chosen] += 1
        if seed < 20:
            assert _chosen(rj.nas.calibration_subset(dataset, n, seed=seed)) == chosen
    # Binomial(400, 1/4): mean 100, sd 8.7; every count within 4.6 sd.
    assert counts.min() >= 60 and counts.max() <= 140
    assert _chosen(rj.nas.calibration_subset(images, n, seed=3)) == _chosen(rj.nas.calibration_subset(images, n,
                                                                                                    seed=3))
    assert len({tuple(_chosen(rj.nas.calibration_subset(images, n, seed=s))) for s in range(10)}) >= 9
    assert sorted(_chosen(rj.nas.calibration_subset(images, 50))) == list(range(total))  # fewer than n: all
