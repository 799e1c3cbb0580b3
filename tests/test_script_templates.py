"""TVMScript kernels parsed once per skeleton (:mod:`gensorage.codegen.script_templates`): a text bound from its
skeleton's template is the PrimFunc TVM's parser makes of the text itself, at every shape."""

from __future__ import annotations

import contextlib

import pytest

from gensorage.codegen import script_templates
from gensorage.codegen.module import compile_ugraph
from gensorage.hw import load_profile
from gensorage.precision import DEFAULT_PRECISION
from gensorage.program import Program
from gensorage.ugraph import from_program

tvm = pytest.importorskip("tvm")
tvm_ffi = pytest.importorskip("tvm_ffi")


def test_skeleton_takes_out_integer_literals_and_the_name_only() -> None:
    text = (
        "@T.prim_func\n"
        'def kernel3_add(in0: T.Buffer((8, 16), "float32"), out0: T.Buffer((8, 16), "float32")):\n'
        '    T.func_attr({"global_symbol": "kernel3_add", "tir.noalias": True})\n'
        "    for bx in T.parallel(4):\n"
        "        for tx in T.serial(32):\n"
        "            out0[bx * 2 + tx // 16, tx % 16] = in0[bx * 2 + tx // 16, tx % 16] * T.float32(1e-06)"
        " + T.float32(2.5) + T.int64(4294967296)\n"
    )
    body, values = script_templates.skeleton(text, "kernel3_add")
    assert values == [8, 16, 8, 16, 4, 32, 2, 16, 16, 2, 16, 16]
    assert "kernel3_add" not in body and "in0" in body and "out0" in body and "bx" in body
    assert "1e-06" in body and "2.5" in body and "4294967296" in body  # floats and int64 literals stay
    assert body.count("c0_") == 2  # the parameter and its one use


def _programs(t: int) -> list[Program]:
    """Decoder-layer pieces whose kernels are TVMScript text: norms, RoPE-like slices, a causal-free softmax."""
    p = Program(name="rms")
    x, g = p.input("X", (t, 64), "float32"), p.input("G", (64,), "float32")
    p.output(p.mul(p.rms_norm(x), g))
    q = Program(name="rope")
    h = q.input("H", (2, t, 16), "float32")
    c = q.input("C", (t, 16), "float32")
    half = q.concat([q.slice(h, -1, 8, 16), q.slice(h, -1, 0, 8)], -1)
    q.output(q.add(q.mul(h, c), q.mul(half, c)))
    s = Program(name="softmax")
    y = s.input("Y", (2, t, t), "float32")
    e = s.exp(y)
    s.output(s.div(e, s.sum(e, -1)))
    return [p, q, s]


@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_templates_give_the_parsers_own_primfuncs_at_every_shape(
    target: str, deferred: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(script_templates, "_TEMPLATES", type(script_templates._TEMPLATES)())
    hw = load_profile("h100")
    texts = 0
    for t in (8, 12, 33, 64, 8, 57):  # multiples of the tiles and not; 8 again: a pending skeleton met again
        for p in _programs(t):
            with script_templates.deferred_templates() if deferred and t != 8 else contextlib.nullcontext():
                cg = compile_ugraph(from_program(p, DEFAULT_PRECISION), hw, target)  # type: ignore[arg-type]
            for k in cg.kernels():
                if k.script.lstrip().startswith(
                    "@T.prim_func\n"
                ):  # text kernels (scheduled ones are not parsed)
                    texts += 1
                    assert tvm_ffi.structural_equal(k.func, tvm.script.from_source(k.script)), k.name
    kept = script_templates._TEMPLATES
    print(f"{texts} texts, {len(kept)} skeletons, {sum(v is None for v in kept.values())} parsed directly")
    assert kept and texts >= 2 * len(
        kept
    )  # every text after the first of its skeleton came from the template
    assert all(v is not None for v in kept.values())
    pending = [v for v in kept.values() if isinstance(v, script_templates._Pending)]
    assert not pending or deferred


def _rows_text(name: str, rows: int, cols: int) -> str:
    return (
        "@T.prim_func\n"
        f'def {name}(in0: T.Buffer(({rows}, {cols}), "float32"), out0: T.Buffer(({rows}, {cols}), "float32")):\n'
        f'    T.func_attr({{"global_symbol": "{name}", "tir.noalias": True}})\n'
        f"    for i in T.serial({rows}):\n"
        f"        for j in T.serial({cols}):\n"
        "            out0[i, j] = in0[i, j] * T.float32(2.5)\n"
    )


def test_skeleton_results_are_not_shared_between_callers() -> None:
    text = _rows_text("k_a", 33, 16)
    body, values = script_templates.skeleton(text, "k_a")
    values.append(-1)
    assert script_templates.skeleton(text, "k_a") == (body, [33, 16, 33, 16, 33, 16])


def _rows_text(name: str, rows: int, cols: int) -> str:
    return (
        "@T.prim_func\n"
        f'def {name}(in0: T.Buffer(({rows}, {cols}), "float32"), out0: T.Buffer(({rows}, {cols}), "float32")):\n'
        f'    T.func_attr({{"global_symbol": "{name}", "tir.noalias": True}})\n'
        f"    for i in T.serial({rows}):\n"
        f"        for j in T.serial({cols}):\n"
        "            out0[i, j] = in0[i, j] * T.float32(2.5)\n"
    )


def _counting_parser(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    parsed: list[str] = []
    real = tvm.script.from_source

    def from_source(text: str) -> object:
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(tvm.script, "from_source", from_source)
    return parsed


@pytest.mark.parametrize("deferred", [False, True])
def test_a_deferred_template_waits_for_the_skeletons_second_text(
    deferred: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(script_templates, "_TEMPLATES", type(script_templates._TEMPLATES)())
    texts = [_rows_text(f"k_{rows}", rows, 16) for rows in (33, 57, 100)]
    want = [tvm.script.from_source(t) for t in texts]
    parsed = _counting_parser(monkeypatch)
    with script_templates.deferred_templates() if deferred else contextlib.nullcontext():
        got = [script_templates.parse_text(texts[0], "k_33")]
        # the text, and (not deferred) the template at once
        assert [("c0_" in t) for t in parsed] == ([False] if deferred else [False, True])
        parsed.clear()
        got.append(script_templates.parse_text(texts[1], "k_57"))
        # deferred: the template now, checked against the first text's parse; else bound from it
        assert [("c0_" in t) for t in parsed] == ([True] if deferred else [])
        parsed.clear()
        got.append(script_templates.parse_text(texts[2], "k_100"))
        assert not parsed  # bound from the template
    for g, w in zip(got, want, strict=True):
        assert tvm_ffi.structural_equal(g, w)


def test_a_deferred_template_that_fails_its_check_leaves_the_skeleton_parsed_directly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(script_templates, "_TEMPLATES", type(script_templates._TEMPLATES)())
    with script_templates.deferred_templates():
        script_templates.parse_text(_rows_text("k_a", 33, 16), "k_a")
    checked: list[object] = []
    real = script_templates._template

    def wrong(body: str, values: list[int], name: str, direct: object) -> object:
        checked.append(direct)
        assert real(body, values, name, direct) is not None
        # a template whose specialisation at the first text's values is not that text's parse
        return real(body, [v + 1 for v in values], name, direct)

    monkeypatch.setattr(script_templates, "_template", wrong)
    parsed = _counting_parser(monkeypatch)
    for rows in (57, 100):
        text = _rows_text("k_b", rows, 16)
        assert tvm_ffi.structural_equal(
            script_templates.parse_text(text, "k_b"), tvm.script.from_source(text)
        )
    assert len(checked) == 1  # checked once, at the second text; the third is parsed directly too
    assert (
        sum("c0_" not in t for t in parsed) == 4
    )  # the two texts, each parsed by the call and by the assert
    (entry,) = script_templates._TEMPLATES.values()
    assert entry is None


def test_a_pending_skeleton_gets_its_template_for_a_compiled_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script_templates, "_TEMPLATES", type(script_templates._TEMPLATES)())
    text = _rows_text("k_a", 33, 16)
    with script_templates.deferred_templates():
        direct = script_templates.parse_text(text, "k_a")
    body, values = script_templates.skeleton(text, "k_a")
    template = script_templates.template_of(body, values, "k_a", direct)
    assert template is not None and script_templates._TEMPLATES[body] is template
    bound = script_templates._bind(template, [57, 16, 57, 16, 57, 16], "k_b")
    assert tvm_ffi.structural_equal(bound, tvm.script.from_source(_rows_text("k_b", 57, 16)))


def test_a_cuda_elementwise_kernel_has_one_skeleton_at_every_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds guard of a CUDA elementwise kernel stays where the grid covers its elements exactly (1024
    rows of 16 here), so a new length binds the first length's template: no parse, and the parser's PrimFunc."""
    monkeypatch.setattr(script_templates, "_TEMPLATES", type(script_templates._TEMPLATES)())
    hw = load_profile("h200")

    def add(t: int) -> Program:
        p = Program(name="add")
        p.output(p.add(p.input("A", (t, 16), "float32"), p.input("B", (t, 16), "float32")))
        return p

    first = compile_ugraph(from_program(add(1024), DEFAULT_PRECISION), hw, "cuda").kernels()
    assert [k.script.count("if f < 16384:") for k in first] == [1]
    parsed = _counting_parser(monkeypatch)
    with script_templates.deferred_templates():  # as the dispatcher lowers a new length
        later = compile_ugraph(from_program(add(300), DEFAULT_PRECISION), hw, "cuda").kernels()
    assert not parsed and len(later) == 1
    assert tvm_ffi.structural_equal(later[0].func, tvm.script.from_source(later[0].script))
    llvm = compile_ugraph(from_program(add(1024), DEFAULT_PRECISION), hw, "llvm").kernels()
    assert "if f <" not in llvm[0].script  # the CPU kernel has no guard where it needs none
