# SPDX-License-Identifier: Apache-2.0
"""The C ABI's structs as ctypes classes, built from _layout.py: the layouts that
python/abi_layout.c wrote at build time from include/pooler/pooler.h. Nothing
here declares a field by hand; check() compares every field's offset and size
with what the C compiler reported."""

import ctypes

from . import _layout

ABI_VERSION = _layout.ABI_VERSION
CONSTANTS = dict(_layout.CONSTANTS)


def _resolve(name, structs):
    if name.startswith("POINTER(") and name.endswith(")"):
        return ctypes.POINTER(_resolve(name[len("POINTER("):-1], structs))
    if name in structs:
        return structs[name]
    if name.startswith("c_") and hasattr(ctypes, name):
        return getattr(ctypes, name)
    raise ImportError(f"pooler/_layout.py names the C type {name!r}, which has no ctypes counterpart: "
                      "python/abi_layout.c needs a mapping for it")


def _growable_init(magic):
    """The __init__ of a growable struct (one that starts with size, magic and version, as
    pooler.h's POOLER_*_INITIALIZER fill them): the header is set, the positional and keyword
    arguments fill the fields after it."""

    def __init__(self, *args, **kwargs):
        ctypes.Structure.__init__(self, ctypes.sizeof(self), magic, ABI_VERSION, *args, **kwargs)

    return __init__


def _build():
    structs = {}
    for struct_name, size, fields in _layout.STRUCTS:
        declared = []
        for field, type_name, count, _offset, _size in fields:
            ctype = _resolve(type_name, structs)
            declared.append((field, ctype * count if count else ctype))
        namespace = {"_fields_": declared}
        if [field[0] for field in fields[:3]] == ["size", "magic", "version"]:
            namespace["__init__"] = _growable_init(CONSTANTS[struct_name.upper() + "_MAGIC"])
        structs[struct_name] = type(struct_name, (ctypes.Structure,), namespace)
    return structs


STRUCTS = _build()


def check():
    """Raises ImportError unless every struct and field has the C compiler's size and offset."""
    problems = []
    for struct_name, size, fields in _layout.STRUCTS:
        cls = STRUCTS[struct_name]
        if ctypes.sizeof(cls) != size:
            problems.append(f"{struct_name} is {ctypes.sizeof(cls)} bytes in ctypes, {size} in C")
        for field, _type, _count, offset, field_size in fields:
            descriptor = getattr(cls, field)
            if (descriptor.offset, descriptor.size) != (offset, field_size):
                problems.append(f"{struct_name}.{field} at {descriptor.offset} ({descriptor.size} bytes) in ctypes, "
                                f"at {offset} ({field_size} bytes) in C")
    if problems:
        raise ImportError("pooler's ctypes layouts differ from include/pooler/pooler.h: " + "; ".join(problems))


check()

UniqueId = STRUCTS["pooler_unique_id"]
LayerDesc = STRUCTS["pooler_layer_desc"]
Options = STRUCTS["pooler_options"]
Tensor = STRUCTS["pooler_tensor"]
ExpertInput = STRUCTS["pooler_expert_input"]
PeerTimeoutInfo = STRUCTS["pooler_peer_timeout_info"]
MailboxInfo = STRUCTS["pooler_mailbox_info"]
GemmShape = STRUCTS["pooler_gemm_shape"]

OK = CONSTANTS["POOLER_OK"]
INVALID_ARGUMENT = CONSTANTS["POOLER_INVALID_ARGUMENT"]
NO_DRIVER = CONSTANTS["POOLER_NO_DRIVER"]
PEER_TIMEOUT = CONSTANTS["POOLER_PEER_TIMEOUT"]
DTYPE_BF16 = CONSTANTS["POOLER_DTYPE_BF16"]
DTYPE_F32 = CONSTANTS["POOLER_DTYPE_F32"]
DTYPE_U8 = CONSTANTS["POOLER_DTYPE_U8"]
DTYPE_E4M3 = CONSTANTS["POOLER_DTYPE_E4M3"]
LOG_TRACE = CONSTANTS["POOLER_LOG_TRACE"]
LOG_DEBUG = CONSTANTS["POOLER_LOG_DEBUG"]
LOG_INFO = CONSTANTS["POOLER_LOG_INFO"]
LOG_WARN = CONSTANTS["POOLER_LOG_WARN"]
LOG_ERROR = CONSTANTS["POOLER_LOG_ERROR"]
LOG_CRITICAL = CONSTANTS["POOLER_LOG_CRITICAL"]
LOG_OFF = CONSTANTS["POOLER_LOG_OFF"]
