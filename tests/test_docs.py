"""The code in docs/how-it-works.md runs as written (blocks share one namespace, in order)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "how-it-works.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_doc_has_examples() -> None:
    assert len(_blocks()) >= 5


def test_how_it_works_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path))
    namespace: dict[str, object] = {}
    for i, block in enumerate(_blocks()):
        try:
            exec(compile(block, f"{DOC.name}[block {i}]", "exec"), namespace)  # noqa: S102 - our own doc
        except Exception as exc:  # pragma: no cover - the failure message is the point
            raise AssertionError(f"docs/how-it-works.md block {i} failed: {exc!r}\n{block}") from exc


SEARCH_DOC = Path(__file__).resolve().parents[1] / "docs" / "search.md"


def test_search_doc_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", SEARCH_DOC.read_text(), flags=re.S)
    assert blocks
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, SEARCH_DOC.name, "exec"), namespace)  # noqa: S102 - our own doc
    assert namespace["result"].best is not None  # type: ignore[attr-defined]
