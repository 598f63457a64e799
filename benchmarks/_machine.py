"""What a benchmark result names as its machine."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, or what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
