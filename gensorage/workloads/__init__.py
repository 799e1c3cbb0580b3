"""Workloads for the construction tuner: built-in operators, user TE/TIR computations, benchmark configs.

>>> import gensorage.workloads as workloads
>>> wl = workloads.gemm(1024, 1024, 1024)
>>> [a.name for a in wl.axes]
['i', 'j', 'k']
"""

from __future__ import annotations

from gensorage.workloads.analysis import from_prim_func, from_te
from gensorage.workloads.builtin import avgpool2d, batch_matmul, conv2d, gemm, gemv
from gensorage.workloads.configs import (
    OPS,
    get_op_config,
    list_op_configs,
    load_op_configs,
    workload_from_spec,
)
from gensorage.workloads.data import SUPPORTED_DTYPES, accum_dtype, numpy_dtype, random_inputs
from gensorage.workloads.workload import Access, Axis, Workload

__all__ = [
    "OPS",
    "SUPPORTED_DTYPES",
    "Access",
    "Axis",
    "Workload",
    "accum_dtype",
    "avgpool2d",
    "batch_matmul",
    "conv2d",
    "from_prim_func",
    "from_te",
    "gemm",
    "gemv",
    "get_op_config",
    "list_op_configs",
    "load_op_configs",
    "numpy_dtype",
    "random_inputs",
    "workload_from_spec",
]
