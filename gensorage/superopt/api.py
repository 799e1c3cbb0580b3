"""``superoptimize``: exhaustive µGraph search (full mode) or stored-structure reuse (fast mode) for one program.

Full mode
    1. The exhaustive search (:func:`gensorage.exhaustive.run.runner.run_search`: checkpointed, resumable, within
       the time budget; Ctrl-C keeps what was found) runs at the preset's small *search shapes* for a bundled
       benchmark program, else at the program's own shapes.
    2. Its top candidates are re-instantiated at the requested shapes (:mod:`.reshape_structure`: grids and
       loops constructed again) and ranked by the µGraph cost model together with the direct µGraph (one
       kernel per op), so the answer is never worse than the naive program by that model. On a machine with
       a GPU the leading candidates and the direct µGraph are timed on the device instead and the fastest
       measured wins.
    3. The winner is re-verified against the program at the requested δ (:func:`gensorage.verify.equivalent`)
       and lowered by the code generator; a candidate failing either is skipped for the next.
    4. The search's candidates are stored as the program's *structure* (:mod:`.structure_store`), keyed by
       (structure key, GPU, gensorage version).

Fast mode
    The stored structure of the program is re-instantiated at the requested shapes, verified and lowered, in
    seconds, chosen by the cost model (nothing is timed on the device); without a stored structure (or if none
    of its graphs carries over) the direct µGraph is used and the code generator constructs its kernels'
    schedules. The result says which happened and why.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from gensorage.errors import ConfigError
from gensorage.interrupts import stop_requests
from gensorage.precision import DEFAULT_PRECISION, check_precision
from gensorage.program import Program
from gensorage.superopt.choice import Progress
from gensorage.superopt.presets import DEFAULT_DELTA, Preset
from gensorage.superopt.result import SuperoptResult
from gensorage.superopt.run import Run
from gensorage.superopt.sources import resolve_preset, resolve_program

if TYPE_CHECKING:
    from gensorage.hw.profile import HwProfile
    from gensorage.store import Store

Mode = Literal["full", "fast"]
MODES: tuple[str, ...] = ("full", "fast")


def superoptimize(
    program: Program | str | os.PathLike[str],
    hw: str | HwProfile = "h100",
    mode: str = "full",
    time_budget_s: float | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    *,
    params: Mapping[str, int] | None = None,
    seed: int = 0,
    workers: int | None = None,
    cluster: str | None = None,
    preset: Preset | str | None = None,
    store: Store | str | os.PathLike[str] | None = None,
    use_store: bool = True,
    progress: bool = True,
    delta: float | None = None,
    precision: str = DEFAULT_PRECISION,
) -> SuperoptResult:
    """Superoptimise ``program`` for the GPU ``hw``.

    Parameters
    ----------
    program : Program, path or str
        A :class:`~gensorage.program.Program`, a ``.gsp`` file, or the name of a bundled benchmark program
        (``configs/programs/<name>.gsp``).
    hw : str or HwProfile
        Hardware profile name (``configs/hw/<hw>.toml``) or a loaded profile.
    mode : {"full", "fast"}
        ``"full"``: exhaustive search (see the module docstring). ``"fast"``: re-use the structure a full run
        stored for this program and GPU, at the new shapes; without one, the direct µGraph.
    time_budget_s : float, optional
        Wall-time budget of the search (full mode); default: the preset's, else none. The search stops
        dispatching work when it is spent and the best of what was found is returned.
    checkpoint : path, optional
        The search's SQLite checkpoint (default: one per search spec under ``$GENSORAGE_HOME``); an existing
        one for the same search is resumed.
    params : mapping, optional
        Program params (for a file or config name).
    seed : int
        Seeds the search's construction and verification, the grid construction and the final check.
    workers : int, optional
        Search worker processes (default: the usable cores).
    cluster : str, optional
        Run the search's tasks on a Dask cluster instead (``pip install 'gensorage[distributed]'``): its
        scheduler's address (``tcp://HOST:8786``), or ``"local:N"`` for N worker processes on this machine
        (docs/distributed.md). Excludes ``workers``.
    preset : Preset or str, optional
        Search shapes and limits (default: ``configs/presets/<program name>.toml`` when it exists).
    store : Store or path, optional
        The result store holding structures (default ``$GENSORAGE_HOME/store.sqlite``).
    use_store : bool
        Read (fast mode) and write (full mode) structures in the store.
    progress : bool
        Report progress on stderr.
    delta : float, optional
        False-accept probability of the equivalence checks (default: the preset's, else 1e-9).
    precision : {"float32", "storage"}
        How intermediates are stored (:mod:`gensorage.precision`): ``"float32"`` keeps the results of exp,
        sums, sqrt, div and squares in float32 when the program's dtype is narrower (torch autocast's list), so
        large logits and activations do not overflow float16; ``"storage"`` stores every tensor in the
        program's dtype (fewer bytes, no overflow protection). Outputs keep the program's dtype either way.

    Returns
    -------
    SuperoptResult

    Raises
    ------
    SuperoptInterrupted
        Ctrl-C during the search; ``.result`` is the best of what was found.
    ConfigError, ProgramError, StoreError
        Bad program, preset, profile, budget or store.
    """
    start = time.perf_counter()
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    check_precision(precision)
    if time_budget_s is not None and not (time_budget_s > 0 and math.isfinite(time_budget_s)):
        raise ConfigError(f"time budget must be a positive number of seconds, got {time_budget_s!r}")
    say = Progress(progress)
    notes: list[str] = []
    profile = _load_hw(hw)
    src = resolve_program(program, params)
    chosen_preset, explicit = resolve_preset(preset, src)
    d = delta if delta is not None else (chosen_preset.delta if chosen_preset else DEFAULT_DELTA)
    if not 0 < d < 1:
        raise ConfigError(f"delta must be in (0, 1), got {d!r}")
    run = Run(src, profile, chosen_preset, d, seed, say, notes, start, store, use_store, precision)
    with stop_requests() as run.stops:
        if mode == "fast":
            return run.fast()
        return run.full(
            explicit,
            time_budget_s,
            checkpoint,
            workers,
            progress,
            hw if isinstance(hw, str) else profile.name,
            cluster,
        )


def _load_hw(hw: str | HwProfile) -> HwProfile:
    from gensorage.hw import HwProfile as Profile
    from gensorage.hw import load_profile

    return hw if isinstance(hw, Profile) else load_profile(hw)


__all__ = ["MODES", "Mode", "superoptimize"]
