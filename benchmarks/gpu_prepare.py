"""The GPU suite's bundle: every kernel to measure, built here (TVM + nvcc), runnable on a GPU without TVM.

The lent GPU machines have torch, CuPy and the CUDA driver but no TVM, and TVM's wheel is too large to travel
with the working tree. So the suite builds on this machine: each case's kernels are lowered by gensorage,
compiled by nvcc to a cubin for the profile's arch, and described in ``manifest.json`` with their launch
configuration (read off TVM's host code, :func:`gensorage.codegen.launch.launch_specs`) and the tensors their
pointer arguments refer to. ``benchmarks/gpu_runner.py`` loads the bundle on the device.

Cases:

- ``gemm``: the GEMMs of Gensor's Table IV and the LLaMA-3-8B projections at M in {16, 4096}, float16. Per
  shape: the tensor-core kernel the construction picks, a few fixed tensor-core tilings (so the cost model is
  judged on more than its own choices), and the CUDA-core kernel of the Markov construction.
- ``program``: each bundled program's direct µGraph (one kernel per op) at the program's shapes, or a fused
  µGraph of it (``EXTRA_UGRAPHS``); with ``--block-mma-warps``, a fused µGraph also under fixed warp counts for
  its tensor-core block matmuls (``program_<name>_w<warps>``), so one run says which warp layout is fastest.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.gpu_shapes import CONVS, EXTRA_GEMMS, GEMMS, PREFILL_GEMMS  # noqa: F401 (re-exported)
from gensorage.codegen.barriers import has_explicit_barriers, honour_explicit_barriers
from gensorage.codegen.cuda_build import build_cubin, cuda_target
from gensorage.codegen.launch import Launch, launch_specs
from gensorage.codegen.module import compile_ugraph, ir_module
from gensorage.codegen.operand_views import graph_views
from gensorage.codegen.predefined_matmul import matmul_prim_func
from gensorage.codegen.tensor_core import RULE, TensorCoreTiles, build_config, schedule_tensor_core
from gensorage.codegen.ugraph_tir import dominant_matmul, plan_threads
from gensorage.codegen.wgmma import target_profile
from gensorage.construction import construct_schedule, matmul_workload
from gensorage.construction.block_threads import ThreadChoice
from gensorage.construction.tensor_core import construct_tensor_core, predict_tensor_core_time
from gensorage.errors import GensorageError
from gensorage.hw.profile import HwProfile
from gensorage.markov.cost_model import predict_schedule_time
from gensorage.opset import Op
from gensorage.precision import DEFAULT_PRECISION
from gensorage.program import Program, dump_program, load_config
from gensorage.ugraph import KernelGraph, examples, from_program
from gensorage.ugraph.ir import GraphDefinedOp, KernelOp, Ref
from gensorage.ugraph.shapes import GraphInfo, infer
from gensorage.ugraph.validate import validate

#: Fixed tilings timed beside the constructed one (where they fit the shape).
VARIANTS: tuple[TensorCoreTiles, ...] = (
    TensorCoreTiles(128, 128, 32, 64, 64, 3),
    TensorCoreTiles(128, 256, 32, 64, 64, 3),
    TensorCoreTiles(64, 64, 32, 32, 32, 3),
    TensorCoreTiles(16, 64, 64, 16, 16, 4),
)


def _kernel_entry(
    launch: Launch,
    cubin: str,
    tensors: Sequence[str],
    shapes: Sequence[Sequence[int]],
    maps: Mapping[int, tuple[int, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """A kernel's manifest entry; ``maps``: parameter index -> (tensor index, its ``tensor_map``) for the
    parameters that are tensor maps (TMA kernels) rather than pointers."""
    maps = maps or {}

    def arg(i: int) -> dict[str, Any]:
        if i in maps:
            t, spec = maps[i]
            return {"tensor": tensors[t], "shape": list(shapes[t]), "tensor_map": spec}
        return {"tensor": tensors[i], "shape": list(shapes[i])}

    return {
        "cubin": cubin,
        "entry": launch.kernel,
        "grid": list(launch.grid),
        "block": list(launch.block),
        "smem": launch.shared_bytes,
        "args": [arg(i) for i in launch.args],
    }


def _cubin(mod: Any, hw: HwProfile, config: dict[str, Any], out: Path, name: str) -> str:
    import tvm

    if any(has_explicit_barriers(f) for f in mod.functions.values()):
        honour_explicit_barriers()
    with tvm.transform.PassContext(config=config):
        ex = tvm.compile(mod, target=cuda_target(hw))
    src = str(ex.mod.imports[0].inspect_source())
    binary = build_cubin(src, hw.arch)
    if binary is None:
        raise GensorageError("nvcc is needed to prepare the GPU bundle")
    (out / f"{name}.cubin").write_bytes(binary)
    (out / f"{name}.cu").write_text(src)
    return f"{name}.cubin"


def _gemm_case(
    name: str,
    dims: tuple[int, int, int],
    variant: str,
    mod: Any,
    config: dict[str, Any],
    hw: HwProfile,
    out: Path,
    predicted: float | None,
    meta: dict[str, Any],
    dtype: str = "float16",
    maps: Mapping[int, tuple[int, dict[str, Any]]] | None = None,
    layout: str = "nn",
) -> dict[str, Any]:
    m, n, k = dims
    if dtype != "float16":
        name = f"{name}_{dtype}"
    if layout != "nn":
        name = f"{name}_{layout}"
    cubin = _cubin(mod, hw, config, out, f"{name}_{variant}")
    launches = launch_specs(mod, cuda_target(hw), config)
    names: tuple[str, ...] = ("A", "B", "C")
    shapes: tuple[tuple[int, ...], ...] = ((m, k), (n, k) if layout == "nt" else (k, n), (m, n))
    split = meta.get("tiles", {}).get("split_k", 1)
    if split > 1:  # the partials' scratch parameter
        rows = -(-m // meta["tiles"]["block_m"]) * meta["tiles"]["block_m"]
        names, shapes = (*names, "P"), (*shapes, (split, rows, n))
    return {
        "name": f"gemm_{name}_{variant}",
        "kind": "gemm",
        "dtype": dtype,
        "tensors": [
            {
                "name": t,
                "shape": list(s),
                "dtype": "float32" if t == "P" else dtype,
                "role": r,
                "view_of": None,
            }
            for t, s, r in zip(names, shapes, ("input", "input", "output", "intermediate"), strict=False)
        ],
        "inputs_order": ["A", "B"],
        "outputs_order": ["C"],
        "kernels": [_kernel_entry(la, cubin, names, shapes, maps) for la in launches],
        "gemm": {"M": m, "N": n, "K": k, "batch": None, "layout": layout},
        "predicted_s": predicted,
        "flops": 2 * m * n * k,
        "min_bytes": 2 * (m * k + k * n + m * n),
        "meta": {"shape": name, "variant": variant, **meta},
    }


def gemm_cases(
    hw: HwProfile,
    out: Path,
    shapes: dict[str, tuple[int, int, int]],
    dtype: str = "float16",
    *,
    variants: bool = True,
    searches: bool = False,
    layout: str = "nn",
) -> list[dict[str, Any]]:
    """Per shape: the constructed tiling; with ``variants``, also the fixed tilings and the CUDA-core kernel;
    with ``searches``, the tilings Optuna (1000 TPE trials) and random sampling (1000) pick with the same model.
    ``layout`` "nt": B is stored [N, K] and read in place (``x @ W.T``; no searches nor CUDA-core kernel)."""
    from gensorage.baselines.tensor_core_search import optuna_tiling, random_tiling

    nt = layout == "nt"
    cases = []
    for name, (m, n, k) in shapes.items():
        dims4 = (1, m, n, k)
        t0 = time.perf_counter()
        tiles, cost = construct_tensor_core(dims4, hw, dtype, layout=layout)
        chosen = [("constructed", tiles, cost.total_s, time.perf_counter() - t0)]
        for label, search in (
            (("optuna1000", optuna_tiling), ("random1000", random_tiling)) if searches and not nt else ()
        ):
            found = search(dims4, hw, dtype)
            chosen.append((label, found.tiles, found.predicted_s, found.wall_s))
        for v in VARIANTS if variants else ():
            v = dataclasses.replace(v, layout=layout)
            c = predict_tensor_core_time(dims4, v, hw)
            if v != tiles and c is not None and v.block_m <= max(16, m) and v.block_n <= n:
                chosen.append((_variant_name(v), v, c.total_s, None))
        for variant, t, predicted, wall_s in chosen:
            func = matmul_prim_func((m, k), (k, n), (m, n), dtype, dtype, t.split_k, t.block_m, layout)
            mod = schedule_tensor_core(func, t).mod
            meta = {"tiles": dataclasses.asdict(t), "rule": f"{RULE}: {t.describe()}", "tensor_cores": True}
            if wall_s is not None:
                meta["search_wall_s"] = wall_s
            config = build_config([RULE])
            cases.append(
                _gemm_case(
                    name, (m, n, k), variant, mod, config, hw, out, predicted, meta, dtype, layout=layout
                )
            )
        if variants and not nt:
            cases.append(_cuda_core_case(name, (m, n, k), hw, out))
    return cases


def _variant_name(t: TensorCoreTiles) -> str:
    name = f"tc{t.block_m}x{t.block_n}x{t.block_k}w{t.warp_m}x{t.warp_n}s{t.stages}"
    name += "" if t.split_k == 1 else f"k{t.split_k}"
    return name if t.fragment_pipeline else name + "np"


def _cuda_core_case(name: str, dims: tuple[int, int, int], hw: HwProfile, out: Path) -> dict[str, Any]:
    from gensorage.codegen.lower_schedule import lower

    m, n, k = dims
    base = matmul_workload(1, m, n, k, "float16")
    schedule = construct_schedule(base, hw)
    wl = dataclasses.replace(
        base, build=lambda: matmul_prim_func((m, k), (k, n), (m, n), "float16", "float16")
    )
    mod = lower(wl, schedule, "cuda", hw=hw)
    meta = {
        "rule": f"markov construct: T0={list(schedule.tiles[0])}, T1={list(schedule.tiles[1])}",
        "tensor_cores": False,
    }
    return _gemm_case(
        name, dims, "cuda_core", mod, {}, hw, out, predict_schedule_time(base, hw, schedule), meta
    )


def _tensor_names(g: KernelGraph, info: GraphInfo) -> dict[Ref, str]:
    """Each tensor's storage name; an alias op's (reshape's) output names its input's storage. A transpose its
    matmuls read in place has no storage (:mod:`gensorage.codegen.operand_views`)."""
    names: dict[Ref, str] = {Ref(i): t.name for i, t in enumerate(g.inputs)}
    views = graph_views(g, info)
    for k in range(len(g.ops)):
        if k in views:
            continue
        node = len(g.inputs) + k
        for o in range(len(info.nodes[node])):
            names[Ref(node, o)] = f"t{node}_{o}"
    return names


def row_thread_plans(g: KernelGraph, hw: HwProfile, threads: int) -> dict[int, ThreadChoice]:
    """Every graph-defined kernel without a block matmul (a row kernel of row fusion) on ``threads`` threads
    instead of the planned count (the others keep their plans)."""
    info = validate(g, hw)
    plans = {}
    for k, op in enumerate(g.ops):
        if isinstance(op, GraphDefinedOp) and dominant_matmul(op, info.blocks[k]) is None:  # type: ignore[arg-type]
            plans[k] = ThreadChoice(threads, None, None, f"bundle variant: {threads} threads")
    return plans


def mma_warp_plans(g: KernelGraph, hw: HwProfile, variant: str) -> dict[int, ThreadChoice]:
    """Every graph-defined kernel's thread plan with each tensor-core block matmul on the warps ``variant``
    says: ``"W"`` (``W`` warps of the planned block, at most all of them; 0: all of them, one warp tile per
    warp as before the choice of warps existed) or ``"W:T"`` (``W`` warps of a block of ``T`` threads, for the
    kernels that have a tensor-core block matmul; every phase runs on those ``T``), with fragments loaded by
    ``ldmatrix`` and tiles by ``cp.async`` where the layout allows, or element by element with a trailing ``e``
    (``"0e"``: the kernels as they were before warps were chosen). A count whose accumulators do not fit the registers gets the warp
    tiles with the fewest (they may spill: the resource report says)."""
    elementwise = variant.endswith("e")
    warps_text, _, threads_text = variant.removesuffix("e").partition(":")
    warps = int(warps_text)
    info = validate(g, hw)
    plans = {}
    for k, op in enumerate(g.ops):
        if not isinstance(op, GraphDefinedOp):
            continue
        plan = plan_threads(g, k, info, hw)
        if threads_text and plan.mma_warps:
            threads = int(threads_text)
            mma = {j for j, _ in plan.mma_warps}
            tiling = None if plan.matmul_node in mma else plan.tiling  # the tensor cores compute that one
            if tiling is not None and tiling.threads != threads:
                raise GensorageError(
                    f"variant {variant}: kernel {k}'s CUDA-core tiling needs {tiling.threads}"
                )
            rule = f"bundle variant {variant}: {threads} threads"
            plan = ThreadChoice(threads, plan.matmul_node, tiling, rule, plan.mma_warps)
        most = plan.threads // hw.warp_size
        chosen = tuple((j, min(warps, most) if warps else most) for j, _ in plan.mma_warps)
        plans[k] = dataclasses.replace(plan, mma_warps=chosen, runs=not elementwise)
    return plans


def stage_plans(g: KernelGraph, hw: HwProfile, stages: int) -> dict[int, ThreadChoice]:
    """Every graph-defined kernel's thread plan with its loop's ``cp.async`` tiles in ``stages`` stages instead
    of the chosen ones (a kernel whose stages do not fit falls back to one, as the code generator does)."""
    info = validate(g, hw)
    return {
        k: dataclasses.replace(plan_threads(g, k, info, hw), stages=stages)
        for k, op in enumerate(g.ops)
        if isinstance(op, GraphDefinedOp)
    }


def program_case(
    name: str,
    program: Program,
    hw: HwProfile,
    out: Path,
    precision: str = DEFAULT_PRECISION,
    ugraph: KernelGraph | None = None,
    mma_warps: str | None = None,
    label: str = "",
    row_threads: int | None = None,
    stages: int | None = None,
) -> dict[str, Any]:
    """The program's direct µGraph, or ``ugraph`` (a fused one of the same program), under ``precision`` (named
    ``program_<name>``, plus ``_<precision>`` when it is not the default); ``mma_warps``: its tensor-core block
    matmuls on the warps (and threads) it names (:func:`mma_warp_plans`, named ``_w<warps>`` or
    ``_w<warps>t<threads>``) instead of the chosen ones; ``label`` is appended to the case's name;
    ``row_threads``: its kernels without a block matmul on that many threads (named ``_rt<threads>``);
    ``stages``: its loops' ``cp.async`` tiles in that many stages (:func:`stage_plans`, named ``_st<stages>``)."""
    from gensorage.ugraph.cost import kernel_costs

    g = (
        from_program(program, precision)
        if ugraph is None
        else dataclasses.replace(ugraph, precision=precision)
    )
    base = name  # the program's own name: where the device reads the program
    name += label
    if precision != DEFAULT_PRECISION:
        name = f"{name}_{precision}"
    if mma_warps is not None:
        name = f"{name}_w{mma_warps.replace(':', 't')}"
    info = infer(g)
    plans = None if mma_warps is None else mma_warp_plans(g, hw, mma_warps)
    if row_threads is not None:
        name = f"{name}_rt{row_threads}"
        plans = row_thread_plans(g, hw, row_threads)
    if stages is not None:
        name = f"{name}_st{stages}"
        plans = stage_plans(g, hw, stages)
    cg = compile_ugraph(g, hw, "cuda", plans=plans)
    # The kernels' tensors are the compiled graph's (an epilogue its GEMM family refuses runs as ops again).
    g, info, plans = cg.ugraph, cg.info, cg.plans if plans is not None else None
    kernels = cg.kernels()
    config = build_config(k.rule for k in kernels)
    mod = ir_module(kernels)
    hw = target_profile(hw, [k.rule for k in kernels])  # sm_90a when a matmul is a wgmma kernel
    cubin = _cubin(mod, hw, config, out, f"program_{name}")
    names = _tensor_names(g, info)
    tensors = _program_tensors(g, info, names)
    by_function = {k.name: k for k in kernels}
    entries, launch_ops = [], []
    for la in launch_specs(mod, cuda_target(hw), config, order=[k.name for k in kernels]):
        kern = by_function[la.function]
        refs = [names[p.ref] if p.ref is not None else f"{kern.name}_{p.name}" for p in kern.params]
        entries.append(_kernel_entry(la, cubin, refs, [p.shape for p in kern.params]))
        launch_ops.append(kern.op_index)
    costs = kernel_costs(g, hw, plans=plans)  # the layout bundled
    for kern in kernels:  # split-k partials: a buffer of the kernel's own
        tensors += [
            {
                "name": f"{kern.name}_{p.name}",
                "shape": list(p.shape),
                "dtype": p.dtype,
                "role": "intermediate",
                "view_of": None,
            }
            for p in kern.params
            if p.role == "scratch"
        ]
    return {
        "name": f"program_{name}",
        "kind": "program",
        "dtype": program.inputs[0].dtype,
        "tensors": tensors,
        "inputs_order": [names[Ref(i)] for i in range(len(g.inputs))],
        "outputs_order": [names[r] for r in g.outputs],
        "kernels": entries,
        "program": {"path": program_path(name, program, out, base), "params": {}},
        "predicted_s": sum(c.time_s for c in costs),
        "flops": 0,
        "min_bytes": sum(math.prod(t.shape) * 2 for t in program.inputs),
        "meta": {
            "rules": [k.rule for k in kernels],
            "tensor_cores": any(k.rule.startswith(RULE) for k in kernels),
            "mma_warps": mma_warps,
            "stages": stages,
            # Per launch, the µGraph operator it belongs to (a split-k matmul launches twice), and the model's
            # time per operator: what ``--per-kernel`` runs compare kernel by kernel.
            "launch_ops": launch_ops,
            "op_predicted_s": [c.time_s for c in costs],
        },
    }


def _program_tensors(g: KernelGraph, info: GraphInfo, names: dict[Ref, str]) -> list[dict[str, Any]]:
    tensors = []
    outputs = set(g.outputs)
    for ref, name in names.items():
        t = info.of(ref)
        role = "input" if ref.node < len(g.inputs) else ("output" if ref in outputs else "intermediate")
        view_of = None
        if ref.node >= len(g.inputs):
            op = g.ops[ref.node - len(g.inputs)]
            if isinstance(op, KernelOp) and op.op is Op.RESHAPE:
                view_of = _base(g, names, op.inputs[0])
        tensors.append(
            {"name": name, "shape": list(t.shape), "dtype": t.dtype, "role": role, "view_of": view_of}
        )
    return tensors


def _base(g: KernelGraph, names: dict[Ref, str], ref: Ref) -> str:
    """The storage a reshape chain ends at."""
    while ref.node >= len(g.inputs):
        op = g.ops[ref.node - len(g.inputs)]
        if not (isinstance(op, KernelOp) and op.op is Op.RESHAPE):
            break
        ref = op.inputs[0]
    return names[ref]


def _priority(case: dict[str, Any]) -> int:
    """What the runner reaches first if its deadline cuts the run short: constructed GEMMs, programs, the rest;
    TMA kernels after all (one whose ring breaks traps and takes the CUDA context, failing the cases after it)."""
    if case.get("meta", {}).get("tiles", {}).get("tma"):
        return 4 if case["meta"]["shape"].startswith("smoke") else 5
    if case["kind"] in ("program", "conv"):
        return 1
    variant = case["meta"].get("variant")
    if str(variant).startswith("wgmma"):  # the smoke GEMMs first: they tell whether any wgmma result is right
        return 0 if case["meta"]["shape"].startswith("smoke") or variant == "wgmma_constructed" else 1
    return 0 if variant in ("constructed", "optuna1000", "random1000") else 2 if variant == "cuda_core" else 3


def write_manifest(out: Path, cases: list[dict[str, Any]], prepared: dict[str, Any]) -> Path:
    cases = sorted(cases, key=_priority)
    path = out / "manifest.json"
    path.write_text(json.dumps({"prepared": prepared, "cases": cases}, indent=1))
    return path


#: The bundled attention programs: since issue 23 in the stable form, their papers' form bundled as NAME_papers.
ATTENTION_PROGRAMS = frozenset(
    f"{v}_{m}" for v in ("mha", "gqa", "mqa") for m in ("prefill", "incdec", "specdec")
)
#: Runs prepared before this time measured the papers' form under the plain name: the commit time of 3f6adce,
#: which bundled the stable forms (ISO 8601 in UTC, compared as text with the manifest's ``prepared.date``).
STABLE_ATTENTION_SINCE = "2026-11-27T04:45:48+00:00"


def papers_form(name: str) -> str:
    """``NAME_papers`` for a bundled attention program, else ``name``."""
    return f"{name}_papers" if name in ATTENTION_PROGRAMS else name


def measured_as(name: str, prepared: str) -> str:
    """The program a run prepared at ``prepared`` (its ISO date) measured under the bundled name ``name``."""
    return papers_form(name) if prepared < STABLE_ATTENTION_SINCE else name


def program_names() -> list[str]:
    """Every bundled program but the papers' forms of the attention programs (name them to bundle them)."""
    from gensorage.program import list_configs

    stems = [p.stem for p in list_configs()]
    return [
        s for s in stems if not (s.endswith("_papers") and s.removesuffix("_papers") in ATTENTION_PROGRAMS)
    ]


def llama3_attention(queries: int, keys: int = 1024, dtype: str = "float16") -> Program:
    """LLaMA-3-8B attention as models write it: 32 query heads, 8 key/value heads, head dim 128, K kept as
    [heads, keys, dim] and transposed, the stable softmax (issue 23), GQA by repeating K and V."""
    p = Program(f"llama3_attention_q{queries}")
    q = p.input("Q", (32, queries, 128), dtype)
    k = p.input("K", (8, keys, 128), dtype)
    v = p.input("V", (8, keys, 128), dtype)
    kt = p.transpose(p.repeat(k, 0, 4), 1, 2)
    scores = p.softmax(p.scale(p.matmul(q, kt), 128**-0.5), dim=2)
    p.output(p.matmul(scores, p.repeat(v, 0, 4)))
    return p


def llama3_norm_projection(tokens: int = 1024, dtype: str = "bfloat16") -> Program:
    """LLaMA-3-8B's RMSNorm then a 4,096-wide projection ``x @ W.T`` at ``tokens`` tokens: the precision policy
    keeps the normalised x in float32, so the matmul multiplies float32 by ``dtype`` (converted to bfloat16
    in the copies to shared memory, on wgmma where the construction picks it)."""
    p = Program(f"llama3_norm_projection_{tokens}")
    x, w = p.input("X", (tokens, 4096), dtype), p.input("W", (4096, 4096), dtype)
    p.output(p.matmul(p.rms_norm(x), p.transpose(w, 0, 1)))
    return p


def program_part(name: str) -> Program:
    """One kernel's worth of a bundled program at its shapes, to time the program's kernels one by one (the
    runner times whole cases, and takes 16-bit programs only): ``qknorm_pv`` (qknorm's PV product),
    ``rmsnorm_norm`` and ``rmsnorm_mm`` (in float16, where rmsnorm's µGraph multiplies the float32 normalised X
    by the float16 W: a program does not mix dtypes)."""
    p = Program(name)
    match name:
        case "qknorm_pv":
            p.output(
                p.matmul(p.input("P", (2, 256, 4096), "float16"), p.input("V", (2, 4096, 64), "float16"))
            )
        case "rmsnorm_norm":
            x, g = p.input("X", (16, 1024), "float16"), p.input("G", (1024,), "float16")
            p.output(p.div(p.mul(x, g), p.sqrt(p.scale(p.sum(p.mul(x, x), dim=1), 1 / 1024))))
        case "rmsnorm_mm":
            p.output(p.matmul(p.input("Y", (16, 1024), "float16"), p.input("W", (1024, 4096), "float16")))
        case _:
            raise GensorageError(f"no program part '{name}'")
    return p


PROGRAM_PARTS = ("qknorm_pv", "rmsnorm_norm", "rmsnorm_mm")


def program_path(name: str, program: Program, out: Path, base: str | None = None) -> str:
    """Where the device reads program ``base`` (bundled as case ``name``; ``base`` defaults to ``name`` less a
    precision suffix): its config, or (a program built here, or one with no config) its text in the bundle."""
    base = base if base is not None else name.removesuffix("_storage")
    root = Path(__file__).resolve().parents[1]
    config = f"configs/programs/{base}.gsp"
    if base not in EXTRA_PROGRAMS and base not in EXTRA_UGRAPHS and (root / config).is_file():
        return config
    path = out / f"program_{name}.gsp"
    path.write_text(dump_program(program))
    return (
        str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path.resolve())
    )


#: Fused µGraphs the suite can bundle (name -> (program, µGraph)): the stable attention of LLaMA-3-8B's
#: attention heads (32 heads of 128, 1,024 queries and keys) as FlashAttention-2 with online softmax.
EXTRA_UGRAPHS: dict[str, Any] = {
    "llama3_flash_attention2": lambda: examples.flash_attention2(
        heads=32, q_len=1024, kv_len=1024, head_dim=128, q_blocks=16, forloop=16
    ),
    # Decode (one query, 4,096 keys): FlashDecoding's split-KV with online softmax, then the combine kernel.
    "llama3_flash_decoding_stable": lambda: examples.flash_decoding_stable(
        heads=32, kv_len=4096, head_dim=128, splits=16, forloop=4
    ),
    # The stable mha_prefill (32 heads, 512 queries, 4,096 keys) as FlashAttention-2: 64-row query blocks, 64
    # keys per iteration, the online P·V on tensor cores (gensorage.codegen.online_mma).
    "fa2_mha_prefill": lambda: examples.flash_attention2(
        heads=32, q_len=512, kv_len=4096, head_dim=128, q_blocks=8, forloop=64
    ),
    # The papers' form (exp(S) V / Σ exp(S), K as [heads, dim, keys]) fused the same way, for comparison.
    "llama3_flash_attention_papers": lambda: examples.flash_attention(
        heads=32, q_len=1024, kv_len=1024, head_dim=128, q_blocks=16, forloop=16
    ),
    # The structures the search finds for the bundled programs (issue 26), fused at those programs' shapes.
    "fused_mha_prefill": lambda: examples.flash_attention(
        heads=32, q_len=512, kv_len=4096, head_dim=128, q_blocks=8, forloop=64
    ),
    "fused_mha_specdec": lambda: examples.flash_attention(
        heads=32, q_len=32, kv_len=4096, head_dim=128, q_blocks=2, forloop=64
    ),
    "fused_mha_incdec": lambda: examples.flash_decoding(
        heads=32, kv_len=4096, head_dim=128, splits=16, forloop=8
    ),
    "fused_gqa_incdec": lambda: examples.gqa(
        kv_heads=2, group=8, q_len=1, kv_len=4096, head_dim=128, kv_splits=16, forloop=8, out_splits=2
    ),
    "fused_qknorm": lambda: examples.qknorm_attention(
        heads=2, q_len=256, kv_len=4096, head_dim=64, q_blocks=4, forloop=64
    ),
    "fused_gated_mlp": lambda: examples.gated_mlp(m=8, k=4096, n=4096, blocks=64, forloop=64),
    "fused_rmsnorm": lambda: examples.rmsnorm_matmul(batch=16, hidden=1024, out=4096, blocks=64, forloop=16),
    "fused_lora": lambda: examples.lora(m=16, k=4096, n=4096, rank=16, n_blocks=256, m_blocks=1),
}


#: The program each fused µGraph computes, as bundled with its direct µGraph: pairs whose measured order the
#: µGraph cost model must reproduce (tests/test_ugraph_measured.py).
DIRECT_OF = {
    # (the fused attention examples compute the papers' form: K given as [heads, dim, keys], no max)
    **{name: papers_form(name.removeprefix("fused_")) for name in EXTRA_UGRAPHS if name.startswith("fused_")},
    # LLaMA-3-8B's attention at 1,024 queries: the fused kernel takes K and V per query head, the program
    # repeats the 8 key/value heads; the same work but for that copy.
    "llama3_flash_attention2": "llama3_attention_prefill",
    "fa2_mha_prefill": "mha_prefill",
}


#: Programs the suite can bundle besides the bundled configs (name -> builder).
EXTRA_PROGRAMS = {
    "llama3_attention_prefill": lambda: llama3_attention(1024),
    "llama3_attention_decode": lambda: llama3_attention(1),
    "llama3_norm_projection": lambda: llama3_norm_projection(1024),
    **{part: lambda part=part: program_part(part) for part in PROGRAM_PARTS},
}


def load_program(name: str) -> Program:
    if name in EXTRA_UGRAPHS:
        return EXTRA_UGRAPHS[name]()[0]
    build = EXTRA_PROGRAMS.get(name)
    return build() if build is not None else load_config(name)


def load_ugraph(name: str) -> KernelGraph | None:
    """The fused µGraph bundled under ``name`` (None: the program's direct µGraph)."""
    return EXTRA_UGRAPHS[name]()[1] if name in EXTRA_UGRAPHS else None
