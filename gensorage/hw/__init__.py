"""Hardware profiles (``configs/hw/*.toml``) and local GPU detection.

>>> from gensorage.hw import load_profile
>>> load_profile("a100").sm_count
108
"""

from __future__ import annotations

from gensorage.hw.detect import DetectedGpu, detect, match_profile, parse_nvidia_smi_csv, probe
from gensorage.hw.loader import list_profiles, load_profile, profile_from_dict, resolve_profile_path
from gensorage.hw.profile import HwProfile, MemLevel

__all__ = [
    "DetectedGpu",
    "HwProfile",
    "MemLevel",
    "detect",
    "list_profiles",
    "load_profile",
    "match_profile",
    "parse_nvidia_smi_csv",
    "probe",
    "profile_from_dict",
    "resolve_profile_path",
]
