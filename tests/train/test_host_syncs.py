"""A training step never waits on the device: between the loop's log and eval intervals, no operator that forces
the host to wait on a CUDA device runs, for every method (issue 46, item 6).

On a GPU the host queues kernels and runs ahead; an operator whose result the host needs (a tensor's value as a
Python number, a shape that depends on the data, a copy back to the host) makes it wait until the device has
caught up, and a step that does so is bound by its kernel launches. A CPU runs every operator synchronously, so
the check runs here, on CPU, through torch's dispatcher: every aten operator of the steps passes through a
``TorchDispatchMode`` that records those that would synchronise on CUDA:

* ``aten::_local_scalar_dense`` (``.item()``, ``float(t)``, ``int(t)``, ``bool(t)``, ``if t:``), ``is_nonzero``,
  ``equal``, ``allclose``;
* operators whose output shape depends on the data: ``nonzero``, ``masked_select``, ``unique`` and its kin,
  ``repeat_interleave`` without ``output_size``, indexing or assigning with a boolean mask;
* a tensor built from host data inside a step (``aten::lift_fresh``: ``torch.tensor([...])``), which on CUDA is a
  copy to the device from pageable memory;
* copies to the host: ``Tensor.cpu``, ``.tolist``, ``.numpy`` (on a CPU tensor they do not reach the dispatcher, so
  they are counted where Python calls them).

What is counted is the device's work of each step: the optimizer step (forward, backward, clipping, AdamW, the
schedule) and adding its loss to the running sums. The batch itself is built on the host by design, from host
memory (the DataLoader collates it, pins it and it is copied without blocking: raysent.train.loop.device_batches).

The settings are the ones a CUDA device resolves to (``raysent.train.device``: one forward, no length buckets,
bf16 autocast); length buckets and gradient caching, CPU and memory speedups, read row widths on the host by
design (docs/performance.md). ``raysent bench --parts profile`` counts the same on a GPU from the profiler.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from raysent.config import parse_config
from raysent.train import loop
from raysent.train.device import resolve
from raysent.train.loop import TrainHooks
from raysent.train.run import build_method, prepare_data

from conftest import RAW_BERT

pytestmark = [pytest.mark.shared, pytest.mark.slow]  # real data and models; trains a few steps

SYNCING = {"aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal", "aten::allclose", "aten::nonzero",
           "aten::nonzero_static", "aten::argwhere", "aten::masked_select", "aten::unique", "aten::_unique",
           "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
           "aten::lift_fresh", "aten::lift_fresh_copy"}


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ()))


class HostSyncs(TorchDispatchMode):
    """Records each operator (and host copy) that would make the host wait on a CUDA device."""

    def __init__(self, paused: int = 0):
        super().__init__()
        self.seen: Counter[str] = Counter()
        self.paused = paused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.paused:
            name = func._schema.name
            if name in SYNCING:
                self.seen[name] += 1
            elif name in ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_") \
                    and _bool_index(args):
                self.seen[f"{name} (boolean mask)"] += 1
            elif name == "aten::repeat_interleave" and kwargs.get("output_size") is None and \
                    isinstance(args[0], torch.Tensor) and (len(args) < 2 or isinstance(args[1], torch.Tensor)):
                self.seen[f"{name} (no output_size)"] += 1
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def pause(self):
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    @contextlib.contextmanager
    def watch(self):
        self.paused -= 1
        try:
            yield
        finally:
            self.paused += 1


@contextlib.contextmanager
def counting_host_copies(counter: HostSyncs, monkeypatch):
    """Count ``.cpu()``, ``.tolist()`` and ``.numpy()`` where Python calls them (a CPU tensor's copy to the host
    is no operator); the loop's own reads at its intervals are paused."""
    for name in ("cpu", "tolist", "numpy"):
        original = getattr(torch.Tensor, name)

        def wrapped(self, *a, _name=name, _original=original, **k):
            if not counter.paused:
                counter.seen[f"Tensor.{_name}"] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    yield


def _watched(counter: HostSyncs, original):
    def watched(*a, **k):
        with counter.watch():
            return original(*a, **k)

    return watched


# (label, method, params, data): every method, and the variants that take another code path
CASES = [
    ("simcse-unsup", "simcse-unsup", {}, "sts-unlabeled"),
    ("simcse-sup", "simcse-sup", {"hard_negative_weight": 0.5}, "nli-triplets"),
    ("sg opt1 (cached views)", "sg", {"loss": "opt1"}, "sts-unlabeled"),
    ("sg-opt", "sg-opt", {}, "sts-unlabeled"),
    ("consert shuffle+feature_cutoff", "consert", {}, "sts-unlabeled"),
    ("consert token_cutoff+dropout", "consert", {"augmentations": ["token_cutoff", "dropout"]}, "sts-unlabeled"),
    ("consert joint", "consert", {"supervision": "joint", "augmentations": ["none", "shuffle"]}, "snli:dev+test"),
    ("consert joint adversarial", "consert", {"supervision": "joint", "augmentations": ["none", "adversarial"]},
     "snli:dev+test"),
    ("layeratt eq8", "layeratt", {"objective": "eq8"}, "nli-triplets"),
    ("layeratt eq7", "layeratt", {"objective": "eq7"}, "sts-unlabeled"),
    ("supcon", "supcon", {}, "snli:dev+test"),
    ("supcon 3p3n", "supcon", {"pos_cap": 3, "neg_cap": 3}, "snli:dev+test"),
    ("sbert-nli", "sbert-nli", {}, "snli:dev+test"),
]
WARMUP, STEPS, BATCH = 2, 3, 16
CUDA_LIKE = {"precision": "bf16", "length_buckets": 1, "huge_pages": False, "fused_adamw": True}


def test_the_cuda_settings_are_what_the_check_runs():
    """What CUDA's ``auto`` resolves to is what the steps below run with (bf16 where the device supports it), but
    for the compile: on CUDA a long run replays the encoder as CUDA graphs, inside which a host sync cannot even be
    captured (CUDA refuses it while a stream captures), so the eager step the check runs is the one that could wait."""
    cfg = parse_config({"name": "x", "method": "simcse-unsup", "model": {"name": RAW_BERT}})
    cuda = resolve(cfg.train, "cuda")
    assert (cuda.length_buckets, cuda.huge_pages, cuda.fused_adamw) == (1, False, True)
    assert cuda.compile and cuda.cuda_graphs and not resolve(cfg.train, "cuda", total_steps=WARMUP + STEPS).compile
    assert cuda.auto == ("length_buckets", "huge_pages", "fused_adamw", "precision", "compile")
    cpu = resolve(cfg.train, "cpu")
    assert (cpu.precision, cpu.length_buckets, cpu.huge_pages, cpu.fused_adamw) == ("fp32", 4, True, True)


@pytest.mark.parametrize("label,method,params,data", CASES, ids=[c[0] for c in CASES])
def test_no_host_sync_between_log_intervals(label, method, params, data, tiny_bert, tmp_path, monkeypatch):
    # the tiny random BERT: which operators a step runs does not depend on the model's width or depth
    cfg = parse_config({"name": "syncs", "method": method, "model": {"name": tiny_bert},
                        "params": params, "data": {"train": data, "max_train_samples": BATCH * (WARMUP + STEPS + 4)},
                        "train": {"batch_size": BATCH, "max_length": 32, "max_steps": WARMUP, "eval_every": 1000,
                                  "log_every": 1000, "eval_at_start": False, **CUDA_LIKE}})
    m = build_method(cfg)
    tok, groups, _ = prepare_data(cfg, m)
    run = loop.setup(cfg, m, tok, [], TrainHooks(tmp_path, quiet=True), groups=groups)
    m.prepare(tok, run.hooks.device)
    m.train()
    evaluations = []
    monkeypatch.setattr(loop, "evaluate_and_save", lambda run, state, loss: evaluations.append(state.step) or False)
    state = loop.TrainState()
    loop.fit(run, state)  # warm-up steps: the optimizer's state is created at its first step
    assert state.step == WARMUP

    counter = HostSyncs(paused=1)  # watching only the device's work of a step
    reads = []
    read = loop.LossMeter._read
    monkeypatch.setattr(loop.LossMeter, "_read", staticmethod(lambda *a, **k: reads.append(a[3]) or read(*a, **k)))
    for owner, name in ((loop.Stepper, "step"), (loop.LossMeter, "add")):
        monkeypatch.setattr(owner, name, _watched(counter, getattr(owner, name)))
    run.total = WARMUP + STEPS
    with counting_host_copies(counter, monkeypatch), counter:
        loop.fit(run, state)
    assert state.step == WARMUP + STEPS and evaluations == [WARMUP, WARMUP + STEPS]
    assert reads == [WARMUP + STEPS], "the loss is read once, at the eval interval that ends the run"
    assert not counter.seen, f"{label}: operators that wait on a CUDA device in {STEPS} steps: {dict(counter.seen)}"


def test_the_counter_sees_what_it_is_for():
    """The mode catches each kind of operator it looks for (else the test above could not fail)."""
    x = torch.arange(6.0)
    counter = HostSyncs()
    with counter:
        float(x.sum())
        x[x > 2]
        x.nonzero()
        torch.tensor([1, 2])
        if x.max():
            pass
    assert counter.seen["aten::_local_scalar_dense"] >= 2
    assert counter.seen["aten::index (boolean mask)"] == 1 and counter.seen["aten::nonzero"] == 1
    assert counter.seen["aten::lift_fresh"] == 1
