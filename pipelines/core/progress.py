"""A small terminal progress bar: done/total, rate-derived ETA and a few live figures.

On a terminal it redraws one line on stderr; in a Jupyter notebook it is an HTML bar that updates in
place (one display, updated through its display id); otherwise (logs, CI) it prints a line at most
every 10% of the work. ``enabled=False`` (``progress=false``) prints nothing.

The ETA counts only the work after the first completed unit: the first unit pays for compiling the
kernels (numba, CuPy), which would otherwise make the first rates, and so the first ETAs, absurd.
Until that first unit completes the bar says "compiling kernels" instead of an ETA.

Why not tqdm (``tqdm.auto``), checked with tqdm 4.70: (1) its rate counts the first unit, so a run whose
first task compiles for 0.5 s and whose 99 others take 1 ms each shows "ETA 00:49" after the first unit and
takes 0.1 s; (2) on a stream that is not a terminal (a SLURM log, CI) it writes ``\r``-separated redraws, 102
of them on one line for 100 units, where this bar writes a line per 10 %; (3) in a notebook ``tqdm.auto``
needs ipywidgets (not a pgmflow dependency) and falls back to the text bar without it, where this bar is a
plain HTML display that any Jupyter front end renders.
"""

from __future__ import annotations

import html
import sys
import time


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where the bar renders as HTML)."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _fmt_time(s: float) -> str:
    if s != s or s == float("inf"):
        return "--:--"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


class Progress:
    def __init__(
        self, total: int, desc: str, unit: str = "it", enabled: bool = True, stream=None, clock=time.monotonic
    ):
        self.total = max(int(total), 1)
        self.desc = desc
        self.unit = unit
        self.enabled = enabled
        self.notebook = enabled and stream is None and in_notebook()
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) and not self.notebook
        self._handle = None
        self.done = 0
        self.fields: dict[str, str] = {}
        self.clock = clock
        self.t0 = clock()
        self._first: tuple | None = None  # (time, done) when the first unit completed
        self._last_draw = 0.0
        self._last_pct_printed = -1
        if self.enabled and (self.tty or self.notebook):
            self._draw(final=True)  # "compiling kernels" while the first unit runs

    def set(self, **fields):
        for k, v in fields.items():
            self.fields[k] = f"{v:.3g}" if isinstance(v, float) else str(v)

    def update(self, n: int = 1, **fields):
        self.done = min(self.done + n, self.total)
        if self._first is None and self.done > 0:
            self._first = (self.clock(), self.done)
        self.set(**fields)
        self._draw()

    def eta(self) -> float | None:
        """Seconds left, from the rate since the first completed unit; None before that unit
        completes (compiling), inf while no rate is known yet."""
        if self.done >= self.total:
            return 0.0
        if self._first is None:
            return None
        t1, d1 = self._first
        dt, dn = self.clock() - t1, self.done - d1
        return (self.total - self.done) * dt / dn if dt > 0 and dn > 0 else float("inf")

    def _line(self) -> str:
        el = self.clock() - self.t0
        eta = self.eta()
        frac = self.done / self.total
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        extra = "  ".join(f"{k} {v}" for k, v in self.fields.items())
        return (
            f"{self.desc} [{bar}] {self.done}/{self.total} {self.unit} {100 * frac:5.1f}%  "
            f"{extra}  elapsed {_fmt_time(el)}  " + ("compiling kernels" if eta is None else f"ETA {_fmt_time(eta)}")
        )

    def _html(self) -> str:
        """The notebook's bar: an HTML <progress> element and the same figures as the terminal line."""
        el = self.clock() - self.t0
        eta = self.eta()
        extra = " &nbsp; ".join(f"{html.escape(k)} <b>{html.escape(v)}</b>" for k, v in self.fields.items())
        when = "compiling kernels" if eta is None else f"ETA {_fmt_time(eta)}"
        return (
            f"<div style='font-family: monospace'>{html.escape(self.desc)} "
            f"<progress value='{self.done}' max='{self.total}' style='width: 18em'></progress> "
            f"{self.done}/{self.total} {html.escape(self.unit)} ({100 * self.done / self.total:.1f}%) &nbsp; "
            f"{extra} &nbsp; elapsed {_fmt_time(el)} &nbsp; {when}</div>"
        )

    def _draw_notebook(self, now: float, final: bool):
        if not (final or now - self._last_draw > 0.1):
            return
        from IPython.display import display

        bundle = {"text/plain": self._line(), "text/html": self._html()}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)
        self._last_draw = now

    def _draw(self, final: bool = False):
        if not self.enabled:
            return
        now = self.clock()
        if self.notebook:
            self._draw_notebook(now, final)
        elif self.tty:
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
            if self.notebook:
                self._draw(final=True)
            elif self.tty:
                self._draw(final=True)
                self.stream.write("\n")
            elif self.done < self.total or self._last_pct_printed < 10:
                self._draw(final=True)
            self.stream.flush()
