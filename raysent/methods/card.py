"""The model card: README.md in every model folder raysent saves, in the sentence-transformers style.

It says what the model is (the method with its paper and BibTeX, the base model, the training data, with
transductive training flagged), how it was trained (every hyperparameter, the seed, the best dev score and
its step), how to load it (sentence-transformers, raysent, transformers), and, once a search has run its
final phase, the search's mean ± std table against the paper's setting (:func:`write_card`'s ``results``).
Everything comes from the folder's ``raysent.json``. Imports no Ray and no MLflow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raysent.config import hyperparameters, parse_config
from raysent.methods.spec import SPECS

CARD = "README.md"
RESULTS_START, RESULTS_END = "<!-- raysent-results -->", "<!-- /raysent-results -->"


def _front_matter(meta: dict, method: str) -> str:
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "raysent", method]
    lines = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity", "tags:",
             *(f"- {t}" for t in tags)]
    base = (meta.get("config") or {}).get("model", {}).get("name")
    if base and "/" in base and not base.startswith((".", "/", "~")):  # a hub id, not a local folder
        lines.append(f"base_model: {base}")
    return "\n".join([*lines, "---"])


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v)
    return str(v)


def model_card(meta: dict, results: str | None = None) -> str:
    """The card of a model folder whose ``raysent.json`` is ``meta`` (``results``: a markdown section)."""
    name = meta.get("method") or "unknown"
    cls = SPECS.get(name)
    raw = meta.get("config") or {}
    cfg = parse_config(raw, source="raysent.json", check_search=False) if raw else None
    data = meta.get("data") or {}
    st = meta.get("sentence_transformers") or {}
    needs_raysent = bool(st.get("needs_raysent"))
    transductive = data.get("transductive")
    base = cfg.model.name if cfg else "?"
    title = f"{cfg.name}: {name} on {base}" if cfg else f"{name} model"
    out = [_front_matter(meta, name), "", f"# {title}", ""]
    if cls is not None:
        paper = f"{cls.paper}" + (f", [arXiv:{cls.arxiv}](https://arxiv.org/abs/{cls.arxiv})" if cls.arxiv else "")
        out += [f"A sentence encoder trained by raysent with **{name}**: "
                f"{cls.summary}.", "", f"- **Method**: {paper}"]
    else:
        out += [f"A sentence encoder saved by raysent (method {name}).", ""]
    out += [f"- **Base model**: `{base}`",
            f"- **Training data**: `{data.get('spec') or (cfg.data.train if cfg else '?')}`"
            + (f" ({data['examples']:,} examples)" if data.get("examples") else ""),
            ]
    if transductive:
        out.append("- **Transductive**: yes. It was trained on the unlabelled text of evaluation sets; its scores "
                   "on those sets are not comparable with inductive results.")
    elif transductive is False:
        out.append("- **Transductive**: no")
    out += [f"- **Pooling**: `{meta.get('pooling')}` (raysent's name; the sentence-transformers modules below "
            "compute the same vectors)",
            f"- **Max sequence length**: {st.get('max_length', '?')} tokens",
            "- **sentence-transformers modules**: "
            + ", ".join(f"`{m.rsplit('.', 1)[-1]}`" for m in st.get("modules", []))]
    if needs_raysent:
        out.append("- **Needs raysent**: this pooling is computed by raysent's own sentence-transformers module "
                   "(`raysent.models.st_pooling.RaysentPooling`): install raysent and load with "
                   "`trust_remote_code=True`.")
    out += ["", "## Training", ""]
    if cfg is not None:
        hp = {k: v for k, v in hyperparameters(cfg).items() if k not in ("method", "model", "train_data")}
        params = meta.get("params") or {}
        hp.update(params)
        out += ["| hyperparameter | value |", "| :--- | :--- |",
                *(f"| `{k}` | {_value(v)} |" for k, v in sorted(hp.items()) if v is not None)]
        seeds = meta.get("seeds")
        out += ["", f"Seed {cfg.train.seed}" + (f" (the final phase ran seeds {seeds})" if seeds else "")
                + (f"; best dev Spearman ×100 {meta['dev_spearman']:.2f} at step {meta.get('step')} "
                   f"({', '.join(cfg.data.dev)})" if isinstance(meta.get("dev_spearman"), (int, float)) else "")
                + "."]
    if results:
        out += ["", RESULTS_START, results.strip(), RESULTS_END]
    load = "SentenceTransformer(path, trust_remote_code=True)" if needs_raysent else "SentenceTransformer(path)"
    out += ["", "## Usage", "", "```python",
            *(["# pip install raysent  (this pooling is raysent's own module)"] if needs_raysent else []),
            "from sentence_transformers import SentenceTransformer", "",
            "path = \"path/to/this/folder\"",
            f"model = {load}",
            "embeddings = model.encode([\"A man is playing a guitar.\", \"Someone plays an instrument.\"])",
            "print(model.similarity(embeddings, embeddings))", "```", "", "With raysent:", "", "```python",
            "import raysent", "", "model = raysent.load(\"path/to/this/folder\")",
            "embeddings = model.encode([\"A man is playing a guitar.\"])  # numpy array", "```", "",
            "`raysent eval --model path/to/this/folder` prints its STS table. The folder is also a plain "
            "`save_pretrained` folder (`transformers.AutoModel`), without the pooling."]
    if cls is not None and cls.citation:
        out += ["", "## Citation", "", "```bibtex", cls.citation, "```"]
    return "\n".join(out) + "\n"


def write_card(folder: str | Path, results: str | None = None) -> Path:
    """Write (or rewrite) README.md of a saved model folder from its raysent.json; ``results`` (markdown) is
    kept in the card until a later call replaces it."""
    folder = Path(folder)
    meta = json.loads((folder / "raysent.json").read_text())
    card = folder / CARD
    if results is None and card.is_file():  # keep the results a search wrote
        text = card.read_text()
        if RESULTS_START in text and RESULTS_END in text:
            results = text.split(RESULTS_START, 1)[1].split(RESULTS_END, 1)[0]
    card.write_text(model_card(meta, results))
    return card
