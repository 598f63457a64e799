"""A small terminal progress bar: done/total, rate-derived ETA and a few live figures.

On a terminal it redraws one line on stderr; otherwise (logs, CI) it prints a line at most every
10% of the work. ``enabled=False`` (``progress=false``) prints nothing.
"""

from __future__ import annotations

import sys
import time


def _fmt_time(s: float) -> str:
    if s != s or s == float("inf"):
        return "--:--"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


class Progress:
    def __init__(self, total: int, desc: str, unit: str = "it", enabled: bool = True, stream=None):
        self.total = max(int(total), 1)
        self.desc = desc
        self.unit = unit
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.fields: dict[str, str] = {}
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self._last_pct_printed = -1

    def set(self, **fields):
        for k, v in fields.items():
            self.fields[k] = f"{v:.3g}" if isinstance(v, float) else str(v)

    def update(self, n: int = 1, **fields):
        self.done = min(self.done + n, self.total)
        self.set(**fields)
        self._draw()

    def _line(self) -> str:
        el = time.monotonic() - self.t0
        rate = self.done / el if el > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        frac = self.done / self.total
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        extra = "  ".join(f"{k} {v}" for k, v in self.fields.items())
        return (f"{self.desc} [{bar}] {self.done}/{self.total} {self.unit} {100 * frac:5.1f}%  "
                f"{extra}  elapsed {_fmt_time(el)}  ETA {_fmt_time(eta)}")

    def _draw(self, final: bool = False):
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            if final or now - self._last_draw > 0.1:
                self.stream.write("\r\033[K" + self._line())
                self.stream.flush()
                self._last_draw = now
        else:
            pct = int(10 * self.done / self.total)
            if final or pct > self._last_pct_printed:
                self._last_pct_printed = pct
                self.stream.write(self._line() + "\n")
                self.stream.flush()

    def close(self):
        if self.enabled:
            if self.tty:
                self._draw(final=True)
                self.stream.write("\n")
            elif self.done < self.total or self._last_pct_printed < 10:
                self._draw(final=True)
            self.stream.flush()
