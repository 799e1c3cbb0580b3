"""One :func:`~gensorage.superopt.superoptimize` call: fast mode, full mode, the choice among the candidates at
the requested shapes, Ctrl-C, and what goes to the structure store (see :mod:`gensorage.superopt.api`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gensorage.errors import GensorageError
from gensorage.hw.profile import HwProfile
from gensorage.interrupts import StopRequests
from gensorage.precision import DEFAULT_PRECISION
from gensorage.program import Program, dump_program
from gensorage.superopt import choice
from gensorage.superopt.choice import Option, Progress, cost_fn, elements, rank, try_compile
from gensorage.superopt.gpu import gpu_name, gpu_unavailable_reason, measure_ugraph
from gensorage.superopt.presets import DEFAULT_TOP_K, DEFAULT_VERIFY_MAX_ELEMENTS, Preset
from gensorage.superopt.reshape_structure import reinstantiate, structure_signature
from gensorage.superopt.result import SuperoptInterrupted, SuperoptResult, Verification
from gensorage.superopt.row_fusion import FUSED_ORIGINS, check_fused_candidate, fused_candidate, fused_options
from gensorage.superopt.size_map import ReshapeFailed
from gensorage.superopt.sources import ProgramSource, search_program
from gensorage.superopt.structure_store import StructureRecord, StructureStore
from gensorage.ugraph import KernelGraph, from_program
from gensorage.verify.equivalent import VerificationStopped

#: GPU profiling of full mode: how many of the best-predicted candidates are timed, and how often each.
PROFILE_TOP = 3
PROFILE_WARMUP = 5
PROFILE_REPEATS = 50
PROFILE_BUDGET_S = 2.0  # per candidate: a slow one is timed on fewer samples (see gpu.median_time)
#: Search candidates (distinct structures) that carry over to the requested shapes are kept up to MAX_CARRY;
#: up to MAX_TRIED are tried, and kept in the store. What is best at the small search shapes often does not fit
#: at large ones (attention without a loop over the keys: at 7 keys the whole K tile fits, at 4096 it outgrows
#: shared memory), so trying stops at the first MAX_CARRY that fit, not at the first MAX_CARRY tried.
MAX_CARRY = 32
MAX_TRIED = 256


@dataclass(slots=True)
class Run:
    """One :func:`~gensorage.superopt.superoptimize` call: its mode, the choice among candidates, the store."""

    src: ProgramSource
    hw: HwProfile
    preset: Preset | None
    delta: float
    seed: int
    say: Progress
    notes: list[str]
    start: float
    store: Any
    use_store: bool
    precision: str = DEFAULT_PRECISION
    timings: dict[str, float] = field(default_factory=dict)
    _cost: Callable[[KernelGraph], float] | None = None
    stops: StopRequests = field(default_factory=StopRequests)
    _presses: int = 0  # Ctrl-C presses before the current phase (see begin_choosing)

    @property
    def program(self) -> Program:
        return self.src.program

    def cost(self, g: KernelGraph) -> float:
        if self._cost is None:
            self._cost = cost_fn(self.hw)
        return self._cost(g)

    @property
    def top_k(self) -> int:
        return self.preset.top_k if self.preset else DEFAULT_TOP_K

    def direct(self) -> Option:
        g = from_program(self.program, self.precision)
        return Option(g, self.cost(g), "direct")

    def baseline(self) -> list[Option]:
        """The direct µGraph, and the fused direct µGraphs where row fusion applies (:mod:`.row_fusion`)."""
        t0 = time.perf_counter()
        fused = fused_options(
            self.program, self.precision, self.hw, self.cost, self.delta, self.seed, self.preset
        )
        self._tick("fuse", t0)
        return [self.direct(), *fused]

    def _tick(self, phase: str, t0: float) -> None:
        self.timings[phase] = self.timings.get(phase, 0.0) + time.perf_counter() - t0

    def begin_choosing(self) -> None:
        """From here a Ctrl-C (even after one that stopped the search) ends the choice with the direct µGraph."""
        self._presses = self.stops.grace()

    def stop_requested(self) -> bool:
        return self.stops.count > self._presses

    def interrupted(self) -> bool:
        """Ctrl-C was pressed during the call (the result is then raised in :class:`SuperoptInterrupted`)."""
        return self.stops.count > 0

    # --------------------------------------------------------------------------------------- choosing
    def carry_over(
        self, graphs: Sequence[tuple[KernelGraph, dict[str, Any] | None]], at: Program, label: str, keep: int
    ) -> list[Option]:
        """The graphs (µGraphs of ``at``) rebuilt at the requested shapes, the ``keep`` predicted fastest.

        Graphs of one structure (same :func:`structure_signature`) are tried once, in order, until
        :data:`MAX_CARRY` carried over or :data:`MAX_TRIED` were tried. Those that do not carry over are noted.
        """
        t0 = time.perf_counter()
        same = at.key() == self.program.key()
        options: list[Option] = []
        seen: set[str] = set()
        fused: dict[str, bool] = {}  # origins whose row groups were fused: whether after epilogue fusion
        failed = 0
        for i, (g, report) in enumerate(graphs):
            sig = structure_signature(g)
            if sig in seen:
                continue
            if len(options) >= MAX_CARRY or len(seen) >= MAX_TRIED:
                break
            if self.stop_requested():
                self.notes.append(f"interrupted: {len(seen)} of the {label} structures were tried")
                break
            seen.add(sig)
            try:
                new = g if same else reinstantiate(g, at, self.program, self.hw, self.cost, seed=self.seed)
                # The search works under the default policy; the graph's ops do not depend on it.
                new = dataclasses.replace(new, precision=self.precision)
                opt = Option(new, self.cost(new), f"{label} #{i}", g, report)
                # its pre-defined ops fused by the rule the model prices fastest (the first on ties)
                forms = {e: fused_candidate(opt, self.hw, self.cost, e) for e in FUSED_ORIGINS.values()}
                epilogues = min(forms, key=lambda e: forms[e].predicted_time_s)
                options.append(forms[epilogues])
                if options[-1] is not opt:
                    fused[opt.origin] = epilogues
            except (ReshapeFailed, GensorageError) as exc:
                failed += 1
                if failed <= 3:
                    self.notes.append(f"{label} candidate #{i} does not carry over to these shapes: {exc}")
        if failed > 3:
            self.notes.append(f"... {failed} of {len(seen)} {label} structures tried do not carry over")
        self._tick("reinstantiate", t0)
        kept = self.launchable(sorted(options, key=lambda o: o.predicted_time_s), keep)
        limit = self.preset.verify_max_elements if self.preset is not None else DEFAULT_VERIFY_MAX_ELEMENTS
        if elements(self.program) <= limit:
            return kept  # each is checked at these shapes
        t0 = time.perf_counter()
        kept = [
            check_fused_candidate(o, at, self.hw, self.delta, self.seed, fused[o.origin])
            if o.origin in fused
            else o
            for o in kept
        ]
        self._tick("fuse", t0)
        return kept

    def launchable(self, options: list[Option], keep: int | None = None) -> list[Option]:
        """The first ``keep`` (default: all) of ``options`` whose kernels launch on the GPU as the CUDA build
        emits them (:func:`~gensorage.codegen.kernel_fit.launch_problem`; the model charges a block less shared
        memory than its kernel declares); the others are noted. The direct µGraph always stays."""
        from gensorage.codegen.kernel_fit import launch_problem

        t0 = time.perf_counter()
        kept: list[Option] = []
        for opt in options:
            if keep is not None and len(kept) >= keep:
                break
            why = None if opt.origin == "direct" else launch_problem(opt.graph, self.hw, self.seed)
            if why is None:
                kept.append(opt)
            else:
                self.notes.append(
                    f"{opt.origin}: not a candidate, it does not launch on {self.hw.name}: {why}"
                )
        self._tick("launch check", t0)
        return kept

    def choose(
        self, options: list[Option], measure: bool
    ) -> tuple[Option, Verification, Any, GensorageError | None, str]:
        """Rank, measure on the GPU if asked and there is one, then take the first that verifies and lowers."""
        selection = "cost model"
        gpu = gpu_unavailable_reason() if measure else "fast mode does not measure"
        ranked = rank(options)
        if (
            gpu is None
        ):  # the direct µGraphs are timed too: a candidate the model overrates must not beat them
            top = ranked[:PROFILE_TOP]
            selection = self.profile_on_gpu(
                top
                + [o for o in ranked if (o.origin == "direct" or o.origin in FUSED_ORIGINS) and o not in top]
            )
            ranked = rank(options)
        elif len(options) > 1 and measure:
            self.notes.append(f"chosen by the cost model, not measured: {gpu}")
        for opt in ranked:
            if self.stop_requested():
                return self.direct_on_interrupt(options, selection)
            t0 = time.perf_counter()
            self.say(f"verifying {opt.origin} ({opt.predicted_time_s:.3g} s predicted)")
            try:
                ver = choice.verify_option(
                    self.program, opt, self.delta, self.preset, self.seed, self.stop_requested
                )
            except VerificationStopped:
                self._tick("verify", t0)
                return self.direct_on_interrupt(options, selection)
            except GensorageError as exc:
                self.notes.append(f"{opt.origin}: verification failed to run: {exc}")
                self._tick("verify", t0)
                continue
            self._tick("verify", t0)
            if not ver:
                self.notes.append(f"{opt.origin}: rejected by the equivalence check ({ver})")
                continue
            t0 = time.perf_counter()
            self.say(f"lowering {opt.origin} to kernels")
            compiled, error = try_compile(opt.graph, self.hw, self.seed)
            self._tick("codegen", t0)
            if compiled is None and opt.origin != "direct":
                self.notes.append(f"{opt.origin}: the code generator cannot lower it: {error}")
                continue
            if error is not None:
                self.notes.append(f"the code generator cannot lower the direct µGraph: {error}")
            return opt, ver, compiled, error, selection
        raise AssertionError("the direct µGraph is always among the options and always verifies")

    def direct_on_interrupt(
        self, options: list[Option], selection: str
    ) -> tuple[Option, Verification, Any, GensorageError | None, str]:
        """Ctrl-C while choosing: the direct µGraph (equal by construction; its kernels are built on demand)."""
        self.notes.append(
            "interrupted while checking the candidates at these shapes: the direct µGraph is "
            "reported (a rerun resumes from the search's checkpoint)"
        )
        direct = next(o for o in options if o.origin == "direct")
        return direct, Verification(True, "direct µGraph"), None, None, selection

    def profile_on_gpu(self, options: list[Option]) -> str:
        t0 = time.perf_counter()
        for opt in options:
            if self.stop_requested():
                break
            compiled, error = try_compile(opt.graph, self.hw, self.seed)
            if compiled is None:
                self.notes.append(f"{opt.origin}: not profiled, the code generator cannot lower it: {error}")
                continue
            try:
                opt.measured_s = measure_ugraph(
                    compiled,
                    self.program,
                    seed=self.seed,
                    warmup=PROFILE_WARMUP,
                    repeats=PROFILE_REPEATS,
                    budget_s=PROFILE_BUDGET_S,
                ).median_s
            except GensorageError as exc:
                self.notes.append(f"{opt.origin}: profiling failed: {exc}")
            self.say(f"measured {opt.origin}: {opt.measured_s}")
        self._tick("profile", t0)
        return f"median of up to {PROFILE_REPEATS} samples on {gpu_name()}"

    def result(self, mode: str, options: list[Option], **extra: Any) -> SuperoptResult:
        options = self.launchable(options)
        direct = next(o for o in options if o.origin == "direct")
        opt, ver, compiled, error, selection = self.choose(options, measure=mode == "full")
        measured = {o.origin: o.measured_s for o in options if o.measured_s is not None} or None
        return SuperoptResult(
            program=self.program,
            hw=self.hw,
            mode=mode,
            best=opt.graph,
            predicted_time_s=opt.predicted_time_s,
            naive_predicted_time_s=direct.predicted_time_s,
            equivalence=ver,
            search_time_s=time.perf_counter() - self.start,
            selection=selection,
            timings=self.timings,
            notes=self.notes,
            measured=measured,
            seed=self.seed,
            origin=opt.origin,
            candidates=tuple((o.origin, o.graph, o.predicted_time_s) for o in rank(options)),
            _compiled=compiled,
            _compile_error=error,
            **extra,
        )

    # ------------------------------------------------------------------------------------------ fast
    def fast(self) -> SuperoptResult:
        self.begin_choosing()
        result = self._fast()
        if self.interrupted():
            result.stopped_by = "interrupt"
            raise SuperoptInterrupted(result)
        return result

    def _fast(self) -> SuperoptResult:
        baseline = self.baseline()
        record: StructureRecord | None = None
        if self.use_store:
            t0 = time.perf_counter()
            with StructureStore(self.store) as st:
                record = st.get(self.program.structure_key(), self.hw.name)
            self._tick("store", t0)
        if record is None:
            reason = (
                "no structure stored for this program and GPU (run full mode once)"
                if self.use_store
                else "the store is not used"
            )
            self.say(f"{reason}; using the direct µGraph")
            return self.result("fast", baseline, fallback_reason=reason)
        self.say(f"re-instantiating the stored structure (found at {record.params or 'its shapes'})")
        stored = record.program()
        options = self.carry_over(
            [(g, record.report(i)) for i, g in enumerate(record.ugraphs)], stored, "stored", self.top_k
        )
        if not options:
            reason = "no stored µGraph carries over to these shapes (see notes)"
            return self.result("fast", baseline, fallback_reason=reason, search_params=record.params)
        result = self.result("fast", [*baseline, *options], search_params=record.params)
        # A stored direct µGraph means the search found nothing better: the direct answer then comes from the store.
        stored_direct = record.ugraphs[0] == from_program(stored)
        result.from_store = result.origin.startswith("stored") or stored_direct
        if not result.from_store:
            result.fallback_reason = (
                "no stored µGraph is faster at these shapes by the cost model (or verifies)"
            )
        return result

    # ------------------------------------------------------------------------------------------ full
    def full(
        self,
        explicit: bool,
        time_budget_s: float | None,
        checkpoint: Any,
        workers: int | None,
        progress: bool,
        hw_name: str,
        cluster: str | None = None,
    ) -> SuperoptResult:
        from gensorage.exhaustive.chain_split import spliced_candidates
        from gensorage.exhaustive.derived_limits import derive_limits
        from gensorage.exhaustive.opcatalog import unsearched
        from gensorage.exhaustive.run.runner import SearchInterrupted, run_search
        from gensorage.exhaustive.spec import SearchSpec

        if (why := unsearched(self.program)) is not None:
            self.begin_choosing()
            self.say(f"{why}; using the direct µGraph")
            return self.result("full", self.baseline(), fallback_reason=why)
        if cluster is not None:  # a bad address is a one-line error before anything is said or searched
            from gensorage.exhaustive.run.cluster import require_engine

            require_engine(cluster)
        small = search_program(self.src, self.preset, explicit, self.notes)
        budget = (
            time_budget_s
            if time_budget_s is not None
            else (self.preset.time_budget_s if self.preset else None)
        )
        limits = dict(self.preset.search) if self.preset and self.preset.search else {}
        split = None
        if not limits:  # no preset's limits: derived from the program, the way Mirage sizes its space
            derived = derive_limits(small)
            limits, split = derived.limits, derived.split
            self.notes.append(derived.note)
            self.say(derived.note)
        searched = small if split is None else split.rest
        spec = SearchSpec(program=searched, hw=hw_name, seed=self.seed, delta=self.delta, **limits)
        if small is not self.program:
            where: object = small.params or {t.name: list(t.shape) for t in small.inputs}
            origin = (
                f"preset '{self.preset.name}'" if self.preset and self.preset.search_params else "derived"
            )
            self.say(f"searching at {where} ({origin})")
        t0 = time.perf_counter()
        interrupted = False
        try:
            sr = run_search(
                spec,
                checkpoint=checkpoint,
                workers=workers,
                time_budget_s=budget,
                progress=progress,
                cluster=cluster,
            )
        except SearchInterrupted as exc:
            sr, interrupted = exc.result, True
        if split is not None:  # the rest's candidates behind the program's own chain, each checked whole
            sr = dataclasses.replace(
                sr, candidates=tuple(spliced_candidates(split, small, spec, sr.candidates))
            )
        self._tick("search", t0)
        self.begin_choosing()
        found = [(c.ugraph, dict(c.equivalence)) for c in sr.candidates]
        self.say(
            f"search: {len(sr.candidates)} verified candidate(s); {sr.tasks_done}/{sr.tasks_total} tasks"
        )
        options = [*self.baseline(), *self.carry_over(found, small, "search", self.top_k)]
        best = sr.candidates[0] if sr.candidates else None
        stats = {
            "stats": _stats_json(sr.stats),
            "tasks_done": sr.tasks_done,
            "tasks_total": sr.tasks_total,
            "tasks_resumed": sr.tasks_resumed,
            "candidates": len(sr.candidates),
            "search_elapsed_s": sr.elapsed_s,
            "checkpoint": str(sr.checkpoint_path),
            # What the search found at its own shapes (before re-instantiation at the requested ones).
            "at_search_shapes": {
                "best_predicted_time_s": None if best is None else best.predicted_time_s,
                "best_kernels": None if best is None else len(best.ugraph.ops),
                "naive_predicted_time_s": self.cost(from_program(small)),
                "naive_kernels": len(from_program(small).ops),
            },
        }
        result = self.result(
            "full",
            options,
            search_stats=stats,
            complete=sr.complete,
            stopped_by=sr.stopped_by,
            search_params=dict(small.params),
        )
        if self.use_store:
            with self.stops.critical():
                self.save(small, found, sr, result)
        if interrupted or self.interrupted():
            result.stopped_by = result.stopped_by or "interrupt"
            raise SuperoptInterrupted(result)
        return result

    def save(
        self, small: Program, found: list[tuple[KernelGraph, Any]], sr: Any, result: SuperoptResult
    ) -> None:
        """Store the search's verified candidates as this program's structure (the one chosen at the requested
        shapes first; the direct µGraph when a complete search found none). An incomplete search does not
        replace what a complete one stored."""
        if not found and not sr.complete:
            return  # an unfinished search that found nothing has learnt nothing worth storing
        t0 = time.perf_counter()
        entries = _distinct(found)[:MAX_TRIED] or [(from_program(small), None)]
        if result.origin.startswith("search #"):
            chosen = found[int(result.origin.split("#")[1])]
            entries = [chosen, *(e for e in entries if e[0] != chosen[0])]
        with StructureStore(self.store) as st:
            old = st.get(self.program.structure_key(), self.hw.name)
            if old is not None and old.search.get("complete") and not sr.complete:
                self.notes.append("an earlier complete search's structure is kept in the store")
                self._tick("store", t0)
                return
            st.put(
                StructureRecord(
                    structure_key=self.program.structure_key(),
                    hw=self.hw.name,
                    version=_version(),
                    program_text=dump_program(small),
                    params=dict(small.params),
                    ugraphs=tuple(g for g, _ in entries),
                    reports=tuple(r for _, r in entries),
                    predicted_time_s=self.cost(entries[0][0]),
                    naive_predicted_time_s=self.cost(from_program(small)),
                    search={
                        "complete": sr.complete,
                        "candidates": len(sr.candidates),
                        "tasks_done": sr.tasks_done,
                        "tasks_total": sr.tasks_total,
                    },
                )
            )
        self._tick("store", t0)


def _distinct(found: list[tuple[KernelGraph, Any]]) -> list[tuple[KernelGraph, Any]]:
    """One graph per structure signature, in the given order."""
    seen: set[str] = set()
    out = []
    for g, report in found:
        sig = structure_signature(g)
        if sig not in seen:
            seen.add(sig)
            out.append((g, report))
    return out


def _stats_json(stats: Any) -> dict[str, Any]:
    to_json = getattr(stats, "to_json", None)
    return dict(to_json()) if callable(to_json) else {}


def _version() -> str:
    from gensorage import __version__

    return __version__


__all__ = ["MAX_CARRY", "MAX_TRIED", "PROFILE_TOP", "Run"]
