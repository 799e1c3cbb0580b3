"""The GPU suite's bundle, built here (TVM + nvcc) and checked by the runner's own manifest validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import gpu_convs, gpu_prepare
from benchmarks.gpu_bundle import validate_bundle
from gensorage.codegen.cuda_build import cubin_unavailable_reason
from gensorage.codegen.implicit_gemm import Conv2d
from gensorage.hw import load_profile
from gensorage.ugraph import examples

pytestmark = pytest.mark.skipif(cubin_unavailable_reason() is not None, reason="needs nvcc to build cubins")
HW = load_profile("h200")


def test_a_bundle_of_gemms_and_a_program_validates(tmp_path: Path) -> None:
    # A constructed GEMM that splits k (two kernels, a scratch tensor), one without, a program's µGraph and a
    # convolution's implicit GEMM.
    cases = gpu_prepare.gemm_cases(
        HW, tmp_path, {"kv": (16, 1024, 4096), "sq": (256, 256, 256)}, variants=False
    )
    cases += gpu_prepare.gemm_cases(HW, tmp_path, {"sq": (256, 256, 256)}, "bfloat16", variants=False)
    cases.append(gpu_prepare.program_case("rmsnorm", gpu_prepare.load_program("rmsnorm"), HW, tmp_path))
    cases += gpu_convs.conv_cases(HW, tmp_path, {"small": Conv2d(2, 8, 9, 9, 32, 3, 3, (2, 2), (1, 1))})
    gpu_prepare.write_manifest(tmp_path, cases, {"hw": "h200"})
    parsed = {c.name: c for c in validate_bundle(tmp_path)}
    assert set(parsed) == {
        "gemm_kv_constructed",
        "gemm_sq_constructed",
        "gemm_sq_bfloat16_constructed",
        "program_rmsnorm",
        "conv_small_constructed",
    }
    conv = parsed["conv_small_constructed"]
    assert conv.kind == "conv" and conv.raw["conv"]["stride"] == [2, 2]
    assert [t.shape for t in conv.tensors] == [(2, 8, 9, 9), (32, 8, 3, 3), (2, 32, 5, 5)]
    assert sorted(conv.kernels[0].args) == ["W", "X", "Y"]  # no im2col buffer: the gather is inlined
    split = parsed["gemm_kv_constructed"]
    assert len(split.kernels) == 2 and split.kernels[0].grid[1] > 1  # the slices, then the adding kernel
    assert split.kernels[0].args[-1] == split.kernels[1].args[0] == "P"
    program = parsed["program_rmsnorm"]
    assert [k.entry for k in program.kernels][:2] == ["kernel0_mul_kernel", "kernel1_sum_kernel"]
    # per launch its µGraph operator (the split-k matmul's two launches share one), the model per operator
    ops, predicted = program.raw["meta"]["launch_ops"], program.raw["meta"]["op_predicted_s"]
    assert len(ops) == len(program.kernels) and ops == sorted(ops) and len(ops) > len(set(ops))
    assert set(ops) == set(range(len(predicted))) and all(p > 0 for p in predicted)
    assert sum(predicted) == pytest.approx(program.raw["predicted_s"])
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [c["meta"].get("variant") for c in manifest["cases"]][:3] == ["constructed"] * 3  # GEMMs first
    for case in manifest["cases"]:
        for kernel in case["kernels"]:
            assert (tmp_path / kernel["cubin"]).stat().st_size > 0


def test_a_fused_ugraph_bundles_under_several_warp_layouts(tmp_path: Path) -> None:
    # Every case names a program file that exists (the validator checks it): a variant's is its base program's.
    # --block-mma-warps: the same fused µGraph with its tensor-core matmuls on all warps (0), on 2 of the
    # planned block's (with ldmatrix, and element-wise: 2e), and on 2 warps of a 64-thread block; each its own
    # case, each layout in its rule.
    program, g = examples.flash_attention(heads=2, q_len=64, kv_len=64, head_dim=16, q_blocks=2, forloop=2)
    cases = [
        gpu_prepare.program_case("fa", program, HW, tmp_path, ugraph=g, mma_warps=v)
        for v in ("0", "2", "2:64", "2e")
    ]
    gpu_prepare.write_manifest(tmp_path, cases, {"hw": "h200"})
    parsed = {c.name: c for c in validate_bundle(tmp_path)}
    assert set(parsed) == {"program_fa_w0", "program_fa_w2", "program_fa_w2t64", "program_fa_w2e"}
    rules = {
        c["name"]: c["meta"]["rules"][0]
        for c in json.loads((tmp_path / "manifest.json").read_text())["cases"]
    }
    assert "2 of " in rules["program_fa_w2"] and " of " not in rules["program_fa_w0"].split(";", 1)[1]
    assert rules["program_fa_w2t64"].startswith("bundle variant 2:64: 64 threads")
    assert parsed["program_fa_w2t64"].kernels[0].block[0] == 64
    # ldmatrix fragment loads and cp.async tile loads unless the variant asks for element-wise ones (a trailing e).
    assert "ldmatrix" in (tmp_path / "program_fa_w2.cu").read_text()
    assert "ldmatrix" not in (tmp_path / "program_fa_w2e.cu").read_text()
    assert "cp.async" in (tmp_path / "program_fa_w2.cu").read_text()
    assert "cp.async" not in (tmp_path / "program_fa_w2e.cu").read_text()


def test_the_default_programs_are_every_bundled_program_in_its_stable_form() -> None:
    # The stable attention programs run by default; their papers' forms only when named.
    names = gpu_prepare.program_names()
    assert set(gpu_prepare.ATTENTION_PROGRAMS) <= set(names)
    assert not [n for n in names if n.endswith("_papers")]
    assert {"gated_mlp", "rmsnorm", "qknorm", "ntrans"} <= set(names)
