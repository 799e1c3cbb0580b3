"""A bfloat16 program's float32 intermediate that only matmuls read is stored in bfloat16
(gensorage.ugraph.matmul_operands): the matmul rounds it so anyway, and then reads half the bytes unconverted."""

from __future__ import annotations

import numpy as np
import pytest

from gensorage.codegen.module import compile_ugraph
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.program import Program
from gensorage.ugraph import from_program
from gensorage.ugraph.ir import KernelOp, Ref
from gensorage.ugraph.matmul_operands import matmul_operands
from gensorage.ugraph.shapes import infer

H200 = load_profile("h200")


def _norm_projection(dtype: str, *, summed: bool = False, reshaped: bool = False) -> tuple[Program, int]:
    """``(x·g / rms(x)) @ W.T`` (optionally through a reshape, or with a sum reading the normalised x too), and the
    program node of the normalised x: with the gain inside the division it is bounded by √96·|g| only, so the
    policy keeps it float32 (a bare ``rms_norm(x)`` is bounded by √96 and stored in the program's dtype)."""
    p = Program()
    x = p.input("x", (64, 96), dtype)
    w = p.input("w", (80, 96), dtype)
    g = p.input("g", (96,), dtype)
    xn = p.div(p.mul(x, g), p.sqrt(p.add_scalar(p.scale(p.sum(p.mul(x, x), 1), 1 / 96), 1e-6)))
    if summed:
        p.output(p.sum(xn, 1))
    a = p.reshape(p.reshape(xn, (8, 8, 96)), (64, 96)) if reshaped else xn
    p.output(p.matmul(a, p.transpose(w, 0, 1)))
    return p, xn.id


def _matmul_operand(g: object) -> Ref:
    (mm,) = [op for op in g.ops if isinstance(op, KernelOp) and op.op is Op.MATMUL]  # type: ignore[attr-defined]
    return mm.inputs[0]


@pytest.mark.parametrize("reshaped", [False, True])
def test_a_normalised_activation_read_only_by_matmuls_is_stored_in_bfloat16(reshaped: bool) -> None:
    p, _ = _norm_projection("bfloat16", reshaped=reshaped)
    g = from_program(p)
    a = _matmul_operand(g)
    assert infer(g).of(a).dtype == "bfloat16"
    if not reshaped:  # through reshapes (views) the normalised x itself is the operand that is narrowed
        assert a in matmul_operands(g)
    rule = compile_ugraph(g, H200, "llvm").kernels("llvm")[-1].rule
    assert "converted" not in rule and ("wgmma" in rule or "tensor-core" in rule), rule


def test_other_readers_float16_programs_and_the_storage_policy_keep_their_dtypes() -> None:
    for p, precision, want in (
        (_norm_projection("bfloat16", summed=True)[0], "float32", "float32"),  # a sum reads it too
        (_norm_projection("float16")[0], "float32", "float32"),  # float16's range: kept in float32
        (_norm_projection("bfloat16")[0], "storage", "bfloat16"),
    ):
        g = from_program(p, precision)
        assert infer(g).of(_matmul_operand(g)).dtype == want


def test_program_outputs_are_never_operands() -> None:
    p = Program()
    x, w = p.input("x", (16, 32), "bfloat16"), p.input("w", (32, 8), "bfloat16")
    xn = p.rms_norm(x)
    p.output(xn)
    p.output(p.matmul(xn, w))
    g = from_program(p)
    assert not {Ref(r.node) for r in g.outputs} & matmul_operands(g)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_the_narrowed_matmul_matches_the_converting_one(scale: float) -> None:
    # The converting kernel rounds the float32 operand to bfloat16 in its copies; the producer now rounds it on
    # store. Same operands, so the two agree to float32 accumulation order, and both match float64.
    narrowed, _ = _norm_projection("bfloat16")
    converting, _ = _norm_projection("bfloat16", summed=True)
    xs = narrowed.random_inputs(seed=1)
    xs[0] = (xs[0].astype(np.float32) * scale).astype(xs[0].dtype)
    a = compile_ugraph(from_program(narrowed), H200, "llvm").run(*xs)[-1].astype(np.float64)
    b = compile_ugraph(from_program(converting), H200, "llvm").run(*xs)[-1].astype(np.float64)
    want = narrowed.run(*xs)[-1].astype(np.float64)
    assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)
    assert np.linalg.norm(a - want) <= 2e-2 * np.linalg.norm(want)


@pytest.mark.parametrize("outlier", [1.0, 300.0, 1000.0])
def test_a_row_fused_norm_stores_its_matmul_operand_in_bfloat16_at_outlier_magnitudes(outlier: float) -> None:
    # The row-fused µGraph (what users get without a search): the norm is one graph-defined kernel whose saved
    # output only the projection reads, so the saver stores it in bfloat16. One massive-activation channel (as
    # LLaMA's) and a bfloat16 program: within 2e-2 of float64, and the same as the unfused µGraph's kernels.
    from gensorage.precision import DEFAULT_PRECISION
    from gensorage.superopt.row_fusion import fused_direct
    from gensorage.ugraph.ir import GraphDefinedOp

    p, _ = _norm_projection("bfloat16")
    g = fused_direct(p, DEFAULT_PRECISION, H200)
    assert g is not None
    a = _matmul_operand(g)
    assert isinstance(g.ops[a.node - len(g.inputs)], GraphDefinedOp)
    assert a in matmul_operands(g) and infer(g).of(a).dtype == "bfloat16"
    xs = p.random_inputs(seed=4)
    x = xs[0].astype(np.float32)
    x[:, 7] *= outlier
    xs[0] = x.astype(xs[0].dtype)
    want = np.asarray(p.run(*xs)[-1], dtype=np.float64)
    fused = compile_ugraph(g, H200, "llvm").run(*xs)[-1].astype(np.float64)
    direct = compile_ugraph(from_program(p), H200, "llvm").run(*xs)[-1].astype(np.float64)
    assert np.isfinite(fused).all()
    assert np.linalg.norm(fused - want) <= 2e-2 * np.linalg.norm(want)
    assert np.linalg.norm(fused - direct) <= 1e-2 * np.linalg.norm(direct)
