"""What /proc/cpuinfo says about this machine's CPU: one reader for the C kernels' build key,
the engine's per-CPU choices and the benchmarks' machine records. Standard library only (no
torch), so the lightest benchmark can record its machine. Where the file cannot be read (not
Linux), every answer is empty and :func:`model_name` falls back on ``platform``."""
from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def first_cpu(path: Path | None = None) -> dict[str, str]:
    """The fields of the first processor block of ``path`` (default :data:`CPUINFO`), name ->
    value ({} where it cannot be read)."""
    try:
        text = (path or CPUINFO).read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def flags(path: Path | None = None) -> set[str]:
    """The feature flags (x86's ``flags``, Arm's ``Features``); empty where unknown."""
    cpu = first_cpu(path)
    return set(cpu.get("flags", cpu.get("Features", "")).split())


def vendor(path: Path | None = None) -> str:
    """``vendor_id`` ("AuthenticAMD", "GenuineIntel"; "" where unknown)."""
    return first_cpu(path).get("vendor_id", "")


def model_name(path: Path | None = None) -> str:
    """The marketing name (``model name``), else what ``platform`` knows."""
    return first_cpu(path).get("model name") or platform.processor() or platform.machine()
