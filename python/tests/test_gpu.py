# SPDX-License-Identifier: Apache-2.0
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


def test_pooler_layer_from_a_stock_module_matches_the_stock_path(group):
    """A model-file-like build: pooler_layer(moe, tp, rank) of stock-like modules, then the Pooler; its
    outputs against the stock path in plain torch (pooler.reference) of its own projected blocks."""
    import torch

    import gpu_suite
    import pooler
    from test_seed_api import stock_moe

    device = torch.device("cuda", 0)
    moes = [stock_moe(nvfp4=index not in (0, 3), seed=index, p=gpu_suite.P, h=gpu_suite.H).to(device)
            for index in range(4)]
    for moe in moes:
        with torch.no_grad():
            moe.pooler.weight.mul_(0.02)
    layers = [pooler.pooler_layer(moe, 1, 0) for moe in moes]
    assert [layer.global_scale is not None for layer in layers] == [False, True, True, False]
    generator = torch.Generator(device=device)
    generator.manual_seed(7)
    with pooler.Pooler(group, tp=1, rank=0, device=device, layers=layers, batches=(1, 8)) as p:
        p.warm_up()
        for b in (1, 8):
            x = gpu_suite.fresh_x(b, device, generator)
            for index in range(len(layers)):
                result = gpu_suite.snapshot(p.run(index, x))
                block = p.last_projection(b).clone()
                gpu_suite.check_against_stock(p, index, block, result, None)
                # The module's own product (FP64) against the Pooler's block: within 1 BF16 ulp, or 2^-20
                # of sum |x w| where it nearly cancels.
                w = moes[index].pooler.weight.detach().double()
                exact = x.double() @ w.t()
                bound = torch.maximum(exact.abs() * 2.0 ** -7, (x.double().abs() @ w.abs().t()) * 2.0 ** -20)
                assert int(((block.double() - exact).abs() > bound).sum()) == 0, (b, index)
        p.check()


def test_compile_pooler_gemm_alone(group):
    """The skinny GEMM without a Pooler: the Pooler's project() bits at its shape, fresh shapes within
    1 BF16 ulp of FP64, and a CUDA graph of it."""
    import torch

    import gpu_suite
    import pooler

    device = torch.device("cuda", 0)
    generator = torch.Generator(device=device)
    generator.manual_seed(11)
    layers = gpu_suite.make_layers(0, 1, device)
    with pooler.Pooler(group, tp=1, rank=0, device=device, layers=layers, batches=(8,)) as p:
        p.warm_up()
        x = gpu_suite.fresh_x(8, device, generator)
        want = p.project(1, x).clone()
        gemm = pooler.compile_pooler_gemm(8)
        c = torch.full_like(want, float("nan"))
        gemm(x, layers[1].weight, c, c, torch.cuda.current_stream())
        torch.cuda.synchronize()
        assert torch.equal(c.view(torch.int16), want.view(torch.int16))
    for rows, n, k in ((1, 1536, 2048), (4, 512, 8192), (16, 4096, 1024)):
        a = gpu_suite.fresh_x(rows, device, generator)[:, :k].contiguous()
        b = (torch.randn(n, k, generator=generator, device=device) * 0.02).to(torch.bfloat16)
        gemm = pooler.compile_pooler_gemm(rows, pooler.PoolerGemmShape.choose(rows, n, k), n=n, k=k, device=device)
        assert len(gemm.forms) == 1 and gemm.shape_for(n, k) == pooler.PoolerGemmShape.choose(rows, n, k)
        c = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device=device)
        gemm(a, b, None, c, None)
        exact = a.double() @ b.double().t()
        bound = torch.maximum(exact.abs() * 2.0 ** -7, (a.double().abs() @ b.double().abs().t()) * 2.0 ** -20)
        assert int(((c.double() - exact).abs() > bound).sum()) == 0, (rows, n, k)
        # Captured: the same bits on replay, with a fresh a.
        a_static = a.clone()
        c_static = torch.empty_like(c)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gemm(a_static, b, None, c_static, None)
        a_static.copy_(gpu_suite.fresh_x(rows, device, generator)[:, :k])
        graph.replay()
        gemm(a_static, b, None, c, None)
        torch.cuda.synchronize()
        assert torch.equal(c_static.view(torch.int16), c.view(torch.int16)), (rows, n, k)
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            with pytest.raises(pooler.PoolerError, match="nothing compiles during CUDA-graph capture"):
                gemm(a_static, b[:n // 2], None, c[:, :n // 2].contiguous(), None)
        gemm.close()


def test_consumers_alone_on_a_poolers_mailbox(group):
    """compile_gather and compile_norm_quant on a Pooler's mailbox after its project + publish: the bits
    of the Pooler's own gather (the edge layer's `rows`, an NVFP4 layer's packed and scales)."""
    import torch

    import gpu_suite
    import pooler

    device = torch.device("cuda", 0)
    generator = torch.Generator(device=device)
    generator.manual_seed(13)
    layers = gpu_suite.make_layers(0, 1, device)
    with pooler.Pooler(group, tp=1, rank=0, device=device, layers=layers, batches=(1, 8), capacity=16) as p:
        p.warm_up()
        mailbox = p.mailbox
        assert isinstance(mailbox, pooler.Mailbox) and mailbox.view.dtype == torch.bfloat16
        assert mailbox.view.numel() == 3 * 1 * 16 * gpu_suite.P and mailbox.stage_view.shape == (8,)
        assert p.rows.shape == (16, gpu_suite.P) and p.rows.dtype == torch.bfloat16
        gather = pooler.compile_gather(hidden=gpu_suite.P, tp=1, capacity_m=16)
        quant = pooler.compile_norm_quant(hidden=gpu_suite.P, tp=1, capacity_m=16, eps=layers[1].eps,
                                          gain_center=layers[1].gain_center)
        assert "consumer" in gather.form and "consumer" in quant.form
        for b in (1, 8):
            x = gpu_suite.fresh_x(b, device, generator)
            p.run(0, x)
            want_rows = p.rows[:b].clone()
            want_quant = gpu_suite.snapshot(p.run(1, x))
            # The edge layer's block, gathered by the standalone plain gather.
            p.project(0, x)
            p.publish(b)
            rows = torch.full((16, gpu_suite.P), float("nan"), dtype=torch.bfloat16, device=device)
            gather(mailbox, rows, mailbox.stage_view, b, torch.cuda.current_stream())
            # The NVFP4 layer's, through the standalone norm + quantize.
            p.project(1, x)
            p.publish(b)
            packed = torch.full((b, gpu_suite.P // 2), 0xAA, dtype=torch.uint8, device=device)
            scales = torch.full((b, gpu_suite.P // 16), 0xAA, dtype=torch.uint8, device=device)
            quant(mailbox, layers[1].norm_weight, layers[1].global_scale, packed, scales, mailbox.stage_view, b, None)
            torch.cuda.synchronize()
            assert torch.equal(rows[:b].view(torch.int16), want_rows.view(torch.int16)), b
            assert gpu_suite.same_bits((packed, scales.view(torch.float8_e4m3fn)), want_quant), b
            # The Pooler carries on after them: its stage advanced as its own gather would.
            assert gpu_suite.same_bits(gpu_suite.snapshot(p.run(1, x)), want_quant), b
        with pytest.raises(ValueError, match="stage_state is not this mailbox's stage_view"):
            gather(mailbox, rows, torch.zeros(8, dtype=torch.int32, device=device), 1, None)
        with pytest.raises(ValueError, match="m = 17; expected 1 to 16"):
            gather(mailbox, rows, None, 17, None)
        other = pooler.compile_gather(hidden=gpu_suite.P, tp=1, capacity_m=8)
        with pytest.raises(pooler.InvalidArgument, match="capacity 16; expected the kernel's P 4096, tp 1, capacity 8"):
            other(mailbox, rows, None, 1, None)
        p.check()
    with pytest.raises(pooler.PoolerError, match="closed"):
        gather(mailbox, rows, None, 1, None)
    assert mailbox.view.numel() == 0 and p.rows.numel() == 0
