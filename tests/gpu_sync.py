"""pytest plugin for GPU runs (``-p gpu_sync``, with ``tests/`` on the path; .ci/gpu_verify.sh
loads it): the GPU is synchronised after each test, so that an asynchronous CUDA error (an
illegal address, a device-side assertion) is reported against the test that launched the
kernel, not against whichever later test first synchronises. Such an error ends the process's
CUDA context and every later test of the process would fail on it, so the process stops: an
xdist worker exits (xdist reports the test as crashed and goes on in a new worker), a run
without xdist ends with the message."""
import os
import sys


def pending_error(torch_module):
    """The asynchronous CUDA error pending in this process, or None (none, or CUDA unused)."""
    cuda = torch_module.cuda
    if not cuda.is_initialized():
        return None
    try:
        cuda.synchronize()
    except Exception as err:  # torch raises AcceleratorError (RuntimeError before 2.8)
        return err
    return None


def stop_on_error(nodeid: str, torch_module, in_worker: bool, exit_worker, exit_run) -> None:
    """After test nodeid: when a CUDA error is pending, reports it against the test and stops
    the process (exit_worker() in an xdist worker, else exit_run(message))."""
    err = pending_error(torch_module)
    if err is None:
        return
    message = f"gpu_sync: an asynchronous CUDA error is pending after {nodeid}: {err}"
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    if in_worker:
        exit_worker()
    else:
        exit_run(message)


def pytest_runtest_teardown(item, nextitem):
    torch = sys.modules.get("torch")
    if torch is None:
        return
    import pytest
    stop_on_error(item.nodeid, torch, bool(os.environ.get("PYTEST_XDIST_WORKER")),
                  lambda: os._exit(3), lambda message: pytest.exit(message, returncode=3))
