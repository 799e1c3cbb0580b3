"""The top-level names of the issues' contracts resolve to the right objects, whatever was imported before."""

from __future__ import annotations

import importlib
import inspect

import gensorage


def test_top_level_functions_are_not_shadowed_by_submodules() -> None:
    # Importing every subpackage first must not replace gensorage.tune / superoptimize / equivalent with a module.
    for name in (
        "tuning",
        "superopt",
        "verify",
        "program",
        "ugraph",
        "hw",
        "workloads",
        "markov",
        "exhaustive",
    ):
        importlib.import_module(f"gensorage.{name}")
    for name in ("tune", "superoptimize", "equivalent", "load_program", "load_profile"):
        assert inspect.isfunction(getattr(gensorage, name)), name
    assert inspect.isclass(gensorage.Program)
    assert inspect.isclass(gensorage.KernelGraph)
    assert callable(gensorage.workloads.gemm)


def test_unknown_attribute_is_an_attribute_error() -> None:
    try:
        gensorage.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
