"""Backend detection at install time: an explicit CUDA_HOME is obeyed, a toolchain that cannot
build or run gives the reference backend with a warning that says why, and a build directory
configured for another toolchain is started afresh."""
import json
import os
import stat

import pytest

from build_tools import backend, native_build


def _fake_tool(home, name):
    path = os.path.join(home, "bin", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\nexit 1\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


def _env(tmp_path, **kw):
    env = {"PATH": str(tmp_path / "empty-path")}
    env.update(kw)
    return env


def test_explicit_cuda_home_is_obeyed(tmp_path):
    plan = backend.plan_build(_env(tmp_path, CUDA_HOME=str(tmp_path / "nowhere"), NVTE_FRAMEWORK="none"))
    assert plan.backend == "none"
    assert any("CUDA_HOME=" in w and "has no bin/nvcc" in w for w in plan.warnings), plan.warnings
    nvcc = _fake_tool(str(tmp_path / "cuda"), "nvcc")
    plan = backend.plan_build(_env(tmp_path, CUDA_HOME=str(tmp_path / "cuda"), NVTE_BACKEND="cuda",
                                   NVTE_FRAMEWORK="none"))
    assert plan.backend == "cuda" and plan.compiler == nvcc and plan.home == str(tmp_path / "cuda")


def test_nvcc_without_gpu_libraries_builds_reference_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(backend, "cublas_search_dirs", lambda home: [home])
    _fake_tool(str(tmp_path / "cuda"), "nvcc")
    plan = backend.plan_build(_env(tmp_path, CUDA_HOME=str(tmp_path / "cuda"), NVTE_FRAMEWORK="none"))
    assert plan.backend == "none" and "cuBLASLt" in plan.reason
    assert "WARNING" in plan.describe() and "NVTE_BACKEND=cuda" in plan.describe()
    assert plan.summary()["warnings"] == list(plan.warnings)
    # with the library present but no driver, the reason names the driver
    os.makedirs(tmp_path / "cuda" / "lib")
    (tmp_path / "cuda" / "lib" / "libcublasLt.so.13").write_text("")
    monkeypatch.setattr(backend, "_cuda_driver_present", lambda: False)
    plan = backend.plan_build(_env(tmp_path, CUDA_HOME=str(tmp_path / "cuda"), NVTE_FRAMEWORK="none"))
    assert plan.backend == "none" and "CUDA driver" in plan.reason
    # and with a driver, an nvcc that cannot compile is reported as such
    monkeypatch.setattr(backend, "_cuda_driver_present", lambda: True)
    plan = backend.plan_build(_env(tmp_path, CUDA_HOME=str(tmp_path / "cuda"), NVTE_FRAMEWORK="none"))
    assert plan.backend == "none" and "cannot compile" in plan.reason


def test_nothing_found_and_forced_none(tmp_path):
    plan = backend.plan_build(_env(tmp_path, NVTE_FRAMEWORK="none", ROCM_PATH=str(tmp_path / "r"),
                                   CUDA_HOME=str(tmp_path / "c")))
    assert plan.backend == "none" and len(plan.warnings) == 3  # no nvcc, no hipcc, what was built
    plan = backend.plan_build(_env(tmp_path, NVTE_BACKEND="none", NVTE_FRAMEWORK="none"))
    assert plan.backend == "none" and plan.reason == "NVTE_BACKEND=none" and not plan.warnings
    with pytest.raises(ValueError, match="NVTE_BACKEND='metal'"):
        backend.plan_build(_env(tmp_path, NVTE_BACKEND="metal"))
    with pytest.raises(RuntimeError, match="NVTE_BACKEND=cuda but nvcc was not found"):
        backend.plan_build(_env(tmp_path, NVTE_BACKEND="cuda", CUDA_HOME=str(tmp_path / "x"),
                                NVTE_FRAMEWORK="none"))


def test_foreign_build_directory_is_started_afresh(tmp_path):
    d = tmp_path / "native"
    d.mkdir()
    (d / "CMakeCache.txt").write_text("CMAKE_MAKE_PROGRAM:FILEPATH=/tmp/pip-build-env-gone/bin/ninja\n")
    key = {"cmake": "/usr/bin/cmake", "args": ["-GNinja"]}
    native_build._reset_if_foreign(str(d), key)  # no key file: made by someone else
    assert sorted(os.listdir(d)) == ["build_key.json"]
    (d / "objects").mkdir()
    native_build._reset_if_foreign(str(d), key)  # same key: kept
    assert (d / "objects").exists()
    native_build._reset_if_foreign(str(d), {**key, "args": ["-GNinja", "-DNVTE_CUDA_ARCHS=90a"]})
    assert not (d / "objects").exists()
    assert json.loads((d / "build_key.json").read_text())["args"][-1] == "-DNVTE_CUDA_ARCHS=90a"


def test_working_toolchain_gives_cuda(tmp_path, monkeypatch):
    """nvcc that compiles, cuBLASLt and a driver: the CUDA backend, the reason naming all three."""
    monkeypatch.setattr(backend, "cublas_search_dirs", lambda home: [home])
    monkeypatch.setattr(backend, "_cuda_driver_present", lambda: True)
    monkeypatch.setattr(backend, "_nvcc_compiles", lambda nvcc, arch: (True, ""))
    nvcc = _fake_tool(str(tmp_path / "cuda"), "nvcc")
    os.makedirs(tmp_path / "cuda" / "lib")
    (tmp_path / "cuda" / "lib" / "libcublasLt.so.13").write_text("")
    plan = backend.plan_build(_env(tmp_path, CUDA_HOME=str(tmp_path / "cuda"), NVTE_FRAMEWORK="none"))
    assert (plan.backend, plan.compiler, plan.warnings) == ("cuda", nvcc, ())
    assert "compiles" in plan.reason and "cuBLASLt" in plan.reason and "driver" in plan.reason


@pytest.mark.skipif(not os.path.exists("/usr/local/cuda/bin/nvcc"), reason="no CUDA toolkit at /usr/local/cuda")
def test_real_nvcc_compiles_the_probe():
    ok, why = backend._nvcc_compiles("/usr/local/cuda/bin/nvcc", "90a")
    assert ok, why
    ok, why = backend._nvcc_compiles("/usr/local/cuda/bin/nvcc", "1")  # no such arch
    assert not ok and isinstance(why, str) and why
