"""Facts about the host that go into a calibrated file's provenance (no torch)."""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path

# 1-minute load average above which a CPU calibration is flagged: spinning OpenMP threads
# that lose their core stall parallel ops for a scheduler tick.
BUSY_LOAD = 0.5


def other_load(load_average, own_threads: float = 0.0) -> float:
    """The 1-minute load average minus the calibrating process's own busy threads (e.g. traces.timing's
    spinning measurement thread, which keeps the load average near its count): the load of others."""
    if not load_average:
        return 0.0
    return float(load_average[0]) - float(own_threads or 0.0)


def contended(load_average, own_threads: float = 0.0) -> bool:
    """Whether other processes were busy when a CPU calibration started (its timings then inflated)."""
    return other_load(load_average, own_threads) > BUSY_LOAD


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def physical_memory_bytes() -> tuple[float, str]:
    """(bytes, how it was read)."""
    try:
        match = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        if match:
            return float(match.group(1)) * 1024, "/proc/meminfo MemTotal"
    except OSError:
        pass
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "sysconf(SC_PHYS_PAGES)"


def _parse_cache_size(text: str) -> int | None:
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if not match:
        return None
    return int(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2)]


def last_level_cache_bytes() -> int | None:
    """Size of the highest cache level of cpu0 from sysfs (None where unavailable)."""
    best_level, best_size = -1, None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = _parse_cache_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if size is not None and level > best_level:
            best_level, best_size = level, size
    return best_size


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
