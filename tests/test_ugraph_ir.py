"""µGraph IR: structural equality/hashing, normalisation, and every validity rule."""

from __future__ import annotations

import dataclasses

import pytest

from gensorage.errors import UGraphError
from gensorage.hw.profile import HwProfile
from gensorage.opset import Op
from gensorage.ugraph import (
    Accumulator,
    BlockGraph,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelOp,
    OutputSaver,
    Ref,
    TensorSpec,
    ThreadGraph,
    ThreadOp,
    is_valid,
    validate,
)
from gensorage.ugraph.examples import gated_mlp, rmsnorm_matmul


def _profile(name: str = "h100") -> HwProfile:
    try:
        from gensorage.hw import load_profile

        return load_profile(name)
    except ImportError:  # profiles not available: a hand-made H100-like profile
        return HwProfile(
            name="h100",
            display_name="H100",
            arch="sm_90",
            sm_count=132,
            clock_hz=1.98e9,
            warp_size=32,
            max_threads_per_block=1024,
            max_threads_per_sm=2048,
            max_blocks_per_sm=32,
            registers_per_sm=65536,
            max_registers_per_thread=255,
            shared_mem_per_sm=233472,
            shared_mem_per_block=232448,
            l2_bytes=50 * 2**20,
            shared_banks=32,
            bank_width_bytes=4,
            transaction_bytes=32,
            dram_bytes=80 * 10**9,
            levels=(),
            peak_flops=(),
        )


def matmul_graph(
    m: int = 4,
    k: int = 8,
    n: int = 6,
    *,
    grid: tuple[int, ...] = (3,),
    forloop: int = 2,
    x_imap: tuple[int | None, ...] = (None,),
    w_imap: tuple[int | None, ...] = (1,),
    x_fmap: int | None = 1,
    w_fmap: int | None = 0,
    omap: tuple[int, ...] = (1,),
    accumulate: bool = True,
    dtype: str = "float16",
) -> KernelGraph:
    """``X[m,k] @ W[k,n]`` as one graph-defined kernel with the given maps."""
    nodes: list = [
        InputIterator(0, x_imap, x_fmap),
        InputIterator(1, w_imap, w_fmap),
        BlockOp(Op.MATMUL, (0, 1)),
    ]
    if accumulate:
        nodes.append(Accumulator(2))
    nodes.append(OutputSaver(len(nodes) - 1, omap))
    block = BlockGraph(grid, forloop, tuple(nodes))
    return KernelGraph(
        (TensorSpec("X", (m, k), dtype), TensorSpec("W", (k, n), dtype)),
        (GraphDefinedOp(block, (0, 1)),),
        (2,),
    )


# --------------------------------------------------------------------------------------- equality / hashing


def test_identical_graphs_are_equal_and_hash_equal() -> None:
    a, b = rmsnorm_matmul()[1], rmsnorm_matmul()[1]
    assert a is not b and a == b and hash(a) == hash(b)
    assert len({a, b}) == 1


def test_changed_map_is_unequal() -> None:
    g = matmul_graph()
    assert g == matmul_graph()
    assert g != matmul_graph(w_imap=(None,))
    assert g != matmul_graph(x_fmap=None, w_fmap=None, forloop=1, accumulate=False)
    assert g != matmul_graph(grid=(1,))
    assert hash(g) != hash(matmul_graph(omap=(0,)))  # (hashes of tuples differing in an int differ)


def test_constructors_normalise_inputs() -> None:
    a = BlockOp("sum", [Ref(0)], {"dim": 1, "keepdim": True})
    b = BlockOp(Op.SUM, ((0, 0),), (("keepdim", True), ("dim", 1)))
    c = BlockOp(Op.SUM, (0,), {"keepdim": True, "dim": 1})
    assert a == b == c and hash(a) == hash(b) == hash(c)
    assert BlockOp(Op.RESHAPE, (0,), {"shape": [1, 2]}).attrs == (("shape", (1, 2)),)
    assert InputIterator(0, [1, None]).imap == (1, None)
    assert BlockGraph([2, 3], 1, [OutputSaver(0, [0, 1])]).grid == (2, 3)


def test_ir_is_frozen() -> None:
    g = matmul_graph()
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.ops = ()  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------- validity


def test_examples_are_valid() -> None:
    validate(gated_mlp()[1], _profile())
    info = validate(rmsnorm_matmul()[1])
    assert info.nodes[3][0].shape == (4, 12)


def _raises(g: KernelGraph, *fragments: str, hw: HwProfile | None = None) -> str:
    with pytest.raises(UGraphError) as e:
        validate(g, hw)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, msg
    assert "\n" not in msg
    assert not is_valid(g, hw)
    return msg


def test_bad_imap_partition() -> None:
    _raises(matmul_graph(n=7), "kernel op %2", "block node #1 (iterator)", "imap x->1 does not divide")


def test_bad_fmap_partition() -> None:
    _raises(matmul_graph(k=9, forloop=2), "block node #0", "fmap 1 does not divide")


def test_fmap_without_loop_is_rejected() -> None:
    _raises(matmul_graph(forloop=1, accumulate=False), "no for-loop")


def test_imap_dim_out_of_range_and_length() -> None:
    _raises(matmul_graph(x_imap=(2,)), "imap x dim 2")
    _raises(matmul_graph(x_imap=(None, None)), "imap has 2 entries for a 1-d grid")


def test_omap_rules() -> None:
    _raises(matmul_graph(grid=(3, 2), x_imap=(None, 0), w_imap=(1, None), omap=(1, 1)), "two grid dims")
    _raises(matmul_graph(omap=(5,)), "omap x dim 5")
    _raises(matmul_graph(grid=(3, 2), x_imap=(None, 0), w_imap=(1, None), omap=(1,)), "omap has 1 entries")


def test_omap_replica_is_unrepresentable() -> None:
    # omap entries are data dims; a replica (None) does not even construct.
    with pytest.raises(TypeError):
        OutputSaver(0, (None,))  # type: ignore[arg-type]


def test_grid_rules() -> None:
    _raises(
        matmul_graph(grid=(1, 1, 1, 1), x_imap=(None,) * 4, w_imap=(None,) * 4, omap=(0, 1, 0, 1)),
        "1 to 3 dims",
    )
    _raises(matmul_graph(grid=(0,)), "below 1")


def test_looped_path_without_accumulator() -> None:
    msg = _raises(matmul_graph(accumulate=False), "block node #3 (saver)", "no accumulator")
    assert "#2" in msg


def test_accumulator_without_loop() -> None:
    _raises(
        matmul_graph(forloop=1, x_fmap=None, w_fmap=None), "accumulator in a block graph without a for-loop"
    )


def test_post_loop_op_reading_loop_body_value() -> None:
    nodes = (
        InputIterator(0, (None,), 1),
        InputIterator(1, (1,), 0),
        BlockOp(Op.MATMUL, (0, 1)),
        Accumulator(2),
        BlockOp(Op.ADD, (3, 2)),
        OutputSaver(4, (1,)),
    )
    g = dataclasses.replace(matmul_graph(), ops=(GraphDefinedOp(BlockGraph((3,), 2, nodes), (0, 1)),))
    _raises(g, "block node #4 (add)", "loop-body value #2")


def test_two_accumulators_on_a_path() -> None:
    nodes = (
        InputIterator(0, (None,), 1),
        InputIterator(1, (1,), 0),
        BlockOp(Op.MATMUL, (0, 1)),
        Accumulator(2),
        Accumulator(3),
        OutputSaver(4, (1,)),
    )
    g = dataclasses.replace(matmul_graph(), ops=(GraphDefinedOp(BlockGraph((3,), 2, nodes), (0, 1)),))
    _raises(g, "block node #4 (accumulator)", "second accumulator")


def test_thread_graph_only_elementwise() -> None:
    tg = ThreadGraph((2,), (ThreadOp(Op.SUM, (0,), {"dim": 0}),), (1,))
    nodes = (
        InputIterator(0, (None,)),
        InputIterator(1, (1,)),
        BlockOp(Op.MATMUL, (0, 1)),
        tg,
        OutputSaver(3, (1,)),
    )
    g = dataclasses.replace(matmul_graph(), ops=(GraphDefinedOp(BlockGraph((3,), 1, nodes), (0, 1)),))
    _raises(g, "thread graph", "only elementwise")


def test_op_spec_mismatch_names_node() -> None:
    nodes = (
        InputIterator(0, (None,)),
        InputIterator(1, (1,)),
        BlockOp(Op.MATMUL, (1, 0)),
        OutputSaver(2, (1,)),
    )
    g = dataclasses.replace(matmul_graph(), ops=(GraphDefinedOp(BlockGraph((3,), 1, nodes), (0, 1)),))
    _raises(g, "block node #2 (matmul)", "inner dims differ")


def test_bad_references() -> None:
    nodes = (InputIterator(0, (None,)), BlockOp(Op.EXP, (4,)), OutputSaver(1, (1,)))
    g = dataclasses.replace(matmul_graph(), ops=(GraphDefinedOp(BlockGraph((3,), 1, nodes), (0, 1)),))
    _raises(g, "not an earlier node")
    nodes2 = (InputIterator(5, (None,)), OutputSaver(0, (1,)))
    g2 = dataclasses.replace(matmul_graph(), ops=(GraphDefinedOp(BlockGraph((1,), 1, nodes2), (0, 1)),))
    _raises(g2, "input 5 out of range")
    nodes3 = (InputIterator(0, (None,)), OutputSaver(0, (1,)), BlockOp(Op.EXP, (1,)), OutputSaver(2, (1,)))
    g3 = dataclasses.replace(matmul_graph(), ops=(GraphDefinedOp(BlockGraph((1,), 1, nodes3), (0, 1)),))
    _raises(g3, "which has 0")  # savers have no block-level output
    _raises(dataclasses.replace(matmul_graph(), outputs=(Ref(2, 1),)), "kernel graph outputs")


def test_kernel_level_spec_errors() -> None:
    g = KernelGraph((TensorSpec("A", (2, 3)), TensorSpec("B", (2, 3))), (KernelOp(Op.MATMUL, (0, 1)),), (2,))
    _raises(g, "kernel op %2 (matmul)", "inner dims differ")
    dup = KernelGraph(
        (TensorSpec("A", (2, 3)), TensorSpec("A", (3, 2))), (KernelOp(Op.MATMUL, (0, 1)),), (2,)
    )
    _raises(dup, "duplicate name")
    validate(
        KernelGraph((TensorSpec("A", (2, 3)), TensorSpec("B", (3, 2))), (KernelOp(Op.MATMUL, (0, 1)),), (2,))
    )


def test_shared_memory_budget_h100() -> None:
    hw = _profile("h100")
    # Fits: 128x64 and 64x128 fp16 tiles + a 128x128 product: 16 KiB + 16 KiB + 32 KiB (+ accumulator 32 KiB).
    validate(matmul_graph(m=128, k=512, n=1024, grid=(8,), forloop=8), hw)
    # A whole 512x1024 fp16 W tile in one block is 1 MiB of shared memory: over budget.
    big = matmul_graph(m=128, k=512, n=1024, grid=(1,), forloop=1, x_fmap=None, w_fmap=None, accumulate=False)
    validate(big)  # fine without a profile
    msg = _raises(big, "shared memory", str(hw.shared_mem_per_block), hw=hw)
    assert "kernel op %2" in msg


def test_device_memory_budget() -> None:
    hw = dataclasses.replace(_profile("h100"), dram_bytes=200)  # the graph holds 64 + 96 + 48 bytes
    _raises(matmul_graph(), "device memory", hw=hw)


def test_register_budget() -> None:
    hw = dataclasses.replace(_profile("h100"), max_registers_per_thread=3)
    _, g = gated_mlp(dtype="float32")  # its thread graph keeps 4 fp32 values per element
    _raises(g, "registers", hw=hw)
    validate(g, dataclasses.replace(hw, max_registers_per_thread=4))


def test_unknown_dtype_with_profile() -> None:
    _raises(matmul_graph(dtype="float7"), "unknown dtype", hw=_profile())
