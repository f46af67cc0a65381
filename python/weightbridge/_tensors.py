"""What weightbridge needs to know of a tensor, from numpy arrays and torch tensors (CPU or CUDA,
plain or DTensor): its memory, dtype, local shape and strides, and — for a trainer's sharded
parameter — the global shape and the box of it this rank holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple


@dataclass
class Shard:
    """A trainer's piece of a global tensor, for tensors that are not DTensors: ``local`` holds
    rows/columns ``offset[d] .. offset[d] + local.shape[d]`` of the global tensor of shape
    ``shape`` (a numpy array or a torch tensor). ``placement``, when given, says how the tensor
    lies on the trainers' device mesh (``Trainer(mesh=...)``): per mesh dim ``None`` for
    replicated or the tensor dim it is sharded along (torch.chunk rule) — what a DTensor's
    placements say, so that the job needs no trainer layout file. ``dtype`` names the element
    type where ``local``'s own cannot (a numpy uint16 array holding bfloat16: "bf16")."""

    local: Any
    shape: Sequence[int]
    offset: Sequence[int]
    placement: Optional[Sequence[Optional[int]]] = None
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
    placement: Optional[Tuple[int, ...]] = None  # per mesh dim: -1 replicate, d: Shard(d)
    mesh: Optional[Tuple[Tuple[str, int], ...]] = None  # a DTensor's device mesh


_NUMPY_DTYPES = {"float16": "fp16", "float32": "fp32", "int32": "i32", "int64": "i64"}


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


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
    )


def _numpy_info(a, shape=None, offset=None) -> TensorInfo:
    import numpy as np

    if not isinstance(a, np.ndarray):
        raise TypeError(f"expected a numpy array or a torch tensor, got {type(a).__name__}")
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
    )


def info(x, dtype: Optional[str] = None) -> TensorInfo:
    """Describes x: a numpy array, a torch tensor or DTensor, or a Shard of one. ``dtype``
    names the element type where the array's own cannot (numpy uint16 holding bfloat16, uint8
    holding float8_e4m3fn)."""
    shape = offset = placement = None
    if isinstance(x, Shard):
        if x.placement is not None:
            placement = tuple(-1 if p is None else int(p) for p in x.placement)
        if dtype is None:
            dtype = x.dtype
        x, shape, offset = x.local, tuple(int(d) for d in x.shape), tuple(int(o) for o in x.offset)
    ti = _torch_info(x, shape, offset) if _is_torch(x) else _numpy_info(x, shape, offset)
    if placement is not None:
        ti.placement = placement
    if dtype is not None:
        ti.dtype = dtype
    if not ti.dtype:
        raise ValueError(
            "this array's dtype does not say which floating-point format it holds: pass dtype= "
            "('bf16', 'fp8_e4m3', ...)"
        )
    if len(ti.shape) != len(ti.local_shape) or len(ti.offset) != len(ti.local_shape):
        raise ValueError(
            f"shape {ti.shape} and offset {ti.offset} must have the local tensor's "
            f"{len(ti.local_shape)} dimensions"
        )
    return ti
