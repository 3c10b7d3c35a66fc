"""What needs neither torch nor a GPU: the package, its version, the C ABI's layouts, errors."""

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pooler
from pooler import _abi, _layout

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_projects():
    text = (ROOT / "CMakeLists.txt").read_text()
    version = re.search(r"project\(pooler VERSION ([0-9.]+)", text).group(1)
    assert pooler.__version__ == version
    assert pooler.library_version() == version


def test_library_is_bundled_and_speaks_this_abi():
    assert pooler.library_path().is_file()
    assert pooler._library.library().pooler_abi_version() == _layout.ABI_VERSION == 3


def test_layouts_are_the_c_compilers():
    _abi.check()  # also ran at import
    sizes = {name: size for name, size, _fields in _layout.STRUCTS}
    # The sizes runtime/c_api.cpp asserts (a change there is a new ABI version).
    assert sizes == {"pooler_unique_id": 128, "pooler_layer_desc": 32, "pooler_options": 64, "pooler_tensor": 32,
                     "pooler_expert_input": 104, "pooler_peer_timeout_info": 32}
    assert _abi.Options.spin_timeout_ns.offset == 40 and _abi.Options.pooled.offset == 52
    assert _abi.Options.transport.offset == 56 and _abi.Options.allow_nvls.offset == 60
    assert _abi.ExpertInput.packed.offset == 8 and _abi.PeerTimeoutInfo.elapsed_ns.offset == 24
    assert ctypes.sizeof(_abi.UniqueId) == 128


def test_options_init_fills_the_defaults():
    options = _abi.Options()
    pooler._library.call("pooler_options_init", ctypes.byref(options))
    assert (options.num_batches, options.batches[0], options.capacity, options.enable_pdl) == (1, 8, 32, 1)
    assert (options.hidden, options.pooled, options.spin_timeout_ns) == (8192, 4096, 10 ** 10)


def test_errors_carry_the_librarys_message():
    with pytest.raises(pooler.InvalidArgument, match="options is NULL") as caught:
        pooler._library.call("pooler_options_init", None)
    assert isinstance(caught.value, ValueError) and caught.value.status == "POOLER_INVALID_ARGUMENT"
    with pytest.raises(ValueError, match="pooler is NULL"):
        pooler._library.call("pooler_run_into", None, 0, 0, 8, None, None)
    assert issubclass(pooler.PeerTimeout, pooler.PoolerError) and issubclass(pooler.PoolerError, RuntimeError)


def test_device_count_or_no_driver():
    try:
        count = pooler.device_count()
    except pooler.NoDriverError as error:
        assert "no CUDA driver" in str(error)
    else:
        assert count >= 0


def test_a_missing_library_is_named():
    env = dict(os.environ, POOLER_LIBRARY="/nonexistent/libpooler.so")
    result = subprocess.run([sys.executable, "-c", "import pooler; pooler.library_version()"], env=env,
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "cannot load /nonexistent/libpooler.so" in result.stderr


def test_torch_parts_follow_torch():
    assert pooler.HAS_TORCH == hasattr(pooler, "Pooler")
