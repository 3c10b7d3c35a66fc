# SPDX-License-Identifier: Apache-2.0
"""TP2: one process per GPU (torch.multiprocessing), gloo for objects and NCCL for the stock
all-gather; gpu_suite.py says what is checked. Then a lost peer: PeerTimeout."""

import os

import pytest

from conftest import requires_torch, requires_two_gpus

pytestmark = [requires_torch, requires_two_gpus]


def _worker(rank, world, rendezvous, what):
    import torch
    import torch.distributed as dist

    import gpu_suite

    torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world)
    try:
        if what == "suite":
            report = gpu_suite.run_suite(rank, world, dist.group.WORLD, dist.group.WORLD)
            if rank == 0:
                for b, layer, counts in report:
                    print(f"tp 2 rank 0, b = {b}, layer {layer}: {counts}", flush=True)
        else:
            gpu_suite.run_timeout(rank, world, dist.group.WORLD)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("what", ["suite", "timeout"])
def test_tp2(tmp_path, what):
    import torch.multiprocessing as mp

    tests = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = tests + os.pathsep + os.environ.get("PYTHONPATH", "")
    mp.spawn(_worker, args=(2, str(tmp_path / "rendezvous"), what), nprocs=2, join=True)
