# SPDX-License-Identifier: Apache-2.0
"""Argument checks of pooler.Pooler that need torch but no GPU: each bad value raises
TypeError or ValueError naming it, before any NCCL work (a one-rank gloo group)."""

import os

import pytest

from conftest import requires_torch

pytestmark = requires_torch


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def layer(device="cuda:0", pooled=4096, hidden=8192, tp=1, nvfp4=True, **changes):
    import torch

    import pooler

    fields = dict(weight=torch.empty(pooled // tp, hidden, dtype=torch.bfloat16, device="meta"),
                  norm_weight=torch.empty(pooled, dtype=torch.bfloat16, device="meta"), eps=1e-5, gain_center=1.0,
                  global_scale=torch.empty(1, dtype=torch.float32, device="meta") if nvfp4 else None)
    fields.update(changes)
    return pooler.PoolerLayer(**fields)


def build(group, **changes):
    import pooler

    arguments = dict(tp=1, rank=0, device="cuda:0", layers=[layer()], batches=(1, 8))
    arguments.update(changes)
    return pooler.Pooler(group, **arguments)


def test_pooler_layer_defaults_to_an_edge_layer():
    import pooler

    edge = pooler.PoolerLayer(weight=None, norm_weight=None, eps=1e-5, gain_center=1.0)
    assert edge.global_scale is None and edge._fields == ("weight", "norm_weight", "eps", "gain_center",
                                                          "global_scale")


@pytest.mark.parametrize("changes, error, text", [
    (dict(tp=3), ValueError, "TP3"),
    (dict(tp=2), ValueError, "group has 1 ranks"),
    (dict(rank=1), ValueError, "rank is 1"),
    (dict(tp="1"), TypeError, "tp is '1'"),
    (dict(batches=(0, 8)), ValueError, r"batches \[0, 8\]"),
    (dict(batches=(64,), capacity=32), ValueError, "capacity"),
    (dict(batches=()), ValueError, "at least one"),
    (dict(capacity=0), ValueError, "capacity is 0"),
    (dict(device="cpu"), ValueError, "device is cpu"),
    (dict(device=3.5), TypeError, "device 3.5"),
    (dict(layers=[]), ValueError, "layers is empty"),
    (dict(layers=["w"]), TypeError, "layers\\[0\\] is a str"),
    (dict(spin_timeout_s=0), ValueError, "spin_timeout_s is 0"),
    # Not representable as int64 nanoseconds: refused, not wrapped (this one became 0.29 s).
    (dict(spin_timeout_s=18446744074), ValueError, r"spin_timeout_s is 18446744074.0 s = 18446744074000000000 ns"),
    (dict(spin_timeout_s=1e-12), ValueError, "spin_timeout_s is 1e-12 s = 0 ns; expected 1 ns to"),
    (dict(transport="mailbox"), ValueError, "transport is 'mailbox'; expected one of 'auto', 'lamport', 'nccl'"),
    (dict(transport=None), ValueError, "transport is None"),
    (dict(allow_nvls=1), TypeError, "allow_nvls is 1"),
    (dict(allow_nvls=True), ValueError, "allow_nvls=True needs nccl_comm="),
    (dict(predecessor_triggers_early=1), TypeError, r"predecessor_triggers_early is 1 \(int\); expected a bool"),
    (dict(predecessor_triggers_early="yes"), TypeError, r"predecessor_triggers_early is 'yes' \(str\)"),
    (dict(predecessor_triggers_early=None), TypeError, "predecessor_triggers_early is None"),
])
def test_bad_arguments_are_named(group, changes, error, text):
    with pytest.raises(error, match=text):
        build(group, **changes)


def test_bad_layer_tensors_are_named(group):
    import torch

    with pytest.raises(ValueError, match=r"layers\[0\].weight is on meta; expected torch.bfloat16 \[4096, 8192\]"):
        build(group)
    with pytest.raises(TypeError, match=r"layers\[0\].weight is torch.float32"):
        build(group, layers=[layer(weight=torch.empty(4096, 8192))])
    with pytest.raises(ValueError, match=r"layers\[0\].weight has shape \[2048, 8192\]"):
        build(group, layers=[layer(weight=torch.empty(2048, 8192, dtype=torch.bfloat16, device="meta"))])
    with pytest.raises(ValueError, match=r"layers\[0\].weight is not contiguous"):
        build(group, layers=[layer(weight=torch.empty(8192, 4096, dtype=torch.bfloat16, device="meta").t())])
    with pytest.raises(TypeError, match=r"layers\[0\].eps is 'x'"):
        build(group, layers=[layer(eps="x")])


def test_nvlink_multicast_must_be_off(group, monkeypatch):
    import pooler

    monkeypatch.delenv("NCCL_NVLS_ENABLE")
    with pytest.raises(pooler.PoolerError, match="NCCL_NVLS_ENABLE is unset.*NCCL_NVLS_ENABLE=0"):
        build(group)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    with pytest.raises(pooler.PoolerError, match="NCCL_NVLS_ENABLE is 1"):
        build(group)
    assert os.environ["NCCL_NVLS_ENABLE"] == "1"
    # The opt-in (with an engine's communicator) passes the NVLS check: what fails next is the layer.
    with pytest.raises(ValueError, match=r"layers\[0\].weight is on meta"):
        build(group, allow_nvls=True, nccl_comm=1)


@pytest.mark.parametrize("value", [False, True])
def test_predecessor_triggers_early_is_accepted(group, value):
    # Either bool passes its check: what fails next is the layer (the meta tensors).
    with pytest.raises(ValueError, match=r"layers\[0\].weight is on meta"):
        build(group, predecessor_triggers_early=value)


@pytest.mark.parametrize("value, field", [(None, 0), (False, 0), (True, 1)])
def test_predecessor_triggers_early_reaches_the_options(monkeypatch, value, field):
    """What _build hands pooler_create: the keyword (None: its default) as the struct's 0 or 1, in a
    struct that pooler_options_init filled (the library's other calls are not made)."""
    import ctypes

    import torch

    from pooler import _abi, _pooler

    real_call, seen = _pooler.call, []

    class Created(Exception):
        pass

    def fake_call(name, *args):
        if name == "pooler_options_init":
            return real_call(name, *args)
        assert name == "pooler_create", name
        options = args[2]._obj  # ctypes.byref(options)
        seen.append((options.size, options.allow_nvls, options.predecessor_triggers_early))
        raise Created()

    monkeypatch.setattr(_pooler, "call", fake_call)
    p = _pooler.Pooler.__new__(_pooler.Pooler)
    p._handle, p._comm, p._id, p._closed, p._views, p._row_views = (ctypes.c_void_p(), ctypes.c_void_p(), None, False,
                                                                     [], {})
    p.layers = (layer(weight=torch.zeros(1, 1, dtype=torch.bfloat16), norm_weight=torch.zeros(1, dtype=torch.bfloat16),
                      global_scale=None),)
    p.batches, p.capacity, p.enable_pdl, p._spin_timeout_ns, p.hidden, p.pooled = (8,), 32, True, 10 ** 10, 8192, 4096
    p.requested_transport, p.allow_nvls = "auto", False
    p._validate_predecessor(_pooler.Pooler.__init__.__kwdefaults__["predecessor_triggers_early"] if value is None
                            else value)
    with pytest.raises(Created):
        p._build()
    assert seen == [(ctypes.sizeof(_abi.Options), 0, field)]


def test_group_must_be_a_process_group():
    with pytest.raises(TypeError, match="group is str"):
        build("world")


def test_a_failure_of_any_type_reaches_the_vote(group, monkeypatch):
    """A validation error that is not TypeError/ValueError/PoolerError (a RuntimeError from torch)
    still goes through the all-gather that tells the other ranks, so none is left waiting there."""
    import torch.distributed as dist

    from pooler import _pooler

    def refuse(self, *args):
        raise RuntimeError("CUDA error: out of memory (from torch)")

    gathers = []
    real = dist.all_gather

    def counting(*args, **kwargs):
        gathers.append(kwargs.get("group"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_pooler.Pooler, "_validate", refuse)
    monkeypatch.setattr(dist, "all_gather", counting)
    with pytest.raises(RuntimeError, match="out of memory"):
        build(group)
    assert gathers == [group], "the failure skipped the vote"
