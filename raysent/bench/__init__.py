"""``raysent bench``: raysent's speed measured side by side with what users would otherwise run.

One command run measures, on the same model, batch size and sequence length:

1. **training**: optimizer steps/s, sentences/s and peak memory of every method, and of
   sentence-transformers' ``MultipleNegativesRankingLoss`` (the tool users pick for unsupervised
   SimCSE), as ratios; each case in a fresh process (:mod:`raysent.bench.cases`);
2. **speedups**: each of raysent's speedups on and off (length buckets, one concatenated forward
   for the views, SG-OPT's cached BERT_F views, gradient caching), as ratios;
3. **evaluation**: the 7-set STS evaluation against sentence-transformers'
   ``EmbeddingSimilarityEvaluator``, equal scores checked (:mod:`raysent.bench.evaluation`);
4. **overhead**: the same run bare, on one Ray Train worker and in a Ray Tune trial
   (:mod:`raysent.bench.overhead`);
5. **gpu** (only with a CUDA device): simcse-unsup on its defaults, in fp32 and with each speedup
   flipped, against sentence-transformers' MNRL in bf16 (and fp32): steps/s, sentences/s, the ratio,
   GPU memory and model FLOPs utilisation (PaLM's formula) against the device's stated peak;
6. **profile**: a few steps of raysent's simcse-unsup and of MNRL under torch.profiler: operators,
   host milliseconds and host-device waits per step (:mod:`raysent.bench.profile`);
7. **search**: one short search three ways (raysent one trial per GPU without graphs, raysent on its
   defaults, sentence-transformers' ``hyperparameter_search``): wall time, configurations per hour and the
   GPU's utilisation (:mod:`raysent.bench.search`).

A case that fails loses only itself (its error in ``failed_cases``), and the record is handed to be
written after every case, so a run killed by a timeout keeps every case it measured.

It returns a :class:`BenchResult` (:mod:`raysent.bench.result`) and writes it as
``results/bench/<date>.json`` (every number, the versions and the machine) and ``<date>.md`` (the summary,
with the targets the project holds itself to; :mod:`raysent.bench.markdown`). Timings are never
asserted by tests: tests only check that the speedups change nothing (tests/train/test_speedups.py).
"""

from raysent.bench.markdown import format_markdown
from raysent.bench.options import GPU_CASES, METHODS, PARTS, BenchOptions
from raysent.bench.result import BenchResult
from raysent.bench.runner import (
    check_targets,
    method_config,
    model_flops_per_step,
    peak_bf16_tflops,
    run_bench,
    write_results,
)

__all__ = ["GPU_CASES", "METHODS", "PARTS", "BenchOptions", "BenchResult", "check_targets", "format_markdown",
           "method_config", "model_flops_per_step", "peak_bf16_tflops", "run_bench", "write_results"]
