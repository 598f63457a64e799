#!/usr/bin/env python3
"""make gpu-check: everything pgmflow runs on a GPU, checked in one go on a GPU machine (< 10 minutes).

Run on the GPU machine from the repository root, with the wheelhouse of ``make gpu-wheelhouse``
in ``.whl/`` beside it: ``python3 .ci/gpu_check.py`` (standard library only, so the image's own
Python runs it). Without a GPU it stops at once with one line saying so (exit 1). The steps:

1. the GPU: ``nvidia-smi`` (device, driver, memory);
2. a venv that sees the image's numpy, scipy, numba and CuPy (``python3 -m venv
   --system-site-packages``), and pgmflow with the rest of its dependencies installed into it
   from ``.whl/`` with ``--no-index`` (no network needed);
3. what CuPy finds (``pgmflow.tasks.backend.gpu_info``: device, CUDA runtime and driver, CuPy, NVRTC);
4. ``pytest -m gpu``: every GPU kernel against its CPU twin (bit for bit where the design promises
   it: tempering's Philox kernel with integer thresholds; to tolerances elsewhere);
5. every pipeline once in debug size on the GPU: ``pgmflow pipeline=X debug=default backend=cupy``
   for X in tempering, svi, tesla, bounds, sparse_gp; and tempering on a 16-node pairwise MRF
   (``model=mrf``, exact log Z known);
6. the benchmarks on the GPU, in quick sizes: ``benchmarks/tempering.py --quick`` (flips/ns of the
   CUDA kernel) and ``--gpu-only`` (4, 16 and 64 lattices of 1024x1024),
   ``benchmarks/tempering_mrf_gpu.py`` (the MRF CUDA kernels against the NumPy peer and the
   numba kernel, same bits), ``benchmarks/sparse_gp.py --quick --backend cupy`` (seconds per SGPR
   bound and gradient against GPyTorch), ``benchmarks/svi_lda.py --quick --backend cupy`` (documents/s).

It writes one report, ``benchmarks/results/gpu-<device>.md``: the device, driver, CUDA and CuPy
versions and every step's result (the logs of failed steps in full). Exit status 0 when every
step passed. Each step has a time limit and the whole run a budget (``--budget``, 570 s).

``--cpu-rehearsal`` runs the same steps on a machine without a GPU (``backend=numpy``, the GPU
tests skip) to test this script itself; its report goes to ``.gpu-check/`` and is no GPU result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PIPELINES = ("tempering", "svi", "tesla", "bounds", "sparse_gp")
WORK = REPO / ".gpu-check"  # git-ignored: the venv, logs, MLflow stores


class Step:
    def __init__(self, name: str, command: str):
        self.name, self.command = name, command
        self.status = "not run"  # passed | FAILED | timed out | skipped | not run
        self.seconds = 0.0
        self.summary = ""
        self.log = ""


def run(cmd, *, timeout: float, cwd=None, env=None, input_text=None):
    """(exit status or None on timeout, output, seconds)."""
    t0 = time.monotonic()
    try:
        res = subprocess.run(
            cmd, cwd=cwd, env=env, input=input_text, capture_output=True, text=True, timeout=max(1.0, timeout)
        )
        return res.returncode, res.stdout + res.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return None, out, time.monotonic() - t0
    except OSError as exc:
        return 127, f"{type(exc).__name__}: {exc}", time.monotonic() - t0


def nvidia_smi() -> tuple[list[dict], str | None]:
    """The GPUs nvidia-smi lists, or why there are none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi not found"
    rc, out, _ = run(
        [exe, "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"], timeout=30
    )
    if rc != 0:
        return [], f"nvidia-smi failed: {out.strip().splitlines()[-1] if out.strip() else rc}"
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append(
                {
                    "name": parts[0],
                    "driver": parts[1],
                    "memory": parts[2],
                    "compute_cap": parts[3] if len(parts) > 3 else "?",
                }
            )
    return gpus, None if gpus else "nvidia-smi lists no GPU"


def find_gpus() -> tuple[list[dict], str | None]:
    """nvidia-smi's GPUs; where it is missing but a device node exists, what the image's CuPy sees."""
    gpus, why = nvidia_smi()
    if gpus or not list(Path("/dev").glob("nvidia[0-9]*")):
        return gpus, why
    probe = (
        "import cupy as cp; n = cp.cuda.runtime.getDeviceCount(); p = cp.cuda.runtime.getDeviceProperties(0); "
        "print(n, p['name'].decode() if isinstance(p['name'], bytes) else p['name'])"
    )
    rc, out, _ = run([sys.executable, "-c", probe], timeout=90)
    if rc == 0 and out.strip() and out.split()[0].isdigit() and int(out.split()[0]) > 0:
        name = out.strip().splitlines()[-1].split(" ", 1)[1]
        return [{"name": name, "driver": "?", "memory": "?", "compute_cap": "?"}], None
    return [], f"{why}; /dev/nvidia* exists but CuPy sees no device: {tail(out, 1)}"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def tail(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " / ".join(lines[-n:])


def no_pandas(probe_out: str) -> str:
    """A warning for the gpu-info step's summary when the venv lacks pandas: the wheelhouse leaves it to the image
    (too large for .whl/), and mlflow.pyfunc, which logs the svi and sparse_gp runs' models, imports it."""
    try:
        versions = json.loads(probe_out.strip().splitlines()[-1]).get("versions", {})
    except (ValueError, IndexError):
        return ""
    if "pandas" in versions:
        return ""
    return (
        "; NO PANDAS in the image: the svi and sparse_gp pipelines will fail when they log their models (mlflow.pyfunc)"
    )


def junit_cases(path: Path) -> list[dict]:
    if not path.exists():
        return []
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[tag]
                message = (el.get("message") or "").splitlines()[0][:200] if el.get("message") else ""
                break
        cases.append(
            {
                "id": f"{tc.get('classname', '')}::{tc.get('name', '')}",
                "outcome": outcome,
                "seconds": float(tc.get("time") or 0),
                "message": message,
            }
        )
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheelhouse", type=Path, default=REPO / ".whl")
    ap.add_argument("--budget", type=float, default=570.0, help="seconds for the whole check")
    ap.add_argument("--out", type=Path, default=None, help="the report (default benchmarks/results/gpu-<device>.md)")
    ap.add_argument(
        "--cpu-rehearsal",
        action="store_true",
        help="run the steps without a GPU (backend=numpy) to test this script; not a GPU result",
    )
    a = ap.parse_args()
    t_start = time.monotonic()

    # 1. the GPU, or one line and out
    gpus, why = find_gpus()
    if not gpus and not a.cpu_rehearsal:
        print(f"gpu-check: no CUDA GPU on this machine ({why}); run make gpu-check on a GPU machine (docs/gpu.md)")
        return 1
    rehearsal = a.cpu_rehearsal
    backend = "numpy" if rehearsal else "cupy"
    wheels = a.wheelhouse.resolve()
    reqs = wheels / "requirements.txt"
    own = sorted(wheels.glob("pgmflow-*.whl"))
    if not reqs.exists() or not own:
        print(
            f"gpu-check: no wheelhouse in {wheels} (requirements.txt and pgmflow-*.whl); run make gpu-wheelhouse "
            "on a CPU machine with PyPI access and bring .whl/ along"
        )
        return 1

    def left(limit: float) -> float:
        return max(5.0, min(limit, a.budget - (time.monotonic() - t_start)))

    WORK.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=WORK))
    venv = WORK / "venv"
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PGMFLOW_DISABLE_GPU", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(MPLBACKEND="Agg", PYTHONUNBUFFERED="1", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    steps: list[Step] = []

    def step(name, cmd, limit, cwd=None, ok=lambda rc, out: rc == 0, summarize=tail, display=None):
        s = Step(name, display or " ".join(short(c) for c in cmd))
        steps.append(s)
        remaining = a.budget - (time.monotonic() - t_start)
        if remaining < 10:
            s.status, s.summary = "skipped", "no time left in the budget"
            print(f"gpu-check: {name}: skipped (budget spent)", flush=True)
            return s, ""
        print(f"gpu-check: {name} ...", flush=True)
        rc, out, secs = run([str(c) for c in cmd], timeout=left(limit), cwd=cwd or REPO, env=env)
        s.seconds, s.log = secs, out
        s.status = "timed out" if rc is None else ("passed" if ok(rc, out) else "FAILED")
        s.summary = summarize(out) if rc is not None else f"timed out after {secs:.0f} s; " + tail(out, 2)
        print(f"gpu-check: {name}: {s.status} in {secs:.1f} s -- {s.summary[:300]}", flush=True)
        return s, out

    # 2. the venv, from the wheelhouse only
    if venv.exists():
        shutil.rmtree(venv)
    s_venv, _ = step(
        "venv",
        [sys.executable, "-m", "venv", "--system-site-packages", venv],
        60,
        summarize=lambda out: (
            f"{venv.relative_to(REPO)} on {sys.executable} (Python "
            f"{platform.python_version()}), system site-packages visible"
        ),
    )
    if s_venv.status != "passed":  # no ensurepip in the image: the venv uses the image's own pip
        steps.remove(s_venv)
        shutil.rmtree(venv, ignore_errors=True)
        step(
            "venv",
            [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
            60,
            summarize=lambda out: (
                f"{venv.relative_to(REPO)} on {sys.executable} (Python {platform.python_version()})"
                ", system site-packages visible; no ensurepip: the image's pip installs into it"
            ),
        )
    if sys.prefix != sys.base_prefix and venv.exists():
        # The image's python3 is itself a venv (/opt/torch/.venv): --system-site-packages shows the base
        # interpreter's site-packages, not that venv's numpy/scipy/numba/CuPy. A .pth file adds them.
        import sysconfig

        site = Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["platlib"])
        inner = next(venv.glob("lib/python*/site-packages"))
        (inner / "zz-image-site.pth").write_text("".join(f"{d}\n" for d in dict.fromkeys(site)))
    pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index"]  # the wheelhouse only
    step(
        "install",
        [*pip, "--find-links", wheels, "-r", reqs],
        180,
        summarize=lambda out: (
            f"{sum(1 for ln in reqs.read_text().splitlines() if '==' in ln)} packages from "
            f"{wheels.name}/ (--no-index)" + (f"; {tail(out, 1)}" if out.strip() else "")
        ),
    )
    stale = wheel_differences(own[-1])
    if not stale:
        step(
            "install pgmflow",
            [*pip, "--no-deps", "--force-reinstall", own[-1]],
            60,
            summarize=lambda out: f"{own[-1].name} (the same files as the checkout)",
        )
    else:  # a wheelhouse older than the checkout: build and install the checkout itself, not old code
        step(
            "install pgmflow",
            [*pip, "--no-deps", "--no-build-isolation", "--force-reinstall", REPO],
            120,
            summarize=lambda out: (
                f"the checkout itself, built here: {own[-1].name} differs from it in {len(stale)} file(s), e.g. "
                f"{', '.join(stale[:3])} (make gpu-wheelhouse rebuilds it)"
            ),
            display="python -m pip install --no-index --no-deps --no-build-isolation .",
        )

    # 3. what CuPy finds, and the versions that matter
    probe = (
        "import json, platform, importlib.metadata as md\n"
        "from pgmflow.tasks.backend import gpu_info, describe_gpu\n"
        "info = gpu_info()\n"
        "v = {}\n"
        "for p in ('pgmflow', 'numpy', 'scipy', 'numba', 'cupy-cuda13x', 'cupy-cuda12x', 'dask', 'distributed',\n"
        "          'mlflow-skinny', 'hydra-core', 'pandas', 'torch', 'gpytorch', 'scikit-learn', 'pytest'):\n"
        "    try: v[p] = md.version(p)\n"
        "    except md.PackageNotFoundError: pass\n"
        "print(json.dumps({'gpu': info, 'line': describe_gpu(info), 'python': platform.python_version(), "
        "'versions': v}))\n"
    )
    s, out = step(
        "gpu info",
        [py, "-c", probe],
        60,
        cwd=work,
        ok=lambda rc, out: rc == 0 and (rehearsal or '"available": true' in out),
        summarize=lambda out: (
            (json.loads(out.strip().splitlines()[-1])["line"] + no_pandas(out))
            if out.strip().startswith("{")
            else tail(out)
        ),
        display="python -c 'pgmflow.tasks.backend.gpu_info()'",
    )
    try:
        facts = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        facts = {"gpu": {}, "line": "?", "python": "?", "versions": {}}

    # 4. the GPU tests
    gpu_files = sorted(
        str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if "mark.gpu" in p.read_text()
    )
    junit = work / "gpu-tests.xml"
    s_tests, _ = step(
        "pytest -m gpu",
        [py, "-m", "pytest", "-m", "gpu", "-q", "-rA", "-p", "no:cacheprovider", f"--junitxml={junit}", *gpu_files],
        360,
        ok=lambda rc, out: rc == 0 or (rehearsal and rc == 5),
        summarize=lambda out: tail(out, 1),
        display=f"python -m pytest -m gpu {' '.join(gpu_files)}",
    )
    cases = junit_cases(junit)
    if not rehearsal and s_tests.status == "passed" and (not cases or any(c["outcome"] == "skipped" for c in cases)):
        s_tests.status = "FAILED"
        s_tests.summary += " -- GPU tests were skipped on a GPU machine"

    # 5. every pipeline, debug size, on the GPU (the installed pgmflow, from a scratch directory)
    for name in PIPELINES:
        step(
            f"pipeline {name}",
            [
                venv / "bin" / "pgmflow",
                f"pipeline={name}",
                "debug=default",
                f"backend={backend}",
                "progress=false",
                f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
            ],
            90,
            cwd=work,
            summarize=key_line,
            display=f"pgmflow pipeline={name} debug=default backend={backend}",
        )

    # 5b. tempering on a pairwise MRF (model=mrf): a random 16-node graph, so the exact log Z is known and
    # the run's line reports the error in SEs; the spins live on the GPU
    mrf_npz = work / "mrf16.npz"
    make_mrf = (
        "import sys, numpy as np\n"
        "rng = np.random.default_rng(7); n = 16\n"
        "J = np.triu(rng.normal(0.0, 0.5, (n, n)) * (rng.random((n, n)) < 0.3), 1)\n"
        "np.savez(sys.argv[1], J=J + J.T, h=rng.normal(0.0, 0.3, n))\n"
    )
    s_mrf, _ = step("mrf model", [py, "-c", make_mrf, mrf_npz], 30, cwd=work, display="python -c <a 16-node MRF>")
    if s_mrf.status == "passed":
        steps.remove(s_mrf)
        step(
            "pipeline tempering model=mrf",
            [
                venv / "bin" / "pgmflow",
                "pipeline=tempering",
                "debug=default",
                "model=mrf",
                f"model.path={mrf_npz}",
                f"backend={backend}",
                "progress=false",
                f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
            ],
            120,
            cwd=work,
            summarize=key_line,
            display=f"pgmflow pipeline=tempering debug=default model=mrf model.path=<16 nodes> backend={backend}",
        )

    # 6. the benchmarks, quick sizes
    tjson = work / "tempering.json"
    s_temp, _ = step(
        "benchmark tempering",
        [py, "benchmarks/tempering.py", "--quick", "--out", tjson],
        120,
        summarize=lambda out: ([ln for ln in out.splitlines() if ln.startswith("GPU")] or [tail(out)])[-1],
    )
    flips = None
    if tjson.exists():
        gpu_row = json.loads(tjson.read_text()).get("gpu")
        if gpu_row:
            flips = gpu_row.get("flips_per_ns")
            s_temp.summary = f"{flips:.1f} flips/ns on the GPU ({gpu_row.get('lattice')}); " + s_temp.summary
        elif not rehearsal:
            s_temp.status, s_temp.summary = "FAILED", "no GPU figure: " + s_temp.summary
    if not rehearsal:
        step(
            "benchmark tempering, GPU sizes",
            [py, "benchmarks/tempering.py", "--gpu-only"],
            90,
            summarize=lambda out: (
                " / ".join(ln.split("CuPy kernels, ")[-1] for ln in out.splitlines() if ln.startswith("GPU ("))
                or tail(out)
            ),
        )
    mrf_md = work / "tempering_mrf_gpu.md"
    step(
        "benchmark tempering_mrf",
        [py, "benchmarks/tempering_mrf_gpu.py", "--out", mrf_md, *(["--quick", "--rehearse"] if rehearsal else [])],
        150,
        summarize=lambda out: (
            " / ".join(
                f"{ln.split('|')[1].strip()[:12]} R={ln.split('|')[3].strip()}: GPU/peer {ln.split('|')[12].strip()}"
                for ln in out.splitlines()
                if ln.startswith("| ") and ln.count("|") >= 15 and ln.split("|")[3].strip().isdigit()
            )
            or tail(out, 2)
        ),
    )
    gp_md = work / "sparse_gp.md"
    step(
        "benchmark sparse_gp",
        [py, "benchmarks/sparse_gp.py", "--quick", "--backend", backend, "--out", gp_md],
        150,
        summarize=lambda out: (
            " / ".join(ln for ln in out.splitlines() if ln.startswith(("pgmflow:", "GPyTorch:"))) or tail(out, 2)
        ),
    )
    svi_json = work / "svi_lda.json"
    s_svi, _ = step(
        "benchmark svi_lda",
        [
            py,
            "benchmarks/svi_lda.py",
            "--quick",
            "--repeats",
            "1",
            "--peers",
            "sklearn",
            "--backend",
            backend,
            "--out",
            svi_json,
        ],
        150,
        summarize=lambda out: tail(out, 1),
    )
    if svi_json.exists():
        rows = json.loads(svi_json.read_text()).get("rows", [])
        s_svi.summary = (
            "; ".join(
                f"{r['method']} {r['docs_per_second']:.0f} docs/s, perplexity {r['perplexity']:.1f}" for r in rows
            )
            or s_svi.summary
        )

    # the report
    g = facts.get("gpu", {})
    device = g.get("device") or (gpus[0]["name"] if gpus else "cpu-rehearsal")
    out_path = a.out or (
        WORK / "gpu-cpu-rehearsal.md" if rehearsal else REPO / "benchmarks" / "results" / f"gpu-{slug(device)}.md"
    )
    total = time.monotonic() - t_start
    failed = [s for s in steps if s.status != "passed"]
    v = facts.get("versions", {})
    if g.get("available"):
        dev_row = (
            f"{device} (compute capability {g.get('compute_capability', '?')}, {g.get('memory_gib', '?')} GiB, "
            f"{g.get('multiprocessors', '?')} SMs; {g.get('device_count', len(gpus))} device(s))"
        )
    else:
        dev_row = f"none usable: {g.get('reason') or why}"
    driver = g.get("driver") or (gpus[0]["driver"] if gpus else "none")
    lines = [
        f"# make gpu-check on {device}" + (" (CPU REHEARSAL: not a GPU result)" if rehearsal else ""),
        "",
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; commit {git_head()}; {len(steps) - len(failed)} of {len(steps)} "
        f"steps passed in {total:.0f} s (budget {a.budget:.0f} s); `python3 .ci/gpu_check.py"
        f"{' --cpu-rehearsal' if rehearsal else ''}`.",
        "",
        "| what | found |",
        "| --- | --- |",
        f"| device | {dev_row} |",
        f"| driver | {driver}" + (f" (supports CUDA {g['cuda_driver']})" if g.get("cuda_driver") else "") + " |",
        f"| CUDA runtime (CuPy's) | {g.get('cuda_runtime', '?')}; NVRTC {g.get('nvrtc', '?')} |",
        f"| CuPy | {g.get('cupy', '?')} |",
        f"| nvidia-smi | {'; '.join(', '.join(x.values()) for x in gpus) or why} |",
        f"| Python | {facts.get('python', '?')} ({sys.executable}) |",
        f"| packages | {', '.join(f'{k} {val}' for k, val in v.items())} |",
        f"| backend=auto reports | {facts.get('line', '?')} |",
        "",
        "## Steps",
        "",
        "| step | result | seconds | command | outcome |",
        "| --- | --- | ---: | --- | --- |",
    ]
    for s in steps:
        lines.append(f"| {s.name} | {s.status} | {s.seconds:.1f} | `{md_cell(s.command)}` | {md_cell(s.summary)} |")
    if flips is not None:
        lines += ["", f"Tempering: the CUDA kernel runs **{flips:.1f} flips/ns** (target >= 100)."]
    if cases:
        lines += [
            "",
            f"## GPU tests ({sum(c['outcome'] == 'passed' for c in cases)} passed of {len(cases)})",
            "",
            "| test | result | seconds | message |",
            "| --- | --- | ---: | --- |",
        ]
        lines += [f"| `{c['id']}` | {c['outcome']} | {c['seconds']:.2f} | {md_cell(c['message'])} |" for c in cases]
    if mrf_md.exists():
        lines += ["", "## benchmarks/tempering_mrf_gpu.py", "", *mrf_md.read_text().splitlines()]
    if gp_md.exists():
        lines += [
            "",
            "## benchmarks/sparse_gp.py --quick --backend " + backend,
            "",
            *demote(gp_md.read_text()).splitlines(),
        ]
    lines += ["", "## Logs", ""]
    for s in steps:
        if s.log.strip() and (s in failed or s.name.startswith(("pipeline", "benchmark", "pytest"))):
            keep = 200 if s in failed else 60
            lines += [
                f"<details><summary>{s.name} ({s.status}; last {keep} lines)</summary>",
                "",
                "```",
                *[ln.replace(str(REPO) + "/", "") for ln in s.log.strip().splitlines()[-keep:]],
                "```",
                "</details>",
                "",
            ]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("\n".join(lines) + "\n")
    try:
        shown = out_path.relative_to(REPO)
    except ValueError:
        shown = out_path
    print(f"gpu-check: {len(steps) - len(failed)} of {len(steps)} steps passed in {total:.0f} s; report: {shown}")
    return 0 if not failed else 1


# pyproject's package-dir mapping: a file's name in pgmflow's wheel -> its folder in the checkout (first match)
WHEEL_FOLDERS = (("pgmflow/tasks/", "tasks/"), ("pgmflow/conf/", "conf/"), ("pgmflow/", "pipelines/"))


def _source_of(name: str) -> str:
    """The checkout's file for a file in pgmflow's wheel."""
    for pre, folder in WHEEL_FOLDERS:
        if name.startswith(pre):
            return folder + name[len(pre) :]
    return name


def _wheel_name(rel: str) -> str:
    """The name in pgmflow's wheel of a checkout file (the inverse of :func:`_source_of`)."""
    for pre, folder in WHEEL_FOLDERS:
        if rel.startswith(folder):
            return pre + rel[len(folder) :]
    return rel


def wheel_differences(wheel: Path) -> list[str]:
    """The checkout's files that pgmflow's wheel lacks or holds otherwise (empty: the wheel is current)."""
    import zipfile  # noqa: PLC0415

    with zipfile.ZipFile(wheel) as z:
        inside = {n: z.read(n) for n in z.namelist() if not n.split("/")[0].endswith((".dist-info", ".data"))}
    diff = []
    for name, data in inside.items():
        src = REPO / _source_of(name)
        if not src.is_file() or src.read_bytes() != data:
            diff.append(str(src.relative_to(REPO)))
    for folder in ("pipelines", "tasks", "conf", "hydra_plugins"):
        for f in sorted((REPO / folder).rglob("*.py")) + sorted((REPO / folder).rglob("*.yaml")):
            rel = str(f.relative_to(REPO))
            if "__pycache__" not in rel and _wheel_name(rel) not in inside and rel not in diff:
                diff.append(rel)
    return diff


def short(arg) -> str:
    """A command-line argument as the report shows it: paths inside the repository made relative."""
    text = str(arg)
    return text.replace(str(REPO) + "/", "") if text.startswith(str(REPO)) else text


def key_line(out: str) -> str:
    """A pipeline's result: its last "pgmflow:" line before the one that says where the run went."""
    lines = [
        ln.strip()
        for ln in out.splitlines()
        if ln.strip().startswith("pgmflow:") and not ln.strip().startswith("pgmflow: finished.")
    ]
    done = [ln for ln in out.splitlines() if ln.strip().startswith("pgmflow: finished.")]
    run_id = re.search(r"MLflow run (\w+)", done[-1]).group(1) if done else None
    return (lines[-1][:300] if lines else tail(out)) + (f" (MLflow run {run_id})" if run_id else "")


def md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def demote(md: str) -> str:
    """A benchmark's own markdown inside the report: its headings one level down."""
    return re.sub(r"^(#+) ", r"#\1 ", md, flags=re.M)


def git_head() -> str:
    rc, out, _ = run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], timeout=10)
    return out.strip() if rc == 0 else "unknown (no git)"


if __name__ == "__main__":
    sys.exit(main())
