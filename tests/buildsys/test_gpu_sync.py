"""tests/gpu_sync.py: an asynchronous CUDA error pending after a test is reported against that
test, and the process stops (the worker under xdist, the run otherwise); nothing happens when
no error is pending or CUDA was never used."""
import os
import subprocess
import sys
from types import SimpleNamespace

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, TESTS)
from gpu_sync import pending_error, stop_on_error  # noqa: E402


def _torch(initialized=True, error=None):
    def synchronize():
        if error is not None:
            raise error
    return SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: initialized,
                                                synchronize=synchronize))


def test_no_error_without_cuda_or_when_the_sync_passes():
    assert pending_error(_torch(initialized=False, error=RuntimeError("x"))) is None
    assert pending_error(_torch()) is None


def test_pending_error_stops_the_worker_or_the_run(capsys):
    err = RuntimeError("CUDA error: an illegal memory access was encountered")
    calls = []
    stop_on_error("tests/a.py::test_b", _torch(error=err), True,
                  lambda: calls.append("worker"), lambda m: calls.append(("run", m)))
    assert calls == ["worker"]
    assert "after tests/a.py::test_b: CUDA error: an illegal memory access" in capsys.readouterr().err
    calls.clear()
    stop_on_error("tests/a.py::test_c", _torch(error=err), False,
                  lambda: calls.append("worker"), lambda m: calls.append(("run", m)))
    assert calls == [("run", "gpu_sync: an asynchronous CUDA error is pending after "
                             "tests/a.py::test_c: CUDA error: an illegal memory access was "
                             "encountered")]


def test_nothing_stops_without_an_error():
    calls = []
    stop_on_error("tests/a.py::test_d", _torch(), True, lambda: calls.append(1),
                  lambda m: calls.append(2))
    assert calls == []


def test_a_run_stops_at_the_test_that_left_an_error(tmp_path):
    # end to end through pytest's hook: the first test leaves a CUDA error pending (a stand-in
    # torch whose synchronize raises), the run stops there and names it; the second never runs
    (tmp_path / "test_two.py").write_text(
        "import sys\n"
        "from types import SimpleNamespace\n"
        "def _sync():\n"
        "    raise RuntimeError('CUDA error: an illegal memory access was encountered')\n"
        "def test_first():\n"
        "    sys.modules['torch'] = SimpleNamespace(cuda=SimpleNamespace(\n"
        "        is_initialized=lambda: True, synchronize=_sync))\n"
        "def test_second():\n"
        "    raise AssertionError('ran after the error')\n")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(TESTS))
    env.pop("PYTEST_XDIST_WORKER", None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "gpu_sync", str(tmp_path / "test_two.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    text = out.stdout + out.stderr
    assert out.returncode == 3, text
    assert "pending after test_two.py::test_first: CUDA error: an illegal memory access" in text
    assert "ran after the error" not in text and "1 passed" in text
