# SPDX-License-Identifier: Apache-2.0
"""Shared set-up: NVLink multicast off before anything starts NCCL (pooler refuses to start
otherwise), and markers for what a test needs."""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import importlib.util  # noqa: E402

import pytest  # noqa: E402

HAS_TORCH = importlib.util.find_spec("torch") is not None


def gpu_count():
    if not HAS_TORCH:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


requires_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (pip install torch)")
requires_gpu = pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU visible to torch")
requires_two_gpus = pytest.mark.skipif(gpu_count() < 2, reason="needs 2 CUDA GPUs visible to torch (TP2)")
