"""Workloads: built-in ops, user TE/TIR computations, random inputs and the op configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gensorage.workloads as workloads
from gensorage.errors import ConfigError, ProgramError, UnsupportedOpError
from gensorage.workloads import Access, Axis, Workload


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENSORAGE_CONFIG_DIR", raising=False)


def _run_llvm(wl: Workload, arrays: list[np.ndarray]) -> np.ndarray:
    """Compile the workload's PrimFunc (default schedule) for the CPU and run it."""
    import tvm

    ex = tvm.compile(tvm.IRModule({"main": wl.build()}), target="llvm")
    dev = tvm.cpu(0)
    out = tvm.runtime.empty(wl.output.shape, wl.output.dtype, dev)
    ex["main"](*[tvm.runtime.tensor(a, device=dev) for a in arrays], out)
    return np.asarray(out.numpy(), dtype=np.float64)


SMALL = [
    workloads.gemm(17, 9, 13, dtype="float32"),
    workloads.gemv(19, 23, dtype="float32"),
    workloads.batch_matmul(3, 5, 7, 11, dtype="float32"),
    workloads.conv2d(2, 3, 9, 8, 4, 3, 2, stride=(2, 1), padding=(1, 2), dtype="float32"),
    workloads.conv2d(1, 4, 7, 7, 3, 3, 3, stride=2, dtype="float32"),
    workloads.avgpool2d(2, 3, 9, 8, 3, 2, stride=(2, 1), padding=1, dtype="float32"),
    workloads.avgpool2d(2, 3, 8, 8, 2, 2, dtype="float32"),
]


@pytest.mark.parametrize("wl", SMALL, ids=lambda w: w.key())
def test_builtin_matches_reference_on_llvm(wl: Workload) -> None:
    arrays = workloads.random_inputs(wl, seed=3)
    ref = wl.reference(*arrays)
    assert ref.shape == wl.output.shape and ref.dtype == np.float64
    np.testing.assert_allclose(_run_llvm(wl, arrays), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "wl",
    [workloads.gemm(16, 8, 32), workloads.conv2d(1, 4, 6, 6, 2, 3, 3, padding=1, dtype="bfloat16")],
    ids=lambda w: w.key(),
)
def test_16bit_inputs_accumulate_in_float32(wl: Workload) -> None:
    assert wl.output.dtype == "float32" and all(a.dtype == wl.dtype for a in wl.inputs)
    arrays = workloads.random_inputs(wl, seed=1)
    assert all(a.dtype == workloads.numpy_dtype(wl.dtype) for a in arrays)
    # Inputs are exactly representable; with float32 accumulation only the summation rounds.
    np.testing.assert_allclose(_run_llvm(wl, arrays), wl.reference(*arrays), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("wl", SMALL, ids=lambda w: w.key())
def test_primfunc_params_follow_accesses(wl: Workload) -> None:
    func = wl.build()
    got = [(str(p.name), tuple(int(s) for s in p.ty.shape), str(p.ty.dtype)) for p in func.params]
    assert got == [(a.tensor, a.shape, a.dtype) for a in wl.accesses]
    assert wl.accesses[-1].is_output and not any(a.is_output for a in wl.accesses[:-1])


def test_gemm_loop_nest() -> None:
    wl = workloads.gemm(64, 32, 16)
    assert wl.axes == (Axis("i", 64, "spatial"), Axis("j", 32, "spatial"), Axis("k", 16, "reduce"))
    assert wl.flops == 2 * 64 * 32 * 16 and wl.dtype == "float16"
    a, b, c = wl.accesses
    assert a.index == ((("i", 1),), (("k", 1),)) and b.index == ((("k", 1),), (("j", 1),))
    assert c == Access("C", (64, 32), "float32", ((("i", 1),), (("j", 1),)), (0, 0), is_output=True)
    assert wl.key() == "gemm(M=64,N=32,K=16)[i:64:s,j:32:s,k:16:r]:float16"


def test_conv_loop_nest_has_strided_offset_access() -> None:
    wl = workloads.conv2d(2, 8, 30, 30, 16, 3, 3, stride=2, padding=1)
    assert [(a.name, a.extent, a.kind) for a in wl.axes] == [
        ("n", 2, "spatial"),
        ("f", 16, "spatial"),
        ("oh", 15, "spatial"),
        ("ow", 15, "spatial"),
        ("c", 8, "reduce"),
        ("kh", 3, "reduce"),
        ("kw", 3, "reduce"),
    ]
    x = wl.inputs[0]
    assert x.index[2] == (("oh", 2), ("kh", 1)) and x.index[3] == (("ow", 2), ("kw", 1))
    assert x.offset == (0, 0, -1, -1)
    assert wl.flops == 2 * 2 * 16 * 15 * 15 * 8 * 3 * 3


def test_avgpool_counts_padding() -> None:
    wl = workloads.avgpool2d(1, 1, 2, 2, 3, 3, stride=1, padding=1, dtype="float32")
    x = np.ones((1, 1, 2, 2), dtype=np.float32)
    # Every 3x3 window sees the 4 real ones and 5 padded zeros; count_include_pad divides by 9.
    np.testing.assert_allclose(wl.reference(x), np.full((1, 1, 2, 2), 4 / 9))
    np.testing.assert_allclose(_run_llvm(wl, [x]), np.full((1, 1, 2, 2), 4 / 9), rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 3),
    h=st.integers(1, 7),
    w=st.integers(1, 7),
    f=st.integers(1, 3),
    kh=st.integers(1, 3),
    kw=st.integers(1, 3),
    sh=st.integers(1, 3),
    sw=st.integers(1, 3),
    ph=st.integers(0, 2),
    pw=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_conv_reference_equals_direct_loops(
    n: int, c: int, h: int, w: int, f: int, kh: int, kw: int, sh: int, sw: int, ph: int, pw: int, seed: int
) -> None:
    if h + 2 * ph < kh or w + 2 * pw < kw:
        with pytest.raises(ProgramError, match="does not fit"):
            workloads.conv2d(n, c, h, w, f, kh, kw, stride=(sh, sw), padding=(ph, pw))
        return
    wl = workloads.conv2d(n, c, h, w, f, kh, kw, stride=(sh, sw), padding=(ph, pw), dtype="float32")
    x, wt = workloads.random_inputs(wl, seed)
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    expect = np.zeros((n, f, oh, ow))
    for idx in np.ndindex(n, f, oh, ow, c, kh, kw):
        b, o, y, z, ci, i, j = idx
        hh, ww = y * sh + i - ph, z * sw + j - pw
        if 0 <= hh < h and 0 <= ww < w:
            expect[b, o, y, z] += float(x[b, ci, hh, ww]) * float(wt[o, ci, i, j])
    np.testing.assert_allclose(wl.reference(x, wt), expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: workloads.gemm(0, 4, 4), "M must be a positive integer"),
        (lambda: workloads.gemm(4, 4, True), "K must be a positive integer"),
        (lambda: workloads.gemv(4, 4, dtype="int8"), "unsupported dtype 'int8'"),
        (lambda: workloads.conv2d(1, 1, 2, 2, 1, 3, 3), "does not fit"),
        (lambda: workloads.avgpool2d(1, 1, 4, 4, 2, 2, stride=0), "stride must be"),
        (lambda: workloads.conv2d(1, 1, 4, 4, 1, 3, 3, padding=-1), "padding must be"),
    ],
)
def test_bad_builtin_arguments(call: Any, match: str) -> None:
    with pytest.raises(ProgramError, match=match):
        call()


def test_reference_checks_its_arguments() -> None:
    wl = workloads.gemm(4, 5, 6, dtype="float32")
    with pytest.raises(ProgramError, match="takes 2 arrays"):
        wl.reference(np.zeros((4, 6)))
    with pytest.raises(ProgramError, match="shape"):
        wl.reference(np.zeros((4, 6)), np.zeros((5, 6)))


def test_random_inputs_shapes_and_seed() -> None:
    wl = workloads.conv2d(1, 2, 5, 5, 3, 3, 3)
    a = workloads.random_inputs(wl, seed=7)
    assert [(x.shape, x.dtype) for x in a] == [((1, 2, 5, 5), np.float16), ((3, 2, 3, 3), np.float16)]
    b = workloads.random_inputs(wl, seed=7)
    c = workloads.random_inputs(wl, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    assert all(np.all(np.abs(x.astype(np.float32)) <= 1) for x in a)


# ---------------------------------------------------------------------------------------------------------
# from_te / from_prim_func
# ---------------------------------------------------------------------------------------------------------


def _nt_matmul(M: int = 8, N: int = 6, K: int = 5) -> tuple[Any, Any, Any]:
    from tvm import te

    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((N, K), "float32", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[j, k], axis=k), name="C")
    return A, B, C


def test_from_te_custom_matmul() -> None:
    A, B, C = _nt_matmul()
    wl = workloads.from_te([A, B], C)
    assert wl.name == "C"
    assert wl.axes == (Axis("i", 8, "spatial"), Axis("j", 6, "spatial"), Axis("k", 5, "reduce"))
    assert wl.accesses == (
        Access("A", (8, 5), "float32", ((("i", 1),), (("k", 1),)), (0, 0)),
        Access("B", (6, 5), "float32", ((("j", 1),), (("k", 1),)), (0, 0)),
        Access("C", (8, 6), "float32", ((("i", 1),), (("j", 1),)), (0, 0), is_output=True),
    )
    assert wl.flops == 2 * 8 * 6 * 5 and wl.dtype == "float32"
    a, b = workloads.random_inputs(wl, seed=0)
    expect = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(wl.reference(a, b), expect, rtol=1e-12)
    np.testing.assert_allclose(_run_llvm(wl, [a, b]), expect, rtol=1e-5)


def test_from_prim_func_on_tvmscript_text() -> None:
    import tvm

    A, B, C = _nt_matmul()
    from_te = workloads.from_te([A, B], C)
    func = tvm.script.from_source(from_te.build().script())
    wl = workloads.from_prim_func(func, name="nt")
    assert wl.name == "nt" and wl.axes == from_te.axes and wl.accesses == from_te.accesses
    assert wl.flops == from_te.flops


@pytest.mark.parametrize(
    "wl",
    SMALL + [workloads.gemm(8, 8, 8), workloads.avgpool2d(1, 2, 6, 6, 3, 3, 2, 1)],
    ids=lambda w: w.key(),
)
def test_from_prim_func_recovers_builtin_loop_nest(wl: Workload) -> None:
    got = workloads.from_prim_func(wl.build(), name=wl.name)
    assert (got.axes, got.accesses, got.flops, got.dtype) == (wl.axes, wl.accesses, wl.flops, wl.dtype)
    arrays = workloads.random_inputs(wl, seed=5)
    np.testing.assert_allclose(got.reference(*arrays), wl.reference(*arrays), rtol=1e-12, atol=1e-12)
    assert got.key() != wl.key()  # user workloads carry a signature of the function text


def test_max_reduction_with_transposed_output() -> None:
    from tvm import te, tirx

    A = te.placeholder((7, 4), "float32", name="A")
    k = te.reduce_axis((0, 4), name="k")
    C = te.compute((4, 7), lambda j, i: te.max(tirx.exp(A[i, k]) * 2.0 - 1.0, axis=k), name="C")
    wl = workloads.from_te([A], C)
    assert [a.name for a in wl.axes] == ["j", "i", "k"]
    assert wl.output.index == ((("j", 1),), (("i", 1),))
    assert wl.flops == (1 + 3) * 7 * 4 * 4  # max-combine + exp, mul, sub per iteration
    (a,) = workloads.random_inputs(wl, seed=2)
    expect = np.broadcast_to((np.exp(a.astype(np.float64)) * 2 - 1).max(axis=1), (4, 7))
    np.testing.assert_allclose(wl.reference(a), expect, rtol=1e-12)
    np.testing.assert_allclose(_run_llvm(wl, [a]), expect, rtol=1e-5)


def _unsupported_cases() -> list[tuple[str, Any, str]]:
    from tvm import s_tir, te, tirx

    A = te.placeholder((8, 4), "float32", name="A")
    B = te.placeholder((4, 6), "float32", name="B")
    k = te.reduce_axis((0, 4), name="k")
    A2 = te.compute((8, 4), lambda i, j: A[i, j] * 2, name="A2")
    two_blocks = te.compute((8, 6), lambda i, j: te.sum(A2[i, k] * B[k, j], axis=k), name="C")
    floordiv = te.compute((8, 6), lambda i, j: te.sum(A[i // 2, k] * B[k, j], axis=k), name="C")
    product = te.compute((8, 6), lambda i, j: te.sum(A[tirx.min(i * j, 7), k] * B[k, j], axis=k), name="C")
    elementwise = te.compute((8, 4), lambda i, j: A[i, j] + 1, name="C")
    S = te.placeholder((4, 4), "float32", name="S")
    kk = te.reduce_axis((0, 4), name="kk")
    twice = te.compute((4, 4), lambda i, j: te.sum(S[i, kk] * S[kk, j], axis=kk), name="C")
    gemm = te.compute((8, 6), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    sch = s_tir.Schedule(te.create_prim_func([A, B, gemm]))
    sch.split(sch.get_loops(sch.get_sblock("C"))[0], [2, 4])
    Q = te.placeholder((4, 4), "int8", name="Q")
    int8 = te.compute((4,), lambda i: te.sum(Q[i, k], axis=k), name="C")
    return [
        ("two blocks", lambda: workloads.from_te([A, B], two_blocks), "2 blocks"),
        ("floordiv index", lambda: workloads.from_te([A, B], floordiv), "not affine"),
        ("product index", lambda: workloads.from_te([A, B], product), "not affine"),
        ("no reduction", lambda: workloads.from_te([A], elementwise), "no reduction"),
        ("read twice", lambda: workloads.from_te([S], twice), "two different index patterns"),
        ("scheduled", lambda: workloads.from_prim_func(sch.mod["main"]), "already scheduled"),
        ("missing input", lambda: workloads.from_te([A], gemm), "placeholder B"),
        (
            "output first",
            lambda: workloads.from_prim_func(te.create_prim_func([gemm, A, B])),
            "last parameter",
        ),
        (
            "unused input",
            lambda: workloads.from_prim_func(te.create_prim_func([A, S, B, gemm])),
            "never read",
        ),
        ("int8", lambda: workloads.from_te([Q], int8), "dtype int8"),
        ("not a function", lambda: workloads.from_prim_func("gemm"), "expected a tvm.tirx.PrimFunc"),
    ]


def test_unsupported_computations_raise_clearly() -> None:
    for label, call, match in _unsupported_cases():
        with pytest.raises(UnsupportedOpError, match=match):
            call()
            pytest.fail(label)


# ---------------------------------------------------------------------------------------------------------
# Op configs
# ---------------------------------------------------------------------------------------------------------

TABLE4 = {
    "C1": ("conv2d", {"N": 128, "C": 256, "H": 30, "W": 30, "F": 256, "KH": 3, "KW": 3, "stride_h": 2}),
    "C2": ("conv2d", {"N": 128, "C": 128, "H": 28, "W": 28, "F": 128, "KH": 3, "KW": 3, "stride_h": 1}),
    "C3": ("conv2d", {"N": 128, "C": 128, "H": 58, "W": 58, "F": 128, "KH": 3, "KW": 3, "stride_h": 2}),
    "M1": ("gemm", {"M": 8192, "K": 8192, "N": 8192}),
    "M2": ("gemm", {"M": 65536, "K": 4, "N": 1024}),
    "M3": ("gemm", {"M": 65536, "K": 1024, "N": 4096}),
    "V1": ("gemv", {"M": 16384, "N": 16384}),
    "V2": ("gemv", {"M": 16384, "N": 8192}),
    "V3": ("gemv", {"M": 16384, "N": 1000}),
    "P1": ("avgpool2d", {"N": 16, "C": 48, "H": 48, "W": 48, "KH": 2, "KW": 2, "stride_h": 2}),
    "P2": ("avgpool2d", {"N": 128, "C": 168, "H": 83, "W": 83, "KH": 2, "KW": 2, "stride_h": 2}),
    "P3": ("avgpool2d", {"N": 128, "C": 617, "H": 21, "W": 21, "KH": 3, "KW": 3, "stride_h": 2}),
}


def test_all_configs_load() -> None:
    configs = workloads.load_op_configs()
    ids = [i for i, _ in configs]
    assert len(ids) == 32 and len(set(ids)) == 32
    assert all(isinstance(w, Workload) and w.flops > 0 for _, w in configs)
    by_id = dict(configs)
    for wid, (op, params) in TABLE4.items():
        wl = by_id[wid]
        assert wl.name == op and {k: v for k, v in wl.params if k in params} == params, wid
    unbalanced = {wid: dict(by_id[wid].params) for wid in ("U1", "U2", "U3")}
    assert unbalanced == {
        "U1": {"M": 65536, "N": 4, "K": 1024},
        "U2": {"M": 32768, "N": 64, "K": 2048},
        "U3": {"M": 16384, "N": 32, "K": 1024},
    }
    assert {w.name for w in by_id.values()} == {"gemm", "gemv", "batch_matmul", "conv2d", "avgpool2d"}


def test_get_op_config() -> None:
    assert workloads.get_op_config("M1").key() == workloads.gemm(8192, 8192, 8192).key()
    assert "P3" in workloads.list_op_configs()
    with pytest.raises(ConfigError, match=r"unknown op config 'M99' \(known: .*M1"):
        workloads.get_op_config("M99")


def test_workload_from_spec() -> None:
    wl = workloads.workload_from_spec(
        {
            "op": "conv2d",
            "N": 1,
            "C": 2,
            "H": 8,
            "W": 8,
            "F": 4,
            "KH": 3,
            "KW": 3,
            "stride": [2, 1],
            "padding": 1,
            "dtype": "float32",
        }
    )
    assert wl.key() == workloads.conv2d(1, 2, 8, 8, 4, 3, 3, stride=(2, 1), padding=1, dtype="float32").key()


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        ({"N": 4}, "op", "missing"),
        ({"op": "matmul"}, "op", "unknown op 'matmul'"),
        ({"op": "gemm", "M": 4, "N": 4}, "K", "missing"),
        ({"op": "gemm", "M": 4, "N": 4, "K": "4"}, "K", "expected an integer"),
        ({"op": "gemm", "M": 4, "N": 4, "K": True}, "K", "expected an integer"),
        ({"op": "gemm", "M": -4, "N": 4, "K": 4}, "M", "must be a positive integer"),
        ({"op": "gemm", "M": 4, "N": 4, "K": 4, "stride": 2}, "stride", "unknown field for op gemm"),
        ({"op": "gemv", "M": 4, "N": 4, "dtype": 16}, "dtype", "expected a string"),
        (
            {"op": "avgpool2d", "N": 1, "C": 1, "H": 4, "W": 4, "KH": 2, "KW": 2, "stride": [1, 2, 3]},
            "stride",
            "pair of integers",
        ),
    ],
)
def test_bad_specs_name_the_field(spec: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        workloads.workload_from_spec(spec, where="--shape")
    msg = str(info.value)
    assert msg.startswith("--shape: ") and f"'{field}'" in msg and reason in msg, msg


def test_spec_rejected_by_the_op_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"--shape: gemv: unsupported dtype 'float64'"):
        workloads.workload_from_spec({"op": "gemv", "M": 4, "N": 4, "dtype": "float64"}, where="--shape")


GOOD_ENTRY = '[[workload]]\nid = "X1"\nop = "gemv"\nM = 4\nN = 8\n'


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        (GOOD_ENTRY + "N = 9\n", "invalid TOML"),
        (GOOD_ENTRY.replace('id = "X1"\n', ""), "entry 1: field 'id'"),
        (GOOD_ENTRY.replace("N = 8", "N = 0"), "entry 'X1': field 'N': must be a positive integer"),
        (GOOD_ENTRY.replace("M = 4", "Q = 4"), "entry 'X1': field 'Q': unknown field"),
        (GOOD_ENTRY + GOOD_ENTRY, "entry 'X1': field 'id': duplicate"),
        ("[workloads]\nid = 1\n", "field 'workloads': unknown top-level field"),
    ],
)
def test_malformed_config_files(tmp_path: Path, text: str, expect: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        workloads.load_op_configs(path)
    assert str(path) in str(info.value) and expect in str(info.value), str(info.value)


def test_user_config_dir_adds_and_shadows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "mine.toml").write_text(GOOD_ENTRY + GOOD_ENTRY.replace('"X1"', '"M1"'))
    monkeypatch.setenv("GENSORAGE_CONFIG_DIR", str(tmp_path))
    by_id = dict(workloads.load_op_configs())
    assert len(by_id) == 33 and by_id["X1"].params == (("M", 4), ("N", 8))
    assert by_id["M1"].name == "gemv"
    assert dict(workloads.load_op_configs(tmp_path / "ops")).keys() == {"X1", "M1"}
