"""How many trials ``gpus_per_worker: auto`` packs on one GPU, from a probe's measurements (raysent.train.packing): a
pure function, checked here with numbers shaped like an H200's (141 GiB; a BERT-base trial bound by the host at
small batches, by the chip at large ones). Nothing here touches CUDA or Ray."""

from __future__ import annotations

import pytest

from raysent.train import packing
from raysent.train.packing import (
    GIB,
    HEADROOM,
    MIN_GAIN,
    Packing,
    Probe,
    ProbePoint,
    choose,
    counts,
    memory_fraction,
    most_per_gpu,
    next_count,
    share_of,
    trials_per_gpu,
)

H200 = int(141 * GIB)


def point(k: int, rate: float | None, peak_gib: float = 2.0, context_gib: float = 0.5,
          error: str | None = None) -> ProbePoint:
    """What the probe measures for k copies: their steps/s together, one copy's peak, the device's use (k copies'
    memory and CUDA contexts)."""
    return ProbePoint(k, rate, int(peak_gib * GIB), int(k * (peak_gib + context_gib) * GIB), error)


def probe(*points: ProbePoint, most: int = 16, total: int = H200) -> Probe:
    return Probe(device="NVIDIA H200", total_bytes=total, points=tuple(points), most=most)


def test_a_share_is_one_kth_rounded_down_to_rays_precision_and_caps_memory_below_the_headroom():
    assert [share_of(k) for k in (1, 2, 3, 4, 6, 7, 16)] == [1.0, 0.5, 0.3333, 0.25, 0.1666, 0.1428, 0.0625]
    for k in range(1, 17):  # k of them fit on one GPU, and no more
        assert trials_per_gpu(share_of(k)) == k and k * share_of(k) <= 1.0 < (k + 1) * share_of(k)
    assert trials_per_gpu(0.0) == 0 and trials_per_gpu(2.0) == 1
    assert HEADROOM == 0.10 and MIN_GAIN == 1.05
    assert memory_fraction(0.25) == pytest.approx(0.225) and memory_fraction(0.5) == pytest.approx(0.45)
    assert memory_fraction(1.0) is None and memory_fraction(0.0) is None and memory_fraction(2.0) is None
    assert 4 * memory_fraction(0.25) == pytest.approx(1 - HEADROOM)  # the caps of a full GPU leave 10 % free


def test_the_counts_tried_are_powers_of_two_up_to_what_the_phase_and_the_cpus_per_gpu_hold():
    assert counts(16) == [1, 2, 4, 8, 16] and counts(6) == [1, 2, 4, 6] and counts(3) == [1, 2, 3]
    assert counts(2) == [1, 2] and counts(1) == [1]
    # one GPU, 8 CPUs, half a CPU a trial, 8 trials: 8 at most
    assert most_per_gpu(1, 8, 0.5, 8) == 8
    # 100 trials on a node of 8 GPUs and 96 CPUs at 1 CPU a trial: the 12 CPUs per GPU
    assert most_per_gpu(8, 96, 1.0, 100) == 12
    assert most_per_gpu(8, 96, 1.0, 100, cpus_per_gpu=4.0) == 4  # the poorest GPU node's CPUs per GPU
    assert most_per_gpu(1, 64, 1.0, 1000) == packing.MAX_TRIALS_PER_GPU
    assert most_per_gpu(8, 96, 1.0, 8) == 1  # the phase's trials fit the GPUs: nothing to pack
    assert most_per_gpu(8, 96, 1.0, 100, max_concurrent=16) == 2  # a number caps the trials at once
    assert most_per_gpu(0, 96, 1.0, 100) == 1


def test_a_host_bound_trial_is_packed_to_the_count_with_the_best_total_throughput():
    # BERT-base at batch 16-64 on an H200: one trial keeps a few % of the chip busy; 16 at once gain < 5 % over 8
    measured = probe(point(1, 28.0), point(2, 54.0), point(4, 97.0), point(8, 131.0), point(16, 134.0))
    chosen = choose(measured, 16)
    assert chosen.trials_per_gpu == 8 and chosen.gpus_per_worker == 0.125
    assert chosen.reason.startswith("8 trials per GPU: 131.0 steps/s together on NVIDIA H200, 4.68× one trial's 28.0")
    assert "one trial's peak 2.00 GiB of its cap 15.86 GiB" in chosen.reason
    record = chosen.record()
    assert record["trials_per_gpu"] == 8 and record["memory_fraction"] == pytest.approx(0.1125)
    assert [p["k"] for p in record["probe"]["points"]] == [1, 2, 4, 8, 16]
    assert record["probe"]["points"][3]["steps_per_second"] == 131.0
    # fewer copies allowed (a small phase): the best of those
    assert choose(measured, 4).trials_per_gpu == 4 and choose(measured, 1).trials_per_gpu == 1


def test_it_never_packs_where_packing_is_not_clearly_faster():
    # batch 512: the chip is busy with one trial; two at once share it and gain nothing
    flat = choose(probe(point(1, 14.4, 30.0), point(2, 14.7, 30.0), point(4, 14.1, 30.0)), 16)
    assert flat.trials_per_gpu == 1 and flat.gpus_per_worker == 1.0
    assert flat.reason.startswith("1 trial per GPU: packing gained less than 5% on NVIDIA H200")
    assert flat.record()["memory_fraction"] is None  # a whole GPU: no cap
    # a gain below MIN_GAIN at 2 does not stop a larger count that gains clearly
    assert choose(probe(point(1, 30.0), point(2, 31.0), point(4, 45.0)), 4).trials_per_gpu == 4
    # each step up must beat the best so far by 5 %, not only the first
    assert choose(probe(point(1, 30.0), point(2, 40.0), point(4, 41.0)), 4).trials_per_gpu == 2


def test_a_count_that_would_not_leave_ten_percent_of_the_memory_free_is_not_chosen():
    # 40 GiB a copy: two fit in 0.9 × 141 GiB (caps of 63.45 GiB), four would not (31.7 GiB caps)
    big = probe(point(1, 10.0, 40.0), point(2, 13.0, 40.0), point(4, 20.0, 40.0))
    assert choose(big, 4).trials_per_gpu == 2
    # the device's memory in use counts too (CUDA contexts, the GPU's other users)
    crowded = ProbePoint(2, 20.0, int(40 * GIB), int(130 * GIB))
    assert choose(probe(point(1, 10.0, 40.0), crowded), 2).trials_per_gpu == 1
    # a count that ran out of memory ends the walk; the best before it stands
    oom = probe(point(1, 10.0, 20.0), point(2, 14.0, 20.0), ProbePoint(4, None, error="OutOfMemoryError: CUDA out "
                                                                                         "of memory"))
    chosen = choose(oom, 8)
    assert chosen.trials_per_gpu == 2 and "4: OutOfMemoryError" in chosen.reason


def test_when_one_copy_did_not_run_auto_stays_one_per_gpu_and_says_why():
    failed = choose(probe(ProbePoint(1, None, error="OutOfMemoryError: CUDA out of memory")), 8)
    assert failed.trials_per_gpu == 1 and "OutOfMemoryError" in failed.reason
    nothing = choose(Probe(device="none", total_bytes=0, points=(), most=8, note="no CUDA device on the probe's node"),
                     8)
    assert nothing.trials_per_gpu == 1 and nothing.reason == ("1 trial per GPU: the GPU probe measured no step (no "
                                                              "CUDA device on the probe's node)")


def _walk(rates: dict[int, float], peak_gib: float, most: int, total: int = H200) -> list[int]:
    """The counts a probe tries when k copies train rates[k] steps/s together, each holding peak_gib."""
    points: list[ProbePoint] = []
    k = next_count(points, most, total)
    while k is not None:
        points.append(point(k, rates[k], peak_gib))
        k = next_count(points, most, total)
    return [p.k for p in points]


def test_the_probe_stops_at_the_first_count_that_is_slower_or_would_not_fit():
    rising = {1: 28.0, 2: 54.0, 4: 97.0, 8: 131.0, 12: 140.0, 16: 134.0}
    assert _walk(rising, 2.0, 16) == [1, 2, 4, 8, 16]
    assert _walk(rising, 2.0, 12) == [1, 2, 4, 8, 12]  # the largest count itself last
    assert _walk({1: 30.0, 2: 31.0, 4: 29.0, 8: 60.0}, 2.0, 8) == [1, 2, 4]  # 4 is slower than the best (1)
    assert _walk({1: 30.0}, 2.0, 1) == [1]
    # 40 GiB a copy: 4 would not fit beside 10 % headroom, so it is never started
    assert _walk({1: 10.0, 2: 13.0, 4: 20.0}, 40.0, 8) == [1, 2]
    # 70 GiB: not even two
    assert _walk({1: 10.0, 2: 13.0}, 70.0, 8) == [1]
    # a failed count is the last
    assert next_count([point(1, 10.0), ProbePoint(2, None, error="died")], 8, H200) is None


def test_a_probe_round_trips_through_json():
    measured = Probe(device="NVIDIA H200", total_bytes=H200, points=(point(1, 28.0), ProbePoint(2, None, error="x")),
                     most=4, key={"train": {"batch_size": 64}}, seconds=31.5, note="stopped at 2 at once: x")
    assert Probe.from_json(measured.to_json()) == measured
    assert isinstance(Packing(1, "why").record()["reason"], str)
