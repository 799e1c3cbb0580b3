"""The abstraction the search prunes with (Mirage §4.3, with extensions).

- :mod:`.abstract_expr`: abstract expressions (hash-consed terms) of programs and µGraphs;
- :mod:`.expr_arith`: the arithmetic that computes them for tensors, tiles and concatenations;
- :mod:`.canon`: their normal forms, the canonical model of ``A_eq``;
- :mod:`.axioms`: ``A_eq`` and ``A_sub`` as Z3 axioms;
- :mod:`.oracle`: the subexpression oracle (normal forms first, Z3 where they cannot decide);
- :mod:`.ties`: index ties, the dims and reduction classes abstract expressions forget.
"""

from __future__ import annotations

from gensorage.exhaustive.expr.abstract_expr import Term, expr_of
from gensorage.exhaustive.expr.canon import Canon, Elem, TooBig
from gensorage.exhaustive.expr.expr_arith import EXPR, ExprArith, ExprValue
from gensorage.exhaustive.expr.oracle import SubexprOracle
from gensorage.exhaustive.expr.ties import TieArith, Ties

__all__ = [
    "EXPR",
    "Canon",
    "Elem",
    "ExprArith",
    "ExprValue",
    "SubexprOracle",
    "Term",
    "TieArith",
    "Ties",
    "TooBig",
    "expr_of",
]
