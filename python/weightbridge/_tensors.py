"""What weightbridge needs to know of a tensor, from numpy arrays and torch tensors (CPU or CUDA,
plain or DTensor) by their own attributes, and from any other object with ``__dlpack__`` (CuPy,
JAX, ...: _dlpack.py): its memory, dtype, local shape and strides, and — for a trainer's sharded
parameter — the global shape and the box of it this rank holds."""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

from . import _dlpack, _lib


@dataclass(frozen=True)
class At:
    """A placement for one mesh dim of a :class:`Shard`: only the ranks at coordinate ``index``
    of that dim hold the tensor (a pipeline stage's layers, an expert-parallel rank's experts);
    the ranks at other coordinates do not register it."""

    index: int

    def __post_init__(self):
        if not isinstance(self.index, int) or isinstance(self.index, bool) or self.index < 0:
            raise ValueError(f"At({self.index!r}): a mesh coordinate is an int >= 0")


def _place_value(p) -> int:
    """A Shard's placement entry as the wire carries it: -1 replicate, d >= 0 Shard(d),
    -2 - i At(i)."""
    if p is None:
        return -1
    if isinstance(p, At):
        return -2 - p.index
    if isinstance(p, bool) or not isinstance(p, int) or p < 0:
        raise ValueError(f"placement entry {p!r}: None (replicated), a tensor dim >= 0 or At(i)")
    return p


@dataclass
class Shard:
    """A trainer's piece of a global tensor, for tensors that are not DTensors: ``local`` holds
    rows/columns ``offset[d] .. offset[d] + local.shape[d]`` of the global tensor of shape
    ``shape`` (a numpy array or a torch tensor). ``placement``, when given, says how the tensor
    lies on the trainers' device mesh (``Trainer(mesh=...)``): per mesh dim ``None`` for
    replicated, the tensor dim it is sharded along (torch.chunk rule) — what a DTensor's
    placements say — or ``At(i)``: only the ranks at coordinate i of that dim hold it (pipeline
    stages, expert parallelism), so that the job needs no trainer layout file. ``dtype`` names the element
    type where ``local``'s own cannot (a numpy uint16 array holding bfloat16: "bf16")."""

    local: Any
    shape: Sequence[int]
    offset: Sequence[int]
    placement: Optional[Sequence[Any]] = None
    dtype: Optional[str] = None


@dataclass
class TensorInfo:
    ptr: int
    dtype: str  # a name wb_dtype_parse() accepts
    local_shape: Tuple[int, ...]
    strides: Optional[Tuple[int, ...]]  # elements; None: contiguous
    device: int  # CUDA device index, -1 for host memory
    shape: Tuple[int, ...]  # global shape
    offset: Tuple[int, ...]  # where the local box starts in the global tensor
    keep: Any  # the object that owns the memory (kept alive by the endpoint)
    placement: Optional[Tuple[int, ...]] = None  # per mesh dim: -1 replicate, d: Shard(d), -2-i: At(i)
    mesh: Optional[Tuple[Tuple[str, int], ...]] = None  # a DTensor's device mesh
    itemsize: int = 0  # bytes per element of the buffer itself (numpy itemsize, torch element_size)
    buffer: str = ""  # what the buffer holds, for messages: "numpy uint8", "torch.bfloat16"
    writeable: bool = True  # False for a read-only numpy array (bytes, a read-only mapping)
    src: Any = None  # the object registered (a DTensor, a Parameter): what state() re-reads
    hold: List[Any] = field(default_factory=list)  # what keeps the memory alive and in place


_NUMPY_DTYPES = {"float16": "fp16", "float32": "fp32", "int32": "i32", "int64": "i64"}


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _is_numpy(x) -> bool:
    np = sys.modules.get("numpy")  # never imported: x is no numpy array
    return np is not None and isinstance(x, np.ndarray)


def _dtensor_local(t):
    """(local tensor, global shape, global offset) of a DTensor, or None for a plain tensor."""
    try:
        from torch.distributed.tensor import DTensor  # PyTorch >= 2.4
    except ImportError:  # older PyTorch (or none with distributed)
        try:
            from torch.distributed._tensor import DTensor  # type: ignore
        except ImportError:
            return None
    if not isinstance(t, DTensor):
        return None
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    except ImportError:
        from torch.distributed._tensor._utils import compute_local_shape_and_global_offset  # type: ignore
    local = t.to_local()
    lshape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    if tuple(lshape) != tuple(local.shape):
        raise ValueError(
            f"DTensor local shape {tuple(local.shape)} differs from the placement's {tuple(lshape)}"
        )
    mesh = t.device_mesh
    ranks = mesh.mesh.flatten().tolist()
    if ranks != list(range(len(ranks))):
        raise ValueError(
            "the DTensor's device mesh does not number its ranks 0..N-1 row-major; weightbridge "
            "numbers trainer ranks that way"
        )
    names = mesh.mesh_dim_names or tuple(f"d{i}" for i in range(mesh.ndim))
    place = []
    for p in t.placements:
        if p.is_replicate():
            place.append(-1)
        elif p.is_shard():
            place.append(int(p.dim))
        else:
            raise ValueError(f"placement {p} (partial values) cannot be moved; reduce it first")
    dims = tuple((str(n), int(s)) for n, s in zip(names, mesh.mesh.shape))
    return local, tuple(int(d) for d in t.shape), tuple(int(o) for o in offset), tuple(place), dims


def _torch_raw(torch) -> Tuple[Any, ...]:
    """The torch integer dtypes that may hold another format's bits (torch.uint16 where the
    installed torch has it)."""
    names = ("uint8", "int8", "uint16", "int16")
    return tuple(getattr(torch, n) for n in names if getattr(torch, n, None) is not None)


def _torch_info(t, shape=None, offset=None) -> TensorInfo:
    import torch

    d = _dtensor_local(t)
    placement = mesh = None
    if d is not None:
        t, shape, offset, placement, mesh = d
    if t.dtype == torch.bfloat16:
        dt = "bf16"
    elif t.dtype == torch.float16:
        dt = "fp16"
    elif t.dtype == torch.float32:
        dt = "fp32"
    elif getattr(torch, "float8_e4m3fn", None) is not None and t.dtype == torch.float8_e4m3fn:
        dt = "fp8_e4m3"
    elif t.dtype == torch.int32:
        dt = "i32"
    elif t.dtype == torch.int64:
        dt = "i64"
    elif t.dtype in _torch_raw(torch):
        # raw bits, as numpy's uint8/uint16 are: bfloat16 or float8 an engine keeps as bytes
        # (vLLM's FP8 buffers on a torch without float8 dtypes); dtype= says which
        dt = ""
    else:
        raise ValueError(f"dtype {t.dtype} is not one weightbridge moves")
    local_shape = tuple(int(x) for x in t.shape)
    strides = tuple(int(s) for s in t.stride())
    contiguous = t.is_contiguous()
    device = t.device.index if t.device.type == "cuda" else -1
    if t.device.type == "cuda" and device is None:
        device = torch.cuda.current_device()
    return TensorInfo(
        ptr=int(t.data_ptr()),
        dtype=dt,
        local_shape=local_shape,
        strides=None if contiguous else strides,
        device=device,
        shape=tuple(shape) if shape is not None else local_shape,
        offset=tuple(offset) if offset is not None else (0,) * len(local_shape),
        keep=t,
        placement=placement,
        mesh=mesh,
        itemsize=int(t.element_size()),
        buffer=str(t.dtype),
    )


def _numpy_info(a, shape=None, offset=None) -> TensorInfo:
    name = a.dtype.name
    # numpy has no bfloat16 or float8: such tensors come as raw 16/8-bit arrays with the dtype
    # given by the caller (see info(..., dtype=...)).
    dt = _NUMPY_DTYPES.get(name)
    if dt is None and name not in ("uint16", "int16", "uint8", "int8"):
        raise ValueError(f"numpy dtype {name} is not one weightbridge moves")
    es = a.itemsize
    strides = tuple(s // es for s in a.strides)
    local_shape = tuple(int(x) for x in a.shape)
    return TensorInfo(
        ptr=int(a.ctypes.data),
        dtype=dt or "",
        local_shape=local_shape,
        strides=None if a.flags["C_CONTIGUOUS"] else strides,
        device=-1,
        shape=tuple(shape) if shape is not None else local_shape,
        offset=tuple(offset) if offset is not None else (0,) * len(local_shape),
        keep=a,
        itemsize=int(es),
        buffer=f"numpy {name}",
        writeable=bool(a.flags.writeable),
    )


def _dlpack_info(x, shape=None, offset=None) -> TensorInfo:
    """Any other tensor, read through its DLPack export (the capsule is held while registered)."""
    e = _dlpack.export(x)
    kind = type(x)
    return TensorInfo(
        ptr=e.ptr,
        dtype=e.dtype,
        local_shape=e.shape,
        strides=e.strides,
        device=e.device,
        shape=tuple(shape) if shape is not None else e.shape,
        offset=tuple(offset) if offset is not None else (0,) * len(e.shape),
        keep=x,
        itemsize=e.itemsize,
        buffer=f"DLPack {e.type_name} from {kind.__module__}.{kind.__qualname__}",
        writeable=e.writeable,
        hold=[e.capsule],
    )


def info(x, dtype: Optional[str] = None) -> TensorInfo:
    """Describes x: a numpy array, a torch tensor or DTensor, any other object with
    ``__dlpack__`` (CuPy, JAX, ...), or a Shard of one. ``dtype`` names the element type where
    the array's own cannot (numpy, torch or DLPack uint16 holding bfloat16, uint8 holding
    float8_e4m3fn; torch.float8_e4m3fn and DLPack's bfloat16 and float8_e4m3fn need none)."""
    shape = offset = placement = None
    if isinstance(x, Shard):
        if x.placement is not None:
            placement = tuple(_place_value(p) for p in x.placement)
        if dtype is None:
            dtype = x.dtype
        x, shape, offset = x.local, tuple(int(d) for d in x.shape), tuple(int(o) for o in x.offset)
    if _is_torch(x):
        ti = _torch_info(x, shape, offset)
    elif _is_numpy(x):
        ti = _numpy_info(x, shape, offset)
    elif _dlpack.has_dlpack(x):
        ti = _dlpack_info(x, shape, offset)
    else:
        raise TypeError(
            f"expected a numpy array, a torch tensor or an object with __dlpack__ (DLPack: CuPy, "
            f"JAX, ...), got {type(x).__module__}.{type(x).__qualname__}"
        )
    ti.src = x
    if placement is not None:
        ti.placement = placement
    if dtype is not None:
        ti.dtype = dtype
    if not ti.dtype:
        raise ValueError(
            "this array's dtype does not say which floating-point format it holds: pass dtype= "
            "('bf16', 'fp8_e4m3', ...)"
        )
    # every byte written or read is counted in the registered dtype's elements: a buffer of
    # smaller elements would be run past (a uint8 array registered as bf16 is half as long)
    size = _lib.dtype_size_of(ti.dtype)
    if size and size != ti.itemsize:
        raise ValueError(
            f"dtype {ti.dtype} has {size}-byte elements, but the buffer's itemsize is "
            f"{ti.itemsize} ({ti.buffer})"
        )
    if len(ti.shape) != len(ti.local_shape) or len(ti.offset) != len(ti.local_shape):
        raise ValueError(
            f"shape {ti.shape} and offset {ti.offset} must have the local tensor's "
            f"{len(ti.local_shape)} dimensions"
        )
    ti.hold = _hold(x) + ti.hold
    return ti


def _hold(x) -> List[Any]:
    """References that keep x's memory alive and where it is while it is registered. A torch
    tensor: a detached alias of its storage (survives ``p.data = other``, which would otherwise
    free the memory the peers write). A numpy array: weak references to it and to every array it
    is a view of — numpy refuses to reallocate an array that has one (``resize``, even with
    ``refcheck=False``: "cannot resize an array that references or is referenced by another
    array in this way"); dropping them (the endpoint's close) lets it resize again."""
    if _is_torch(x):
        local = x.to_local() if hasattr(x, "to_local") else x
        return [x, local.detach()]
    out: List[Any] = [x]
    a = x
    while a is not None and type(a).__module__ == "numpy" and hasattr(a, "base"):
        try:
            out.append(weakref.ref(a))
        except TypeError:
            break
        a = a.base
    return out


def state(x) -> Tuple[int, int, str]:
    """(address, bytes, dtype) of what x's memory is now — compared before every version with
    what was registered: weightbridge reads and writes registered memory in place."""
    if isinstance(x, Shard):
        x = x.local
    if _is_torch(x):
        t = x.to_local() if hasattr(x, "to_local") else x
        return int(t.data_ptr()), int(t.numel()) * int(t.element_size()), str(t.dtype)
    if _is_numpy(x):
        return int(x.ctypes.data), int(x.nbytes), str(x.dtype)
    return _dlpack.state(x)


def changes(was: Tuple[int, int, str], now: Tuple[int, int, str]) -> str:
    """How a buffer's state changed: "address 0x.. -> 0x.., 256 -> 512 bytes, dtype a -> b"."""
    out = []
    if was[0] != now[0]:
        out.append(f"address {was[0]:#x} -> {now[0]:#x}")
    if was[1] != now[1]:
        out.append(f"{was[1]} -> {now[1]} bytes")
    if was[2] != now[2]:
        out.append(f"dtype {was[2]} -> {now[2]}")
    return ", ".join(out)
