"""FSDP2 over NCCL, one process per GPU: the cases of fsdp_cases.py (FP32 weights, and
quantized_model_init FP8 weights all-gathered as FP8) train like the unsharded model for 20 steps
and round-trip through torch.distributed.checkpoint. Needs two GPUs; the same cases run in a
two-process gloo group on the CPU in tests/pytorch/test_fsdp.py."""
import os
import socket
import sys
import tempfile
import traceback

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsdp_cases  # noqa: E402

WORLD, STEPS = 2, 20
PRECISIONS = ("fp32", "fp8")


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _worker(rank: int, port: int, precision: str, errfile: str):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=torch.device("cuda", rank))
    try:
        fsdp_cases.run_fsdp_case(rank, WORLD, dist.group.WORLD, "cuda", precision, STEPS)
        dist.barrier()
    except BaseException:  # noqa: BLE001  (reported to the parent through the file)
        with open(f"{errfile}.{rank}", "w") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_fsdp2_matches_unsharded_and_checkpoints_nccl(precision):
    if _gpus() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs with the native backend; {_gpus()} visible")
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        errfile = os.path.join(tmp, "err")
        try:
            mp.start_processes(_worker, args=(port, precision, errfile), nprocs=WORLD,
                               start_method="spawn")
        except Exception as exc:  # show the ranks' tracebacks, not only "process 1 terminated"
            msgs = [f"rank {r}:\n" + open(f"{errfile}.{r}").read() for r in range(WORLD)
                    if os.path.exists(f"{errfile}.{r}")]
            pytest.fail("\n".join(msgs) or str(exc))
