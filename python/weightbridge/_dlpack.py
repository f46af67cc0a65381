"""Reading a tensor through DLPack: any object with ``__dlpack__``/``__dlpack_device__`` (CuPy,
JAX, numpy >= 1.22, torch, ...) is exported to a DLPack capsule, whose DLManagedTensor (or, from
producers of DLPack >= 1.0, DLManagedTensorVersioned) is read with ctypes: its pointer, device,
dtype, shape and strides.

The capsule is held, unconsumed, for as long as the tensor is registered: the producer keeps the
memory alive while its capsule lives, and the capsule's own destructor calls the producer's
deleter when the last reference goes (the endpoint's close). Renaming the capsule
"used_dltensor" and calling the deleter ourselves, as a consuming library does, was rejected:
it needs a ctypes call through a foreign function pointer at an arbitrary time (a garbage
collection, interpreter exit) for no gain, since we never free or reuse the memory ourselves.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Optional, Tuple

# DLDeviceType (dlpack.h)
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3
DEVICE_NAMES = {
    1: "CPU", 2: "CUDA", 3: "CUDAHost", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCM",
    11: "ROCMHost", 12: "ExtDev", 13: "CUDAManaged", 14: "OneAPI", 15: "WebGPU", 16: "Hexagon",
    17: "MAIA", 18: "Trn",
}
# DLDataTypeCode (dlpack.h) -> the name of the type for messages
CODE_NAMES = {
    0: "int", 1: "uint", 2: "float", 3: "opaque handle", 4: "bfloat", 5: "complex", 6: "bool",
    7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz", 10: "float8_e4m3fn",
    11: "float8_e4m3fnuz", 12: "float8_e5m2", 13: "float8_e5m2fnuz", 14: "float8_e8m0fnu",
    15: "float6_e2m3fn", 16: "float6_e3m2fn", 17: "float4_e2m1fn",
}
# (code, bits) -> the weightbridge dtype; "" for integers that hold another format's bits (as
# numpy's uint8/uint16 do: dtype= names it)
DTYPES = {
    (2, 16): "fp16", (2, 32): "fp32", (4, 16): "bf16", (10, 8): "fp8_e4m3", (0, 32): "i32",
    (0, 64): "i64", (0, 8): "", (1, 8): "", (0, 16): "", (1, 16): "",
}
FLAG_READ_ONLY = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY
FLAG_IS_COPIED = 1 << 1  # DLPACK_FLAG_BITMASK_IS_COPIED


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# Our own prototypes of the capsule calls (ctypes.pythonapi's shared function objects keep
# whatever argtypes the last module gave them).
_get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def has_dlpack(x) -> bool:
    return callable(getattr(x, "__dlpack__", None)) and callable(getattr(x, "__dlpack_device__", None))


def type_name(code: int, bits: int, lanes: int = 1) -> str:
    """A DLPack dtype as a name: float32, bfloat16, float8_e4m3fn, uint8, bfloat16x2 (lanes),
    "unknown" (a code dlpack.h does not define)."""
    base = CODE_NAMES.get(code)
    if base is None:
        name = "unknown"
    elif code in (0, 1, 2, 4, 5):
        name = f"{base}{bits}"
    elif code == 6:
        name = "bool" if bits == 8 else f"bool ({bits} bits)"
    elif code == 3:
        name = f"opaque handle ({bits} bits)"
    else:  # the float8/6/4 codes name their width; a producer giving other bits is wrong
        width = int(base.split("_")[0][5:])
        name = base if bits == width else f"{base} ({bits} bits)"
    return name if lanes == 1 else f"{name}x{lanes}"


def device_name(device_type: int, device_id: int) -> str:
    return f"{DEVICE_NAMES.get(device_type, f'device type {device_type}')}:{device_id}"


@dataclass
class Exported:
    """What a DLPack export says of a tensor."""

    ptr: int  # data + byte_offset
    dtype: str  # the weightbridge dtype ("" for raw integers: dtype= names it)
    type_name: str  # the DLPack dtype, for messages
    itemsize: int
    shape: Tuple[int, ...]
    strides: Optional[Tuple[int, ...]]  # elements; None: compact row-major
    device: int  # CUDA device index, -1 for host memory
    writeable: bool
    capsule: Any  # held while registered: keeps the memory alive


def _call_dlpack(x):
    """x.__dlpack__(), asking for a DLPack 1.0 capsule that is never a copy where the producer
    knows those arguments (array API 2023), the plain call where it does not (numpy < 2.1,
    torch < 2.4, CuPy < 13.3)."""
    try:
        return x.__dlpack__(max_version=(1, 0), copy=False)
    except TypeError:
        return x.__dlpack__()


def export(x) -> Exported:
    """Exports x through DLPack and reads the capsule. Raises ValueError for what weightbridge
    cannot register (a device it does not address, a dtype it does not move, a copy, a producer
    of another DLPack major version), naming the DLPack value."""
    try:
        dev = tuple(int(v) for v in x.__dlpack_device__())
    except Exception as e:  # noqa: BLE001 - any producer failure is the caller's message
        raise ValueError(f"__dlpack_device__() failed: {type(e).__name__}: {e}") from None
    if dev[0] not in (KDL_CPU, KDL_CUDA, KDL_CUDA_HOST):
        raise ValueError(
            f"DLPack device {device_name(*dev)} is not memory weightbridge reads or writes "
            "(CPU, CUDA or CUDAHost)"
        )
    try:
        capsule = _call_dlpack(x)
    except Exception as e:  # noqa: BLE001 - BufferError and the like, named
        raise ValueError(f"__dlpack__() failed: {type(e).__name__}: {e}") from None
    name = _get_name(capsule)
    if name == b"dltensor_versioned":
        m = DLManagedTensorVersioned.from_address(_get_pointer(capsule, name))
        if m.version.major != 1:
            raise ValueError(
                f"the DLPack capsule is of DLPack {m.version.major}.{m.version.minor}; "
                "weightbridge reads major version 1"
            )
        flags, t = int(m.flags), m.dl_tensor
    elif name == b"dltensor":
        flags, t = 0, DLManagedTensor.from_address(_get_pointer(capsule, name)).dl_tensor
    else:
        raise ValueError(f"__dlpack__() returned a capsule named {name!r}, not a DLPack tensor")
    if flags & FLAG_IS_COPIED:
        raise ValueError(
            "the DLPack export is a copy (flag IS_COPIED); weightbridge reads and writes "
            "registered memory in place"
        )
    code, bits, lanes = int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes)
    tname = type_name(code, bits, lanes)
    if lanes != 1 or (code, bits) not in DTYPES:
        raise ValueError(
            f"DLPack dtype {tname} (code {code}, bits {bits}, lanes {lanes}) is not one "
            "weightbridge moves"
        )
    kind, dev_id = int(t.device.device_type), int(t.device.device_id)
    if kind not in (KDL_CPU, KDL_CUDA, KDL_CUDA_HOST):  # the capsule's word is the last one
        raise ValueError(
            f"DLPack device {device_name(kind, dev_id)} is not memory weightbridge reads or "
            "writes (CPU, CUDA or CUDAHost)"
        )
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    strides = tuple(int(t.strides[i]) for i in range(ndim)) if t.strides else None
    if strides is not None and _compact(shape, strides):
        strides = None
    return Exported(
        ptr=int(t.data or 0) + int(t.byte_offset),
        dtype=DTYPES[(code, bits)],
        type_name=tname,
        itemsize=bits // 8,
        shape=shape,
        strides=strides,
        device=dev_id if kind == KDL_CUDA else -1,
        writeable=not flags & FLAG_READ_ONLY,
        capsule=capsule,
    )


def _compact(shape, strides) -> bool:
    """Row-major without gaps (numpy's C_CONTIGUOUS: a dim of size 1 may have any stride, an
    empty tensor is compact)."""
    if 0 in shape:
        return True
    want = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != want:
            return False
        want *= n
    return True


def state(x) -> Tuple[int, int, str]:
    """(address, bytes, dtype) of what x's DLPack export describes now, as _tensors.state()
    gives them for numpy and torch: a new export, whose capsule is dropped at once."""
    e = export(x)
    n = 1
    for d in e.shape:
        n *= d
    return e.ptr, n * e.itemsize, e.type_name
