"""The Flax modules under a jax.sharding.Mesh of two GPUs (data-parallel 2x1 and tensor-parallel
1x2) match one GPU (the native custom calls) in FP8: tests/jax/mesh_cases.py in a subprocess
per mesh. Needs two GPUs;
the same script runs on a 2x2 mesh of four CPU devices in tests/jax/test_sharding_mesh.py."""
import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "tests", "jax", "mesh_cases.py")


def _gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def _package_root() -> str:
    """Where this process imports transformer_engine from (the installed package with its
    native library, or the source tree when that is what the tests run), for the subprocess to
    import the same one."""
    spec = importlib.util.find_spec("transformer_engine")
    return os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else ROOT


@pytest.mark.parametrize("mesh", ["2x1", "1x2"])
def test_flax_modules_on_two_gpus_match_one_gpu_in_fp8(mesh):
    if _gpus() < 2:
        pytest.skip(f"needs 2 GPUs; {_gpus()} visible")
    env = dict(os.environ, PYTHONPATH=_package_root() + os.pathsep + os.environ.get("PYTHONPATH", ""),
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run([sys.executable, "-W", "ignore", SCRIPT, "--mesh", mesh], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "match one device" in proc.stdout
