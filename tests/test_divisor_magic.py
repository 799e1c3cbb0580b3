"""Division by a divisor's magic pair (gensorage.codegen.divisor_magic): exact over the whole int32 range, in
Python and in a compiled kernel whose text was rewritten."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gensorage.codegen.divisor_magic import divisor_positions, floordiv, magic, with_magic_divisions
from gensorage.codegen.script_templates import skeleton

INT32 = st.integers(-(2**31), 2**31 - 1)
#: Divisors of every size: the small ones the kernels use, powers of two and their neighbours, the largest.
DIVISORS = st.one_of(
    st.integers(1, 4096),
    st.integers(1, 30).map(lambda k: 2**k).flatmap(lambda p: st.sampled_from([p - 1, p, p + 1])),
    st.integers(1, 2**31 - 1),
)


@settings(max_examples=2000)
@given(n=INT32, d=DIVISORS.filter(lambda d: 1 <= d < 2**31))
def test_the_magic_pair_divides_exactly_over_int32(n: int, d: int) -> None:
    m, s = magic(d)
    assert 0 < m <= 2**32 and s <= 62  # the product of a 31-bit x and m stays below 2**63
    assert floordiv(n, m, s) == n // d
    assert n - floordiv(n, m, s) * d == n % d


@pytest.mark.parametrize("n", [0, 1, -1, 2**31 - 1, -(2**31), 2**31 - 2, -(2**31) + 1])
@pytest.mark.parametrize("d", [1, 2, 3, 7, 20, 33, 1000, 2**30, 2**30 + 1, 2**31 - 1])
def test_the_extremes(n: int, d: int) -> None:
    assert floordiv(n, *magic(d)) == n // d


@pytest.mark.parametrize("d", [0, -3, 2**31])
def test_a_divisor_out_of_range_is_refused(d: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        magic(d)


TEXT = """@T.prim_func
def k(a: T.Buffer((64,), "int32"), q: T.Buffer((64,), "int32"), r: T.Buffer((64,), "int32")):
    T.func_attr({"global_symbol": "k", "tir.noalias": True})
    for i in T.serial(64):
        q[i] = (a[i] * 1 + 0) // 20 % 7
        r[i] = a[i] % 20 // 3
"""


@settings(max_examples=5)
@given(d20=DIVISORS, d7=DIVISORS, d3=DIVISORS, seed=st.integers(0, 2**16))
def test_a_rewritten_kernel_divides_as_tvm_does(d20: int, d7: int, d3: int, seed: int) -> None:
    """The text rewrite (nested numerators, a subscript as a numerator) compiled by TVM: the quotients and
    remainders of int32 values of every sign and size, divisors bound at the call, against numpy's floor
    division (TVM's ``//`` and ``%`` on int32)."""
    import tvm

    body, values = skeleton(TEXT, "k")
    divs = sorted(divisor_positions(body))
    assert [values[i] for i in divs] == [20, 7, 20, 3]
    text = with_magic_divisions(body, divs)
    assert text is not None and "//" not in text.split("):", 1)[1]
    func = tvm.script.from_source(text)
    ex = tvm.compile(tvm.IRModule({"k": func.with_attr("global_symbol", "k")}), target="llvm")
    bound = dict(zip(divs, (d20, d7, d20, d3), strict=True))
    literals = [bound.get(i, v) for i, v in enumerate(values)]
    pairs = [x for i in divs for x in magic(bound[i])]
    rng = np.random.default_rng(seed)
    a = rng.integers(-(2**31), 2**31, 64, dtype=np.int64).astype(np.int32)
    a[:6] = [0, -1, 2**31 - 1, -(2**31), d20, -d20]
    q, r = np.zeros(64, np.int32), np.zeros(64, np.int32)
    args = [tvm.runtime.tensor(x) for x in (a, q, r)]
    ex["k"](*literals, *pairs, *args)
    a64 = a.astype(np.int64)
    np.testing.assert_array_equal(args[1].numpy(), np.floor_divide(a64, d20) % d7)
    np.testing.assert_array_equal(args[2].numpy(), np.mod(a64, d20) // d3)


def test_int64_text_keeps_its_divisors() -> None:
    body, _ = skeleton(TEXT.replace('"int32"', '"int64"'), "k")
    assert with_magic_divisions(body, sorted(divisor_positions(body))) is None
