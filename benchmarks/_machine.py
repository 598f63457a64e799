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


def emit(text: str, out: Path | None) -> None:
    """Print a benchmark's report and, with ``--out``, write it there too."""
    print("\n" + text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
