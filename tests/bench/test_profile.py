"""The profile part of `raysent bench` (raysent.bench.profile): what it counts per step from torch.profiler's events,
checked on a loop whose operators are known, and (slow) both sides profiled for real on a tiny BERT on this CPU."""

from __future__ import annotations

import json

import pytest

from raysent.bench import BenchResult, format_markdown
from raysent.bench.profile import SYNC_OPS, summarize

from conftest import cli_in_process


def _profile_toy(steps: int, warmup: int = 2) -> dict:
    """A step with a known host sync per step: one .item(), one boolean-mask index (nonzero inside)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    layer = torch.nn.Linear(8, 8)
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(skip_first=warmup, wait=0, warmup=1, active=steps, repeat=1)) as prof:
        for _ in range(warmup + 1 + steps):
            x = torch.randn(4, 8)
            y = layer(x)
            kept = y[y > 0]  # boolean indexing: aten::nonzero
            loss = y.pow(2).mean() + kept.sum() * 0
            loss.backward()
            float(loss.item())  # aten::_local_scalar_dense
            prof.step()
    return summarize(prof.events())


def test_the_profile_counts_each_steps_operators_and_host_syncs():
    out = _profile_toy(steps=3)
    assert out["steps"] == 3
    assert out["sync_ops_per_step"]["aten::_local_scalar_dense"] == 1.0
    assert out["sync_ops_per_step"]["aten::nonzero"] == 2.0  # the boolean index, and its backward
    assert set(out["sync_ops_per_step"]) <= set(SYNC_OPS)
    # where from: .item() in the step's own code, nonzero in the index and in autograd's backward of it
    assert out["sync_op_sources"] == {"aten::_local_scalar_dense < aten::item": 1.0,
                                      "aten::nonzero < aten::index": 1.0,
                                      "aten::nonzero < aten::_index_put_impl_ < IndexBackward0": 1.0}
    # per step, not over the whole run: the same loop recorded for more steps gives the same counts
    longer = _profile_toy(steps=6)
    assert longer["ops_per_step"] == out["ops_per_step"] and longer["top_ops"] == out["top_ops"]
    assert out["top_level_ops_per_step"] < out["ops_per_step"]  # linear's addmm runs inside aten::linear
    top = list(out["top_ops"].values())
    assert top == sorted(top, reverse=True) and sum(top) <= out["ops_per_step"] and out["host_ms_per_step"] > 0
    assert "kernels_per_step" not in out and "sync_calls_per_step" not in out  # no CUDA here


def test_a_profile_without_a_recorded_step_is_refused():
    with pytest.raises(RuntimeError, match="no step"):
        summarize([])


@pytest.mark.slow
@pytest.mark.shared
def test_the_profile_part_profiles_raysent_and_sentence_transformers_on_a_cpu(tiny_bert, tmp_path):
    out = tmp_path / "bench"
    proc = cli_in_process("bench", "--model", tiny_bert, "--parts", "profile", "--batch-size", "16",
                          "--max-length", "24", "--warmup", "1", "--profile-steps", "2", "--output-dir", str(out))
    [js] = out.glob("*.json")
    r = json.loads(js.read_text())
    p = r["profile"]
    assert p["method"] == "simcse-unsup" and p["warmup"] == 1 and "failed_cases" not in r
    for side in ("raysent", "st_mnrl"):
        c = p[side]
        assert c["steps"] == 2 and c["device"] == "cpu" and c["precision"] == "fp32", side
        assert c["ops_per_step"] > c["top_level_ops_per_step"] > 0 and c["host_ms_per_step"] > 0
        assert 0 < len(c["top_ops"]) <= 15 and sum(c["top_ops"].values()) <= c["ops_per_step"]
        assert "kernels_per_step" not in c and "sync_calls_per_step" not in c  # CPU: no CUDA counts
    assert p["raysent"]["settings"]["device"] == "cpu"  # raysent's resolved defaults
    md = js.with_suffix(".md").read_text()
    assert md == format_markdown(BenchResult.model_validate(r)) and md in proc.stdout
    assert "## Profile (torch.profiler)" in md and "| host milliseconds |" in md and "CUDA kernels" not in md


def test_the_cuda_counts_are_taken_per_step_from_the_events_a_cuda_profile_holds():
    """The CUDA side of summarize on events shaped as torch.profiler gives them on a GPU (no GPU here): runtime
    calls on the host inside each step's span, kernels and copies on the device; the profiler's own wait for the
    device when it stops comes after the last span and is not counted."""
    from dataclasses import dataclass, field

    from torch.autograd import DeviceType

    @dataclass
    class Span:
        start: float
        end: float

        def elapsed_us(self) -> float:
            return self.end - self.start

    @dataclass
    class Event:
        name: str
        start: float
        end: float
        device_type: DeviceType = DeviceType.CPU
        cpu_parent: Event | None = None
        time_range: Span = field(init=False)

        def __post_init__(self):
            self.time_range = Span(self.start, self.end)

    events = [Event("ProfilerStep#3", 0, 1000), Event("ProfilerStep#4", 1000, 3000)]
    for t in (0, 1000):
        mm = Event("aten::mm", t + 10, t + 50)
        events += [mm, Event("cudaLaunchKernel", t + 20, t + 25, cpu_parent=mm),
                   Event("cudaLaunchKernelExC", t + 60, t + 65), Event("cuLaunchKernel_v7000", t + 70, t + 72),
                   Event("sm90_gemm", t + 100, t + 400, DeviceType.CUDA),
                   Event("elementwise_kernel", t + 400, t + 500, DeviceType.CUDA),
                   Event("triton_red_fused", t + 500, t + 600, DeviceType.CUDA)]
    item = Event("aten::item", 1800, 1900)
    events += [item, Event("aten::_local_scalar_dense", 1810, 1890, cpu_parent=item),
               Event("cudaMemcpyAsync", 1820, 1830), Event("cudaStreamSynchronize", 1830, 1880),
               Event("Memcpy DtoH (Device -> Pageable)", 1840, 1842, DeviceType.CUDA),
               Event("cudaDeviceSynchronize", 3100, 3500)]  # the profiler's, when it stops
    out = summarize(events)
    assert out["steps"] == 2 and out["host_ms_per_step"] == 1.5  # (1000 + 2000) us over 2 steps
    assert out["kernels_per_step"] == 3.0  # the launches, whatever entry point
    assert out["device_ms_per_step"] == 0.5  # 300 + 100 + 100 us of kernels a step; copies are not kernels
    assert out["sync_calls_per_step"] == {"cudaStreamSynchronize": 0.5, "Memcpy DtoH": 0.5}
    assert out["sync_ops_per_step"] == {"aten::_local_scalar_dense": 0.5}
    assert out["sync_op_sources"] == {"aten::_local_scalar_dense < aten::item": 0.5}
    assert out["ops_per_step"] == 2.0 and out["top_level_ops_per_step"] == 1.5
