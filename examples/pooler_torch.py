#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""pooler from PyTorch: an example of the `pooler` package (pip install . at the repository's root).

One process per visible GPU (tp 1, 2, 4 or 8), each a rank of a torch.distributed group.
Every rank builds a Pooler over a synthetic Muse Spark-like model (BF16 edge layers first
and last, NVFP4 between), warms it up, captures every layer in a CUDA graph, replays it on
fresh inputs and checks the outputs against the stock path in plain torch
(pooler.reference: all_gather_into_tensor, RMSNorm with gain center, NVFP4) fed by the
Pooler's own projected blocks. Exit status 0 when every check passes (or no GPU is visible).

    python3 examples/pooler_torch.py [--layers 8] [--batch 8]
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"  # before anything starts NCCL: pooler never uses NVLink multicast

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

P, H = 4096, 8192


def worker(rank, world, args, rendezvous):
    import torch
    import torch.distributed as dist

    import pooler
    from pooler import reference

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    g = torch.Generator(device=device).manual_seed(1234)  # the same model on every rank
    width, layers = P // world, []
    for i in range(args.layers):
        weight = (torch.randn(P, H, generator=g, device=device) * 0.02).to(torch.bfloat16)[rank * width:][:width]
        norm = (torch.randn(P, generator=g, device=device) * 0.1).to(torch.bfloat16)
        scale = None if i in (0, args.layers - 1) else torch.full((1,), 448.0 * 6.0 / 5.0, device=device)
        layers.append(pooler.PoolerLayer(weight.contiguous(), norm, 1e-5, 1.0, scale))

    p = pooler.Pooler(dist.group.WORLD, tp=world, rank=rank, device=device, layers=layers, batches=(args.batch,))
    p.warm_up()  # collective, before capture
    x = torch.zeros(args.batch, H, dtype=torch.bfloat16, device=device)
    blocks = torch.empty(args.layers, args.batch, width, dtype=torch.bfloat16, device=device)
    outputs = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(args.layers):
            out = p.run(i, x)  # views of scratch: copy what must outlive the next call
            outputs.append(tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone())
            blocks[i].copy_(p.last_projection(args.batch))
    failures = 0
    for replay in range(2):
        x.copy_(torch.randn(args.batch, H, generator=g, device=device).to(torch.bfloat16))
        graph.replay()  # the same replays on every rank
        torch.cuda.synchronize()
        p.check()  # raises pooler.PeerTimeout if a peer stopped publishing
        for i, layer in enumerate(layers):
            stock = reference.expert_input(reference.gather_rows(blocks[i]), layer)
            counts = reference.compare(outputs[i], stock)
            bad = counts["differ"] > 1e-3 * counts["values"] if layer.global_scale is not None \
                else counts["beyond_one_ulp"] > 0
            failures += bad
            if rank == 0:
                print(f"replay {replay}, layer {i} ({'NVFP4' if layer.global_scale is not None else 'BF16'}): "
                      f"{counts['differ']} of {counts['values']} differ from the stock path{' FAIL' if bad else ''}")
    p.close()  # collective
    dist.destroy_process_group()
    if failures:
        sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8, help="MoE layers (default 8)")
    parser.add_argument("--batch", type=int, default=8, help="rows b per call (default 8)")
    args = parser.parse_args()
    import torch
    import torch.multiprocessing as mp

    import pooler

    visible = torch.cuda.device_count()
    if visible < 1:
        print("pooler_torch: no CUDA GPU visible; nothing to run")
        return 0
    world = max(n for n in (1, 2, 4, 8) if n <= visible)
    print(f"pooler {pooler.__version__} ({pooler.library_path()}), torch {torch.__version__}, tp {world}")
    with tempfile.TemporaryDirectory() as directory:
        try:
            mp.spawn(worker, args=(world, args, os.path.join(directory, "rendezvous")), nprocs=world)
        except Exception as error:  # a rank failed; spawn has ended the others
            print(f"pooler_torch: FAILED: {error}", file=sys.stderr)
            return 1
    print("pooler_torch: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
