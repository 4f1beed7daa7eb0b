"""pytest plugin for pytest-xdist runs on a machine with several GPUs (``-n N -p gpu_spread``,
with ``tests/`` on the path; ``XDIST=N bash .ci/gpu_verify.sh`` does both): worker gwK sees one
GPU, number K mod TE_TEST_SPREAD_GPUS, so a single-GPU suite runs on every GPU at once.

xdist sets PYTEST_XDIST_WORKER before a worker loads its plugins, and this runs at import, before
any test module imports torch, so the device mask is in place before CUDA starts. Not for
tests/distributed, whose tests need every GPU in one process tree."""
import os


def device_for_worker(worker: str, gpus: int):
    """The CUDA_VISIBLE_DEVICES value for xdist worker `worker` ('gw3') over `gpus` GPUs, or None
    when nothing is to be masked (not a worker, or fewer than two GPUs)."""
    if not worker.startswith("gw") or not worker[2:].isdigit() or gpus < 2:
        return None
    return str(int(worker[2:]) % gpus)


_device = device_for_worker(os.environ.get("PYTEST_XDIST_WORKER", ""),
                            int(os.environ.get("TE_TEST_SPREAD_GPUS", "0") or 0))
if _device is not None:
    os.environ["CUDA_VISIBLE_DEVICES"] = _device
