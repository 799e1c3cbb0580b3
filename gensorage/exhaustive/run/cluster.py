"""The search on a Dask cluster (``run_search(..., cluster=ADDRESS)``): :class:`DaskEngine`, the
:class:`~.engine.Engine` whose workers are the cluster's.

Why Dask distributed: a pure-Python wheel of a few MB (Ray's is ~70 MB with a C++ raylet); the scheduler
re-runs a dead worker's tasks on the others by itself; a cluster is two commands (``dask scheduler`` on one
host, ``dask worker tcp://HOST:8786`` on each) or, on one machine, a ``LocalCluster`` (``cluster="local:N"``).

How a job travels: the driver submits ``run_job`` (core, spec, task, job key) as a Dask task. The worker runs
the task; every ``save_every_s`` it puts where it is (an :class:`~.conversions.Outcome` covering the job so
far) on the run's event ``Queue``, with its progress. The driver keeps each running job's last save point in
the run's ``saves`` Variable (it is the only writer). If a worker dies, the scheduler runs its job again on
another worker, and that run starts from the job's entry there: no work before the last save point the driver
received is lost, and the job still returns one Outcome covering it from its start, so the driver (the single
writer of the checkpoint) records it once. Stop requests go the other way, through the run's ``stop``
Variable (``"all"`` or the keys of jobs to stop), which jobs poll every :data:`CLUSTER_STOP_POLL_S`.

Workers must run the same gensorage and see the same hardware profile as the driver: :func:`connect` asks
every worker for :func:`identity` and refuses the cluster, naming the worker, when one differs.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

from gensorage.errors import ConfigError
from gensorage.exhaustive.run.conversions import Outcome, encode, stats_to_dict
from gensorage.exhaustive.run.core import SearchCore
from gensorage.exhaustive.run.engine import Event
from gensorage.exhaustive.run.pieces import join
from gensorage.exhaustive.run.processes import sigint_ignored
from gensorage.exhaustive.run.workers import WORKER_PROGRESS_S, Throttled

# How often a job on a cluster worker asks the scheduler whether it should stop (a network round trip).
CLUSTER_STOP_POLL_S = 0.5
# How long connecting to a scheduler may take before the address is called unreachable.
CONNECT_TIMEOUT_S = 10.0
# The extra that installs the engine.
EXTRA = "gensorage[distributed]"


def identity(spec: Any) -> dict[str, Any]:
    """What a worker must share with the driver: the gensorage version and the fingerprint of the search's
    hardware profile as this process loads it (None for a core whose spec names none)."""
    import gensorage

    hw = getattr(spec, "hw", None)
    profile = None
    if isinstance(hw, str):
        from gensorage.hw.loader import profile_fingerprint

        profile = profile_fingerprint(hw)
    return {"gensorage": gensorage.__version__, "profile": profile}


def parse_cluster(address: str) -> tuple[str, int]:
    """``("local", N)`` for ``"local:N"``, else ``("remote", 0)`` for a scheduler address."""
    if not isinstance(address, str) or not address.strip():
        raise ConfigError(
            f"cluster: expected a scheduler address (tcp://HOST:PORT) or local:N, got {address!r}"
        )
    if address.startswith("local:"):
        n = address.removeprefix("local:")
        if not n.isdigit() or int(n) < 1:
            raise ConfigError(f"cluster: local:N needs N >= 1 worker processes, got {address!r}")
        return "local", int(n)
    if "://" not in address and ":" not in address:
        raise ConfigError(
            f"cluster: {address!r} is not a scheduler address (tcp://HOST:PORT, HOST:PORT) or local:N"
        )
    return "remote", 0


def require_engine(address: str) -> None:
    """Check ``address`` and that the Dask extra is installed, before any work starts."""
    parse_cluster(address)
    _distributed()


def _distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise ConfigError(f"cluster: the Dask engine is not installed (pip install '{EXTRA}')") from None
    return distributed


class DaskEngine:
    """Jobs on the workers of a Dask cluster (see the module docstring); :func:`connect` makes one."""

    can_stop_one = True

    def __init__(
        self, client: Any, cluster: Any, core: SearchCore, spec: Any, save_every_s: float | None
    ) -> None:
        d = _distributed()
        self.client, self._cluster = client, cluster
        self._core, self._spec, self._save_every_s = core, spec, save_every_s
        self._run = f"gensorage-{uuid.uuid4().hex[:12]}"
        self._events = d.Queue(f"{self._run}-events", client=client)
        self._control = d.Variable(f"{self._run}-stop", client=client)
        self._control.set([])
        self._saves = d.Variable(f"{self._run}-saves", client=client)
        self._saves.set({})
        self._saved: dict[int, Outcome] = {}  # the last save point of each running job
        self._stopping: set[int] = set()
        self._futures: dict[Any, int] = {}
        self.workers = sum(w["nthreads"] for w in client.scheduler_info()["workers"].values())
        self._identity = identity(spec)  # every job checks its worker's: workers may join after connect

    def submit(self, key: int, task: Any) -> None:
        fut = self.client.submit(
            run_job,
            self._core,
            self._spec,
            task,
            key,
            self._run,
            self._save_every_s,
            self._identity,
            key=f"{self._run}-{key}",
            pure=False,
        )
        self._futures[fut] = key

    def events(self, timeout: float) -> list[Event]:
        d = _distributed()
        with contextlib.suppress(TimeoutError):
            d.wait(list(self._futures), timeout=timeout, return_when="FIRST_COMPLETED")
        out: list[Event] = [tuple(e) for e in self._events.get(batch=True)]  # saves precede the end
        saved = [e for e in out if e[0] == "save" and e[1] in self._futures.values()]
        for fut in [f for f in self._futures if f.done()]:
            key = self._futures.pop(fut)
            if fut.status == "finished":
                out.append(("done", key, fut.result()))
            else:
                exc = fut.exception()
                out.append(("error", key, _job_error(exc, key)))
            self._saved.pop(key, None)
        if saved:
            self._saved.update((key, point) for _, key, point in saved if key in self._futures.values())
            self._saves.set(dict(self._saved))
        return out

    def stop(self, key: int | None = None) -> None:
        if key is None:
            self._control.set("all")
        else:
            self._stopping.add(key)
            self._control.set(sorted(self._stopping))

    def close(self, abort: bool) -> None:
        # The stop Variable stays set (not deleted): a job still running on a remote worker, which no cancel
        # can interrupt, must read "all" at its next poll rather than find no Variable.
        with contextlib.suppress(Exception):
            self._control.set("all")
            if self._futures:
                self.client.cancel(list(self._futures))
            self._saves.delete()
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def _job_error(exc: BaseException | None, key: int) -> BaseException:
    name = type(exc).__name__
    if name == "KilledWorker":
        return ConfigError(
            f"cluster: job {key} killed the workers that ran it too often (the scheduler's "
            f"distributed.scheduler.allowed-failures); last: {exc}"
        )
    return exc if exc is not None else RuntimeError(f"cluster: job {key} was cancelled")


def connect(address: str, core: SearchCore, spec: Any, save_every_s: float | None) -> DaskEngine:
    """Start (``local:N``) or reach the cluster at ``address`` and check its workers (see the module
    docstring).

    Raises
    ------
    ConfigError
        A bad address, ``local:0``, the extra not installed, no scheduler there, no workers, or a worker with
        another gensorage version or hardware profile.
    """
    kind, n = parse_cluster(address)
    d = _distributed()
    cluster = None
    try:
        if kind == "local":
            # Worker processes (the search is CPU-bound Python), one thread each, over loopback TCP; they
            # ignore Ctrl-C, which reaches the whole process group: the driver stops their jobs itself.
            with sigint_ignored():
                cluster = d.LocalCluster(
                    n_workers=n,
                    processes=True,
                    threads_per_worker=1,
                    host="127.0.0.1",
                    dashboard_address=None,
                    silence_logs=40,
                )
            client = d.Client(cluster)
        else:
            client = d.Client(address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        if cluster is not None:
            cluster.close()
        raise ConfigError(f"cluster: cannot reach a Dask scheduler at {address} ({exc})") from None
    try:
        _check_workers(client, address, spec)
        return DaskEngine(client, cluster, core, spec, save_every_s)
    except BaseException:
        client.close()
        if cluster is not None:
            cluster.close()
        raise


def _check_workers(client: Any, address: str, spec: Any) -> None:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while not client.scheduler_info()["workers"]:
        if time.monotonic() > deadline:
            raise ConfigError(f"cluster: the scheduler at {address} has no workers")
        time.sleep(0.1)
    mine = identity(spec)
    try:
        theirs = client.run(identity, spec)
    except Exception as exc:  # a worker that cannot even import gensorage
        raise ConfigError(
            f"cluster: a worker of {address} cannot run gensorage ({type(exc).__name__}: {exc})"
        ) from None
    for worker, ident in sorted(theirs.items()):
        refuse_other(worker, ident, mine)


def refuse_other(worker: str, ident: dict[str, Any], mine: dict[str, Any]) -> None:
    """A one-line :class:`ConfigError` when ``worker``'s :func:`identity` is not the driver's (``mine``)."""
    for what, value in mine.items():
        if ident.get(what) != value:
            name = "gensorage version" if what == "gensorage" else "hardware profile fingerprint"
            raise ConfigError(
                f"cluster: worker {worker} has {name} {ident.get(what)}, this driver {value}; "
                "install the same gensorage (and profile) on every worker"
            )


# ================================================================================================ worker side


def run_job(
    core: SearchCore,
    spec: Any,
    task: Any,
    key: int,
    run: str,
    save_every_s: float | None,
    driver: dict[str, Any] | None = None,
) -> Outcome:
    """On a cluster worker: run job ``key`` (``task``), from the job's last save point if an earlier run of
    it died; report progress and save points; return its Outcome from the job's start. A worker whose
    :func:`identity` is not ``driver``'s refuses the job (it may have joined after the check at connect)."""
    d = _distributed()
    if driver is not None:
        refuse_other(d.get_worker().address, identity(spec), driver)
    control = d.Variable(f"{run}-stop")
    events = d.Queue(f"{run}-events")
    try:
        before: Outcome | None = d.Variable(f"{run}-saves").get(timeout=CONNECT_TIMEOUT_S).get(key)
    except Exception:  # the run is over (its driver closed it): nothing to continue
        before = None
    if before is not None and before.resume is not None and core.resume_task is not None:
        task = core.resume_task(task, before.resume)
        with contextlib.suppress(Exception):
            events.put(("resumed", key, before.resume))
    else:
        before = None
    idx = int(task.index)
    t0 = time.perf_counter()
    last = [time.monotonic()]  # short jobs send no progress

    def should_stop() -> bool:
        try:
            wanted = control.get(timeout=CONNECT_TIMEOUT_S)
        except Exception:  # the driver is gone (or the scheduler): nobody would record the result
            return True
        return bool(wanted == "all" or key in wanted)

    def on_progress(stats: Any) -> None:
        now = time.monotonic()
        if now - last[0] >= WORKER_PROGRESS_S:
            last[0] = now
            with contextlib.suppress(Exception):  # best-effort: the result is what counts
                events.put(("progress", key, stats_to_dict(stats)))

    def on_save(res: Any) -> None:
        with contextlib.suppress(Exception):
            events.put(("save", key, join(before, encode(idx, res, time.perf_counter() - t0))))

    saving: dict[str, Any] = {}
    if save_every_s is not None:
        saving = {"save_every_s": save_every_s, "on_save": on_save}
    stop = Throttled(should_stop, CLUSTER_STOP_POLL_S, first_s=CLUSTER_STOP_POLL_S)  # short jobs never ask
    res = core.run_task(spec, task, should_stop=stop, on_progress=on_progress, **saving)
    return join(before, encode(idx, res, time.perf_counter() - t0))


__all__ = [
    "CLUSTER_STOP_POLL_S",
    "CONNECT_TIMEOUT_S",
    "DaskEngine",
    "connect",
    "identity",
    "parse_cluster",
    "refuse_other",
    "require_engine",
    "run_job",
]
