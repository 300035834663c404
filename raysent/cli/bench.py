"""`raysent bench`: speed side by side with sentence-transformers."""

from __future__ import annotations

import argparse
import signal
import sys

from raysent.cli.common import EPILOG, split_list
from raysent.errors import RaysentError

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and
# every other command start without torch, Ray or MLflow); sentence-transformers only where a part runs it.


def register(sub) -> None:
    from raysent.bench import GPU_CASES, BenchOptions
    from raysent.bench import METHODS as BENCH_METHODS
    from raysent.bench import PARTS as BENCH_PARTS

    bd = BenchOptions()
    b = sub.add_parser("bench", help="measure training, evaluation and orchestration speed side by side with "
                       "sentence-transformers; writes results/bench/<date>.{json,md}",
                       description="Side-by-side speed measurements on one model, batch size and sequence length: "
                       "training steps/s and peak memory of every method and of sentence-transformers' "
                       "MultipleNegativesRankingLoss (training), each speedup on and off (speedups), the 7-set STS "
                       "evaluation against sentence-transformers' EmbeddingSimilarityEvaluator with equal scores "
                       "checked (evaluation), the same run bare, on one Ray Train worker and in a Ray Tune trial "
                       "(overhead), simcse-unsup on its defaults, in fp32 and with each speedup flipped against "
                       "sentence-transformers MNRL with steps/s, memory and MFU on a GPU (gpu), and operators, host "
                       "time and host-device waits per step of both under torch.profiler (profile). Each case runs "
                       "in a fresh process; a case that fails loses only itself, and the record is written after "
                       "every case. Needs sentence-transformers (pip install -e '.[bench]').",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--model", default=bd.model, help=f"encoder (default {bd.model})")
    b.add_argument("--batch-size", type=int, default=bd.batch_size, help=f"training batch (default {bd.batch_size})")
    b.add_argument("--max-length", type=int, default=bd.max_length,
                   help=f"training sequence length (default {bd.max_length})")
    b.add_argument("--steps", type=int, default=bd.steps, help=f"timed steps per case (default {bd.steps})")
    b.add_argument("--warmup", type=int, default=bd.warmup, help=f"untimed steps first (default {bd.warmup})")
    b.add_argument("--parts", default=",".join(BENCH_PARTS),
                   help=f"comma-separated parts to run (default all: {','.join(BENCH_PARTS)})")
    b.add_argument("--methods", default=",".join(BENCH_METHODS),
                   help="comma-separated methods of the training part (default: every training method)")
    b.add_argument("--overhead-steps", type=int, default=bd.overhead_steps,
                   help=f"steps of the run the overhead part repeats four ways (default {bd.overhead_steps})")
    b.add_argument("--overhead-trials", type=int, default=bd.overhead_trials,
                   help="Tune trials of each Tune way, one after another as a search runs them: trials training "
                        "in their own process reuse the process of the trial before, trials running Ray Train "
                        f"start their own (default {bd.overhead_trials})")
    b.add_argument("--eval-repeats", type=int, default=bd.eval_repeats,
                   help=f"runs of each evaluator, the fastest counts (default {bd.eval_repeats})")
    b.add_argument("--speedups", default=",".join(bd.speedups),
                   help="speedups the speedups part turns on and off (default all: " + ",".join(bd.speedups) + ")")
    b.add_argument("--eval-sets", default=",".join(bd.eval_sets),
                   help="STS test sets of the evaluation part (default all seven)")
    b.add_argument("--grad-cache-batch", type=int, default=bd.grad_cache_batch,
                   help=f"batch of the gradient-caching case (default {bd.grad_cache_batch})")
    b.add_argument("--grad-cache-rows", type=int, default=None,
                   help="chunk rows of the gradient-caching case (default: an eighth of its batch)")
    b.add_argument("--cpus", type=float, default=bd.cpus, help=f"CPUs a Ray trial may use (default {bd.cpus:g})")
    b.add_argument("--threads", type=int, default=None, help="torch threads of each training case (default torch's)")
    b.add_argument("--peak-tflops", type=float, default=None,
                   help="the GPU's dense bf16 peak for MFU (default: looked up by device name)")
    b.add_argument("--gpu-cases", default=",".join(bd.gpu_cases),
                   help="comma-separated cases of the gpu part, run in the order given (default, most important "
                        f"first: {','.join(GPU_CASES)})")
    b.add_argument("--profile-steps", type=int, default=bd.profile_steps,
                   help=f"steps the profile part records on each side, after --warmup (default {bd.profile_steps})")
    b.add_argument("--search-trials", type=int, default=bd.search_trials,
                   help=f"trials of the search part, one learning rate each (default {bd.search_trials}, at most 8)")
    b.add_argument("--search-steps", type=int, default=bd.search_steps,
                   help=f"steps of each of the search part's trials (default {bd.search_steps})")
    b.add_argument("--output-dir", default=bd.output_dir,
                   help=f"where the JSON and markdown go (default {bd.output_dir})")
    b.set_defaults(func=run)


def run(args) -> int:
    import importlib.util

    from raysent.bench import BenchOptions, format_markdown, run_bench, write_results

    opts = BenchOptions(model=args.model, batch_size=args.batch_size, max_length=args.max_length, steps=args.steps,
                        warmup=args.warmup, parts=split_list([args.parts]), methods=split_list([args.methods]),
                        overhead_steps=args.overhead_steps, overhead_trials=args.overhead_trials,
                        eval_repeats=args.eval_repeats, cpus=args.cpus,
                        eval_sets=split_list([args.eval_sets]), speedups=split_list([args.speedups]),
                        threads=args.threads, output_dir=args.output_dir, peak_tflops=args.peak_tflops,
                        grad_cache_rows=args.grad_cache_rows, grad_cache_batch=args.grad_cache_batch,
                        gpu_cases=split_list([args.gpu_cases]), profile_steps=args.profile_steps,
                        search_trials=args.search_trials, search_steps=args.search_steps)
    # looked up, not imported (~6 CPU-s): run_bench names a bad option first thing
    if importlib.util.find_spec("sentence_transformers") is None:
        raise RaysentError("raysent bench compares with sentence-transformers, which is not installed: "
                           "pip install -e '.[bench]'")
    from raysent.bench.runner import Terminated

    def terminated(signum, frame):
        raise Terminated

    # SIGTERM (what `timeout` sends) stops the run as Ctrl-C does: what was measured is written, and said to be cut
    # short; the record is written after every case besides, so even a run killed outright keeps its cases
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        result = run_bench(opts, say=lambda m: print(m, file=sys.stderr, flush=True),
                           save=lambda r: write_results(r, opts.output_dir))
    finally:
        signal.signal(signal.SIGTERM, previous)
    json_path, md_path = write_results(result, opts.output_dir)
    print(format_markdown(result))
    print(f"written: {json_path} and {md_path}")
    if result.interrupted:
        return 143 if result.interrupted_by == "SIGTERM" else 130
    failed = [*result.failed, *(f"{part} ({', '.join(cases)})" for part, cases in result.failed_cases.items())]
    if failed:
        print(f"raysent bench: failed: {'; '.join(failed)} (the others were measured and written)", file=sys.stderr)
        return 1
    return 0
