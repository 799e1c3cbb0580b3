"""The bundle the GPU suite carries to the device: its manifest, checked; a case's tensors, inputs, reference.

``benchmarks/gpu_suite.py --prepare DIR`` writes ``DIR/manifest.json`` and the cubins it names; the runner
(``benchmarks/gpu_runner.py``) reads them on the GPU machine. This module needs neither TVM nor a GPU (torch is
passed in), so the prepare side can call :func:`validate_bundle` on what it wrote before the bundle travels,
and tests run it with a CPU torch.

Manifest: ``{"prepared": {...}, "cases": [CASE, ...]}``; each CASE has ``name``, ``kind`` (gemm | program),
``dtype`` (float16 | bfloat16), ``tensors`` (name, shape, dtype, role input | intermediate | output, ``view_of``:
null or the tensor whose storage it reshapes, row-major), ``inputs_order``, ``outputs_order``, ``kernels`` in
launch order (cubin, entry, grid, block, dynamic ``smem`` bytes, ``args``: one tensor per pointer parameter,
passed as its storage's base pointer, or with a ``tensor_map`` object: that tensor's ``CUtensorMap`` passed by
value, see ``benchmarks/gpu_tensor_map.py``), ``gemm`` (M, N, K, batch: C = A @ B; optional ``layout`` "nt": B
stored [N, K], C = A @ B.T) or ``program`` (path, params), and
free-form ``predicted_s``, ``flops``, ``min_bytes``, ``meta`` that the runner copies into its results.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu_tensor_map import check_tensor_map
from gensorage.baselines.torch_eager import TorchArith
from gensorage.program import Program, load_program

REPO_ROOT = Path(__file__).resolve().parents[1]
TOL = 2e-2  # rel_err over this (or NaN) fails a case: fp16/bf16 operands land between 1e-3 and 1e-2
KINDS = ("gemm", "program", "conv")
CONV_KEYS = ("n", "c", "h", "w", "f", "kh", "kw")
CASE_DTYPES = ("float16", "bfloat16")
TENSOR_DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")
ROLES = ("input", "intermediate", "output")
MAX_SMEM = 227 * 1024  # Hopper's per-block maximum of shared memory


class ManifestError(ValueError):
    """A bundle that cannot be run: the message is one line naming the case and the field."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str
    view_of: str | None


@dataclass(frozen=True)
class KernelSpec:
    cubin: str
    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[str, ...]  # tensor names; each passes its storage's base pointer
    # Per arg: None (the pointer) or the tensor map of that tensor passed by value (benchmarks/gpu_tensor_map.py);
    # empty when every arg is a pointer.
    maps: tuple[Mapping[str, Any] | None, ...] = ()


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    dtype: str
    tensors: tuple[TensorSpec, ...]
    inputs_order: tuple[str, ...]
    outputs_order: tuple[str, ...]
    kernels: tuple[KernelSpec, ...]
    gemm: Mapping[str, Any] | None
    program: Mapping[str, Any] | None
    raw: Mapping[str, Any] = field(repr=False)

    def spec(self, name: str) -> TensorSpec:
        return next(t for t in self.tensors if t.name == name)

    def root(self, name: str) -> str:
        """The tensor whose storage ``name`` shares (itself unless it is a view)."""
        spec = self.spec(name)
        return spec.name if spec.view_of is None else self.root(spec.view_of)

    def input_bytes(self) -> int:
        return sum(nbytes(self.spec(n)) for n in {self.root(n) for n in self.inputs_order})


def numel(shape: tuple[int, ...] | list[int]) -> int:
    return math.prod(shape)


def nbytes(spec: TensorSpec) -> int:
    width = {"float16": 2, "bfloat16": 2, "float32": 4, "int32": 4}.get(spec.dtype, 8)
    return numel(spec.shape) * width


def _need(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise ManifestError(f"{where}: {what}")


def _shape(value: Any, where: str) -> tuple[int, ...]:
    ok = isinstance(value, list) and all(isinstance(d, int) and d > 0 for d in value)
    _need(ok, where, f"shape must be a list of positive ints, got {value!r}")
    return tuple(value)


def _dim3(value: Any, where: str) -> tuple[int, int, int]:
    dims = _shape(value, where)
    _need(len(dims) == 3, where, f"needs 3 dims, got {value!r}")
    return dims[0], dims[1], dims[2]


def parse_tensor(raw: Any, where: str) -> TensorSpec:
    _need(isinstance(raw, dict) and isinstance(raw.get("name"), str), where, "tensor without a name")
    where = f"{where} tensor {raw['name']}"
    _need(raw.get("dtype") in TENSOR_DTYPES, where, f"dtype {raw.get('dtype')!r} not in {TENSOR_DTYPES}")
    _need(raw.get("role") in ROLES, where, f"role {raw.get('role')!r} not in {ROLES}")
    view_of = raw.get("view_of")
    _need(view_of is None or isinstance(view_of, str), where, "view_of must be null or a tensor name")
    return TensorSpec(raw["name"], _shape(raw.get("shape"), where), raw["dtype"], raw["role"], view_of)


def check_views(tensors: dict[str, TensorSpec], where: str) -> None:
    """Every view names a tensor of the same dtype and size, and no chain of views loops."""
    for spec in tensors.values():
        seen, cur = {spec.name}, spec
        while cur.view_of is not None:
            _need(cur.view_of in tensors, where, f"{cur.name} is a view of unknown tensor {cur.view_of}")
            base = tensors[cur.view_of]
            _need(base.name not in seen, where, f"views loop through {base.name}")
            _need(base.dtype == cur.dtype, where, f"view {cur.name} and {base.name} differ in dtype")
            _need(
                numel(base.shape) == numel(cur.shape),
                where,
                f"view {cur.name} and {base.name} differ in size",
            )
            seen.add(base.name)
            cur = base


def parse_kernel(raw: Any, tensors: dict[str, TensorSpec], bundle_dir: Path, where: str) -> KernelSpec:
    _need(isinstance(raw, dict), where, "kernel must be an object")
    _need(
        isinstance(raw.get("entry"), str) and isinstance(raw.get("cubin"), str),
        where,
        "needs cubin and entry",
    )
    where = f"{where} kernel {raw['entry']}"
    _need((bundle_dir / raw["cubin"]).is_file(), where, f"missing cubin {raw['cubin']}")
    block = _dim3(raw.get("block"), f"{where} block")
    _need(numel(block) <= 1024, where, f"block {block} has over 1024 threads")
    smem = raw.get("smem", 0)
    _need(isinstance(smem, int) and 0 <= smem <= MAX_SMEM, where, f"smem {smem!r} outside 0..{MAX_SMEM}")
    args, maps = [], []
    for arg in raw.get("args") or []:
        _need(isinstance(arg, dict) and arg.get("tensor") in tensors, where, f"arg {arg!r} names no tensor")
        shape = _shape(arg.get("shape"), f"{where} arg {arg['tensor']}")
        # An arg may view its tensor in another shape, never past the tensor's storage.
        _need(numel(shape) <= numel(tensors[arg["tensor"]].shape), where, f"arg {arg['tensor']} overruns it")
        args.append(arg["tensor"])
        maps.append(_tensor_map(arg, tensors, where))
    _need(bool(args), where, "no args")
    return KernelSpec(
        raw["cubin"],
        raw["entry"],
        _dim3(raw.get("grid"), f"{where} grid"),
        block,
        smem,
        tuple(args),
        tuple(maps) if any(m is not None for m in maps) else (),
    )


def _tensor_map(arg: dict[str, Any], tensors: dict[str, TensorSpec], where: str) -> Mapping[str, Any] | None:
    """An arg's tensor map (None: a pointer), checked against the copy engine's limits and its tensor."""
    spec = arg.get("tensor_map")
    if spec is None:
        return None
    where = f"{where} arg {arg['tensor']} tensor map"
    _need(isinstance(spec, dict), where, "must be an object")
    why = check_tensor_map(spec)
    _need(why is None, where, str(why))
    tensor = tensors[arg["tensor"]]
    _need(spec["dtype"] == tensor.dtype, where, f"dtype {spec['dtype']} is not the tensor's {tensor.dtype}")
    _need(numel(spec["dims"]) <= numel(tensor.shape), where, f"dims {spec['dims']} overrun the tensor")
    return dict(spec)


def check_gemm(
    gemm: Any, tensors: dict[str, TensorSpec], ins: list[str], outs: list[str], where: str
) -> None:
    _need(isinstance(gemm, dict), where, "gemm case without a gemm object")
    sizes = [gemm.get(k) for k in ("M", "N", "K")]
    _need(
        all(isinstance(s, int) and s > 0 for s in sizes), where, f"gemm M, N, K must be positive ints: {gemm}"
    )
    batch = gemm.get("batch")
    _need(batch is None or (isinstance(batch, int) and batch > 0), where, "gemm batch must be null or an int")
    _need(gemm.get("layout", "nn") in ("nn", "nt"), where, "gemm layout must be 'nn' or 'nt'")
    _need(len(ins) == 2 and len(outs) == 1, where, "gemm takes inputs [A, B] and outputs [C]")
    m, n, k = sizes
    want = {ins[0]: m * k, ins[1]: k * n, outs[0]: m * n}
    for name, size in want.items():
        _need(numel(tensors[name].shape) == size * (batch or 1), where, f"{name} is not of the gemm's size")


def check_conv(
    conv: Any, tensors: dict[str, TensorSpec], ins: list[str], outs: list[str], where: str
) -> None:
    """A conv case: inputs [X (n, c, h, w), W (f, c, kh, kw)], output [Y (n, f, oh, ow)], NCHW."""
    _need(isinstance(conv, dict), where, "conv case without a conv object")
    sizes = [conv.get(k) for k in CONV_KEYS]
    _need(all(isinstance(v, int) and v > 0 for v in sizes), where, f"conv {CONV_KEYS} must be positive ints")
    pairs = [conv.get("stride"), conv.get("padding")]
    _need(
        all(isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) for v in p) for p in pairs),
        where,
        "conv stride and padding must be [h, w] int pairs",
    )
    _need(len(ins) == 2 and len(outs) == 1, where, "conv takes inputs [X, W] and outputs [Y]")
    n, c, h, w, f, kh, kw = sizes
    _need(tensors[ins[0]].shape == (n, c, h, w), where, "X is not (n, c, h, w)")
    _need(tensors[ins[1]].shape == (f, c, kh, kw), where, "W is not (f, c, kh, kw)")
    oh, ow = conv_out_hw(conv)
    _need(tensors[outs[0]].shape == (n, f, oh, ow), where, "Y is not (n, f, oh, ow)")


def conv_out_hw(conv: Mapping[str, Any]) -> tuple[int, int]:
    (sh, sw), (ph, pw) = conv["stride"], conv["padding"]
    return (conv["h"] + 2 * ph - conv["kh"]) // sh + 1, (conv["w"] + 2 * pw - conv["kw"]) // sw + 1


def parse_case(raw: Any, bundle_dir: Path) -> Case:
    """One case of the manifest, validated; :class:`ManifestError` (one line) names what is wrong."""
    _need(isinstance(raw, dict) and isinstance(raw.get("name"), str), "manifest", "case without a name")
    where = f"case {raw['name']}"
    _need(raw.get("kind") in KINDS, where, f"kind {raw.get('kind')!r} not in {KINDS}")
    _need(raw.get("dtype") in CASE_DTYPES, where, f"dtype {raw.get('dtype')!r} not in {CASE_DTYPES}")
    _need(isinstance(raw.get("tensors"), list), where, "tensors must be a list")
    specs = [parse_tensor(t, where) for t in raw["tensors"]]
    tensors = {t.name: t for t in specs}
    _need(len(tensors) == len(specs), where, "duplicate tensor names")
    check_views(tensors, where)
    ins, outs = list(raw.get("inputs_order") or []), list(raw.get("outputs_order") or [])
    for names, role in ((ins, "input"), (outs, "output")):
        for n in names:
            _need(n in tensors and tensors[n].role == role, where, f"{n} is not an {role} tensor")
    _need(bool(ins) and bool(outs), where, "needs inputs_order and outputs_order")
    _need(isinstance(raw.get("kernels"), list) and bool(raw["kernels"]), where, "no kernels")
    kernels = tuple(parse_kernel(k, tensors, bundle_dir, where) for k in raw["kernels"])
    if raw["kind"] == "gemm":
        check_gemm(raw.get("gemm"), tensors, ins, outs, where)
    elif raw["kind"] == "conv":
        check_conv(raw.get("conv"), tensors, ins, outs, where)
    else:
        prog = raw.get("program")
        _need(
            isinstance(prog, dict) and isinstance(prog.get("path"), str), where, "program case without a path"
        )
        _need(isinstance(prog.get("params") or {}, dict), where, "program params must be an object")
        _need(program_path(prog).is_file(), where, f"program file {prog['path']} does not exist")
    return Case(
        raw["name"], raw["kind"], raw["dtype"], tuple(specs), tuple(ins), tuple(outs), kernels,
        raw.get("gemm"), raw.get("program"), raw,
    )  # fmt: skip


def read_manifest(bundle_dir: Path) -> dict[str, Any]:
    """``bundle_dir/manifest.json`` with its top level checked (cases are parsed one by one)."""
    path = Path(bundle_dir) / "manifest.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: {one_line(exc)}") from None
    _need(isinstance(data, dict), str(path), "not a JSON object")
    _need(isinstance(data.get("prepared"), dict), str(path), "no 'prepared' object")
    _need(isinstance(data.get("cases"), list), str(path), "no 'cases' list")
    return data


def validate_bundle(bundle_dir: Path) -> list[Case]:
    """Every case of the bundle parsed; raises :class:`ManifestError` at the first problem (for --prepare)."""
    return [parse_case(raw, Path(bundle_dir)) for raw in read_manifest(bundle_dir)["cases"]]


def one_line(exc: BaseException, limit: int = 300) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:limit]


def allocate(torch: Any, case: Case, device: str) -> dict[str, Any]:
    """Every tensor of the case: one allocation per root, views reshaping their root's storage."""
    roots = {
        t.name: torch.empty(t.shape, dtype=getattr(torch, t.dtype), device=device)
        for t in case.tensors
        if t.view_of is None
    }
    return {t.name: roots[case.root(t.name)].view(t.shape) for t in case.tensors}


def poison(case: Case, tensors: Mapping[str, Any]) -> None:
    """NaN into every output and intermediate storage, so an element no kernel writes shows up."""
    for t in case.tensors:
        if t.view_of is None and t.role != "input" and tensors[t.name].is_floating_point():
            tensors[t.name].fill_(float("nan"))


def footprint(case: Case) -> int:
    return sum(nbytes(t) for t in case.tensors if t.view_of is None)


def draw_inputs(torch: Any, case: Case, tensors: Mapping[str, Any], seed: int) -> None:
    """Fresh standard-normal inputs (GEMM: B over sqrt(K), so outputs stay O(1)), drawn where they live."""
    for i, name in enumerate(case.inputs_order):
        t = tensors[name]
        gen = torch.Generator(device=t.device).manual_seed(seed * 7919 + i)
        x = torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32)
        if case.kind == "gemm" and i == 1:
            x.mul_(1.0 / math.sqrt(case.gemm["K"]))  # type: ignore[index]
        if case.kind == "conv" and i == 1:  # the weight over sqrt(c kh kw), as a GEMM's B
            conv = case.raw["conv"]
            x.mul_(1.0 / math.sqrt(conv["c"] * conv["kh"] * conv["kw"]))
        t.copy_(x)


def gemm_operands(case: Case, a: Any, b: Any) -> tuple[Any, Any]:
    """A as [batch?, M, K] and B as [batch?, K, N] (the bundle's tensors may be stored in another shape).

    A gemm of ``layout`` "nt" stores B as [batch?, N, K] (a linear layer's weight): B is then its transposed
    view, so ``torch.matmul`` runs cuBLAS's NT GEMM on it, as ``x @ W.T`` does."""
    g = case.gemm or {}
    lead = (g["batch"],) if g.get("batch") else ()
    if g.get("layout", "nn") == "nt":
        return a.reshape(*lead, g["M"], g["K"]), b.reshape(*lead, g["N"], g["K"]).transpose(-1, -2)
    return a.reshape(*lead, g["M"], g["K"]), b.reshape(*lead, g["K"], g["N"])


def program_path(prog: Mapping[str, Any]) -> Path:
    """A program case's file: its path as given when absolute or present here, else under the repository."""
    path = Path(prog["path"])
    return path if path.is_absolute() or path.exists() else REPO_ROOT / path


def load_case_program(case: Case) -> Program | None:
    if case.kind != "program":
        return None
    prog = case.program or {}
    program = load_program(program_path(prog), {k: int(v) for k, v in (prog.get("params") or {}).items()})
    # Outputs are compared in order: the bundle lists them as the program does.
    _need(
        len(program.outputs) == len(case.outputs_order),
        f"case {case.name}",
        "outputs differ from the program's",
    )
    return program


def program_args(program: Program, case: Case, inputs: list[Any]) -> list[Any] | dict[str, Any]:
    """The inputs by name when the bundle names them as the program does, else in inputs_order."""
    if sorted(case.inputs_order) == sorted(t.name for t in program.inputs):
        return dict(zip(case.inputs_order, inputs, strict=True))
    return inputs


def reference(torch: Any, case: Case, program: Program | None, inputs: list[Any]) -> list[Any]:
    """The case's outputs in float64, on the inputs' device."""
    xs = [x.to(torch.float64) for x in inputs]
    if case.kind == "conv":
        conv = case.raw["conv"]
        return [torch.nn.functional.conv2d(xs[0], xs[1], stride=conv["stride"], padding=conv["padding"])]
    if program is None:
        return [torch.matmul(*gemm_operands(case, xs[0], xs[1]))]
    return program.evaluate(TorchArith(torch), program_args(program, case, xs))


def rel_err(torch: Any, outs: list[Any], refs: list[Any]) -> float:
    """‖out − ref‖ / ‖ref‖ over all outputs together, in float64 (NaN when any output element is NaN)."""
    if len(outs) != len(refs):
        raise ValueError(f"{len(outs)} outputs, {len(refs)} references")
    num = den = 0.0
    for out, ref in zip(outs, refs, strict=True):
        diff = out.to(torch.float64).reshape(ref.shape) - ref
        num += float(torch.linalg.vector_norm(diff)) ** 2
        den += float(torch.linalg.vector_norm(ref)) ** 2
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def passes(err: float) -> bool:
    return math.isfinite(err) and err <= TOL
