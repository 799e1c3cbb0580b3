"""Kernel launches read off TVM's host code: what a runner without TVM needs to launch a compiled module.

``tvm.compile`` splits a module into device kernels (CUDA C) and host functions that compute each kernel's
grid, block and dynamic shared memory and launch it. A machine with a GPU but no TVM (the benchmark's device
machine) can still run the kernels from a cubin if it knows those launch values. :func:`launch_specs` lowers
the module exactly as ``tvm.compile`` does and reads the launches from the host functions, in call order; with
static shapes every value is a constant.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gensorage.errors import ScheduleError

_CALL = re.compile(r'T\.call_ffi_kernel\("(\w+)", (.*?), launch_params=\[(.*?)\]')
_INT = re.compile(r"^(?:T\.int\d+\()?(-?\d+)\)?$")
_DIMS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")


@dataclass(frozen=True, slots=True)
class Launch:
    """One kernel launch of a host function: the device symbol, its pointer arguments (indices into the host
    function's parameters) and its launch configuration."""

    function: str
    kernel: str
    args: tuple[int, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int


def launch_specs(
    mod: Any, target: Any, config: dict[str, Any] | None = None, order: Sequence[str] | None = None
) -> list[Launch]:
    """Every kernel launch of ``mod`` built for ``target``, per host function in ``order`` (function names;
    default: the module's order, which is sorted by name and so is not the launch order of a µGraph's
    ``kernel0 .. kernel10``).

    Raises
    ------
    ScheduleError
        A launch whose configuration is not constant (dynamic shapes) or an argument that is not a
        parameter's data pointer.
    """
    import tvm
    from tvm.tirx.build import split_host_device_mods

    from gensorage.codegen.barriers import has_explicit_barriers, honour_explicit_barriers

    t = tvm.target.Target(target).with_host(tvm.target.Target("llvm"))
    if any(has_explicit_barriers(f) for f in mod.functions.values()):
        honour_explicit_barriers()
    with tvm.transform.PassContext(config=config or {}):
        bound = tvm.tirx.transform.BindTarget(t)(mod)
        pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(t)
        host, _ = split_host_device_mods(pipeline(bound))
    launches: list[Launch] = []
    names = list(order) if order is not None else [gv.name_hint for gv in mod.get_global_vars()]
    for name in names:
        params = [p.name for p in mod[name].params]
        buffers = {p: i for i, p in enumerate(params)}
        for call in _CALL.finditer(host[name].script()):
            launches.append(_launch(name, call, buffers, params))
    return launches


def _launch(function: str, call: re.Match[str], buffers: dict[str, int], params: list[str]) -> Launch:
    kernel, args_text, names_text = call.group(1), call.group(2), call.group(3)
    names = [n.strip().strip('"') for n in names_text.split(",") if n.strip()]
    args = [a.strip() for a in args_text.split(",")]
    values, pointers = args[len(args) - len(names) :], args[: len(args) - len(names)]
    dims = {
        "blockIdx.x": 1,
        "blockIdx.y": 1,
        "blockIdx.z": 1,
        "threadIdx.x": 1,
        "threadIdx.y": 1,
        "threadIdx.z": 1,
    }
    shared = 0
    for name, value in zip(names, values, strict=True):
        m = _INT.match(value)
        if m is None:
            raise ScheduleError(f"kernel {kernel}: launch value {name} = {value} is not a constant")
        if name == "tirx.use_dyn_shared_memory":
            shared = int(m.group(1))
        elif name in dims:
            dims[name] = int(m.group(1))
        else:
            raise ScheduleError(f"kernel {kernel}: unknown launch parameter {name}")
    indices = []
    for p in pointers:
        exact = p.removesuffix(".data")
        base = exact if exact in buffers else re.sub(r"_\d+$", "", exact)  # the host renames X to X_1
        if base not in buffers:
            raise ScheduleError(f"kernel {kernel}: argument {p} is not a parameter of {function} ({params})")
        indices.append(buffers[base])
    grid = (dims["blockIdx.x"], dims["blockIdx.y"], dims["blockIdx.z"])
    block = (dims["threadIdx.x"], dims["threadIdx.y"], dims["threadIdx.z"])
    return Launch(function, kernel, tuple(indices), grid, block, shared)
