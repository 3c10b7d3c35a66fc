# SPDX-License-Identifier: Apache-2.0
"""torch.ops.pooler.{run, project, publish, gather}: the Pooler's calls as torch
custom ops, so that torch.compile (fullgraph) traces a model that calls them and
CUDA graphs capture them.

Each op takes the Pooler's id (a Python int, constant to the tracer) and its
`token`, a one-element device tensor that every op declares it mutates: the
mailbox is state outside the graph, and the token keeps the ops in program
order and out of dead-code elimination. Outputs are fresh tensors (the compiled
graph owns them; the library writes them through the *_into calls), always two
(a mutating op's outputs cannot be a list): (packed U8 [b, P / 2], scales E4M3
[b, P / 16]) for an NVFP4 layer, (normed BF16 [b, P], an empty U8 [b, 0]) for a
BF16 edge layer. The fake implementations need only the Pooler's shape,
registered under its id.

The registry holds each Pooler weakly: a Pooler dropped without close() is
collected (and released, with a ResourceWarning), and its id then refuses.
"""

import itertools
import threading
import weakref
from typing import NamedTuple, Tuple

import torch


class Shape(NamedTuple):
    """What the fake implementations need of a Pooler."""

    hidden: int
    pooled: int
    width: int  # P / tp
    nvfp4: tuple  # per layer


_lock = threading.Lock()
_ids = itertools.count(1)
_shapes = {}
_poolers = weakref.WeakValueDictionary()


def register(pooler):
    """Registers a live Pooler (weakly); returns its id for the ops."""
    with _lock:
        index = next(_ids)
        _shapes[index] = Shape(pooler.hidden, pooler.pooled, pooler.width, pooler._nvfp4)
        _poolers[index] = pooler
        return index


def register_shape(shape: Shape):
    """Registers a shape alone (no library Pooler): the fake implementations work, the
    real ones refuse. For tracing and tests without a GPU."""
    with _lock:
        index = next(_ids)
        _shapes[index] = shape
        return index


def unregister(index):
    with _lock:
        _shapes.pop(index, None)
        _poolers.pop(index, None)


def _shape(index):
    try:
        return _shapes[index]
    except KeyError:
        raise ValueError(f"pooler id {index} is not a live Pooler (closed, or never built)") from None


def _pooler(index):
    pooler = _poolers.get(index)
    if pooler is None:
        _shape(index)
        raise ValueError(f"pooler id {index} has a shape but no library Pooler (register_shape): nothing to run")
    return pooler


def _check_layer(shape, layer):
    if not 0 <= layer < len(shape.nvfp4):
        raise ValueError(f"layer {layer} out of range [0, {len(shape.nvfp4)})")


def new_outputs(shape, layer, b, device):
    """The two outputs of run and gather for `layer` at b rows (see the module's docstring)."""
    _check_layer(shape, layer)
    if shape.nvfp4[layer]:
        return (torch.empty(b, shape.pooled // 2, dtype=torch.uint8, device=device),
                torch.empty(b, shape.pooled // 16, dtype=torch.float8_e4m3fn, device=device))
    return (torch.empty(b, shape.pooled, dtype=torch.bfloat16, device=device),
            torch.empty(b, 0, dtype=torch.uint8, device=device))


@torch.library.custom_op("pooler::run", mutates_args=("token",), device_types="cuda")
def run(pooler: int, layer: int, x: torch.Tensor, token: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """x BF16 [b, H] -> (packed, scales) for an NVFP4 layer, (normed, empty) for an edge layer."""
    instance = _pooler(pooler)
    instance._check_layer(layer)
    outputs = new_outputs(_shape(pooler), layer, instance._check_x(x), x.device)
    instance.run_into(layer, x, outputs[:2 if instance._nvfp4[layer] else 1])
    return outputs


@run.register_fake
def _run_fake(pooler, layer, x, token):
    return new_outputs(_shape(pooler), layer, x.shape[0], x.device)


@torch.library.custom_op("pooler::project", mutates_args=("token",), device_types="cuda")
def project(pooler: int, layer: int, x: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """x BF16 [b, H] -> this rank's block BF16 [b, P / tp]."""
    instance = _pooler(pooler)
    block = torch.empty(instance._check_x(x), instance.width, dtype=torch.bfloat16, device=x.device)
    instance.project_into(layer, x, block)
    return block


@project.register_fake
def _project_fake(pooler, layer, x, token):
    shape = _shape(pooler)
    _check_layer(shape, layer)
    return x.new_empty(x.shape[0], shape.width)


@torch.library.custom_op("pooler::publish", mutates_args=("token",), device_types="cuda")
def publish(pooler: int, block: torch.Tensor, token: torch.Tensor) -> None:
    """This rank's block BF16 [b, P / tp] -> every rank's mailbox."""
    _pooler(pooler).publish(block.shape[0], block.contiguous())


@publish.register_fake
def _publish_fake(pooler, block, token):
    _shape(pooler)


@torch.library.custom_op("pooler::gather", mutates_args=("token",), device_types="cuda")
def gather(pooler: int, layer: int, b: int, token: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The published blocks -> the expert input of `layer` (as run)."""
    instance = _pooler(pooler)
    instance._check_layer(layer)
    outputs = new_outputs(_shape(pooler), layer, b, token.device)
    instance.gather_into(layer, b, outputs[:2 if instance._nvfp4[layer] else 1])
    return outputs


@gather.register_fake
def _gather_fake(pooler, layer, b, token):
    return new_outputs(_shape(pooler), layer, b, token.device)
