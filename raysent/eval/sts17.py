"""Multilingual and cross-lingual STS: SemEval-2017 Task 1 (Cer et al. 2017), 250 pairs a track.

The SG-BERT paper (Kim et al. 2021) reports Pearson's r ×100 of cosine similarity on the STS17
tracks; Spearman's ρ ×100 is recorded beside it. The tracks are the ``sts17`` data set's splits
(:mod:`raysent.data.datasets`): ar-ar, ar-en, es-es, es-en.track4a, es-en.track4b, en-en (tr-en is
not in the local data: its input and gold files disagree in length). Cross-lingual tracks pair a
sentence in the first language with one in the second.

Every distinct sentence of the requested tracks is embedded once. Imports no Ray and no MLflow.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from raysent.data import load
from raysent.data.datasets import DATASETS, ScoredPairs
from raysent.errors import RaysentError, did_you_mean
from raysent.eval.results import Sts17Result, Sts17Track
from raysent.eval.sts import score_pairs

STS17_TRACKS = tuple(DATASETS["sts17"].local)  # ar-ar ar-en es-es es-en.track4a es-en.track4b en-en


def evaluate_sts17(
    encode: Callable[[Sequence[str]], np.ndarray],
    tracks: Sequence[str] = STS17_TRACKS,
    max_samples: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Sts17Result:
    """Pearson and Spearman ×100 of cosine vs gold on each track; ``avg`` = mean Pearson.

    ``max_samples`` keeps only the first N pairs of each track (a quick check, noted).
    """
    t0 = time.perf_counter()
    for t in tracks:
        if t not in STS17_TRACKS:
            raise RaysentError(f"unknown STS17 track {t!r}{did_you_mean(t, STS17_TRACKS)}; "
                               f"allowed: {', '.join(STS17_TRACKS)}")
    sets: dict[str, ScoredPairs] = {t: load(f"sts17:{t}", "scored_pairs") for t in tracks}
    notes = [n for d in sets.values() for n in d.notes]
    if max_samples is not None:
        for t, d in list(sets.items()):
            if len(d) > max_samples:
                notes.append(f"sts17 {t}: only the first {max_samples:,} of {len(d):,} pairs (max_samples)")
                sets[t] = ScoredPairs(name=d.name, source=d.source, sentence1=d.sentence1[:max_samples],
                                      sentence2=d.sentence2[:max_samples], scores=d.scores[:max_samples],
                                      subsets=d.subsets[:max_samples])
    sentences = list(dict.fromkeys(s for d in sets.values() for s in d.sentences()))
    if progress:
        progress(f"sts17: embedding {len(sentences):,} distinct sentences of {len(sets)} track(s)")
    vectors = dict(zip(sentences, encode(sentences)))
    out = {}
    for t, d in sets.items():
        r = score_pairs(vectors, d)
        out[t] = Sts17Track(pearson=r.pearson_all, spearman=r.spearman_all, n=r.n, source=d.source)
    return Sts17Result(tracks=out, avg=float(np.mean([r.pearson for r in out.values()])),
                       avg_spearman=float(np.mean([r.spearman for r in out.values()])), notes=notes,
                       seconds=time.perf_counter() - t0)
