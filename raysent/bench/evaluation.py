"""``raysent bench`` part 2: the 7-set STS evaluation, raysent's evaluator against
sentence-transformers' ``EmbeddingSimilarityEvaluator`` on the same model, scores compared.

Both embed with the same encoder weights, mean pooling and maximum length, in this process, on the
same threads. raysent's side is :func:`raysent.eval.sts.evaluate_sts` as `raysent eval` runs it
(reading the data files included); sentence-transformers' side is one
``EmbeddingSimilarityEvaluator`` per set (its default batch size, cosine only) on pairs already in
memory. Each side runs ``repeats`` times, alternating, and the fastest run counts.
"""

from __future__ import annotations

import time

from raysent.bench.result import EvaluationResult, EvaluationSeconds, ScoreComparison, SentencesEmbedded
from raysent.data import STS_TASKS, load
from raysent.eval.results import StsResult

# Lazy imports: sentence_transformers, torch, raysent's heavier modules (heavy, and only the functions that need them
# import them).

SCORE_TOLERANCE = 0.01  # Spearman x100: the two may differ only by float rounding of the embeddings


def bench_evaluation(model: str, max_length: int = 256, repeats: int = 2, tasks=STS_TASKS,
                     say=lambda m: None) -> EvaluationResult:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator
    from sentence_transformers.sentence_transformer.modules import Pooling

    from raysent.eval.sts import evaluate_sts
    from raysent.eval.suite import make_encode
    from raysent.models.encoder import Encoder
    from raysent.models.locate import resolve_model

    encoder = Encoder.load(model)
    encoder.eval()
    ours_encode = make_encode(encoder, "mean", max_length=max_length)
    path, _ = resolve_model(model)
    st = SentenceTransformer(path, device="cuda" if torch.cuda.is_available() else "cpu")
    st.max_seq_length = max_length
    pooling = [m.get_config_dict() for m in st if isinstance(m, Pooling)]
    if not pooling or pooling[0].get("pooling_mode", pooling[0].get("pooling_mode_mean_tokens") and "mean") != "mean":
        raise RuntimeError(f"sentence-transformers loads {path} without mean pooling; the comparison needs the same "
                           "pooling on both sides")
    data = {t: load(t, "scored_pairs") for t in tasks}
    evaluators = [EmbeddingSimilarityEvaluator(list(d.sentence1), list(d.sentence2), [float(s) for s in d.scores],
                                               main_similarity="cosine", similarity_fn_names=["cosine"],
                                               name=t, write_csv=False) for t, d in data.items()]
    if repeats < 1:
        raise ValueError(f"repeats {repeats}: at least one evaluation is timed")
    ours_times, st_times = [], []
    ours: StsResult | None = None
    theirs: dict[str, dict[str, float]] = {}
    for r in range(repeats):
        say(f"  evaluation {r + 1}/{repeats}: raysent")
        t0 = time.perf_counter()
        ours = evaluate_sts(ours_encode, tasks=list(tasks), aggregation="all")  # reads the files too
        ours_times.append(time.perf_counter() - t0)
        say(f"  evaluation {r + 1}/{repeats}: sentence-transformers")
        t0 = time.perf_counter()
        theirs = {ev.name: ev(st) for ev in evaluators}
        st_times.append(time.perf_counter() - t0)
    rows = {}
    for t in tasks:
        assert ours is not None  # repeats >= 1
        a = ours.tasks[t].spearman_all
        b = theirs[t][f"{t}_spearman_cosine"] * 100.0
        rows[t] = ScoreComparison(raysent=a, sentence_transformers=b, difference=a - b)
    n_sentences = sum(2 * len(d) for d in data.values())
    distinct = len({s for d in data.values() for s in d.sentences()})
    return EvaluationResult(
        model=model, max_length=max_length, repeats=repeats,
        raysent_seconds=min(ours_times), sentence_transformers_seconds=min(st_times),
        all_seconds=EvaluationSeconds(raysent=ours_times, sentence_transformers=st_times),
        speedup=min(st_times) / min(ours_times),
        scores=rows, max_abs_difference=max(abs(r.difference) for r in rows.values()),
        equal_scores=all(abs(r.difference) <= SCORE_TOLERANCE for r in rows.values()),
        tolerance=SCORE_TOLERANCE,
        sentences_embedded=SentencesEmbedded(raysent=distinct, sentence_transformers=n_sentences),
    )
