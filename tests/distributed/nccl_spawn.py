"""Running a test body in one process per GPU over NCCL: a free port for the rendezvous, and
spawn_nccl, which reports each failing rank's traceback (not only "process 1 terminated"),
or, for a rank that hangs, the stacks where its threads wait."""
import faulthandler
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


# a rank still running after this long is taken as hung: its threads' stacks are written to its
# report and the process exits, so that the test fails with where each rank waits
HANG_SECONDS = 150


def watch_for_hang(path: str) -> None:
    """Arms faulthandler to dump every thread's stack into `path` and exit after HANG_SECONDS
    (a collective that one rank never joins would otherwise wait forever)."""
    fh = open(path, "w")  # kept open until the process ends: faulthandler writes to it then
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True, file=fh)


def _worker(rank: int, world: int, port: int, errfile: str, body):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    watch_for_hang(f"{errfile}.{rank}")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        body(rank, world, dist.group.WORLD)
        dist.barrier()
    except BaseException:  # noqa: BLE001  (reported to the parent through the file)
        faulthandler.cancel_dump_traceback_later()
        with open(f"{errfile}.{rank}", "w") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


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
                    if os.path.exists(f"{errfile}.{r}") and os.path.getsize(f"{errfile}.{r}")]
            pytest.fail("\n".join(msgs) or str(exc))


def start_ranks(worker, args: tuple, world: int, report_prefix: str) -> None:
    """mp.start_processes(worker, (*args, report_prefix)) over `world` GPUs, for workers that
    call watch_for_hang(f"{report_prefix}.hang.{rank}") first; fails the test with each hung
    rank's stacks (or the spawn error) instead of waiting forever."""
    import torch.multiprocessing as mp
    try:
        mp.start_processes(worker, args=args + (report_prefix,), nprocs=world, start_method="spawn")
    except Exception as exc:
        hangs = [f"rank {r} (hung; its stacks):\n" + open(f"{report_prefix}.hang.{r}").read()
                 for r in range(world) if os.path.exists(f"{report_prefix}.hang.{r}")
                 and os.path.getsize(f"{report_prefix}.hang.{r}")]
        pytest.fail("\n".join(hangs) or str(exc))
