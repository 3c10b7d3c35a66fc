"""torch.ops.pooler.* without a GPU: the fake implementations give the outputs' shapes and
dtypes, and torch.compile(fullgraph=True) traces a model that calls every op, keeping them
in program order (the token), on the meta device."""

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
