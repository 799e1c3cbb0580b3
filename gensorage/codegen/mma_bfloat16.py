"""bfloat16 ``ldmatrix`` and ``mma.sync`` tensor intrinsics, registered beside TVM's float16 ones.

TVM 0.27 registers the m16n8k16 intrinsics for float16 only (``tvm.s_tir.tensor_intrin.cuda``), although its
PTX code generator emits ``ldmatrix`` for any 16-bit type and ``mma`` with ``bf16`` operands. This module
registers the bfloat16 counterparts the tensor-core schedule needs, built the same way: a description (the
loop the intrinsic replaces, which ``tensorize`` matches) and an implementation that calls TVM's
``ptx_legacy.ldmatrix`` / ``ptx_legacy.mma`` builtins. The fragment layout is the one of
:func:`gensorage.codegen.tensor_core.fragment_lane` (the PTX ISA's m16n8k16 layout).
"""

from __future__ import annotations

from functools import cache
from typing import Any

LDMATRIX_A = "gensorage_ldmatrix_bf16_a_dyn"
LDMATRIX_B = "gensorage_ldmatrix_bf16_b_dyn"
MMA = "gensorage_mma_bf16bf16f32"


def ldmatrix_name(operand: str, transposed: bool) -> str:
    """The registered ldmatrix intrinsic of ``operand`` ("A" or "B"), stored transposed or not."""
    base = LDMATRIX_A if operand == "A" else LDMATRIX_B
    return base + "_trans" if transposed else base


def mma_name(ta: bool, tb: bool) -> str:
    """The registered MMA intrinsic whose fragments come from A and B stored so."""
    return MMA + ("_trans_a" if ta else "") + ("_trans_b" if tb else "")


WARP = 32
TILE = 16
LOCAL = 8  # elements of a 16 x 16 fragment per lane


def _lane(i: Any, j: Any) -> tuple[Any, Any]:
    from gensorage.codegen.tensor_core import fragment_lane

    return fragment_lane(i, j)


def _ldmatrix(operand: str, stored_transposed: bool = False) -> tuple[Any, Any]:
    """(description, implementation) of loading a 16 x 16 bfloat16 tile from dynamic shared memory.

    A (row-major [m, k]) loads without transposition, B (row-major [k, n]) with ``.trans``: both fragments
    are then indexed by :func:`_lane` of the shared tile's (row, column), and ``mma.sync.row.col`` reads B's
    as its column-major operand. Lane ``tx`` gives the address of one 16-byte row of the four 8 x 8 matrices:
    row ``tx % 16``, left half for lanes 0-15 and right half for lanes 16-31.

    Stored transposed (A as [k, m], B as [n, k]) the ``.trans`` flips and the four matrices are taken in the
    other order (rows ``tx % 8`` of the top half for lanes 0-15, of the bottom half for 16-31; left, then right
    eight columns), as TVM's float16 ``*_trans`` intrinsics do: the fragments in registers are then the
    same as for the usual layouts.
    """
    from tvm.script import tirx as T

    transpose = (operand == "B") != stored_transposed

    def offset(tx: Any, stride: Any) -> Any:
        if stored_transposed:
            return stride * 8 * (tx // 16) + stride * (tx % 8) + 8 * ((tx % 16) // 8)
        return stride * (tx % 16) + 8 * (tx // 16)

    @T.prim_func(s_tir=True)
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(
            shared_handle, (TILE, TILE), "bfloat16", align=64, offset_factor=TILE, scope="shared.dyn"
        )
        warp = T.match_buffer(
            warp_handle, (WARP, LOCAL), "bfloat16", align=64, offset_factor=TILE, scope="warp"
        )
        with T.sblock("root"):
            T.reads(shared[0:TILE, 0:TILE])
            T.writes(warp[0:WARP, 0:LOCAL])
            for ax0, ax1 in T.grid(TILE, TILE):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(shared[v0, v1])
                    lane, elem = T.meta_var(_lane(v0, v1))
                    T.writes(warp[lane, elem])
                    warp[lane, elem] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(
            shared_handle,
            (TILE, TILE),
            "bfloat16",
            align=64,
            offset_factor=TILE,
            scope="shared.dyn",
            strides=[s0, s1],
        )
        warp = T.match_buffer(
            warp_handle, (WARP, LOCAL), "bfloat16", align=64, offset_factor=TILE, scope="warp"
        )
        with T.sblock("root"):
            T.reads(shared[0:TILE, 0:TILE])
            T.writes(warp[0:WARP, 0:LOCAL])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(
                    T.ptx_legacy.ldmatrix(
                        transpose,
                        4,
                        ".b16",
                        warp.data,
                        warp.elem_offset + LOCAL * tx,
                        shared.access_ptr("r"),
                        offset(tx, s0),
                        dtype="bfloat16",
                    )
                )

    return desc, impl


def _mma(ta: bool = False, tb: bool = False) -> tuple[Any, Any]:
    """(description, implementation) of C[16, 16] += A[16, 16] @ B[16, 16] in float32: two m16n8k16 MMAs.

    ``ta`` / ``tb``: the fragment was loaded from an operand stored transposed, so the description indexes it
    by (k, m) / (n, k) (the registers hold the same values, see :func:`_ldmatrix`)."""
    from tvm.script import tirx as T

    def swap(flag: bool, i: Any, j: Any) -> tuple[Any, Any]:
        return (j, i) if flag else (i, j)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, LOCAL), "bfloat16", align=64, offset_factor=TILE, scope="warp")
        B = T.match_buffer(b, (WARP, LOCAL), "bfloat16", align=64, offset_factor=TILE, scope="warp")
        C = T.match_buffer(c, (WARP, LOCAL), "float32", align=64, offset_factor=TILE, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:LOCAL], A[0:WARP, 0:LOCAL], B[0:WARP, 0:LOCAL])
            T.writes(C[0:WARP, 0:LOCAL])
            for i, j, k in T.grid(TILE, TILE, TILE):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    lc, ec = T.meta_var(_lane(vi, vj))
                    la, ea = T.meta_var(_lane(*swap(ta, vi, vk)))
                    lb, eb = T.meta_var(_lane(*swap(tb, vk, vj)))
                    T.reads(C[lc, ec], A[la, ea], B[lb, eb])
                    T.writes(C[lc, ec])
                    C[lc, ec] += T.Cast("float32", A[la, ea]) * T.Cast("float32", B[lb, eb])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, LOCAL), "bfloat16", align=64, offset_factor=TILE, scope="warp")
        B = T.match_buffer(b, (WARP, LOCAL), "bfloat16", align=64, offset_factor=TILE, scope="warp")
        C = T.match_buffer(c, (WARP, LOCAL), "float32", align=64, offset_factor=TILE, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:LOCAL], A[0:WARP, 0:LOCAL], B[0:WARP, 0:LOCAL])
            T.writes(C[0:WARP, 0:LOCAL])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for half in range(2):  # columns 0-7, then 8-15 of the 16 x 16 tile
                    T.evaluate(
                        T.ptx_legacy.mma(
                            "m16n8k16",
                            "row",
                            "col",
                            "bf16",
                            "bf16",
                            "fp32",
                            A.data,
                            A.elem_offset + tx * LOCAL,
                            B.data,
                            B.elem_offset + tx * LOCAL + half * (LOCAL // 2),
                            C.data,
                            C.elem_offset + tx * LOCAL + half * (LOCAL // 2),
                            False,
                            dtype="float32",
                        )
                    )

    return desc, impl


@cache
def register() -> None:
    """Register the bfloat16 intrinsics with TVM (once per process)."""
    from tvm.s_tir import TensorIntrin

    for operand in ("A", "B"):
        for transposed in (False, True):
            TensorIntrin.register(ldmatrix_name(operand, transposed), *_ldmatrix(operand, transposed))
    for ta in (False, True):
        for tb in (False, True):
            TensorIntrin.register(mma_name(ta, tb), *_mma(ta, tb))


def bfloat16_rounded_text(x: str) -> str:
    """TVMScript text of :func:`bfloat16_rounded` for the float32 expression text ``x`` (the text emitters' form,
    for their llvm twins)."""
    bits = f'T.reinterpret("uint32", {x})'
    half = f"(T.uint32(32767) + (({bits} >> T.uint32(16)) & T.uint32(1)))"
    return f'T.reinterpret("float32", ({bits} + {half}) & T.uint32(4294901760))'


def bfloat16_rounded(x: Any) -> Any:
    """The float32 TIR expression ``x`` rounded to bfloat16 (to nearest even), as a float32 value: what the GPU's
    conversion to a bfloat16 MMA operand gives. The CPU twins need it spelled out because TVM's llvm build
    drops a float32 -> bfloat16 -> float32 round trip (bfloat16 computes in float32 there). NaN and infinity
    are not special-cased: the twins check finite data."""
    from tvm import tirx

    bits = tirx.reinterpret("uint32", x)
    half = tirx.const(0x7FFF, "uint32") + ((bits >> tirx.const(16, "uint32")) & tirx.const(1, "uint32"))
    return tirx.reinterpret("float32", (bits + half) & tirx.const(0xFFFF0000, "uint32"))
