"""The registered methods, by name: each spec of :mod:`raysent.methods.spec` with its model (imports torch)."""

from __future__ import annotations

from raysent.methods.base import Method
from raysent.methods.baseline import Baseline
from raysent.methods.consert import ConSERT
from raysent.methods.layeratt import LayerAtt
from raysent.methods.sbert_nli import SBERTNLI
from raysent.methods.sg import SelfGuided, SelfGuidedOpt
from raysent.methods.simcse_sup import SimCSESup
from raysent.methods.simcse_unsup import SimCSEUnsup
from raysent.methods.spec import get_spec
from raysent.methods.supcon import SupCon

METHODS: dict[str, type[Method]] = {
    cls.name: cls
    for cls in (
        SimCSEUnsup,
        SimCSESup,
        SelfGuided,
        SelfGuidedOpt,
        ConSERT,
        LayerAtt,
        SupCon,
        SBERTNLI,
        Baseline,
    )
}


def get_method(name: str) -> type[Method]:
    get_spec(name)  # an unknown name: the one error, which lists the allowed names
    return METHODS[name]
