"""The methods' descriptions (raysent.methods.spec, read by raysent.config before torch loads) are the one registry:
each spec's implementation is its subclass and takes its description from it, and reading them imports no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from raysent.config import METHOD_NAMES
from raysent.methods import METHODS, SPECS


def test_the_torch_free_names_are_the_registry_in_its_order():
    assert tuple(METHODS) == tuple(SPECS) == METHOD_NAMES
    assert all(METHODS[n].__module__ == SPECS[n].implementation.partition(":")[0] for n in SPECS)


def test_an_implementation_that_is_not_its_specs_subclass_is_refused():
    from raysent.methods.registry import _implementation
    from raysent.methods.spec import SimCSEUnsupSpec

    class Wrong(SimCSEUnsupSpec):
        implementation = "raysent.methods.sbert_nli:SBERTNLI"

    with pytest.raises(TypeError, match="must subclass Wrong and Method"):
        _implementation(Wrong)


def test_each_method_takes_its_description_from_its_spec():
    for name, cls in METHODS.items():
        spec = SPECS[name]
        assert issubclass(cls, spec), name
        for attr in ("name", "paper", "summary", "Params", "kind", "seeds", "variants", "train_defaults",
                     "supports_grad_cache", "trains"):
            assert getattr(cls, attr) == getattr(spec, attr), (name, attr)
        params = spec.Params()
        assert cls.defaults(params) == spec.defaults(params) and cls.data_kind(params) == spec.data_kind(params)


def test_validating_an_experiment_imports_no_torch():
    code = ("import sys\nfrom raysent.config import parse_config\n"
            "for name in ('simcse-unsup', 'consert', 'layeratt', 'sg-opt', 'supcon', 'baseline'):\n"
            "    parse_config({'name': 'x', 'method': name, 'model': {'name': 'm'}, 'data': {'train': 'snli'}})\n"
            "print(sorted(m for m in ('torch', 'transformers', 'ray', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
