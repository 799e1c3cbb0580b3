"""``gensorage hw``: list, show and detect hardware profiles."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gensorage.hw.detect import DetectedGpu, probe
from gensorage.hw.loader import list_profiles, load_profile, resolve_profile_path
from gensorage.hw.profile import HwProfile

EXIT_NO_GPU = 1


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "hw",
        help="hardware profiles: list, show, detect",
        description="Inspect the hardware profiles the construction tuner uses.",
    )
    sub = parser.add_subparsers(dest="hw_command", metavar="ACTION")
    parser.set_defaults(func=lambda _args: _usage(parser))

    p_list = sub.add_parser("list", help="list known profiles")
    p_list.set_defaults(func=cmd_list)

    p_show = sub.add_parser("show", help="show one profile")
    p_show.add_argument(
        "profile", metavar="NAME|PATH", help="profile name (e.g. a100) or path to a .toml file"
    )
    p_show.add_argument("--json", action="store_true", help="print the profile as JSON")
    p_show.set_defaults(func=cmd_show)

    p_detect = sub.add_parser("detect", help="detect the local NVIDIA GPU and its matching profile")
    p_detect.set_defaults(func=cmd_detect)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def cmd_list(_args: argparse.Namespace) -> int:
    names = list_profiles()
    width = max((len(n) for n in names), default=0)
    for name in names:
        print(f"{name:<{width}}  {load_profile(name).display_name}")
    return 0


def profile_to_json(p: HwProfile) -> dict[str, Any]:
    """A JSON-ready dict of a profile (levels as a list, peak FLOP/s and sources as tables)."""
    return {
        "name": p.name,
        "display_name": p.display_name,
        "arch": p.arch,
        "sm_count": p.sm_count,
        "clock_hz": p.clock_hz,
        "warp_size": p.warp_size,
        "max_threads_per_block": p.max_threads_per_block,
        "max_threads_per_sm": p.max_threads_per_sm,
        "max_blocks_per_sm": p.max_blocks_per_sm,
        "registers_per_sm": p.registers_per_sm,
        "max_registers_per_thread": p.max_registers_per_thread,
        "shared_mem_per_sm": p.shared_mem_per_sm,
        "shared_mem_per_block": p.shared_mem_per_block,
        "l2_bytes": p.l2_bytes,
        "shared_banks": p.shared_banks,
        "bank_width_bytes": p.bank_width_bytes,
        "transaction_bytes": p.transaction_bytes,
        "dram_bytes": p.dram_bytes,
        "levels": [
            {
                "name": lv.name,
                "bandwidth_Bps": lv.bandwidth_Bps,
                "latency_cycles": lv.latency_cycles,
                "capacity_bytes": lv.capacity_bytes,
            }
            for lv in p.levels
        ],
        "peak_flops": {dt: {"cuda": cuda, "tensor": tensor} for dt, cuda, tensor in p.peak_flops},
        "sources": dict(p.sources),
    }


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:g} B"


def _rows(p: HwProfile) -> list[tuple[str, str]]:
    rows = [
        ("name", p.name),
        ("display_name", p.display_name),
        ("arch", p.arch),
        ("sm_count", str(p.sm_count)),
        ("clock_hz", f"{p.clock_hz / 1e6:g} MHz"),
    ]
    rows += [
        (k, str(getattr(p, k)))
        for k in (
            "warp_size",
            "max_threads_per_block",
            "max_threads_per_sm",
            "max_blocks_per_sm",
            "registers_per_sm",
            "max_registers_per_thread",
        )
    ]
    rows += [(k, _bytes(getattr(p, k))) for k in ("shared_mem_per_sm", "shared_mem_per_block", "l2_bytes")]
    rows += [
        ("shared_banks", str(p.shared_banks)),
        ("bank_width_bytes", f"{p.bank_width_bytes} B"),
        ("transaction_bytes", f"{p.transaction_bytes} B"),
        ("dram_bytes", _bytes(p.dram_bytes)),
    ]
    for lv in p.levels:
        rows.append((f"levels.{lv.name}.bandwidth_Bps", f"{lv.bandwidth_Bps / 1e9:,.1f} GB/s"))
        rows.append((f"levels.{lv.name}.latency_cycles", f"{lv.latency_cycles:g} cycles"))
    for dt, cuda, tensor in p.peak_flops:
        rows.append((f"peak_flops.{dt}.cuda", f"{cuda / 1e12:g} TFLOP/s"))
        rows.append((f"peak_flops.{dt}.tensor", f"{tensor / 1e12:g} TFLOP/s" if tensor else "none"))
    return rows


def cmd_show(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    if args.json:
        print(json.dumps(profile_to_json(profile), indent=2))
        return 0
    sources = dict(profile.sources)
    rows = _rows(profile)
    kw = max(len(k) for k, _ in rows)
    vw = max(len(v) for _, v in rows)
    print(f"# {profile.display_name} ({resolve_profile_path(args.profile)})")
    for key, value in rows:
        src = sources.get(key, "")
        print(f"{key:<{kw}}  {value:<{vw}}  {src}".rstrip())
    return 0


def _describe(gpu: DetectedGpu) -> str:
    mem = _bytes(gpu.memory_bytes) if gpu.memory_bytes is not None else "memory unknown"
    cc = (
        f"compute capability {gpu.compute_capability[0]}.{gpu.compute_capability[1]}"
        if gpu.compute_capability
        else "compute capability unknown"
    )
    return f"GPU {gpu.index}: {gpu.name}, {mem}, {cc} (via {gpu.source})"


def cmd_detect(_args: argparse.Namespace) -> int:
    found = probe()
    if not found.gpus:
        reasons = " / ".join(found.notes) or "no detection method available"
        print(f"no NVIDIA GPU detected ({reasons})")
        return EXIT_NO_GPU
    for gpu in found.gpus:
        print(_describe(gpu))
        if gpu.profile:
            print(f"  matching profile: {gpu.profile}")
        else:
            print(f"  matching profile: none (known profiles: {', '.join(list_profiles())})")
    return 0
