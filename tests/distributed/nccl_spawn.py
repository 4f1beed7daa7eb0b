"""Running a test body in one process per GPU over NCCL: a free port for the rendezvous, and
spawn_nccl, which reports each failing rank's traceback (not only "process 1 terminated")."""
import os
import socket
import tempfile
import traceback

import pytest
import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, errfile: str, body):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        body(rank, world, dist.group.WORLD)
        dist.barrier()
    except BaseException:  # noqa: BLE001  (reported to the parent through the file)
        with open(f"{errfile}.{rank}", "w") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def spawn_nccl(body, world: int) -> None:
    """body(rank, world, group) in `world` processes, one per GPU; fails the test with the
    tracebacks of the ranks that raised. `body` must be picklable (a module-level function or a
    functools.partial of one)."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        errfile = os.path.join(tmp, "err")
        try:
            mp.start_processes(_worker, args=(world, free_port(), errfile, body), nprocs=world,
                               start_method="spawn")
        except Exception as exc:
            msgs = [f"rank {r}:\n" + open(f"{errfile}.{r}").read() for r in range(world)
                    if os.path.exists(f"{errfile}.{r}")]
            pytest.fail("\n".join(msgs) or str(exc))
