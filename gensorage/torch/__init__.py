"""The PyTorch front end: hand gensorage a model (``gensorage.torch.compile`` or ``backend="gensorage"``).

torch is imported only when a model is compiled, so ``import gensorage`` does not import it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from gensorage.errors import ConfigError
from gensorage.torch.report import first_line

MODES = ("fast", "full")

#: Shapes a compiled model may be captured at. Dynamo stops capturing a function after ``recompile_limit`` (8)
#: shapes per code object, counted over every compiled instance of the model's class, and runs it in eager
#: torch from then on: a ninth sequence length would quietly leave gensorage. :func:`compile` raises dynamo's
#: two limits to this (never lowers them), process-wide: setting them per call costs ~15 µs a call.
RECOMPILE_LIMIT = 4096


#: The start of dynamo's refusal of a compiled function called while FX traces (in any thread: a global flag).
_TRACED_ELSEWHERE = "Detected that you are using FX to symbolically trace a dynamo-optimized function"


class Compiled:
    """The compiled model: call it like the module (or function) it wraps; :meth:`explain` says what ran where."""

    def __init__(self, fn: Any, compiled: Callable[..., Any], report: Any) -> None:
        self._fn = fn
        self._compiled = compiled
        self.report = report
        target = fn.forward if hasattr(fn, "forward") else fn
        functools.update_wrapper(self, target, updated=())
        self.__signature__ = inspect.signature(target)
        from torch._dynamo.exc import TorchDynamoException
        from torch._dynamo.utils import counters

        self._dynamo_error, self._counters = TorchDynamoException, counters
        self._seen: tuple[int, dict[str, int], dict[str, int]] = (-1, {}, {})

    def _dynamo_counts(self, frames: dict[str, int]) -> tuple[int, dict[str, int], dict[str, int]]:
        """How many frames dynamo has begun to convert, and copies of its counts of each graph break reason and
        of each reason it could not capture at all (a frame it skipped: a graph break inside a loop), all
        process-wide. Copied by dict's own method: Counter's runs in Python."""
        return (
            frames["total"],
            dict.copy(self._counters["graph_break"]),
            dict.copy(self._counters["unimplemented"]),
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # dynamo counts only while it converts a frame (a cache miss: a new shape, a first call), so a call that
        # finds the frame count unchanged since the counts were copied copies nothing
        frames = self._counters["frames"]
        if frames["total"] != self._seen[0]:
            self._seen = self._dynamo_counts(frames)
        failed = False
        try:
            return self._compiled(*args, **kwargs)
        except self._dynamo_error as exc:  # capture or compilation failed: torch runs the model as written
            failed = True  # its own line says so
            return self._eager_after(exc, args, kwargs)
        except RuntimeError as exc:
            if not str(exc).startswith(_TRACED_ELSEWHERE):
                return self._raised(exc, args, kwargs)
            return self._after_trace(args, kwargs)
        except Exception as exc:  # the model's own error, raised as eager torch raises it
            return self._raised(exc, args, kwargs)
        finally:
            if frames["total"] != self._seen[0]:
                self._report_dynamo(frames, failed)

    def _raised(self, exc: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The model's own error, raised as eager torch raises it, unless torch.compile cannot take the input."""
        if subclass := _subclass_input(args, kwargs):
            self.report.add(
                f"a {subclass} input, which torch.compile could not take "
                f"({type(exc).__name__}: {first_line(exc)}): eager torch runs this call"
            )
            return self._fn(*args, **kwargs)
        self.report.add(f"the model raised {type(exc).__name__}: {first_line(exc)}")
        raise exc

    def _after_trace(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call again once no thread traces. FX marks a trace in a module global, so a compiled model
        called while another thread captures a graph (dynamo's capture, AOTAutograd's trace, a specialisation
        of :class:`~gensorage.torch.per_shape.PerShape`) is refused by dynamo as if it were traced. Those traces
        hold dynamo's compile lock: taken and released, the trace is over and the call runs as compiled (in eager
        torch if a new trace refuses it again)."""
        from torch._dynamo.convert_frame import compile_lock

        with compile_lock:
            pass
        try:
            return self._compiled(*args, **kwargs)
        except RuntimeError as exc:
            if not str(exc).startswith(_TRACED_ELSEWHERE):
                return self._raised(exc, args, kwargs)
            return self._fn(*args, **kwargs)

    def _report_dynamo(self, frames: dict[str, int], failed: bool) -> None:
        """The graph breaks this call's capture made, and what it could not capture (unless it failed)."""
        _, breaks, skips = self._seen
        self._seen = now = self._dynamo_counts(frames)
        if new := [why for why, n in now[1].items() if n > breaks.get(why, 0)]:
            self.report.graph_breaks(new)
        if not failed and (new := [why for why, n in now[2].items() if n > skips.get(why, 0)]):
            self.report.not_captured(new)

    def _eager_after(self, failure: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call in eager torch after torch.compile failed on it. Where eager torch raises too, the call's
        input was at fault (shapes a matmul rejects, an empty sequence a reshape cannot infer): the model's
        error is raised as eager raises it, and the next call is compiled again. Otherwise torch.compile cannot
        capture the model, and eager torch runs it from then on."""
        try:
            out = self._fn(*args, **kwargs)
        except Exception as exc:
            self.report.add(f"the model raised {type(exc).__name__}: {first_line(exc)}")
            raise exc from None  # eager's error alone, not chained to dynamo's pages about it
        self.report.add(
            f"torch.compile failed, eager torch runs the model from now on: {first_line(failure)}"
        )
        self._compiled = self._fn
        return out

    def explain(self) -> str:
        """Which ops ran in gensorage and which in torch, and why (one line per decision)."""
        return str(self.report.text())


def _subclass_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The type name of the first tensor argument of a tensor subclass (torch.compile's capture fails on one
    that eager torch runs: its ``__torch_dispatch__`` declines the fake tensors), None when all are plain."""
    import torch
    from torch.utils._pytree import tree_leaves

    plain = (torch.Tensor, torch.nn.Parameter)
    leaves = tree_leaves((args, kwargs))
    return next(
        (type(a).__name__ for a in leaves if isinstance(a, torch.Tensor) and type(a) not in plain), None
    )


def compile(
    module_or_fn: Any,
    *,
    hw: str = "h100",
    mode: str = "fast",
    time_budget_s: float | None = None,
    explain: bool = False,
) -> Compiled:
    """Compile a torch module or function: captured by dynamo, lowered to Programs where gensorage can, run by
    gensorage kernels once they are checked, by torch elsewhere.

    Parameters
    ----------
    module_or_fn : torch.nn.Module or callable
        What to compile; it is called with the same arguments.
    hw : str
        The hardware profile the kernels are built for (``gensorage hw list``).
    mode : {"fast", "full"}
        :func:`gensorage.superoptimize`'s mode for each subgraph.
    time_budget_s : float, optional
        Search budget per subgraph (full mode).
    explain : bool
        Print what ran where, and why, to stderr as graphs are compiled (always available from
        :meth:`Compiled.explain`).

    Returns
    -------
    Compiled
        Call it like ``module_or_fn``. Each new input shape is captured and compiled again (static shapes);
        kernels for a shape seen before are reused. Dynamo's recompile limits are raised to
        :data:`RECOMPILE_LIMIT` shapes (process-wide) so that new shapes keep running in gensorage.

    Raises
    ------
    ConfigError
        A bad mode or budget.
    """
    import torch

    from gensorage.torch.backend import make_backend
    from gensorage.torch.report import Report
    from gensorage.torch.subgraph import Options

    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if time_budget_s is not None and not time_budget_s > 0:
        raise ConfigError(f"time budget must be a positive number of seconds, got {time_budget_s!r}")
    if not callable(module_or_fn):
        raise ConfigError(f"expected a torch.nn.Module or a function, got {type(module_or_fn).__name__}")
    import torch._dynamo

    for name in ("recompile_limit", "accumulated_recompile_limit"):
        setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), RECOMPILE_LIMIT))
    report = Report(echo=explain)
    backend = make_backend(Options(hw, mode, time_budget_s, explain), report)
    optimized = torch.compile(module_or_fn, backend=backend, dynamic=False)
    # A compiled module's ``forward`` is dynamo's wrapper of the module's own ``__call__`` (its hooks run
    # there): calling it skips the ``OptimizedModule``'s ``nn.Module.__call__`` around it, which has no hooks
    # (nobody else holds it) and costs ~2 µs a call.
    forward = optimized.forward if isinstance(optimized, torch._dynamo.OptimizedModule) else None
    return Compiled(module_or_fn, forward or optimized, report)


__all__ = ["Compiled", "compile"]
