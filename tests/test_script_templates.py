"""TVMScript kernels parsed once per skeleton (:mod:`gensorage.codegen.script_templates`): a text bound from its
skeleton's template is the PrimFunc TVM's parser makes of the text itself, at every shape."""

from __future__ import annotations

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


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_templates_give_the_parsers_own_primfuncs_at_every_shape(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(script_templates, "_TEMPLATES", type(script_templates._TEMPLATES)())
    hw = load_profile("h100")
    texts = 0
    for t in (8, 12, 33, 64):  # multiples of the tiles and not
        for p in _programs(t):
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
