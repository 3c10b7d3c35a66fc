# SPDX-License-Identifier: Apache-2.0
"""torch.ops.pooler.* without a GPU: the fake implementations give the outputs' shapes and
dtypes, and torch.compile(fullgraph=True) traces a model that calls every op, keeping them
in program order (the token), on the meta device. And what close() and the garbage collector
do to a Pooler's Python side (over CPU tensors, the library's calls recorded)."""

import re

import pytest

from conftest import requires_torch

pytestmark = requires_torch

P, H, TP = 4096, 8192, 2


@pytest.fixture
def pooler_id():
    from pooler import _ops

    index = _ops.register_shape(_ops.Shape(hidden=H, pooled=P, width=P // TP, nvfp4=(False, True, True, False)))
    yield index
    _ops.unregister(index)


def meta(*shape, dtype=None):
    import torch

    return torch.empty(*shape, dtype=dtype or torch.bfloat16, device="meta")


def test_ops_are_registered():
    import torch

    import pooler  # noqa: F401

    for name in ("run", "project", "publish", "gather"):
        assert hasattr(torch.ops.pooler, name), name


def test_fake_shapes_and_dtypes(pooler_id):
    import torch

    token = meta(1, dtype=torch.int32)
    x = meta(8, H)
    normed, empty = torch.ops.pooler.run(pooler_id, 0, x, token)
    assert normed.shape == (8, P) and normed.dtype == torch.bfloat16 and normed.device.type == "meta"
    assert empty.shape == (8, 0)
    packed, scales = torch.ops.pooler.run(pooler_id, 1, x, token)
    assert packed.shape == (8, P // 2) and packed.dtype == torch.uint8
    assert scales.shape == (8, P // 16) and scales.dtype == torch.float8_e4m3fn
    block = torch.ops.pooler.project(pooler_id, 2, x, token)
    assert block.shape == (8, P // TP) and block.dtype == torch.bfloat16
    torch.ops.pooler.publish(pooler_id, block, token)
    packed, scales = torch.ops.pooler.gather(pooler_id, 2, 8, token)
    assert packed.shape == (8, P // 2) and scales.shape == (8, P // 16)


def test_fake_refuses_unknown_ids_and_layers(pooler_id):
    import torch

    token = meta(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="not a live Pooler"):
        torch.ops.pooler.run(10 ** 6, 0, meta(8, H), token)
    with pytest.raises(ValueError, match="layer 4 out of range"):
        torch.ops.pooler.run(pooler_id, 4, meta(8, H), token)


def test_compile_fullgraph_keeps_every_op_in_order(pooler_id):
    import torch
    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    def model(x, token):
        outs = []
        for layer in range(4):
            if layer == 2:  # the three steps, as an engine that interleaves them
                block = torch.ops.pooler.project(pooler_id, layer, x, token)
                torch.ops.pooler.publish(pooler_id, block, token)
                outs += torch.ops.pooler.gather(pooler_id, layer, x.shape[0], token)
            else:
                outs += torch.ops.pooler.run(pooler_id, layer, x * 2, token)
        return outs

    compiled = torch.compile(model, fullgraph=True, backend=aot_autograd(fw_compiler=capture))
    outs = compiled(meta(8, H), meta(1, dtype=torch.int32))
    assert [tuple(o.shape) for o in outs] == [(8, P), (8, 0), (8, P // 2), (8, P // 16), (8, P // 2), (8, P // 16),
                                              (8, P), (8, 0)]
    graph = graphs[-1]
    order = [match.group(1) for match in re.finditer(r"pooler\.(run|project|publish|gather)\.default", graph)]
    # publish returns nothing and is still there: the token's mutation chains every op.
    assert order == ["run", "run", "project", "publish", "gather", "run"], graph


# ---- close() and collection, without a library Pooler --------------------------------------------

@pytest.fixture
def unbuilt(monkeypatch):
    """A Pooler as _build leaves it, over CPU tensors as its scratch, with the library's calls
    recorded instead of made (its handle is a dummy that reaches no library)."""
    import ctypes

    import torch

    from pooler import _ops, _pooler

    calls = []
    monkeypatch.setattr(_pooler, "call", lambda name, *args, **kwargs: calls.append(name))

    def make():
        p = _pooler.Pooler.__new__(_pooler.Pooler)
        p._handle, p._comm, p._id, p._closed, p._views, p._row_views = (ctypes.c_void_p(0x1000), ctypes.c_void_p(),
                                                                         None, False, [], {})
        p.hidden, p.pooled, p.width, p.rank, p.batches = H, P, P // TP, 0, (1, 8)
        p.layers, p._nvfp4, p.device = (None, None), (True, False), torch.device("cpu")
        p._stream = lambda: ctypes.c_void_p()
        capacity = 8
        p._keep_scratch(torch.randn(capacity, P // TP).to(torch.bfloat16),
                        torch.randint(0, 256, (capacity, P // 2), dtype=torch.uint8),
                        torch.randint(0, 256, (capacity, P // 16), dtype=torch.uint8),
                        torch.randn(capacity, P).to(torch.bfloat16))
        p._id = _ops.register(p)
        return p

    return make, calls


def test_close_releases_every_view_and_refuses_every_method(unbuilt):
    import torch

    import pooler

    make, calls = unbuilt
    p = make()
    x = torch.randn(8, H).to(torch.bfloat16)
    packed, scales = p.run(0, x)
    normed = p.run(1, x)
    block = p.last_projection(8)
    assert calls == ["pooler_run", "pooler_run"]
    assert packed.shape == (8, P // 2) and scales.dtype == torch.float8_e4m3fn and normed.shape == (8, P)
    assert p.run(0, x)[0] is packed, "one view per (scratch, b): nothing made per call"
    expected = p.shard[:8].clone()
    assert torch.equal(block, expected)
    pooler_id = p._id

    p.close()
    assert calls[-1] == "pooler_destroy"
    for name, view in [("packed", packed), ("scales", scales), ("normed", normed), ("last_projection", block),
                       ("shard", p.shard), ("packed attribute", p.packed), ("scales attribute", p.scales),
                       ("normed attribute", p.normed)]:
        assert view.numel() == 0, f"{name} still reaches the freed scratch"
        with pytest.raises(IndexError):
            view[0]
    assert packed.shape == (0, P // 2) and scales.dtype == torch.float8_e4m3fn and normed.shape == (0, P)
    refused = [lambda: p.run(0, x), lambda: p.project(0, x), lambda: p.publish(8), lambda: p.gather(0, 8),
               lambda: p.last_projection(8), lambda: p.is_nvfp4(0), lambda: p.outputs(0, 8), lambda: p.warm_up(),
               lambda: p.check(), lambda: p.transport, lambda: p.forms, lambda: p.run_into(0, x, ()),
               lambda: p.project_into(0, x, None), lambda: p.gather_into(0, 8, ()),
               lambda: p.prefetch_weights(0)]
    for use in refused:
        with pytest.raises(pooler.PoolerError, match="closed"):
            use()
    assert calls == ["pooler_run"] * 3 + ["pooler_destroy"], "a closed Pooler called the library"
    with pytest.raises(ValueError, match="not a live Pooler"):
        torch.ops.pooler.run(pooler_id, 0, meta(8, H), meta(1, dtype=torch.int32))
    p.close()  # a second close does nothing
    assert calls.count("pooler_destroy") == 1


def test_an_unclosed_pooler_is_collected_with_a_warning(unbuilt):
    import gc
    import weakref

    from pooler import _ops

    make, calls = unbuilt
    p = make()
    pooler_id, alive = p._id, weakref.ref(p)
    assert _ops._pooler(pooler_id) is p
    with pytest.warns(ResourceWarning, match="collected without close"):
        del p
        gc.collect()
    assert alive() is None, "the op registry kept the Pooler alive"
    assert calls == ["pooler_destroy"]
    with pytest.raises(ValueError, match="not a live Pooler"):
        _ops._pooler(pooler_id)
