"""SentEval transfer tasks: a classifier probe on frozen sentence embeddings, SentEval's protocol.

Reported by SG-OPT (Kim et al. 2021, Table 4) and SupCon (Liao 2021, Table 3): MR, CR, SUBJ, MPQA,
SST-2, TREC, MRPC; test accuracy ×100 (and F1 for MRPC).

Protocol (Conneau & Kiela 2018; ``senteval/tools/validation.py``, reproduced here fold for fold):

* **MR, CR, SUBJ, MPQA** (``inner_kfold``): 10-fold stratified cross-validation (shuffled, seed
  1111); inside each outer training fold, a second 10-fold CV picks the L2 regularisation; the
  classifier is refit on the outer training fold and scored on the held-out fold; the number is
  the mean over the 10 outer folds.
* **SST-2** (``split``): the regularisation is picked on dev; test accuracy of that model.
* **TREC, MRPC** (``kfold``): k-fold CV on train picks the regularisation; refit on all of train,
  scored on test. MRPC's features are SentEval's ``(|u-v|, u*v)`` (``senteval/mrpc.py``);
  ``mrpc_features='full'`` gives ``(u, v, |u-v|, u*v)`` (SBERT's classifier input) instead.
* Data order: SentEval sorts each split by (tokens, label) before embedding and draws its folds on
  that order (:func:`raysent.data.transfer.senteval_order`); so do we, so the folds are SentEval's.
* Features are the raw embeddings: SentEval does **not** standardise or normalise them.
* Classifiers: ``logreg`` = scikit-learn ``LogisticRegression(C=reg, random_state=seed)`` with
  scikit-learn's defaults (SentEval's ``usepytorch=False`` path), C from ``2**-2 .. 2**3``
  (``2**-1 .. 2**5`` for the k-fold tasks); ``mlp`` = SentEval's PyTorch MLP (one hidden sigmoid
  layer of ``nhid`` units, default 50; Adam, batch 64, early stopping with tenacity 5, epoch size 4),
  weight decay from ``1e-5 .. 1e-2``. ``nhid=0`` is SentEval's PyTorch logistic regression
  (SimCSE's and SG-OPT's evaluation setting).
* Scores are rounded to two decimals where SentEval rounds them (the regularisation choice is made
  on rounded scores; ties go to the first, i.e. the strongest regularisation).

Speed on CPU: every distinct sentence is embedded once (through the caller's encoder, cached by
:mod:`raysent.eval.suite`); the probe's fits run with one BLAS thread each (much faster than
several for these small problems), optionally ``n_jobs`` in parallel. MR with 10-fold CV is
600 + 10 logistic-regression fits.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from raysent.data.transfer import TRANSFER_TASKS, LabelledPairs, get_task, load_task, senteval_order
from raysent.errors import RaysentError
from raysent.eval.results import SentEvalResult, SentEvalTaskScore

# Lazy imports: joblib, sklearn, threadpoolctl, torch (heavy, and only the functions that need them import them).

log = logging.getLogger(__name__)

SENTEVAL_TASKS = tuple(TRANSFER_TASKS)  # MR CR SUBJ MPQA SST2 TREC MRPC (SentEval's names)
CLASSIFIERS = ("logreg", "mlp")
MRPC_FEATURES = ("senteval", "full")


@dataclass
class ProbeConfig:
    """The probe's settings (SentEval's names where SentEval has one)."""

    classifier: str = "logreg"
    kfold: int = 10  # SentEval's default is 5 ("prototyping"); the papers use 10
    seed: int = 1111  # SentEval's seed
    nhid: int = 50  # mlp only; 0 = PyTorch logistic regression
    optim: str = "adam"
    batch_size: int = 64
    tenacity: int = 5
    epoch_size: int = 4
    max_epoch: int = 200
    dropout: float = 0.0
    n_jobs: int = 1  # parallel fits (outer folds / regularisation values)
    threads: int = 1  # BLAS / torch threads per fit

    def check(self) -> ProbeConfig:
        if self.classifier not in CLASSIFIERS:
            raise RaysentError(f"unknown probe classifier {self.classifier!r}; allowed: {', '.join(CLASSIFIERS)}")
        if self.kfold < 2:
            raise RaysentError(f"kfold must be at least 2, got {self.kfold}")
        if self.nhid < 0 or self.n_jobs < 1 or self.threads < 1:
            raise RaysentError("nhid must be >= 0, n_jobs and threads >= 1")
        return self

    @property
    def name(self) -> str:
        if self.classifier == "logreg":
            return "sklearn-LogReg"
        return f"pytorch-MLP-nhid{self.nhid}-{self.optim}-bs{self.batch_size}"


def reg_grid(classifier: str, protocol: str) -> list[float]:
    """SentEval's regularisation grid: C of LogisticRegression, or the MLP's weight decay."""
    if classifier == "mlp":
        return [10.0 ** t for t in range(-5, -1)]
    if protocol == "kfold":
        return [2.0 ** t for t in range(-1, 6)]
    return [2.0 ** t for t in range(-2, 4)]


# --------------------------------------------------------------------------- SentEval's MLP
def _optimizer(spec: str, params, weight_decay: float):
    """SentEval's ``get_optimizer``: 'adam', 'sgd,lr=0.1', 'rmsprop', ... (torch defaults otherwise)."""
    import torch

    name, *rest = [p.strip() for p in spec.split(",")]
    kwargs = {}
    for item in rest:
        k, _, v = item.partition("=")
        kwargs[k.strip()] = float(v)
    table = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD, "rmsprop": torch.optim.RMSprop,
             "adagrad": torch.optim.Adagrad, "adadelta": torch.optim.Adadelta, "adamax": torch.optim.Adamax}
    if name not in table:
        raise RaysentError(f"unknown optimizer {name!r} for the MLP probe; allowed: {', '.join(table)}")
    if name == "sgd" and "lr" not in kwargs:
        kwargs["lr"] = 0.1
    return table[name](params, weight_decay=weight_decay, **kwargs)


class SentEvalMLP:
    """SentEval's ``PyTorchClassifier`` + ``MLP`` (senteval/tools/classifier.py) on the CPU.

    Linear(d, nhid) -> Dropout -> Sigmoid -> Linear(nhid, classes) (``nhid=0``: one Linear layer),
    cross-entropy, weight decay = the regularisation. Trains ``epoch_size`` passes at a time and
    keeps the model with the best validation accuracy; stops after ``tenacity`` non-improving
    rounds or ``max_epoch`` passes. Validation is the given set, or a random ``validation_split``
    of the training data. Seeding is local (no change to the global RNGs). Differences from the
    original: the loss is the batch mean (SentEval's ``size_average = False`` attribute has no
    effect in current PyTorch either), and everything runs on the CPU.
    """

    def __init__(self, cfg: ProbeConfig, inputdim: int, nclasses: int, l2reg: float):
        import torch
        from torch import nn

        self.cfg = cfg
        self.rng = np.random.RandomState(cfg.seed)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            if cfg.nhid == 0:
                self.model = nn.Sequential(nn.Linear(inputdim, nclasses))
            else:
                self.model = nn.Sequential(nn.Linear(inputdim, cfg.nhid), nn.Dropout(p=cfg.dropout), nn.Sigmoid(),
                                           nn.Linear(cfg.nhid, nclasses))
        self.loss_fn = nn.CrossEntropyLoss()
        self.optimizer = _optimizer(cfg.optim, self.model.parameters(), weight_decay=l2reg)

    def fit(self, X, y, validation_data=None, validation_split: float | None = None) -> float:
        import torch

        if validation_data is not None:
            trainX, trainy = X, y
            devX, devy = validation_data
        else:
            assert validation_split is not None, "fit needs validation_data or validation_split"
            perm = self.rng.permutation(len(X))
            cut = int(validation_split * len(X))
            trainX, trainy, devX, devy = X[perm[cut:]], y[perm[cut:]], X[perm[:cut]], y[perm[:cut]]
        tX = torch.as_tensor(np.asarray(trainX, dtype=np.float32))
        ty = torch.as_tensor(np.asarray(trainy, dtype=np.int64))
        nepoch, best, best_state, stop, count = 0, -1.0, None, False, 0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.seed)
            while not stop and nepoch <= self.cfg.max_epoch:
                self.model.train()
                for _ in range(self.cfg.epoch_size):
                    order = torch.as_tensor(self.rng.permutation(len(tX)))
                    for i in range(0, len(tX), self.cfg.batch_size):
                        idx = order[i: i + self.cfg.batch_size]
                        loss = self.loss_fn(self.model(tX[idx]), ty[idx])
                        self.optimizer.zero_grad()
                        loss.backward()
                        self.optimizer.step()
                nepoch += self.cfg.epoch_size
                acc = self.score(devX, devy)
                if acc > best:
                    best, best_state = acc, copy.deepcopy(self.model.state_dict())
                else:
                    if count >= self.cfg.tenacity:
                        stop = True
                    count += 1
        if best_state is not None:
            self.model.load_state_dict(best_state)
        return best

    def predict(self, X) -> np.ndarray:
        import torch

        self.model.eval()
        out = []
        with torch.no_grad():
            tX = torch.as_tensor(np.asarray(X, dtype=np.float32))
            for i in range(0, len(tX), self.cfg.batch_size):
                out.append(self.model(tX[i: i + self.cfg.batch_size]).argmax(1).numpy())
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def score(self, X, y) -> float:
        return float((self.predict(X) == np.asarray(y)).mean()) if len(y) else 0.0


# --------------------------------------------------------------------------- one fit
@contextlib.contextmanager
def _single_threaded(threads: int):
    """Limit BLAS/OpenMP and torch threads for the probe's many small fits."""
    from threadpoolctl import threadpool_limits

    before: int | None = None  # torch's threads, restored after (None: torch is not installed)
    try:
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(threads)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        if before is not None:
            torch.set_num_threads(before)


def _fit(cfg: ProbeConfig, reg: float, X, y, nclasses: int, validation_data=None, validation_split=None):
    """One classifier fitted as SentEval does; returns (model, 1 if it did not converge else 0)."""
    if cfg.classifier == "logreg":
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression

        clf = LogisticRegression(C=reg, random_state=cfg.seed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            clf.fit(X, y)
        return clf, int(any(issubclass(w.category, ConvergenceWarning) for w in caught))
    clf = SentEvalMLP(cfg, X.shape[1], nclasses, reg)
    clf.fit(X, y, validation_data=validation_data, validation_split=validation_split)
    return clf, 0


def _parallel(fn, jobs: list[tuple], n_jobs: int) -> list:
    if n_jobs == 1 or len(jobs) == 1:
        return [fn(*j) for j in jobs]
    from joblib import Parallel, delayed

    return Parallel(n_jobs=n_jobs, backend="loky")(delayed(fn)(*j) for j in jobs)


# --------------------------------------------------------------------------- the three protocols
def _inner_fold(X, y, train_idx, test_idx, regs, cfg: ProbeConfig, nclasses: int) -> dict:
    from sklearn.model_selection import StratifiedKFold

    with _single_threaded(cfg.threads):
        Xtr, ytr = X[train_idx], y[train_idx]
        inner = list(StratifiedKFold(n_splits=cfg.kfold, shuffle=True, random_state=cfg.seed).split(Xtr, ytr))
        scores, not_converged = [], 0
        for reg in regs:
            accs = []
            for itr, ite in inner:
                clf, nc = _fit(cfg, reg, Xtr[itr], ytr[itr], nclasses, validation_data=(Xtr[ite], ytr[ite]))
                not_converged += nc
                accs.append(clf.score(Xtr[ite], ytr[ite]))
            scores.append(round(100 * float(np.mean(accs)), 2))
        best = int(np.argmax(scores))
        clf, nc = _fit(cfg, regs[best], Xtr, ytr, nclasses, validation_split=0.05)
        test = round(100 * float(clf.score(X[test_idx], y[test_idx])), 2)
    return {"dev": scores[best], "test": test, "reg": regs[best], "scores": scores,
            "not_converged": not_converged + nc, "fits": len(regs) * len(inner) + 1}


def inner_kfold(X: np.ndarray, y: np.ndarray, cfg: ProbeConfig, nclasses: int) -> dict:
    """SentEval's ``InnerKFoldClassifier`` (MR, CR, SUBJ, MPQA): nested k-fold CV."""
    from sklearn.model_selection import StratifiedKFold

    regs = reg_grid(cfg.classifier, "inner_kfold")
    outer = StratifiedKFold(n_splits=cfg.kfold, shuffle=True, random_state=cfg.seed).split(X, y)
    folds = _parallel(_inner_fold, [(X, y, tr, te, regs, cfg, nclasses) for tr, te in outer], cfg.n_jobs)
    return {"devacc": round(float(np.mean([f["dev"] for f in folds])), 2),
            "acc": round(float(np.mean([f["test"] for f in folds])), 2),
            "regs": [f["reg"] for f in folds], "fold_acc": [f["test"] for f in folds],
            "not_converged": sum(f["not_converged"] for f in folds), "fits": sum(f["fits"] for f in folds)}


def _kfold_reg(X, y, splits, reg, cfg: ProbeConfig, nclasses: int) -> tuple[float, int]:
    with _single_threaded(cfg.threads):
        accs, not_converged = [], 0
        for tr, te in splits:
            clf, nc = _fit(cfg, reg, X[tr], y[tr], nclasses, validation_data=(X[te], y[te]))
            not_converged += nc
            accs.append(clf.score(X[te], y[te]))
    return round(100 * float(np.mean(accs)), 2), not_converged


def kfold(Xtr: np.ndarray, ytr: np.ndarray, Xte: np.ndarray, yte: np.ndarray, cfg: ProbeConfig,
          nclasses: int) -> dict:
    """SentEval's ``KFoldClassifier`` (TREC, MRPC): k-fold CV on train picks the regularisation."""
    from sklearn.model_selection import StratifiedKFold

    regs = reg_grid(cfg.classifier, "kfold")
    splits = list(StratifiedKFold(n_splits=cfg.kfold, shuffle=True, random_state=cfg.seed).split(Xtr, ytr))
    res = _parallel(_kfold_reg, [(Xtr, ytr, splits, reg, cfg, nclasses) for reg in regs], cfg.n_jobs)
    scores = [r[0] for r in res]
    best = int(np.argmax(scores))
    with _single_threaded(cfg.threads):
        clf, nc = _fit(cfg, regs[best], Xtr, ytr, nclasses, validation_split=0.05)
        yhat = clf.predict(Xte)
    return {"devacc": scores[best], "acc": round(100 * float((yhat == yte).mean()), 2), "reg": regs[best],
            "scores": scores, "yhat": yhat, "not_converged": sum(r[1] for r in res) + nc,
            "fits": len(regs) * len(splits) + 1}


def _split_reg(Xtr, ytr, Xdev, ydev, reg, cfg: ProbeConfig, nclasses: int):
    with _single_threaded(cfg.threads):
        clf, nc = _fit(cfg, reg, Xtr, ytr, nclasses, validation_data=(Xdev, ydev))
        return round(100 * float(clf.score(Xdev, ydev)), 2), clf, nc


def split(Xtr, ytr, Xdev, ydev, Xte, yte, cfg: ProbeConfig, nclasses: int) -> dict:
    """SentEval's ``SplitClassifier`` (SST-2): the regularisation is picked on dev.

    SentEval refits the chosen configuration from scratch with the same seed; both classifiers are
    deterministic, so the model fitted during the search is reused (same result, one fit less).
    """
    regs = reg_grid(cfg.classifier, "split")
    res = _parallel(_split_reg, [(Xtr, ytr, Xdev, ydev, reg, cfg, nclasses) for reg in regs], cfg.n_jobs)
    scores = [r[0] for r in res]
    best = int(np.argmax(scores))
    with _single_threaded(cfg.threads):
        acc = round(100 * float(res[best][1].score(Xte, yte)), 2)
    return {"devacc": scores[best], "acc": acc, "reg": regs[best], "scores": scores,
            "not_converged": sum(r[2] for r in res), "fits": len(regs)}


# --------------------------------------------------------------------------- features and tasks
def features(data, vectors: dict[str, np.ndarray], mrpc_features: str = "senteval") -> np.ndarray:
    """The classifier input of each row: the sentence vector, or SentEval's pair features."""
    if isinstance(data, LabelledPairs):
        u = np.stack([vectors[s] for s in data.sentence1])
        v = np.stack([vectors[s] for s in data.sentence2])
        if mrpc_features == "senteval":
            return np.c_[np.abs(u - v), u * v]
        return np.c_[u, v, np.abs(u - v), u * v]
    return np.stack([vectors[s] for s in data.texts])


def run_task(name: str, splits: dict, vectors: dict[str, np.ndarray], cfg: ProbeConfig,
             mrpc_features: str = "senteval") -> SentEvalTaskScore:
    """One task on already-embedded sentences (``vectors``: sentence -> vector)."""
    task = get_task(name)
    t0 = time.perf_counter()
    ordered = {s: d.subset(senteval_order(d)) for s, d in splits.items()}
    X = {s: features(d, vectors, mrpc_features) for s, d in ordered.items()}
    y = {s: d.labels for s, d in ordered.items()}
    if task.protocol == "inner_kfold":
        res = inner_kfold(X["all"], y["all"], cfg, task.nclasses)
        res.update(ndev=len(y["all"]), ntest=len(y["all"]))
    elif task.protocol == "split":
        res = split(X["train"], y["train"], X["dev"], y["dev"], X["test"], y["test"], cfg, task.nclasses)
        res.update(ntrain=len(y["train"]), ndev=len(y["dev"]), ntest=len(y["test"]))
    else:
        res = kfold(X["train"], y["train"], X["test"], y["test"], cfg, task.nclasses)
        yhat = res.pop("yhat")
        if task.name == "MRPC":
            from sklearn.metrics import f1_score

            res["f1"] = round(100 * float(f1_score(y["test"], yhat)), 2)
        res.update(ndev=len(y["train"]), ntest=len(y["test"]))
    res.update(protocol=task.protocol, features=X[next(iter(X))].shape[1],
               source=" + ".join(d.source for d in splits.values()),
               notes=[n for d in splits.values() for n in d.notes], seconds=time.perf_counter() - t0)
    if task.name == "MRPC":
        res["mrpc_features"] = mrpc_features
    return SentEvalTaskScore(**res)


def evaluate_senteval(
    encode: Callable[[Sequence[str]], np.ndarray],
    tasks: Sequence[str] = SENTEVAL_TASKS,
    classifier: str = "logreg",
    kfold: int = 10,
    seed: int = 1111,
    nhid: int = 50,
    mrpc_features: str = "senteval",
    max_samples: int | None = None,
    n_jobs: int = 1,
    threads: int = 1,
    progress: Callable[[str], None] | None = None,
    **mlp_options,
) -> SentEvalResult:
    """SentEval transfer accuracies (×100) of ``encode(sentences) -> [N, d]`` on ``tasks``.

    Returns a :class:`~raysent.eval.results.SentEvalResult`: per task ``acc``, ``devacc``, ``ndev``, ``ntest``, ...
    (MRPC also ``f1``), their ``avg``, the ``probe``. ``max_samples`` caps every split (a quick check, noted).
    """
    unknown = [t for t in mlp_options if t not in ("optim", "batch_size", "tenacity", "epoch_size", "max_epoch",
                                                   "dropout")]
    if unknown:
        raise RaysentError(f"unknown SentEval option(s) {', '.join(unknown)}; allowed: classifier, kfold, seed, "
                           "nhid, mrpc_features, max_samples, n_jobs, threads, optim, batch_size, tenacity, "
                           "epoch_size, max_epoch, dropout")
    if mrpc_features not in MRPC_FEATURES:
        raise RaysentError(f"unknown mrpc_features {mrpc_features!r}; allowed: {', '.join(MRPC_FEATURES)}")
    cfg = ProbeConfig(classifier=classifier, kfold=kfold, seed=seed, nhid=nhid, n_jobs=n_jobs, threads=threads,
                      **mlp_options).check()
    t0 = time.perf_counter()
    names = [get_task(t).name for t in tasks]
    data = {name: load_task(name, max_samples=max_samples) for name in names}
    sentences = list(dict.fromkeys(s for splits in data.values() for d in splits.values() for s in d.sentences()))
    if progress:
        progress(f"senteval: embedding {len(sentences):,} distinct sentences of {len(names)} task(s)")
    vectors = dict(zip(sentences, encode(sentences)))
    results = {}
    for name in names:
        if progress:
            progress(f"senteval: {name} ({TRANSFER_TASKS[name].protocol}, {cfg.name})")
        results[name] = run_task(name, data[name], vectors, cfg, mrpc_features)
        if results[name].not_converged:
            log.warning("senteval %s: %d of %d logistic-regression fits stopped at max_iter before converging "
                        "(scikit-learn's default, as in SentEval)", name, results[name].not_converged,
                        results[name].fits)
    probe = {k: v for k, v in asdict(cfg).items() if cfg.classifier == "mlp" or k not in
             ("nhid", "optim", "batch_size", "tenacity", "epoch_size", "max_epoch", "dropout")}
    probe["name"] = cfg.name
    return SentEvalResult(tasks=results, avg=float(np.mean([r.acc for r in results.values()])), probe=probe,
                          notes=[n for r in results.values() for n in r.notes], seconds=time.perf_counter() - t0)
