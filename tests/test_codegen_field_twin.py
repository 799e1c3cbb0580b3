"""The finite-field twin of the generated kernels: bit-exact agreement with FieldArith, and faults it catches."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.codegen.field_twin import FieldTwin, check_field_twin
from gensorage.codegen.scalar import MIX_SALT, keyed_hash, mix64
from gensorage.errors import NotLaxError
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.ugraph.examples import EXAMPLES
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    OutputSaver,
    Ref,
    TensorSpec,
    ThreadGraph,
    ThreadOp,
)
from gensorage.verify import maxset
from gensorage.verify.field import FieldArith
from gensorage.verify.primes import find_safe_prime_pair

HW = load_profile("h100")


@settings(max_examples=200, deadline=None)
@given(x=st.integers(0, 2**31 - 1), key=st.integers(0, 2**63 - 1))
def test_keyed_hash_is_fieldarith_activation(x: int, key: int) -> None:
    h = maxset.mix64(np.array([x + key], dtype=np.uint64))[0]
    assert mix64(x + key) == int(h)
    arith = FieldArith(1, np.random.default_rng(0), keys={"relu": key, "silu": 0, "gelu": 0})
    p, q = arith.p, arith.q
    value = arith.value(np.array([[x % p]]), np.array([[0]]))
    got = arith.activation("relu", value).data[:, 0, 0]
    assert keyed_hash(x % p, key, p, q) == (int(got[0]), int(got[1]))
    assert int(maxset.mix64(np.array([int(h) ^ MIX_SALT], dtype=np.uint64))[0]) == mix64(int(h) ^ MIX_SALT)


def _all_ops_graph() -> KernelGraph:
    """One block computing every elementwise op of Table 3 (and the keyed activations) in a thread graph."""
    specs = (TensorSpec("X", (4, 6), "float32"), TensorSpec("Y", (4, 6), "float32"))
    ops = (
        ThreadOp(Op.ADD, (0, 1)),
        ThreadOp(Op.SUB, (0, 1)),
        ThreadOp(Op.MUL, (0, 1)),
        ThreadOp(Op.DIV, (0, 1)),
        ThreadOp(Op.EXP, (0,)),
        ThreadOp(Op.SQRT, (1,)),
        ThreadOp(Op.SCALE, (0,), {"factor": 0.125}),
        ThreadOp(Op.RELU, (0,)),
        ThreadOp(Op.SILU, (1,)),
        ThreadOp(Op.GELU, (5,)),
    )
    nodes: list[BlockNode] = [
        InputIterator(0, (0,)),
        InputIterator(1, (0,)),
        ThreadGraph((0, 1), ops, tuple(range(2, 12))),
    ]
    nodes += [OutputSaver(Ref(2, o), (0,)) for o in range(10)]
    g = KernelGraph(
        specs,
        (GraphDefinedOp(BlockGraph((2,), 1, tuple(nodes)), (0, 1)),),
        tuple(Ref(2, o) for o in range(10)),
    )
    return g


def test_every_field_op_matches_fieldarith_bit_for_bit() -> None:
    g = _all_ops_graph()
    result = check_field_twin(g, None, trials=3, seed=7, hw=HW)
    assert result, str(result)
    assert result.trials == 3 and result.reference == "µGraph"


def test_other_moduli() -> None:
    p, q = find_safe_prime_pair(1 << 20)
    result = check_field_twin(_all_ops_graph(), None, trials=2, seed=2, hw=HW, p=p, q=q)
    assert result and (result.p, result.q) == (p, q)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_twin_matches_program(name: str) -> None:
    program, g = EXAMPLES[name](dtype="float32")  # the float32 tests' schedules (construction is memoised)
    result = check_field_twin(g, program, trials=2, seed=11, hw=HW)
    assert result, str(result)


# ------------------------------------------------------------------------------------------ injected faults


def _mutate(twin: FieldTwin, name: str, find: str, old: str, new: str) -> FieldTwin:
    """Replace ``old`` by ``new`` on the first source line containing ``find`` (both residue lines alike)."""
    lines = twin.source(name).splitlines()
    hits = [i for i, ln in enumerate(lines) if find in ln and old in ln]
    assert hits, f"no line with {find!r} and {old!r}"
    for i in hits[:2]:  # the p and the q line of one store
        lines[i] = lines[i].replace(old, new, 1)
    return twin.with_source(name, "\n".join(lines) + "\n")


def test_swapped_imap_in_lowered_code_is_caught() -> None:
    program, g = EXAMPLES["lora"](dtype="float32")
    twin = FieldTwin(g, HW)
    assert check_field_twin(g, program, twin=twin)
    # X's rows are split over grid y (imap (None, 0)): read them by blockIdx.x instead.
    bad = _mutate(twin, "kernel0_graph", "= in0[", "by * 2", "bx * 2")
    result = check_field_twin(g, program, trials=2, twin=bad)
    assert not result and result.mismatch is not None and result.mismatch.output == 0


def test_wrong_loop_offset_is_caught() -> None:
    program, g = EXAMPLES["flash_attention"](dtype="float32")
    twin = FieldTwin(g, HW)
    # K's tile walks the kv dim by the for-loop (fmap): load the first tile every iteration instead.
    bad = _mutate(twin, "kernel0_graph", "= in1[", "it * 4 + ", "")
    assert not check_field_twin(g, program, trials=2, twin=bad)


def test_wrong_omap_is_caught() -> None:
    program, g = EXAMPLES["gqa"](dtype="float32")
    twin = FieldTwin(g, HW)
    src = twin.source("kernel1_graph")
    store = next(ln for ln in src.splitlines() if "out0[0, " in ln)
    offset = re.search(r"by \* \d+", store)
    assert offset is not None
    bad = _mutate(twin, "kernel1_graph", "out0[", offset.group(0), "0")
    assert not check_field_twin(g, program, trials=2, twin=bad)


def test_predefined_matmul_twin_catches_a_wrong_schedule_index() -> None:
    from gensorage.ugraph.from_program import from_program

    program, _ = EXAMPLES["gated_mlp"](dtype="float32")
    g = from_program(program)
    twin = FieldTwin(g, HW)
    assert check_field_twin(g, program, trials=1, twin=twin)
    name = next(k.name for k in twin.kernels if k.name.startswith("kernel0_matmul"))
    src = twin.source(name)
    # The scheduled reduction reads A_shared[v_i, v_k]; read column 0 instead (the reduction index dropped).
    assert "A_shared[v_i, v_k]" in src
    bad = twin.with_source(name, src.replace("A_shared[v_i, v_k] *", "A_shared[v_i, 0] *", 1))
    assert not check_field_twin(g, program, trials=1, twin=bad)


# ------------------------------------------------------------------------------------------ no field semantics


def test_max_accumulator_has_no_field_twin() -> None:
    specs = (TensorSpec("A", (4, 4), "float32"),)
    nodes: tuple[BlockNode, ...] = (
        InputIterator(0, (None,), 0),
        BlockOp(Op.EXP, (0,)),
        Accumulator(1, "max"),
        OutputSaver(2, (0,)),
    )
    g = KernelGraph(specs, (GraphDefinedOp(BlockGraph((1,), 2, nodes), (0,)),), (Ref(1),))
    with pytest.raises(NotLaxError):
        check_field_twin(g, None, trials=1, hw=HW)
