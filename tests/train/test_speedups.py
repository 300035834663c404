"""Every speedup changes nothing: the loss and the gradients of a step are equal with and without
length buckets, one concatenated forward for the views, SG-OPT's cached BERT_F views and gradient
caching (dropout off, so that both sides draw no random masks). Not timed: `raysent bench` measures
the speed (see docs/performance.md)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from raysent.config import parse_config
from raysent.errors import ConfigError
from raysent.models.chunked import length_buckets
from raysent.models.encoder import Encoder
from raysent.train.loop import Stepper, TrainHooks, _to_device, forward_backward
from raysent.train.memory import THP_ENV, kernel_thp_mode
from raysent.train.run import build_method, prepare_data

from conftest import PARAPHRASE, RAW_BERT

pytestmark = pytest.mark.shared  # real data and models from ../shared

ROWS = 24
OFF = {"length_buckets": 1, "concat_views": False, "cache_views": False, "grad_cache_rows": None}
# (method, params, data)
METHODS = [
    ("simcse-unsup", {"pooling": "mean"}, "sts-unlabeled"),
    ("simcse-sup", {"hard_negative_weight": 0.3}, "nli-triplets"),
    ("sg-opt", {"loss": "opt3"}, "sts-unlabeled"),
    ("layeratt", {"objective": "eq8"}, "nli-triplets"),
    ("supcon", {}, "snli:dev+test"),
]
VARIANTS = {
    "length_buckets": {"length_buckets": 4},
    "concat_views": {"concat_views": True},
    "cache_views": {"cache_views": True},
    "grad_cache": {"grad_cache_rows": 5},
    "all_on": {"length_buckets": 4, "concat_views": True, "cache_views": True, "grad_cache_rows": 7},
}


def _config(method: str, params: dict, data: str, train: dict):
    return parse_config({"name": "speedups", "method": method, "model": {"name": RAW_BERT, "dropout": 0.0},
                         "params": params, "data": {"train": data, "max_train_samples": 96},
                         "train": {"batch_size": ROWS, "max_length": 32, **train}})


def step_of(method: str, params: dict, data: str, train: dict, tmp_path) -> tuple[float, dict, int]:
    """Loss, gradients and the number of encoder forward calls of one step, through the loop's Stepper."""
    cfg = _config(method, params, data, {**OFF, **train})
    m = build_method(cfg)  # seeded: the same heads every time
    tok, groups, _ = prepare_data(cfg, m)
    stepper = Stepper(cfg, m, TrainHooks(tmp_path), None, None)
    m.prepare(tok, torch.device("cpu"))
    m.train()
    rows = np.arange(ROWS) if groups is None else np.argsort(groups, kind="stable")[:ROWS]
    calls = []
    handle = m.encoder.model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        loss = forward_backward(stepper.model, m, _to_device(tok.collate(rows), torch.device("cpu")),
                                grad_cache=stepper.grad_cache)
    finally:
        handle.remove()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, len(calls)


def assert_grads_equal(got: dict, want: dict, label: str) -> None:
    assert set(got) == set(want), label
    assert len(want) > 20, label
    for name, ref in want.items():
        scale = max(float(ref.abs().max()), 1e-3)
        # float32 summation order: supcon's mean_no_cls through length buckets differs by 2.6e-5 of the largest
        # gradient of its tensor in float32, by 2.7e-14 when the same step runs in float64
        torch.testing.assert_close(got[name], ref, rtol=0, atol=5e-5 * scale, msg=f"{label}: {name}")


@pytest.mark.slow  # 26 forward and backward passes of a real encoder: 16 s on 2 idle cores, minutes on busy ones
@pytest.mark.parametrize("method,params,data", METHODS, ids=[m[0] for m in METHODS])
def test_each_speedup_gives_the_same_loss_and_gradients(method, params, data, tmp_path):
    ref_loss, ref_grads, ref_calls = step_of(method, params, data, {}, tmp_path)
    for name, train in VARIANTS.items():
        if name == "cache_views" and not method.startswith("sg"):
            continue
        loss, grads, calls = step_of(method, params, data, train, tmp_path)
        assert loss == pytest.approx(ref_loss, abs=1e-5), f"{method} {name}"
        assert_grads_equal(grads, ref_grads, f"{method} {name}")
        # the speedup really ran: more (smaller) encoder calls, or fewer (concatenated), or no BERT_F
        if name == "length_buckets":
            assert calls > ref_calls, f"{method}: the batch was not bucketed"
        if name == "grad_cache":
            assert calls >= 2 * ref_calls * (ROWS // 5), f"{method}: no gradient cache ({calls} calls)"
        if name == "concat_views" and method != "sg-opt":
            assert calls < ref_calls, f"{method}: the views were not concatenated"


def test_sg_view_cache_holds_bert_f_views_of_every_sentence(tmp_path):
    cfg = _config("sg-opt", {"loss": "opt3"}, "sts-unlabeled", {})
    m = build_method(cfg)
    tok, _, _ = prepare_data(cfg, m)
    info = m.prepare(tok, torch.device("cpu"))
    lo, hi = m.layer_range
    assert m._view_cache.shape == (len(tok), hi - lo + 1, m.encoder.hidden_size)
    assert info["view_cache_mib"] == pytest.approx(m._view_cache.numel() * 4 / 2**20)
    rows = [5, 17, 3, 60]
    fresh = m.views(tok.collate(rows)["text"])
    torch.testing.assert_close(m._view_cache[rows], fresh, atol=1e-5, rtol=1e-5)
    # BERT_F with dropout (the official code's setting) gives random views: nothing is cached
    cfg = _config("sg-opt", {"loss": "opt3", "frozen_dropout": True}, "sts-unlabeled", {})
    m = build_method(cfg)
    assert m.prepare(tok, torch.device("cpu")) == {"view_cache": "off (frozen_dropout)"}
    assert m._view_cache is None


def test_grad_cache_with_dropout_replays_the_same_masks():
    """With dropout on, the gradient cache equals the same chunks run with a graph: pass 2 replays
    pass 1's random state, so every chunk sees the masks its cached states were computed with."""
    enc = Encoder.load(RAW_BERT, dropout=0.2)
    enc.train()
    texts = ["a man is playing a guitar .", "the cat sat on the mat", "two dogs run", "it rains",
             "a very long sentence about nothing at all that goes on and on", "short", "why not", "ok then"] * 2
    tok = enc.tokenizer(texts, padding=True, return_tensors="pt")

    def loss_of(states):
        mask = tok["attention_mask"].unsqueeze(-1).float()
        z = (states[-1] * mask).sum(1) / mask.sum(1)
        z = torch.nn.functional.normalize(z, dim=-1)
        return torch.logsumexp(z @ z.T / 0.05, dim=1).mean() + states[2][:, 0].pow(2).mean()

    def grads():
        return {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}

    torch.manual_seed(3)
    with enc.grad_cache(5) as cache:
        loss = loss_of(enc(tok["input_ids"], tok["attention_mask"]))
        loss.backward()
        cache.backward()
    cached = grads()
    enc.zero_grad()
    # reference: the same chunks one after another, with a graph, from the same seed
    torch.manual_seed(3)
    pieces = []
    for idx in torch.arange(len(texts)).split(5):
        width = int(tok["attention_mask"][idx].sum(1).max())
        out = enc.model(input_ids=tok["input_ids"][idx, :width], attention_mask=tok["attention_mask"][idx, :width],
                        output_hidden_states=True)
        pieces.append([torch.nn.functional.pad(h, (0, 0, 0, tok["input_ids"].shape[1] - width))
                       for h in out.hidden_states])
    states = [torch.cat([p[k] for p in pieces]) for k in range(len(pieces[0]))]
    ref = loss_of(states)
    ref.backward()
    assert float(loss) == pytest.approx(float(ref), abs=1e-5)
    assert_grads_equal(cached, grads(), "grad cache with dropout")
    # and a different seed gives other masks, so the test would see a replay that went wrong
    enc.zero_grad()
    torch.manual_seed(4)
    assert abs(float(loss_of(enc(tok["input_ids"], tok["attention_mask"]))) - float(ref)) > 1e-4


def test_length_buckets_only_when_they_pay():
    mask = torch.zeros(32, 40, dtype=torch.long)
    for i, n in enumerate(np.linspace(3, 40, 32).astype(int)):
        mask[i, :n] = 1
    pieces = length_buckets(mask, 4)
    assert pieces is not None and len(pieces) == 4
    assert sorted(torch.cat(pieces).tolist()) == list(range(32))
    assert length_buckets(torch.ones(32, 40, dtype=torch.long), 4) is None  # all rows full: nothing to save
    assert length_buckets(mask[:12], 4) is None  # fewer than 8 rows a bucket


def test_grad_cache_refused_for_consert():
    with pytest.raises(ConfigError) as exc:
        parse_config({"name": "x", "method": "consert", "model": {"name": RAW_BERT},
                      "train": {"grad_cache_rows": 16}}, source="consert.yaml")
    msg = str(exc.value)
    assert "consert.yaml" in msg and "train.grad_cache_rows" in msg and "allowed: null" in msg


_STEPS = """
import json, os, resource, sys
from raysent.config import parse_config
from raysent.train.memory import THP_ENV, large_tensors_on_huge_pages
from raysent.train.run import build_method
cfg = parse_config({"name": "t", "method": "simcse-unsup", "model": {"name": sys.argv[1]},
                    "train": {"huge_pages": sys.argv[2] == "on"}}, source="<test>")
method = build_method(cfg)  # applies train.huge_pages before the model's weights load
import torch
faults, rss = [], []
for _ in range(6):  # what each step does to the word-embedding gradient: a fresh 47 MB tensor, zeroed, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    g = torch.zeros(30522, 384)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del g
    rss.append(int(open("/proc/self/statm").read().split()[1]))
print(json.dumps({"faults": faults[-1], "rss_growth_pages": rss[-1] - rss[1], "env_left": THP_ENV in os.environ,
                  "huge": large_tensors_on_huge_pages()}))
"""


@pytest.mark.slow  # two processes that each load a model: 8 s
@pytest.mark.skipif(kernel_thp_mode() != "madvise",
                    reason="the kernel gives huge pages on request only in its 'madvise' mode ('always': to every "
                           "large mapping, raysent's switch or not; 'never': to none)")
def test_huge_pages_stop_a_step_faulting_its_large_tensors_in_page_by_page():
    """train.huge_pages, applied by build_method before the model loads: a 47 MB tensor allocated again
    faults in 2 MB pages (~720 faults) instead of 4 KiB ones (11,446), and the process does not grow;
    the variable PyTorch reads is not left for the processes it starts."""
    import json
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != THP_ENV}
    got = {way: json.loads(subprocess.run([sys.executable, "-c", _STEPS, PARAPHRASE, way], env=env,
                                          capture_output=True, text=True, check=True).stdout.splitlines()[-1])
           for way in ("off", "on")}
    assert got["off"]["faults"] > 11_000 and not got["off"]["huge"]
    assert got["on"]["faults"] < 1_500 and got["on"]["huge"]
    for way in ("off", "on"):
        assert abs(got[way]["rss_growth_pages"]) < 1_000, got
        assert not got[way]["env_left"]


def test_huge_pages_respect_an_exported_choice_and_the_kernel(monkeypatch, tmp_path):
    from raysent.train import memory

    sysfs = tmp_path / "enabled"
    sysfs.write_text("always madvise [never]\n")
    assert memory.kernel_thp_mode(sysfs) == "never"
    sysfs.write_text("always [madvise] never\n")
    assert memory.kernel_thp_mode(sysfs) == "madvise"
    assert memory.kernel_thp_mode(tmp_path / "missing") is None
    monkeypatch.setattr(memory, "_state", None)
    monkeypatch.setattr(memory, "kernel_thp_mode", lambda: "madvise")
    monkeypatch.setenv(THP_ENV, "0")
    assert memory.use_huge_pages() is False and os.environ[THP_ENV] == "0"
    monkeypatch.setattr(memory, "_state", None)
    monkeypatch.setattr(memory, "kernel_thp_mode", lambda: "never")
    monkeypatch.delenv(THP_ENV)
    assert memory.use_huge_pages() is False and THP_ENV not in os.environ


RELEASE = """
import gc, json, threading
def rss(): return int([l for l in open("/proc/self/status") if l.startswith("VmRSS")][0].split()[1]) // 1024
keep = []
def trial():  # a run in its own thread, as a Tune trial runs: ~400 MB from that thread's malloc arena
    objs = [bytes(4000) + bytes([i % 256]) for i in range(100_000)]
    keep.extend(objs[::50])  # a few objects outlive it, so the arena cannot simply shrink
t = threading.Thread(target=trial); t.start(); t.join()
gc.collect()
held = rss()
from raysent.train.memory import release_freed_memory

ran = release_freed_memory()
print(json.dumps({"held": held, "after": rss(), "ran": ran}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                    reason="malloc_trim is glibc's")
def test_release_freed_memory_hands_a_finished_threads_free_arena_memory_back():
    """What a reused Tune trial process calls before its next trial (raysent.tune.trial.run_trial)."""
    import json
    import subprocess

    out = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    assert r["ran"] and r["held"] > 300, r  # gc alone leaves the freed blocks in the process
    assert r["after"] < r["held"] - 250, r
