# SPDX-License-Identifier: Apache-2.0
"""The GPU checks, for one rank of tp (test_gpu.py: tp = 1 in-process; test_tp2.py: one
process per GPU). A synthetic Muse Spark-like model (P 4096, H 8192; BF16 edge layers first
and last, NVFP4 between) goes through the Pooler eagerly, under torch.cuda.graph and under
torch.compile(fullgraph=True); the three must agree bit for bit, and with the stock path in
plain torch (pooler.reference) fed by the Pooler's own projected blocks: BF16 rows equal or
within 1 ulp, NVFP4 codes and scales differing in at most 1 in 1000 (torch's exact rsqrt and
reciprocals against the hardware's approximations)."""

import os

import torch
import torch.distributed as dist

import pooler
from pooler import reference

P, H, LAYERS, BATCHES = 4096, 8192, 4, (1, 8)
MAX_NVFP4_DIFFER = 1e-3


def make_layers(rank, tp, device, seed=1234):
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)  # the same model on every rank
    width = P // tp
    layers = []
    for index in range(LAYERS):
        full = (torch.randn(P, H, generator=generator, device=device) * 0.02).to(torch.bfloat16)
        norm = torch.randn(P, generator=generator, device=device) * 0.1
        norm[torch.randperm(P, generator=generator, device=device)[:8]] = -1.0
        amax = 3.0 + 5.0 * torch.rand(1, generator=generator, device=device)
        edge = index in (0, LAYERS - 1)
        layers.append(pooler.PoolerLayer(full[rank * width:(rank + 1) * width].clone(), norm.to(torch.bfloat16),
                                         1e-5, 1.0, None if edge else (448.0 * 6.0 / amax).float()))
    return layers


def fresh_x(b, device, generator):
    x = torch.randn(b, H, generator=generator, device=device)
    x *= 10.0 ** (torch.rand(b, 1, generator=generator, device=device) * 4.0 - 2.0)
    if b >= 4:
        x[b // 2] = 0.0
    return x.to(torch.bfloat16)


def snapshot(result):
    """A copy of one run's outputs (they are views of scratch)."""
    return tuple(t.clone() for t in result) if isinstance(result, tuple) else (result.clone(),)


def same_bits(a, b):
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b)) and len(a) == len(b)


def check_against_stock(p, layer, block, result, group):
    """The Pooler's output for `layer` against the stock norm (+ quantize) of its own blocks, gathered by NCCL."""
    rows = reference.gather_rows(block, group if p.tp > 1 else None)
    stock = reference.expert_input(rows, p.layers[layer])
    counts = reference.compare(result if p.is_nvfp4(layer) else result[0], stock)
    if p.is_nvfp4(layer):
        assert counts["differ"] <= MAX_NVFP4_DIFFER * counts["values"], (layer, counts)
    else:
        assert counts["beyond_one_ulp"] == 0, (layer, counts)
    return counts


def eager_all(p, x):
    """Every layer eagerly: (outputs, projected blocks) as copies."""
    outs, blocks = [], []
    for layer in range(LAYERS):
        outs.append(snapshot(p.run(layer, x)))
        blocks.append(p.last_projection(x.shape[0]).clone())
    return outs, blocks


def run_suite(rank, tp, group, stock_group=None):
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    layers = make_layers(rank, tp, device)
    generator = torch.Generator(device=device)
    generator.manual_seed(99)
    p = pooler.Pooler(group, tp=tp, rank=rank, device=device, layers=layers, batches=BATCHES)
    report = []
    with torch.cuda.stream(torch.cuda.Stream(device=device)):
        p.warm_up()
        assert p.forms and all(isinstance(line, str) for line in p.forms)
        for b in BATCHES:
            x = fresh_x(b, device, generator)
            eager, blocks = eager_all(p, x)
            for layer in range(LAYERS):
                report.append((b, layer, check_against_stock(p, layer, blocks[layer], eager[layer], stock_group)))
                # GEMM: within 1 BF16 ulp of FP64, or 2^-20 of sum |x w| where it nearly cancels.
                exact = x.double() @ layers[layer].weight.double().t()
                bound = torch.maximum(exact.abs() * 2.0 ** -7, (x.double().abs() @ layers[layer].weight.double()
                                                                .abs().t()) * 2.0 ** -20)
                assert int(((blocks[layer].double() - exact).abs() > bound).sum()) == 0, (b, layer)

            # The three steps give run's bits.
            for layer in range(LAYERS):
                p.project(layer, x)
                p.publish(b)
                assert same_bits(snapshot(p.gather(layer, b)), eager[layer]), ("steps", b, layer)

            # The ops (fresh outputs through the *_into calls) give run's bits.
            for layer in range(LAYERS):
                out = torch.ops.pooler.run(p._id, layer, x, p._token)
                assert same_bits(tuple(out)[:len(eager[layer])], eager[layer]), ("op", b, layer)

            # A CUDA graph of every layer, replayed on fresh inputs, gives eager's bits.
            x_static = torch.zeros_like(x)
            static = [[torch.empty_like(t) for t in e] for e in eager]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=torch.cuda.current_stream(), capture_error_mode="thread_local"):
                for layer in range(LAYERS):
                    for target, value in zip(static[layer], snapshot_views(p.run(layer, x_static))):
                        target.copy_(value)
            for _ in range(2):
                x2 = fresh_x(b, device, generator)
                x_static.copy_(x2)
                graph.replay()
                replayed = [tuple(t.clone() for t in s) for s in static]
                want, _ = eager_all(p, x2)
                for layer in range(LAYERS):
                    assert same_bits(replayed[layer], want[layer]), ("graph", b, layer)
            del graph

            # torch.compile(fullgraph=True) of a model calling Pooler.run, and that compiled
            # model captured in a CUDA graph: eager's bits.
            def model(x_in):
                outs = []
                for layer in range(LAYERS):
                    result = p.run(layer, x_in * 1)
                    outs.extend(result if isinstance(result, tuple) else (result,))
                return outs

            compiled = torch.compile(model, fullgraph=True)
            got = compiled(x)
            flat = [t for e in eager for t in e]
            assert len(got) == len(flat) and all(same_bits((g,), (w,)) for g, w in zip(got, flat)), ("compile", b)
            compiled(x_static)  # warm (same shapes) before capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=torch.cuda.current_stream(), capture_error_mode="thread_local"):
                captured = compiled(x_static)
            x_static.copy_(x)
            graph.replay()
            assert all(same_bits((g,), (w,)) for g, w in zip(captured, flat)), ("compile + graph", b)
            del graph

        # Bad input names the value.
        x = fresh_x(8, device, generator)
        for call, error, text in [
            (lambda: p.run(0, x[:3]), ValueError, "b = 3 is not a compiled batch"),
            (lambda: p.run(LAYERS, x), ValueError, f"layer {LAYERS} out of range"),
            (lambda: p.run(0, x.float()), TypeError, "x is torch.float32"),
            (lambda: p.run(0, x.t().contiguous().t()), ValueError, "x is not contiguous"),
            (lambda: p.run(0, x.cpu()), ValueError, "x is on cpu"),
            (lambda: p.gather(1, 2), ValueError, "b = 2"),
        ]:
            try:
                call()
            except error as caught:
                assert text in str(caught), (text, str(caught))
            else:
                raise AssertionError(f"no {error.__name__} for {text}")
        torch.cuda.synchronize(device)
        p.check()
        held = p.run(1, fresh_x(8, device, generator))
    p.close()
    # Nothing handed out reaches the freed scratch, and every method refuses.
    assert all(t.numel() == 0 for t in (*held, p.shard, p.packed, p.scales, p.normed)), "a view outlived close()"
    for call in (lambda: p.last_projection(8), lambda: p.run(1, x), lambda: p.check()):
        try:
            call()
        except pooler.PoolerError as caught:
            assert "closed" in str(caught), str(caught)
        else:
            raise AssertionError("a closed Pooler accepted a call")
    return report


def snapshot_views(result):
    return result if isinstance(result, tuple) else (result,)


def run_timeout(rank, tp, group):
    """Rank 1 skips a call: rank 0's consumer gives up and its next call raises PeerTimeout."""
    device = torch.device("cuda", rank)
    layers = make_layers(rank, tp, device)
    p = pooler.Pooler(group, tp=tp, rank=rank, device=device, layers=layers, batches=(8,), spin_timeout_s=1.0)
    p.warm_up()
    x = torch.zeros(8, H, dtype=torch.bfloat16, device=device)
    if rank == 0:
        p.run(1, x)
        torch.cuda.synchronize(device)
        try:
            p.check()
        except pooler.PeerTimeout as error:
            assert (error.rank, error.missing_peer, error.layer) == (0, 1, 1), vars(error)
            assert error.elapsed_ns >= 10 ** 9 * 0.9
        else:
            raise AssertionError("no PeerTimeout")
    dist.barrier(group)
    p.close()
