"""Multi-level µGraphs (Mirage §2): the IR, validity, the literal evaluator, serialisations and examples.

See :mod:`gensorage.ugraph.ir` for the data model and its reference spaces.
"""

from __future__ import annotations

from gensorage.ugraph.evaluate import evaluate, run
from gensorage.ugraph.from_program import from_program, wrap_kernel_op
from gensorage.ugraph.ir import (
    Accumulator,
    BlockGraph,
    BlockNode,
    BlockOp,
    GraphDefinedOp,
    InputIterator,
    KernelGraph,
    KernelNode,
    KernelOp,
    OutputSaver,
    Ref,
    TensorSpec,
    ThreadGraph,
    ThreadOp,
    UGraph,
    node_inputs,
    num_outputs,
)
from gensorage.ugraph.rewrite import drop_loop
from gensorage.ugraph.serialize import from_json, to_json
from gensorage.ugraph.shapes import GraphInfo, infer
from gensorage.ugraph.text import to_text
from gensorage.ugraph.validate import is_valid, loop_phases, validate

__all__ = [
    "Accumulator",
    "BlockGraph",
    "BlockNode",
    "BlockOp",
    "GraphDefinedOp",
    "GraphInfo",
    "InputIterator",
    "KernelGraph",
    "KernelNode",
    "KernelOp",
    "OutputSaver",
    "Ref",
    "TensorSpec",
    "ThreadGraph",
    "ThreadOp",
    "UGraph",
    "drop_loop",
    "evaluate",
    "from_json",
    "from_program",
    "infer",
    "is_valid",
    "loop_phases",
    "node_inputs",
    "num_outputs",
    "run",
    "to_json",
    "to_text",
    "validate",
    "wrap_kernel_op",
]
