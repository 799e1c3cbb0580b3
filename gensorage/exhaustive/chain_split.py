"""A program whose form the space lacks, searched as its own pre-defined operators and a program of the rest.

LayerNorm's mean subtraction ``X − (Σ X)/n`` adds operands that carry different constant factors
(:func:`mixing_nodes`), a form the space's placement of constants never generates (docs/search.md,
"Restrictions of the space"). Its *chain* is the set of the program's operators such an ``add`` or ``sub``
depends on (``sum``, ``scale``, ``sub``), run as the program's own pre-defined operators; the *rest* is a program
of its own (:attr:`ChainSplit.rest`), whose inputs are the chain's results and the program inputs it reads
(LayerNorm's: ``C = X − mean X`` and ``W``), searched for a custom kernel like any program. The rest has no
``sub`` of the chain's, so the index-tie rule, the occurrence budget and the rules of additive constants, which
a ``sub`` in the op set turns off, prune its search. Each of its candidates is joined behind the chain
(:meth:`ChainSplit.splice`) and checked against the whole program (:func:`spliced_candidates`).

A restriction (docs/search.md, "Restrictions of the space", the sixth): a custom kernel that reads ``X`` or the
chain's other tensors, computes a ``sub``, or equals the rest only where ``Σ C = 0`` is not searched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from gensorage.exhaustive.results import Candidate, rank_candidates
from gensorage.exhaustive.rules.constants import Const, const_of, same
from gensorage.exhaustive.spec import SearchSpec
from gensorage.exhaustive.walk.finalize import checked
from gensorage.hw import load_profile
from gensorage.opset import Op
from gensorage.program import Node, Program, Tensor
from gensorage.ugraph.cost import predict_ugraph_time
from gensorage.ugraph.ir import KernelGraph, KernelOp, Ref, TensorSpec


@dataclass(frozen=True, slots=True)
class ChainSplit:
    """A program as its chain of pre-defined operators and the rest (see the module docstring).

    ``rest`` is the rest as a program; ``chain`` is a µGraph of the whole program's inputs made of the chain's
    pre-defined operators, whose outputs are the rest's inputs, in order (a chain result or a program input).
    """

    rest: Program
    chain: KernelGraph

    @property
    def chain_ops(self) -> tuple[str, ...]:
        """The chain's operators, in order (``("sum", "scale", "sub")`` for LayerNorm)."""
        return tuple(op.op.value for op in self.chain.ops if isinstance(op, KernelOp))

    def splice(self, g: KernelGraph) -> KernelGraph:
        """The µGraph of the whole program that runs the chain, then ``g`` (a µGraph of :attr:`rest`) on its
        results."""
        n_in = len(g.inputs)
        base = len(self.chain.inputs) + len(self.chain.ops)

        def at(r: Ref) -> Ref:
            return self.chain.outputs[r.node] if r.node < n_in else Ref(r.node - n_in + base, r.out)

        ops = tuple(dataclasses.replace(op, inputs=tuple(at(r) for r in op.inputs)) for op in g.ops)
        return KernelGraph(
            self.chain.inputs, self.chain.ops + ops, tuple(at(r) for r in g.outputs), g.precision
        )


def mixing_nodes(program: Program) -> list[int]:
    """The live ``add`` and ``sub`` nodes of ``program`` whose operands carry different constant factors
    (:func:`~gensorage.exhaustive.rules.constants.const_of`): ``X − (Σ X)/n``. A stable softmax's ``c·S −
    max(c·S)`` carries ``c`` on both sides and is none."""
    factors: dict[int, Const] = {}
    mixing = []
    for i in program.live_ids():
        node = program.nodes[i]
        if node.op is None:
            factors[i] = 1.0
            continue
        ins = [factors[j] for j in node.inputs]
        a, b = (ins + [None])[:2]
        if node.op in (Op.ADD, Op.SUB) and a is not None and b is not None and not same(a, b):
            mixing.append(i)
        factors[i] = const_of(node.op, node.attrs, ins)
    return mixing


def chain_split(program: Program) -> ChainSplit | None:
    """``program`` as the chain of the operators its factor-mixing ``add`` and ``sub`` depend on and the rest;
    None where it has no such operator, a chain result is an output, or the rest mixes factors itself."""
    nodes = program.nodes
    chain: set[int] = set()
    stack = mixing_nodes(program)
    while stack:
        i = stack.pop()
        if i not in chain and nodes[i].op is not None:
            chain.add(i)
            stack.extend(nodes[i].inputs)
    if not chain or chain & {t.id for t in program.outputs}:
        return None
    rest_ids = [i for i in program.live_ids() if nodes[i].op is not None and i not in chain]
    sources = sorted({j for i in rest_ids for j in nodes[i].inputs if j not in rest_ids})
    rest = Program(name=f"{program.name}_rest")
    tensors: dict[int, Tensor] = {
        j: rest.input(nodes[j].name, nodes[j].shape, nodes[j].dtype) for j in sources
    }
    for i in rest_ids:
        n, op = nodes[i], _op(nodes[i])
        tensors[i] = rest.apply(op, [tensors[j] for j in n.inputs], dict(n.attrs), name=n.name)
    for t in program.outputs:
        rest.output(tensors[t.id])
    if mixing_nodes(rest):
        return None
    ref_of = {t.id: Ref(k) for k, t in enumerate(program.inputs)}
    specs = tuple(TensorSpec(t.name, t.shape, t.dtype) for t in program.inputs)
    ops: list[KernelOp] = []
    for i in sorted(chain):  # node order is topological
        ops.append(KernelOp(_op(nodes[i]), tuple(ref_of[j] for j in nodes[i].inputs), nodes[i].attrs))
        ref_of[i] = Ref(len(specs) + len(ops) - 1)
    return ChainSplit(rest, KernelGraph(specs, tuple(ops), tuple(ref_of[j] for j in sources)))


def _op(node: Node) -> Op:
    assert node.op is not None, "an operator node"
    return node.op


def spliced_candidates(
    split: ChainSplit, program: Program, spec: SearchSpec, candidates: Sequence[Candidate]
) -> list[Candidate]:
    """The candidates of the rest's search (``spec``) joined behind the chain, each checked against the whole
    ``program`` as the walk checks a µGraph (the same seeds, trials and float test) and priced, best first.

    A candidate equal to the rest for every input is equal to ``program`` (the chain computes the rest's inputs),
    so none should fail; the check is made all the same, and one that fails is dropped."""
    hw = load_profile(spec.hw)
    out = []
    for c in candidates:
        g = split.splice(c.ugraph)
        summary = checked(program, g, spec)
        if summary is not None:
            out.append(Candidate(g, predict_ugraph_time(g, hw), summary, c.found_in_task))
    return rank_candidates(out)


__all__ = ["ChainSplit", "chain_split", "mixing_nodes", "spliced_candidates"]
