"""tests/gpu_spread.py: which GPU an xdist worker is given, and that importing the plugin in a
worker's environment masks the devices before anything else runs."""
import os
import subprocess
import sys

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, TESTS)
from gpu_spread import device_for_worker  # noqa: E402


def test_workers_round_robin_over_the_gpus():
    assert [device_for_worker(f"gw{k}", 3) for k in range(7)] == ["0", "1", "2", "0", "1", "2", "0"]


def test_nothing_masked_outside_a_worker_or_with_one_gpu():
    assert device_for_worker("", 4) is None
    assert device_for_worker("master", 4) is None
    assert device_for_worker("gw5", 1) is None
    assert device_for_worker("gw5", 0) is None


def test_import_in_a_worker_sets_cuda_visible_devices():
    env = dict(os.environ, PYTEST_XDIST_WORKER="gw5", TE_TEST_SPREAD_GPUS="2", PYTHONPATH=TESTS)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out = subprocess.run([sys.executable, "-c", "import os, gpu_spread; "
                          "print(os.environ['CUDA_VISIBLE_DEVICES'])"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
