"""tasks/backend.py: what gpu_info / gpu_status report, without a GPU and with a stand-in for CuPy."""

from __future__ import annotations

import types

import pytest

from pgmflow.tasks import backend


def test_without_cupy_or_device_the_reason_is_given(monkeypatch):
    monkeypatch.delenv("PGMFLOW_DISABLE_GPU", raising=False)
    info = backend.gpu_info()
    ok, line = backend.gpu_status()
    assert ok == info["available"]
    if not ok:
        assert info["reason"] and line == info["reason"]
        assert backend.resolve_backend("auto") == "numpy"


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("PGMFLOW_DISABLE_GPU", "1")
    assert backend.gpu_status() == (False, "GPU disabled by PGMFLOW_DISABLE_GPU")


def _fake_cupy(n_devices=2, fail_count=None):
    def count():
        if fail_count:
            raise fail_count
        return n_devices

    runtime = types.SimpleNamespace(
        runtimeGetVersion=lambda: 13000,
        driverGetVersion=lambda: 13000,
        getDeviceCount=count,
        getDeviceProperties=lambda i: {
            "name": b"NVIDIA H100 80GB HBM3",
            "major": 9,
            "minor": 0,
            "totalGlobalMem": 85_045_379_072,
            "multiProcessorCount": 132,
        },
    )
    nvrtc = types.SimpleNamespace(getVersion=lambda: (13, 0))
    return types.SimpleNamespace(__version__="13.6.0", cuda=types.SimpleNamespace(runtime=runtime, nvrtc=nvrtc))


def test_device_runtime_driver_and_cupy_are_reported(monkeypatch):
    monkeypatch.delenv("PGMFLOW_DISABLE_GPU", raising=False)
    monkeypatch.setattr(backend, "cupy", lambda: _fake_cupy())
    monkeypatch.setattr(backend, "_kernel_driver_version", lambda: "580.65.06")
    info = backend.gpu_info()
    assert info == {
        "available": True,
        "reason": None,
        "cupy": "13.6.0",
        "cuda_runtime": "13.0",
        "cuda_driver": "13.0",
        "nvrtc": "13.0",
        "driver": "580.65.06",
        "device_count": 2,
        "device": "NVIDIA H100 80GB HBM3",
        "compute_capability": "9.0",
        "memory_gib": 79.2,
        "multiprocessors": 132,
    }
    ok, line = backend.gpu_status()
    assert ok
    assert line == (
        "NVIDIA H100 80GB HBM3 (sm_90, 79.2 GiB, 1 of 2 devices; CUDA runtime 13.0, "
        "driver 580.65.06 (CUDA 13.0), CuPy 13.6.0)"
    )
    assert backend.resolve_backend("auto") == "cupy"


def test_cupy_without_a_driver_still_reports_its_versions(monkeypatch):
    monkeypatch.delenv("PGMFLOW_DISABLE_GPU", raising=False)
    monkeypatch.setattr(backend, "cupy", lambda: _fake_cupy(fail_count=RuntimeError("cudaErrorInsufficientDriver")))
    monkeypatch.setattr(backend, "_kernel_driver_version", lambda: None)
    info = backend.gpu_info()
    assert not info["available"] and info["cuda_runtime"] == "13.0" and "driver" not in info
    assert backend.gpu_status() == (False, "cupy sees no CUDA device (RuntimeError: cudaErrorInsufficientDriver)")
    assert backend.resolve_backend("auto") == "numpy"


@pytest.mark.parametrize("v, s", [(13000, "13.0"), (12080, "12.8"), (12090, "12.9"), (11080, "11.8")])
def test_cuda_version_numbers(v, s):
    assert backend._version(v) == s
