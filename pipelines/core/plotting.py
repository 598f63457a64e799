"""matplotlib for figures that are logged, never shown: the Agg backend, set once for every workload."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["close", "plt"]


def close(fig) -> None:
    plt.close(fig)
