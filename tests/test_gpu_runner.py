"""The GPU suite's device runner, in the parts that need no GPU: the bundle, inputs, references, errors, report.

The launches and timings need CUDA and cupy and run only on the device (``--self-check`` checks that path
there); everything they rely on is exercised here with a CPU torch.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import gpu_bundle as gb
from benchmarks import gpu_runner as gr
from benchmarks.gpu_bundle import ManifestError, allocate, footprint, parse_case, poison, validate_bundle
from gensorage.program import load_program


@pytest.fixture
def torch() -> Any:
    """torch (a CPU build is enough); the tests of the bundle and the report run without it."""
    return pytest.importorskip("torch")


ATTN = {"path": "configs/programs/mqa_incdec.gsp", "params": {"b": 1, "h": 4, "s": 2, "n": 16, "d": 8}}


def gemm_case(m: int = 8, n: int = 16, k: int = 32, dtype: str = "float16") -> dict[str, Any]:
    """A GEMM case whose kernel reads A through a flat view and writes C through a view of a scratch buffer."""
    return {
        "name": f"gemm_{m}x{n}x{k}_{dtype}",
        "kind": "gemm",
        "dtype": dtype,
        "tensors": [
            {"name": "A", "shape": [m, k], "dtype": dtype, "role": "input", "view_of": None},
            {"name": "B", "shape": [k, n], "dtype": dtype, "role": "input", "view_of": None},
            {"name": "A_flat", "shape": [m * k], "dtype": dtype, "role": "input", "view_of": "A"},
            {"name": "T", "shape": [m, n], "dtype": "float32", "role": "intermediate", "view_of": None},
            {"name": "C", "shape": [m, n], "dtype": dtype, "role": "output", "view_of": None},
            {"name": "C2", "shape": [m * n], "dtype": dtype, "role": "output", "view_of": "C"},
        ],
        "inputs_order": ["A", "B"],
        "outputs_order": ["C"],
        "kernels": [
            {
                "cubin": "k.cubin",
                "entry": "gemm_kernel",
                "grid": [1, 1, 1],
                "block": [128, 1, 1],
                "smem": 64 * 1024,
                "args": [
                    {"tensor": "A_flat", "shape": [m * k]},
                    {"tensor": "B", "shape": [k * n]},
                    {"tensor": "C", "shape": [m, n]},
                ],
            }
        ],
        "gemm": {"M": m, "N": n, "K": k, "batch": None},
        "predicted_s": 1e-6,
        "flops": 2 * m * n * k,
        "min_bytes": 2 * (m * k + k * n + m * n),
        "meta": {"rule": "test"},
    }


def program_case(spec: dict[str, Any] = ATTN) -> dict[str, Any]:
    program = load_program(gb.REPO_ROOT / spec["path"], spec["params"])
    tensors = [
        {"name": t.name, "shape": list(t.shape), "dtype": "float16", "role": "input", "view_of": None}
        for t in program.inputs
    ]
    out = program.outputs[0]
    tensors.append(
        {"name": "O", "shape": list(out.shape), "dtype": "float16", "role": "output", "view_of": None}
    )
    args = [{"tensor": t["name"], "shape": t["shape"]} for t in tensors]
    kernel = {
        "cubin": "k.cubin",
        "entry": "fused",
        "grid": [4, 1, 1],
        "block": [32, 1, 1],
        "smem": 0,
        "args": args,
    }
    return {
        "name": f"program_{program.name}",
        "kind": "program",
        "dtype": "float16",
        "tensors": tensors,
        "inputs_order": [t.name for t in program.inputs],
        "outputs_order": ["O"],
        "kernels": [kernel],
        "program": spec,
        "predicted_s": None,
        "flops": 0,
        "min_bytes": 0,
        "meta": {},
    }


def write_bundle(folder: Path, cases: list[dict[str, Any]]) -> Path:
    (folder / "k.cubin").write_bytes(b"\x7fELF not really")
    manifest = {
        "prepared": {"machine": "here", "date": "today", "commit": "abc", "hw": "h100"},
        "cases": cases,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def cpu_env(torch: Any, tmp_path: Path) -> gr.Env:
    return gr.Env(torch, None, np, tmp_path, device="cpu", use_compile=False)


# ------------------------------------------------------------------------------------------------ the bundle


def test_a_valid_bundle_parses(tmp_path: Path) -> None:
    cases = validate_bundle(write_bundle(tmp_path, [gemm_case(), program_case()]))
    gemm, prog = cases
    assert gemm.kind == "gemm" and gemm.kernels[0].args == ("A_flat", "B", "C")
    assert gemm.kernels[0].smem == 64 * 1024 and gemm.kernels[0].grid == (1, 1, 1)
    assert gemm.root("A_flat") == "A" and gemm.root("C2") == "C" and gemm.root("B") == "B"
    assert gemm.input_bytes() == 2 * (8 * 32 + 32 * 16)  # A_flat shares A's storage: counted once
    assert footprint(gemm) == 2 * (8 * 32 + 32 * 16 + 8 * 16) + 4 * 8 * 16
    assert prog.kind == "program" and prog.inputs_order == ("Q", "K", "V")


def broken(change: str) -> dict[str, Any]:
    case = copy.deepcopy(gemm_case())
    tensors = {t["name"]: t for t in case["tensors"]}
    match change:
        case "kind":
            case["kind"] = "attention"
        case "unknown view":
            tensors["A_flat"]["view_of"] = "Z"
        case "view size":
            tensors["A_flat"]["shape"] = [7]
        case "view loop":
            tensors["A"]["view_of"] = "A_flat"
        case "role":
            tensors["A"]["role"] = "weight"
        case "not an input":
            case["inputs_order"] = ["A", "C"]
        case "gemm size":
            case["gemm"]["K"] = 33
        case "overrun":
            case["kernels"][0]["args"][1]["shape"] = [10_000]
        case "unknown arg":
            case["kernels"][0]["args"][0]["tensor"] = "nope"
        case "missing cubin":
            case["kernels"][0]["cubin"] = "absent.cubin"
        case "block":
            case["kernels"][0]["block"] = [64, 32, 1]
        case "grid":
            case["kernels"][0]["grid"] = [1, 1]
        case "smem":
            case["kernels"][0]["smem"] = 300 * 1024
        case "shape":
            tensors["B"]["shape"] = [32, -16]
    return case


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("kind", "kind 'attention'"),
        ("unknown view", "unknown tensor Z"),
        ("view size", "differ in size"),
        ("view loop", "loop"),
        ("role", "role 'weight'"),
        ("not an input", "C is not an input"),
        ("gemm size", "not of the gemm's size"),
        ("overrun", "overruns"),
        ("unknown arg", "names no tensor"),
        ("missing cubin", "missing cubin absent.cubin"),
        ("block", "over 1024 threads"),
        ("grid", "needs 3 dims"),
        ("smem", "smem 307200"),
        ("shape", "positive ints"),
    ],
)
def test_a_bad_case_is_one_line_naming_it(tmp_path: Path, change: str, words: str) -> None:
    write_bundle(tmp_path, [gemm_case(), broken(change)])
    with pytest.raises(ManifestError) as info:
        validate_bundle(tmp_path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("case gemm_8x16x32_float16") and words in msg, msg


def test_a_bad_manifest_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match=r"manifest.json: JSONDecodeError"):
        validate_bundle(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"prepared": {}}))
    with pytest.raises(ManifestError, match="no 'cases' list"):
        validate_bundle(tmp_path)


def test_the_command_line_reports_a_bad_manifest_before_touching_the_gpu(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "manifest.json").write_text("[]")
    assert gr.main(["--bundle", str(tmp_path), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "not a JSON object" in err and "\n" not in err
    assert not (tmp_path / "r.json").exists()


# ------------------------------------------------------------------------------ tensors, inputs, references


def test_views_share_their_root_and_poison_spares_the_inputs(tmp_path: Path, torch: Any) -> None:
    case = parse_case(gemm_case(), write_bundle(tmp_path, []))
    t = allocate(torch, case, "cpu")
    assert t["A_flat"].data_ptr() == t["A"].data_ptr() and t["A_flat"].shape == (8 * 32,)
    assert t["C2"].data_ptr() == t["C"].data_ptr() and t["T"].dtype == torch.float32
    assert len({t[n].data_ptr() for n in ("A", "B", "T", "C")}) == 4
    gb.draw_inputs(torch, case, t, seed=0)
    a = t["A"].clone()
    poison(case, t)
    assert torch.equal(t["A"], a) and not torch.isnan(t["A_flat"]).any()
    assert torch.isnan(t["C2"]).all() and torch.isnan(t["T"]).all()


def test_inputs_are_fresh_random_and_b_is_scaled(tmp_path: Path, torch: Any) -> None:
    case = parse_case(gemm_case(m=64, n=64, k=256), write_bundle(tmp_path, []))
    t = allocate(torch, case, "cpu")
    gb.draw_inputs(torch, case, t, seed=0)
    a0, b0 = t["A"].clone(), t["B"].clone()
    gb.draw_inputs(torch, case, t, seed=1)
    assert not torch.equal(a0, t["A"]) and (t["A"] != 0).float().mean() > 0.99
    assert 0.9 < float(t["A"].float().std()) < 1.1
    assert 0.9 < float(b0.float().std()) * math.sqrt(256) < 1.1
    gb.draw_inputs(torch, case, t, seed=0)
    assert torch.equal(a0, t["A"])  # a seed is a draw: a rerun checks the same inputs


def test_gemm_reference_is_float64_matmul(tmp_path: Path, torch: Any) -> None:
    raw = gemm_case(m=4, n=6, k=8)
    raw["tensors"][0]["shape"] = [32]  # A stored flat: the reference reads it as [M, K]
    raw["tensors"][2]["shape"] = [4, 8]
    case = parse_case(raw, write_bundle(tmp_path, []))
    t = allocate(torch, case, "cpu")
    gb.draw_inputs(torch, case, t, seed=3)
    (ref,) = gb.reference(torch, case, None, [t["A"], t["B"]])
    want = t["A"].double().numpy().reshape(4, 8) @ t["B"].double().numpy()
    assert ref.dtype == torch.float64 and np.allclose(ref.numpy(), want, rtol=1e-12, atol=1e-12)


def test_an_nt_gemm_reads_b_stored_n_by_k(tmp_path: Path, torch: Any) -> None:
    # x[M, K] @ W[N, K].T: the reference and cuBLAS's baseline see B as W's transposed view (no copy).
    raw = gemm_case(m=4, n=6, k=8)
    raw["tensors"][1]["shape"] = [6, 8]
    raw["gemm"]["layout"] = "nt"
    case = parse_case(raw, write_bundle(tmp_path, []))
    t = allocate(torch, case, "cpu")
    gb.draw_inputs(torch, case, t, seed=5)
    a, b = gb.gemm_operands(case, t["A"], t["B"])
    assert tuple(b.shape) == (8, 6) and b.data_ptr() == t["B"].data_ptr()
    (ref,) = gb.reference(torch, case, None, [t["A"], t["B"]])
    want = t["A"].double().numpy() @ t["B"].double().numpy().T
    assert np.allclose(ref.numpy(), want, rtol=1e-12, atol=1e-12)
    raw["gemm"]["layout"] = "tn"
    with pytest.raises(ManifestError, match="layout"):
        parse_case(raw, tmp_path)


def test_program_reference_is_the_float64_interpreter(tmp_path: Path, torch: Any) -> None:
    case = parse_case(program_case(), write_bundle(tmp_path, []))
    program = gb.load_case_program(case)
    assert program is not None
    t = allocate(torch, case, "cpu")
    gb.draw_inputs(torch, case, t, seed=5)
    xs = [t[n] for n in case.inputs_order]
    (ref,) = gb.reference(torch, case, program, xs)
    (want,) = program.run(*[x.double().numpy() for x in xs])
    assert np.allclose(ref.numpy(), want, rtol=1e-12, atol=1e-12)


def test_rel_err(torch: Any) -> None:
    ref = [torch.tensor([3.0, 4.0], dtype=torch.float64), torch.tensor([[0.0]], dtype=torch.float64)]
    assert gb.rel_err(torch, [r.clone() for r in ref], ref) == 0.0
    out = [torch.tensor([3.0, 4.5], dtype=torch.float16), torch.tensor([0.0], dtype=torch.float16)]
    assert gb.rel_err(torch, out, ref) == pytest.approx(0.5 / 5.0)
    nan = [torch.tensor([3.0, float("nan")]), torch.tensor([0.0])]
    assert math.isnan(gb.rel_err(torch, nan, ref)) and not gb.passes(gb.rel_err(torch, nan, ref))
    assert gb.passes(0.01) and not gb.passes(0.05) and not gb.passes(math.inf)
    with pytest.raises(ValueError):
        gb.rel_err(torch, out[:1], ref)


def test_rotation_count() -> None:
    l2, mem = 50 * 2**20, 2**34
    assert gr.rotation_count(200 * 2**20, 300 * 2**20, l2, mem) == 1  # past 3 L2: no repeat hits L2
    assert gr.rotation_count(32 * 2**20, 40 * 2**20, l2, mem) == 5  # ceil(150 / 32)
    assert gr.rotation_count(1024, 4096, l2, mem) == gr.MAX_COPIES
    assert gr.rotation_count(32 * 2**20, 2**30, l2, 3 * 2**30) == 3  # as many copies as memory allows
    assert gr.rotation_count(32 * 2**20, 2**30, l2, 2**29) == 1


# ------------------------------------------------------------------------------ the checks, on a CPU torch


def fake_ours(torch: Any, case: gr.Case, sets: list[dict[str, Any]], rows: int | None = None) -> gr.Builder:
    """Stands in for the cubins: writes C = A @ B in the case dtype into the bundle's output (``rows`` of it)."""

    def build(i: int) -> Any:
        t = sets[i]

        def run() -> list[Any]:
            c = (t["A"].float() @ t["B"].float()).to(t["C"].dtype)
            t["C"][:rows].copy_(c[:rows])
            return [t["C"]]

        return run

    return build


def test_checks_pass_a_right_kernel_and_fail_an_unwritten_element(tmp_path: Path, torch: Any) -> None:
    env = cpu_env(torch, tmp_path)
    case = parse_case(gemm_case(m=16, n=32, k=64), write_bundle(tmp_path, []))
    sets = [allocate(torch, case, "cpu")]
    methods = {"ours": fake_ours(torch, case, sets), "partial": fake_ours(torch, case, sets, rows=15)}
    methods |= gr.gemm_baselines(env, case, sets, use_compile=False)
    recs = gr.check_methods(env, case, None, sets[0], methods)
    assert (
        recs["ours"]["ok"] and recs["torch_matmul"]["ok"] and len(recs["ours"]["rel_err"]) == gr.CHECK_DRAWS
    )
    assert 0 < max(recs["ours"]["rel_err"]) < 1e-2 and recs["ours"]["nan_elements"] == 0
    assert not recs["partial"]["ok"] and recs["partial"]["nan_elements"] == 32
    assert all(math.isnan(e) for e in recs["partial"]["rel_err"])


def test_a_method_that_raises_is_recorded_in_one_line(tmp_path: Path, torch: Any) -> None:
    env = cpu_env(torch, tmp_path)
    case = parse_case(gemm_case(), write_bundle(tmp_path, []))
    sets = [allocate(torch, case, "cpu")]

    def boom(i: int) -> Any:
        def run() -> list[Any]:
            raise RuntimeError("launch failed\nsecond line")

        return run

    recs = gr.check_methods(env, case, None, sets[0], {"ours": boom})
    assert recs["ours"] == {"rel_err": [], "error": "RuntimeError: launch failed", "ok": False}


def test_attention_baselines_eager_and_sdpa_compute_the_program(tmp_path: Path, torch: Any) -> None:
    env = cpu_env(torch, tmp_path)
    case = parse_case(program_case(), write_bundle(tmp_path, []))
    program = gb.load_case_program(case)
    assert program is not None and gr.sdpa_operands(program) is None
    sets = [allocate(torch, case, "cpu")]
    notes: dict[str, Any] = {}
    methods = gr.program_baselines(env, case, program, sets, False, notes)
    assert sorted(methods) == ["sdpa", "torch_eager"] and "sdpa" in notes
    recs = gr.check_methods(env, case, program, sets[0], methods)
    assert recs["torch_eager"]["ok"] and recs["sdpa"]["ok"], recs


@pytest.mark.parametrize("form", ["", "_papers"])  # K as models keep it [Hk, n, d]; pre-transposed [Hk, d, n]
def test_gqa_maps_onto_sdpa_with_grouped_heads(tmp_path: Path, torch: Any, form: str) -> None:
    params = {"kv": 2, "g": 3, "s": 4, "n": 16, "d": 8}
    spec = {"path": f"configs/programs/gqa_specdec{form}.gsp", "params": params}
    env = cpu_env(torch, tmp_path)
    case = parse_case(program_case(spec), write_bundle(tmp_path, []))
    program = gb.load_case_program(case)
    assert program is not None and gr.sdpa_operands(program) is None
    assert gr.keys_last(program) == (form == "_papers")
    sets = [allocate(torch, case, "cpu")]
    sdpa = gr.sdpa_builder(env, sets, gr.keys_last(program))
    recs = gr.check_methods(env, case, program, sets[0], {"sdpa": sdpa})
    assert recs["sdpa"]["ok"] and max(recs["sdpa"]["rel_err"]) < 1e-2, recs


def test_a_program_case_must_list_the_programs_outputs(tmp_path: Path) -> None:
    raw = program_case()
    raw["tensors"].append({"name": "O2", "shape": [4], "dtype": "float16", "role": "output", "view_of": None})
    raw["outputs_order"] = ["O", "O2"]
    with pytest.raises(ManifestError, match="outputs differ"):
        gb.load_case_program(parse_case(raw, write_bundle(tmp_path, [])))


def test_sdpa_is_skipped_with_a_reason_where_the_program_does_not_map() -> None:
    mlp = load_program(gb.REPO_ROOT / "configs/programs/gated_mlp.gsp", {"t": 2, "k": 8, "f": 8})
    assert "not Q, K, V" in (gr.sdpa_operands(mlp) or "")


# ------------------------------------------------------------------------------------------------ the report


def test_rates_and_summary_table() -> None:
    case = {
        "name": "gemm_a",
        "status": "ok",
        "flops": 2e12,
        "min_bytes": 1e9,
        "predicted_s": 2e-3,
        "methods": {
            "ours": {"rel_err": [1e-3, 2e-3], "median_s": 1e-3},
            "torch_matmul": {"median_s": 0.5e-3},
            "torch_compile": {"error": "BackendCompilerFailed: x", "ok": False},
        },
    }
    gr.add_rates(case)
    assert case["speedup"] == {"torch_matmul": 0.5}
    assert case["ours_tflops"] == pytest.approx(2000.0) and case["predicted_over_measured"] == pytest.approx(
        2.0
    )
    other = {"name": "program_b", "status": "ok", "methods": {"ours": {"rel_err": [1e-3], "median_s": 2e-3}}}
    other["methods"]["torch_matmul"] = {"median_s": 4e-3}
    gr.add_rates(other)
    failed = {"name": "program_c", "status": "failed", "methods": {"ours": {"rel_err": [0.1, float("nan")]}}}
    result = {"cases": [case, other, failed, {"name": "d", "status": "error"}], "not_run": ["e", "f"]}
    lines = gr.summary_table(result).splitlines()
    assert len(lines) == 7 and "cuBLAS" in lines[0] and lines[-1] == "not run (deadline): 2 cases: e, f"
    assert "1000.0" in lines[1] and "2.0e-03" in lines[1] and "0.50x" in lines[1]
    assert lines[3].startswith("program_c") and "nan" in lines[3] and lines[4].startswith("d ")
    assert lines[-2] == "geomean speedup (baseline / ours): cuBLAS 1.00x"  # sqrt(0.5 * 2)


def test_each_launch_is_timed_alone_over_every_copy() -> None:
    from benchmarks.gpu_device import kernel_times

    ran: list[str] = []
    sets = [[(lambda c=c, k=k: ran.append(f"{c}{k}")) for k in "abc"] for c in "01"]

    def timer(_torch: Any, fns: list[Any]) -> dict[str, Any]:
        for f in fns:
            f()
        if ran[-1].endswith("b"):
            raise RuntimeError("capture failed\non two lines")
        return {"median_s": float(len(fns))}

    times = kernel_times(None, sets, timer)
    assert ran == ["0a", "1a", "0b", "1b", "0c", "1c"]  # launch k on copy 0 then copy 1, one launch at a time
    assert times == [{"median_s": 2.0}, {"error": "RuntimeError: capture failed"}, {"median_s": 2.0}]


def test_kernel_records_name_each_launchs_operator_and_its_prediction(tmp_path: Path) -> None:
    raw = program_case()
    raw["kernels"] = [dict(raw["kernels"][0], entry=e) for e in ("k0", "k1_a", "k1_b", "k2")]
    raw["meta"] = {"launch_ops": [0, 1, 1, 2], "op_predicted_s": [1e-6, 4e-6, 2e-6]}
    case = parse_case(raw, write_bundle(tmp_path, [raw]))
    times = [{"median_s": t} for t in (1e-6, 3e-6, 1e-6, 5e-6)]
    records = gr.kernel_records(case, times)
    assert [(r["entry"], r["op"]) for r in records] == [("k0", 0), ("k1_a", 1), ("k1_b", 1), ("k2", 2)]
    # an operator's prediction stands once, on its first launch (a split-k matmul's two launches share it)
    assert [r.get("op_predicted_s") for r in records] == [1e-6, 4e-6, None, 2e-6]
    table = gr.kernel_table({"cases": [{"name": case.name, "kernels": records}]}).splitlines()
    assert len(table) == 5 and "k1_a" in table[2] and "3.0" in table[2] and "4.0" in table[2]
    assert gr.kernel_table({"cases": [{"name": "x"}]}) == ""
    del raw["meta"]  # a bundle prepared before the per-launch operators: the timings, no operators
    old = gr.kernel_records(parse_case(raw, tmp_path), times)
    assert [r["op"] for r in old] == [None] * 4 and all("op_predicted_s" not in r for r in old)


def test_device_line() -> None:
    result = {
        "device": {"gpu": "NVIDIA H100", "sm_count": 132, "driver": "580.1"},
        "ceilings": {"copy_gbps": 3012.4, "matmul_fp16_tflops": 701.2},
        "self_check": {"ok": True},
    }
    assert gr.device_line(result) == (
        "NVIDIA H100 (132 SMs, driver 580.1): copy 3012 GB/s, fp16 matmul 701 TFLOP/s; self-check ok"
    )
    result["self_check"] = {"ok": False, "error": "CUDADriverError: x"}
    assert "self-check FAILED" in gr.device_line(result) and "CUDADriverError" in gr.device_line(result)
    result["ceilings"] = {"error": "OutOfMemoryError: x"}
    assert "ceilings failed: OutOfMemoryError" in gr.device_line(result)


def test_conv_case_reference_is_torch_conv2d_in_float64() -> None:
    torch = pytest.importorskip("torch")
    raw = {
        "name": "conv_x",
        "kind": "conv",
        "dtype": "float16",
        "tensors": [
            {"name": "X", "shape": [2, 3, 7, 7], "dtype": "float16", "role": "input", "view_of": None},
            {"name": "W", "shape": [4, 3, 3, 3], "dtype": "float16", "role": "input", "view_of": None},
            {"name": "Y", "shape": [2, 4, 4, 4], "dtype": "float16", "role": "output", "view_of": None},
        ],
        "inputs_order": ["X", "W"],
        "outputs_order": ["Y"],
        "kernels": [{"cubin": "k.cubin", "entry": "k", "grid": [1, 1, 1], "block": [32, 1, 1], "smem": 0,
                     "args": [{"tensor": "X", "shape": [2, 3, 7, 7]}, {"tensor": "W", "shape": [4, 3, 3, 3]},
                              {"tensor": "Y", "shape": [2, 4, 4, 4]}]}],
        "conv": {"n": 2, "c": 3, "h": 7, "w": 7, "f": 4, "kh": 3, "kw": 3, "stride": [2, 2], "padding": [1, 1]},
    }  # fmt: skip
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.cubin").write_bytes(b"x")
        case = parse_case(raw, Path(d))
        x, w = torch.randn(2, 3, 7, 7, dtype=torch.float64), torch.randn(4, 3, 3, 3, dtype=torch.float64)
        (ref,) = gb.reference(torch, case, None, [x, w])
        assert torch.allclose(ref, torch.nn.functional.conv2d(x, w, stride=2, padding=1))
        bad = dict(raw, conv=dict(raw["conv"], stride=[1, 1]))  # Y no longer (n, f, oh, ow)
        with pytest.raises(ManifestError, match="Y is not"):
            parse_case(bad, Path(d))
