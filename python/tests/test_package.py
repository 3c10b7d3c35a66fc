# SPDX-License-Identifier: Apache-2.0
"""What needs neither torch nor a GPU: the package, its version, the C ABI's layouts, errors."""

import ctypes
import os
import re
import struct
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
    assert pooler._library.library().pooler_abi_version() == _layout.ABI_VERSION == 4


def test_layouts_are_the_c_compilers():
    _abi.check()  # also ran at import
    sizes = {name: size for name, size, _fields in _layout.STRUCTS}
    # The sizes runtime/c_api.cpp asserts (a change there is a new ABI version).
    assert sizes == {"pooler_unique_id": 128, "pooler_layer_desc": 48, "pooler_options": 88, "pooler_tensor": 32,
                     "pooler_expert_input": 104, "pooler_peer_timeout_info": 48, "pooler_mailbox_info": 64,
                     "pooler_gemm_shape": 56}
    assert _abi.Options.spin_timeout_ns.offset == 56 and _abi.Options.pooled.offset == 68
    assert _abi.Options.transport.offset == 72 and _abi.Options.allow_nvls.offset == 76
    assert _abi.Options.predecessor_triggers_early.offset == 80 and _abi.Options.predecessor_triggers_early.size == 4
    assert _abi.ExpertInput.packed.offset == 8 and _abi.PeerTimeoutInfo.elapsed_ns.offset == 40
    assert ctypes.sizeof(_abi.UniqueId) == 128


def test_growable_structs_start_with_their_header():
    # As pooler.h's POOLER_*_INITIALIZER: size, magic, version, then the fields given.
    layer = _abi.LayerDesc(1, 2, 3, 1e-5, 1.0)
    assert (layer.size, layer.magic, layer.version) == (48, _abi.CONSTANTS["POOLER_LAYER_DESC_MAGIC"], 4)
    assert (layer.weight, layer.norm_weight, layer.global_scale, layer.gain_center) == (1, 2, 3, 1.0)
    info = _abi.PeerTimeoutInfo()
    assert (info.size, info.magic, info.occurred) == (48, _abi.CONSTANTS["POOLER_PEER_TIMEOUT_INFO_MAGIC"], 0)
    assert not hasattr(_abi.Tensor(), "size")


def test_options_init_fills_the_defaults():
    options = _abi.Options()
    options.magic = 0
    pooler._library.call("pooler_options_init", ctypes.byref(options), ctypes.sizeof(options))
    assert (options.size, options.magic, options.version) == (88, _abi.CONSTANTS["POOLER_OPTIONS_MAGIC"], 4)
    assert (options.num_batches, options.batches[0], options.capacity, options.enable_pdl) == (1, 8, 32, 1)
    assert (options.hidden, options.pooled, options.spin_timeout_ns) == (8192, 4096, 10 ** 10)
    assert (options.transport, options.allow_nvls, options.predecessor_triggers_early) == (0, 0, 0)
    assert _abi.Options().predecessor_triggers_early == 0  # the ctypes struct's own default, as the initializer's
    # A struct of a header before predecessor_triggers_early (80 bytes): its bytes are not written.
    options.predecessor_triggers_early = 7
    pooler._library.call("pooler_options_init", ctypes.byref(options), _abi.Options.predecessor_triggers_early.offset)
    assert (options.size, options.allow_nvls, options.predecessor_triggers_early) == (80, 0, 7)
    with pytest.raises(pooler.InvalidArgument, match="size is 56"):
        pooler._library.call("pooler_options_init", ctypes.byref(options), 56)


def test_errors_carry_the_librarys_message():
    with pytest.raises(pooler.InvalidArgument, match="options is NULL") as caught:
        pooler._library.call("pooler_options_init", None, ctypes.sizeof(_abi.Options))
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
    assert "libnccl.so.2" in result.stderr and "torch 2.11" in result.stderr


def test_torch_parts_follow_torch():
    assert pooler.HAS_TORCH == hasattr(pooler, "Pooler")


def test_an_old_torch_nccl_is_refused_by_name():
    class Nccl:
        def __init__(self, version):
            self._version = version

        def version(self):
            return self._version

    class Cuda:
        def __init__(self, version):
            self.nccl = Nccl(version)

    class Torch:
        __version__ = "2.4.0"

        def __init__(self, version):
            self.cuda = Cuda(version)

    with pytest.raises(ImportError, match=r"torch 2.4.0 loads NCCL 2.20.5; pooler needs NCCL 2.28 or newer .*"
                                          r"install torch 2.11 or newer"):
        pooler._library._check_torch_nccl(Torch((2, 20, 5)))
    with pytest.raises(ImportError, match="NCCL 2.21.5"):
        pooler._library._check_torch_nccl(Torch(22105))
    pooler._library._check_torch_nccl(Torch((2, 28, 9)))
    pooler._library._check_torch_nccl(Torch((3, 0, 0)))


def test_the_wheel_carries_the_licence():
    folder = Path(pooler.__file__).parent
    assert "Apache License" in (folder / "LICENSE").read_text()


def elf_section_names(path):
    """The section names of a 64-bit little-endian ELF file (its section headers and their string table)."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path} is not a 64-bit little-endian ELF file"
    (header_offset,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)

    def section(index):  # (name offset, file offset, size)
        base = header_offset + index * entry_size
        return struct.unpack_from("<I", data, base)[0], *struct.unpack_from("<QQ", data, base + 0x18)

    _, names_offset, _ = section(names_index)
    return [data[names_offset + name:data.index(b"\0", names_offset + name)].decode()
            for name, _, _ in map(section, range(count))]


@pytest.mark.skipif("POOLER_LIBRARY" in os.environ, reason="POOLER_LIBRARY names a library other than the bundled one")
def test_the_bundled_library_is_stripped():
    names = elf_section_names(pooler.library_path())
    assert ".dynsym" in names and ".text" in names  # the reader reads
    assert [name for name in names if name.startswith(".debug")] == []
