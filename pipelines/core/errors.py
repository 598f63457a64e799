"""One error format for bad input: the field, the value, what is wrong and the fix.

A :class:`ConfigError` is raised at the edge (preflight, cluster opening, data loading), before
any graph is built. The CLI prints ``pgmflow: error: <message>`` on one line and exits with
code 2; an MLflow run that was already started ends FAILED with the same message.
"""

from __future__ import annotations

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


class ConfigError(ValueError):
    """Bad input. ``str(err)`` is the one line shown to the user."""

    def __init__(self, field: str, value, problem: str, fix: str, line: str | None = None):
        self.field = field
        self.value = value
        self.problem = problem
        self.fix = fix
        self._line = line  # a line in another shape (an unknown key has no value to show)
        super().__init__(self.message)

    @property
    def message(self) -> str:
        if self._line is not None:
            return self._line
        v = _show(self.value)
        return f"{self.field}={v}: {self.problem}; fix: {self.fix}"


def _show(value) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    text = " ".join(text.split())
    if len(text) <= 80:
        return text
    if isinstance(value, str) and "/" in value:  # a path: its end (the file name) is what matters
        return "'..." + text[-76:]
    return text[:77] + "..."
