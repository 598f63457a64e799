"""DESIGN.md's one rule between the layers: tasks/ is pure numerics. It never imports dask,
distributed, mlflow, hydra or omegaconf, and only tasks/backend.py imports numba or cupy."""

import ast
from pathlib import Path

TASKS = Path(__file__).resolve().parent.parent / "tasks"
FORBIDDEN = {"dask", "distributed", "mlflow", "hydra", "omegaconf"}
BACKEND_ONLY = {"numba", "cupy", "cupyx"}


def _imports(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module.split(".")[0]


def test_tasks_import_no_orchestration_code():
    files = sorted(TASKS.rglob("*.py"))
    assert len(files) >= 8
    bad = []
    for f in files:
        for line, mod in _imports(f):
            if mod in FORBIDDEN:
                bad.append(f"{f.relative_to(TASKS.parent)}:{line} imports {mod}")
            if mod in BACKEND_ONLY and f.name != "backend.py":
                bad.append(f"{f.relative_to(TASKS.parent)}:{line} imports {mod} (only tasks/backend.py may)")
    assert not bad, "\n".join(bad)


def test_importing_tasks_loads_neither_numba_nor_cupy():
    import subprocess
    import sys

    code = (
        "import sys, pgmflow.tasks.tempering.engine, pgmflow.tasks.tempering.ising_kernels, "
        "pgmflow.tasks.tempering.explorers, "
        "pgmflow.tasks.lda.regularization, pgmflow.tasks.lda.pr_kernels; "
        "print(sorted(m for m in ('numba', 'cupy', 'dask', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=TASKS.parent, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
