"""tp = 1 on one GPU (gpu_suite.py says what is checked)."""

import pytest

from conftest import requires_gpu, requires_torch

pytestmark = [requires_torch, requires_gpu]


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_tp1_eager_graph_compile(group):
    import gpu_suite

    report = gpu_suite.run_suite(0, 1, group)
    for b, layer, counts in report:
        print(f"tp 1, b = {b}, layer {layer}: {counts}")


def test_adopted_communicator(group):
    """A second Pooler on the first one's NCCL communicator (pooler_comm_adopt)."""
    import ctypes

    import torch

    import gpu_suite
    import pooler

    device = torch.device("cuda", 0)
    layers = gpu_suite.make_layers(0, 1, device)
    with pooler.Pooler(group, tp=1, rank=0, device=device, layers=layers, batches=(8,)) as owner:
        nccl = ctypes.c_void_p()
        pooler._library.call("pooler_comm_nccl", owner._comm, ctypes.byref(nccl))
        with pooler.Pooler(group, tp=1, rank=0, device=device, layers=layers, batches=(8,),
                           nccl_comm=nccl.value) as adopted:
            adopted.warm_up()
            x = gpu_suite.fresh_x(8, device, torch.Generator(device=device))
            got = gpu_suite.snapshot(adopted.run(1, x))
            owner.warm_up()
            assert gpu_suite.same_bits(got, gpu_suite.snapshot(owner.run(1, x)))


def test_nccl_transport_matches_lamport(group):
    """transport="nccl" (an all-gather, then the gathered consumer) gives the mailbox's bits, eager and in a graph."""
    import torch

    import gpu_suite
    import pooler

    device = torch.device("cuda", 0)
    layers = gpu_suite.make_layers(0, 1, device)
    with pooler.Pooler(group, tp=1, rank=0, device=device, layers=layers, batches=(1, 8)) as lamport, \
            pooler.Pooler(group, tp=1, rank=0, device=device, layers=layers, batches=(1, 8),
                          transport="nccl") as nccl:
        assert lamport.transport == "lamport" and nccl.transport == "nccl"
        lamport.warm_up()
        nccl.warm_up()
        generator = torch.Generator(device=device)
        generator.manual_seed(99)
        for b in (1, 8):
            x = gpu_suite.fresh_x(b, device, generator)
            for layer in range(gpu_suite.LAYERS):
                expected = gpu_suite.snapshot(lamport.run(layer, x))
                assert gpu_suite.same_bits(gpu_suite.snapshot(nccl.run(layer, x)), expected), (b, layer)
        x = gpu_suite.fresh_x(8, device, generator)
        expected = [gpu_suite.snapshot(lamport.run(layer, x)) for layer in range(gpu_suite.LAYERS)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            copies = [gpu_suite.snapshot(nccl.run(layer, x)) for layer in range(gpu_suite.LAYERS)]
        graph.replay()
        torch.cuda.synchronize()
        for layer in range(gpu_suite.LAYERS):
            assert gpu_suite.same_bits(copies[layer], expected[layer]), layer
        nccl.check()
