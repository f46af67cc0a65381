"""Loading libweightbridge.so and declaring the C calls the package uses (ctypes).

The library is found, in order, at ``$WB_LIBRARY``, beside this package (the package ``make
python`` builds carries it), in the checkout's ``build/lib`` (running from a source tree), then
by the system's loader (``make install`` puts ``libweightbridge.so.0`` in ``$PREFIX/lib``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

# Project error codes (common/common.h); libc errno values are the usual ones. These copies and
# the structs of __init__.py are compared with C's by tests/unit/abi_test.c (make test).
WB_E_CONFIG = 256
WB_E_MATCH = 257
WB_E_PLAN = 258
WB_E_VERSION = 259
WB_E_TOKEN = 260
WB_E_PEER = 261
WB_E_CUDA = 262
WB_E_FABRIC = 263
WB_E_NOGPU = 264
WB_E_BOUNDS = 265
WB_E_ENDED = 266
WB_E_HELLO = 267

WB_PUSH_SOURCES = 1
WB_PUSH_DONE = 2
WB_PUSH_SKIPPED = 1  # wb_endpoint_wait_push: a newer push replaced the version
WB_PUSH_LATEST = 0
WB_PUSH_QUEUE = 1
WB_PUSH_SKIPPED_MAX = 32
WB_STAGE_NAMES = ("h2d", "gather", "fuse", "quant", "write", "barrier")  # enum wb_stage's order


def _candidates():
    env = os.environ.get("WB_LIBRARY")
    if env:
        yield env
    here = Path(__file__).resolve().parent
    yield str(here / "libweightbridge.so")
    for up in here.parents:
        p = up / "build" / "lib" / "libweightbridge.so"
        if p.exists():
            yield str(p)
            break
    found = ctypes.util.find_library("weightbridge")
    if found:
        yield found
    yield "libweightbridge.so.0"


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError(
        "weightbridge: cannot load libweightbridge.so (set WB_LIBRARY, or run `make` in the "
        "checkout, or `make install`); tried:\n  " + "\n  ".join(tried)
    )


lib, path = _load()

c_u64p = ctypes.POINTER(ctypes.c_uint64)
c_i64p = ctypes.POINTER(ctypes.c_int64)
c_charpp = ctypes.POINTER(ctypes.c_char_p)

HOOK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t)


def _decl(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


strerror = _decl("wb_strerror", ctypes.c_char_p, ctypes.c_int)
endpoint_open = _decl(
    "wb_endpoint_open_args", ctypes.c_int,
    ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_int32,
    ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64,
    ctypes.POINTER(ctypes.c_void_p), c_charpp,
)
endpoint_add = _decl(
    "wb_endpoint_add_args", ctypes.c_int,
    ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32, c_u64p, c_u64p, c_u64p,
    c_i64p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32),
)
endpoint_set_mesh = _decl(
    "wb_endpoint_set_mesh", ctypes.c_int,
    ctypes.c_void_p, ctypes.c_uint32, c_charpp, ctypes.POINTER(ctypes.c_uint32),
)
endpoint_set_hook = _decl("wb_endpoint_set_hook", None, ctypes.c_void_p, HOOK, ctypes.c_void_p)
endpoint_start = _decl("wb_endpoint_start", ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64)
endpoint_wait_ready = _decl("wb_endpoint_wait_ready", ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64)
endpoint_push = _decl("wb_endpoint_push", ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64)
endpoint_wait_push = _decl(
    "wb_endpoint_wait_push", ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int,
    ctypes.c_uint64,
)


class PushStats(ctypes.Structure):
    # struct wb_push_stats (agent/agent.h)
    _fields_ = [
        ("version", ctypes.c_uint64),
        ("skipped_by", ctypes.c_uint64),
        ("nskipped", ctypes.c_uint64),
        ("skipped", ctypes.c_uint64 * WB_PUSH_SKIPPED_MAX),
        ("failed", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("writes", ctypes.c_uint64),
        ("stage_ns", ctypes.c_uint64 * len(WB_STAGE_NAMES)),
        ("xfer_ns", ctypes.c_uint64),
        ("wait_ns", ctypes.c_uint64),
        ("total_ns", ctypes.c_uint64),
    ]


endpoint_set_push_policy = _decl("wb_endpoint_set_push_policy", ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
endpoint_push_stats = _decl(
    "wb_endpoint_push_stats", ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(PushStats),
)
endpoint_wait = _decl("wb_endpoint_wait", ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)
endpoint_version = _decl("wb_endpoint_version", ctypes.c_uint64, ctypes.c_void_p)
endpoint_torn = _decl("wb_endpoint_torn", ctypes.c_bool, ctypes.c_void_p)
endpoint_error = _decl("wb_endpoint_error", ctypes.c_char_p, ctypes.c_void_p)
endpoint_close = _decl("wb_endpoint_close", None, ctypes.c_void_p)
synth_fill = _decl(
    "wb_synth_fill_args", ctypes.c_int,
    ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint32, c_u64p,
    c_u64p, c_u64p, ctypes.c_void_p,
)
gpu_count = _decl("wb_gpu_count", ctypes.c_int)
_mode_name = _decl("wb_plan_mode_name", ctypes.c_char_p, ctypes.c_int)
_mode_parse = _decl("wb_plan_mode_parse", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))


def plan_modes():
    """The modes a plan can be asked for, name -> enum wb_plan_mode, from the library's one list
    (route/): the names wb_plan_mode_parse() accepts."""
    out, m = {}, 0
    while True:
        name = _mode_name(m)
        if name == b"invalid":
            return out
        v = ctypes.c_int()
        if _mode_parse(name, ctypes.byref(v)) == 0:
            out[name.decode()] = v.value
        m += 1
_dtype_parse = _decl("wb_dtype_parse", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))
_dtype_size = _decl("wb_dtype_size", ctypes.c_size_t, ctypes.c_int)


def dtype_size_of(name: str) -> int:
    """Bytes per element of a dtype name the library accepts ("bf16", "torch.float8_e4m3fn",
    ...); 0 for a name it does not (wb_endpoint_add then says so)."""
    dt = ctypes.c_int()
    if _dtype_parse(name.encode(), ctypes.byref(dt)) != 0:
        return 0
    return int(_dtype_size(dt.value))

_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None


def free(p):
    _libc.free(p)


def u64s(values):
    values = [int(v) for v in values]
    return (ctypes.c_uint64 * max(len(values), 1))(*values)


def i64s(values):
    values = [int(v) for v in values]
    return (ctypes.c_int64 * max(len(values), 1))(*values)


def errname(code: int) -> str:
    return strerror(code).decode()


TIMEOUT = -errno.ETIMEDOUT
