"""README.md's examples stay true: every ```python block runs, and every ``gensorage`` command line parses.

The Python blocks run in order in one namespace (later blocks may use earlier names), from a scratch directory
with a scratch ``GENSORAGE_HOME``, so they neither read nor leave results in the user's store. A block right
after an HTML comment ``<!-- readme-test: skip -->`` is not run (for examples that need a GPU or hours);
the marker should be rare and say why next to it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gensorage.cli import _build_parser

README = Path(__file__).resolve().parents[1] / "README.md"
SKIP_MARK = "<!-- readme-test: skip -->"
_BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


def blocks(text: str, lang: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of every fenced block in ``lang``, unless preceded by the skip marker."""
    out = []
    for m in _BLOCK.finditer(text):
        if m.group(1) != lang:
            continue
        before = text[: m.start()].rstrip()
        if before.endswith(SKIP_MARK):
            continue
        out.append((text.count("\n", 0, m.start()) + 1, m.group(2)))
    return out


def test_block_extraction() -> None:
    """The extractor itself: finds python and shell blocks, honours the skip marker."""
    text = (
        "intro\n```python\nx = 1\n```\n\n" + SKIP_MARK + "\n```python\nraise SystemExit\n```\n"
        "```bash\ngensorage hw list\n```\n"
    )
    assert blocks(text, "python") == [(2, "x = 1\n")]
    assert blocks(text, "bash") == [(10, "gensorage hw list\n")]


def _readme() -> str:
    if not README.is_file():
        pytest.skip("README.md is not written yet")
    return README.read_text(encoding="utf-8")


def test_readme_python_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code_blocks = blocks(_readme(), "python")
    if not code_blocks:
        pytest.skip("README.md has no python examples")
    monkeypatch.setenv("GENSORAGE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for line, code in code_blocks:
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)  # noqa: S102 - the README's own examples
        except Exception as exc:
            pytest.fail(f"README.md python block at line {line} failed: {type(exc).__name__}: {exc}")


def _commands(text: str) -> list[tuple[int, list[str]]]:
    cmds = []
    for line, code in blocks(text, "bash") + blocks(text, "sh") + blocks(text, "console"):
        for k, raw in enumerate(code.splitlines()):
            cmd = raw.strip().removeprefix("$ ").strip()
            if cmd.startswith("gensorage ") or cmd.startswith("python -m gensorage "):
                argv = shlex.split(cmd.split(" #")[0])
                cmds.append((line + 1 + k, argv[argv.index("gensorage") + 1 :]))
    return cmds


def test_readme_command_lines_parse() -> None:
    """Every ``gensorage ...`` line in a shell block names a real subcommand with options it accepts."""
    cmds = _commands(_readme())
    if not cmds:
        pytest.skip("README.md has no gensorage command lines")
    parser = _build_parser()
    for line, argv in cmds:
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code not in (0, None):  # --help / --version exit 0
                pytest.fail(f"README.md line {line}: 'gensorage {' '.join(argv)}' does not parse")
