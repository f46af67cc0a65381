#!/usr/bin/env python3
"""dlpack_e2e.py — tensors given to weightbridge through DLPack (issue #31): any object with
__dlpack__/__dlpack_device__ (CuPy, JAX, ...) is read from its DLPack capsule. Two producers:

- numpy's own __dlpack__ (numpy >= 1.22; a legacy "dltensor" capsule), behind an object that
  has nothing but the two DLPack methods, as a CuPy or JAX array looks to the package;
- a producer written here on ctypes from dlpack.h (DLPack 1.0 "dltensor_versioned" capsules,
  or legacy ones), for what numpy cannot export: bfloat16 and float8 type codes, other devices,
  flags, a byte_offset, other DLPack versions. Its structs are written here, not taken from the
  package, and both are checked against dlpack.h's sizes and offsets.

Cases (real processes, the harness of _procs.py, the references of fp32_masters_e2e.py):
  structs          the package's and this producer's ctypes structs against dlpack.h's layout;
                   numpy's capsules read back (pointer, shape, strides of views, dtype)
  numpy_fp32_bf16  2 trainer processes register numpy float32 shards through numpy's DLPack
                   (no dtypes=), a rollout numpy uint16 buffers through it (dtypes= bf16);
                   every rollout byte of 2 versions against numpy's reference
  typed_bf16_fp8   trainers' bf16 shards as DLPack bfloat16 (code 4) at a byte_offset, FP8
                   rollout values as DLPack float8_e4m3fn (code 10), scales as numpy float32
                   through DLPack: no dtypes= anywhere; every rollout byte of 2 versions
  torch            torch tensors through their __dlpack__ (trainer float32 → rollout
                   bfloat16) and, where the torch has it, torch.float8_e4m3fn rollout
                   buffers; skipped where torch is not importable
  refusals         each exact error, naming the rank and tensor: dtypes weightbridge does not
                   move (float64, complex64, float8_e5m2, float8_e4m3 (not fn), bfloat16x2,
                   unknown codes), devices it does not address (ROCM, CUDAManaged, OpenCL), an
                   IS_COPIED export, a READ_ONLY export for a rollout (a trainer's is accepted),
                   numpy's refusal of a read-only array, DLPack 2.x, no __dlpack__ at all
  lifetime         the registration holds the producer's memory: with every reference of the
                   caller dropped, the array lives (numpy) and the deleter has not run (ours)
                   until close(), then it is freed, once per export
  moved            an object whose export now points elsewhere: push() and wait() refuse,
                   naming the tensor and both addresses

Usage: dlpack_e2e.py [case...]   (WB_BIN names the programs' directory)
Prints harness lines and the tally "N passed, N failed, N skipped".
"""

import ctypes
import gc
import json
import os
import random
import subprocess
import sys
import weakref

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402
from weightbridge import _dlpack  # noqa: E402

import _procs  # noqa: E402
import fp32_masters_e2e as ref  # noqa: E402  (the model, its masters and the numpy reference)

TOKEN = os.environ.setdefault("WB_E2E_TOKEN", "e2e-dlpack-%d" % random.randrange(1 << 30))
BIN = os.environ.get("WB_BIN", os.path.join(ROOT, "build/bin"))
URL0 = "tcp://127.0.0.1:9"  # the discard port: registrations that fail never connect
VERSIONS = (1, 2)
TRAINERS = ref.TRAINERS
# The cases in fp32_masters_e2e's table (FP8 rollout, mode, replicas, layout (derived), held
# dtype of a name), so that its write_case() and expected() serve them.
ref.CASES["numpy_fp32_bf16"] = (False, "auto", 1, None, lambda n: "fp32")
ref.CASES["typed_bf16_fp8"] = (True, "auto", 1, None, lambda n: "bf16")
ref.CASES["torch_fp32_bf16"] = (False, "auto", 1, None, lambda n: "fp32")
ref.CASES["torch_fp32_fp8"] = (True, "auto", 1, None, lambda n: "fp32")


class Skip(Exception):
    pass


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- producers


class Exporter:
    """Nothing but DLPack, from an object that has it (a numpy array, a torch tensor)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


# dlpack.h, written out again (not the package's): sizes and offsets are checked in `structs`
class Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", Device), ("ndim", ctypes.c_int32), ("dtype", DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class ManagedV(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", Tensor)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_new_capsule = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, DESTRUCTOR)(
    ("PyCapsule_New", ctypes.pythonapi))
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(("PyCapsule_GetName", ctypes.pythonapi))
_capsule_ptr = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
NAMES = {True: ctypes.c_char_p(b"dltensor_versioned"), False: ctypes.c_char_p(b"dltensor")}
LIVE = {}  # address of a managed struct -> what it keeps alive (the producer's side)
STATS = {"made": 0, "deleted": 0}


@DELETER
def _deleter(addr):
    LIVE.pop(addr)
    STATS["deleted"] += 1


@DESTRUCTOR
def _destructor(capsule):
    """A capsule nobody consumed (renamed used_dltensor*) frees its tensor: the producer's
    duty, as numpy's and torch's destructors do."""
    name = _capsule_name(capsule)
    if name.startswith(b"used_"):
        return
    addr = _capsule_ptr(capsule, name)
    ctypes.cast(ctypes.c_void_p.from_address(addr + (16 if name == b"dltensor_versioned" else 56)).value,
                DELETER)(addr)


class Made:
    """A producer over a numpy buffer: exports `a` with DLPack type (code, bits, lanes), on
    `device`, with `flags`, as a versioned (major.minor) or legacy capsule; `pad` bytes before
    the data are given as byte_offset."""

    def __init__(self, shape, np_dtype, code, bits, lanes=1, device=(1, 0), flags=0, versioned=True,
                 version=(1, 0), pad=0):
        itemsize = np.dtype(np_dtype).itemsize
        n = int(np.prod(shape)) if shape else 1
        self.buf = np.zeros(pad + n * itemsize, np.uint8)
        self.a = self.buf[pad:].view(np_dtype).reshape(shape)  # what the caller reads and writes
        self.code, self.bits, self.lanes, self.device = code, bits, lanes, device
        self.flags, self.versioned, self.version, self.pad = flags, versioned, version, pad

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, copy=None, dl_device=None):
        versioned = self.versioned and max_version is not None
        shape = (ctypes.c_int64 * max(1, self.a.ndim))(*self.a.shape)
        strides = (ctypes.c_int64 * max(1, self.a.ndim))(*[s // self.a.itemsize for s in self.a.strides])
        m = ManagedV() if versioned else Managed()
        t = m.dl_tensor
        t.data, t.byte_offset = self.buf.ctypes.data, self.pad
        t.device = Device(*self.device)
        t.ndim, t.dtype = self.a.ndim, DType(self.code, self.bits, self.lanes)
        t.shape, t.strides = shape, strides
        m.deleter = ctypes.cast(_deleter, ctypes.c_void_p).value
        if versioned:
            m.major, m.minor = self.version
            m.flags = self.flags
        addr = ctypes.addressof(m)
        LIVE[addr] = (m, shape, strides, self.buf)
        STATS["made"] += 1
        return _new_capsule(addr, NAMES[versioned], _destructor)


raises = _procs.raises


def rollout0(tensors, dtypes=None):
    return wb.Rollout(URL0, tensors, rank=0, token=TOKEN, dtypes=dtypes, timeout=0)


def trainer0(tensors, dtypes=None):
    return wb.Trainer(URL0, tensors=tensors, rank=0, token=TOKEN, dtypes=dtypes, timeout=0)


# ---------------------------------------------------------------- cases without a job


def test_structs(_tmp):
    # dlpack.h on LP64: DLTensor 48 bytes (shape at 24, byte_offset at 40), DLManagedTensor 64
    # (deleter at 56), DLManagedTensorVersioned 80 (flags at 24, dl_tensor at 32)
    for mod in ((_dlpack.DLTensor, _dlpack.DLManagedTensor, _dlpack.DLManagedTensorVersioned),
                (Tensor, Managed, ManagedV)):
        T, M, V = mod
        got = (ctypes.sizeof(T), T.shape.offset, T.byte_offset.offset, ctypes.sizeof(M), M.deleter.offset,
               ctypes.sizeof(V), V.flags.offset, V.dl_tensor.offset, V.deleter.offset)
        assert got == (48, 24, 40, 64, 56, 80, 24, 32, 16), (T.__module__, got)
    a = np.arange(48, dtype=np.float32).reshape(6, 8)
    for view, strides in ((a, None), (a[:, ::2], (8, 2)), (a[2:, 3:], (8, 1)), (a[1:2, :], None), (a.T, (1, 8))):
        e = _dlpack.export(Exporter(view))
        got = (e.ptr, e.shape, e.strides, e.dtype, e.itemsize, e.device, e.writeable)
        assert got == (view.ctypes.data, view.shape, strides, "fp32", 4, -1, True), got
    for np_t, want in ((np.float16, "fp16"), (np.int32, "i32"), (np.int64, "i64"), (np.uint8, ""),
                       (np.int8, ""), (np.uint16, ""), (np.int16, "")):
        assert _dlpack.export(Exporter(np.zeros(3, np_t))).dtype == want, np_t
    # ours, legacy and versioned, at a byte_offset
    for versioned in (False, True):
        m = Made((4, 4), np.uint16, 4, 16, pad=64, versioned=versioned)
        e = _dlpack.export(m)
        assert (e.ptr, e.dtype, e.type_name, e.shape) == (m.a.ctypes.data, "bf16", "bfloat16", (4, 4)), e
    del e, m
    gc.collect()
    assert not LIVE, LIVE


def test_refusals(_tmp):
    r = "rollout rank 0: w: "
    moves = "is not one weightbridge moves"
    cases = [
        (Exporter(np.zeros(4)), f"DLPack dtype float64 (code 2, bits 64, lanes 1) {moves}"),
        (Exporter(np.zeros(4, np.complex64)), f"DLPack dtype complex64 (code 5, bits 64, lanes 1) {moves}"),
        (Made((4,), np.uint8, 12, 8), f"DLPack dtype float8_e5m2 (code 12, bits 8, lanes 1) {moves}"),
        (Made((4,), np.uint8, 8, 8), f"DLPack dtype float8_e4m3 (code 8, bits 8, lanes 1) {moves}"),
        (Made((4,), np.uint8, 11, 8), f"DLPack dtype float8_e4m3fnuz (code 11, bits 8, lanes 1) {moves}"),
        (Made((4,), np.uint32, 4, 16, lanes=2), f"DLPack dtype bfloat16x2 (code 4, bits 16, lanes 2) {moves}"),
        (Made((4,), np.uint8, 99, 8), f"DLPack dtype unknown (code 99, bits 8, lanes 1) {moves}"),
        (Made((4,), np.float32, 2, 32, device=(10, 0)),
         "DLPack device ROCM:0 is not memory weightbridge reads or writes (CPU, CUDA or CUDAHost)"),
        (Made((4,), np.float32, 2, 32, device=(13, 0)),
         "DLPack device CUDAManaged:0 is not memory weightbridge reads or writes (CPU, CUDA or CUDAHost)"),
        (Made((4,), np.float32, 2, 32, device=(4, 1)),
         "DLPack device OpenCL:1 is not memory weightbridge reads or writes (CPU, CUDA or CUDAHost)"),
        (Made((4,), np.float32, 2, 32, flags=2),
         "the DLPack export is a copy (flag IS_COPIED); weightbridge reads and writes registered memory "
         "in place"),
        (Made((4,), np.float32, 2, 32, version=(2, 0)),
         "the DLPack capsule is of DLPack 2.0; weightbridge reads major version 1"),
        (Made((4,), np.float32, 2, 32, flags=1),
         "the buffer is read-only (DLPack float32 from __main__.Made, its export is flagged READ_ONLY); "
         "a rollout's tensors are written in place"),
        (Exporter(np.zeros(4, np.uint8)), "this array's dtype does not say which floating-point format it holds: "
         "pass dtype= ('bf16', 'fp8_e4m3', ...)"),
    ]
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    try:
        ro.__dlpack__()
        numpy_ro = None  # a numpy that exports read-only arrays flags them: the READ_ONLY case
    except BufferError as e:
        numpy_ro = f"__dlpack__() failed: BufferError: {e}"
        cases.append((Exporter(ro), numpy_ro))
    for obj, want in cases:
        raises(ValueError, r + want, rollout0, {"w": obj})
    raises(ValueError, r + "dtype bf16 has 2-byte elements, but the buffer's itemsize is 1 (DLPack uint8 from "
           "__main__.Exporter)", rollout0, {"w": Exporter(np.zeros(4, np.uint8))}, {"w": "bf16"})
    raises(TypeError, r + "expected a numpy array, a torch tensor or an object with __dlpack__ (DLPack: CuPy, "
           "JAX, ...), got builtins.list", rollout0, {"w": [1.0, 2.0]})
    raises(ValueError, "trainer rank 0: w: DLPack dtype float8_e5m2 (code 12, bits 8, lanes 1) " + moves,
           trainer0, {"w": Made((4,), np.uint8, 12, 8)})
    # a trainer only reads: a READ_ONLY export is fine there; so is a legacy capsule, which
    # cannot say read-only, of a producer that knows no max_version
    trainer0({"w": Made((4,), np.float32, 2, 32, flags=1)}).close()
    trainer0({"w": Made((4,), np.float32, 2, 32, versioned=False)}).close()
    gc.collect()
    assert not LIVE, f"{len(LIVE)} exports were never freed"


def test_lifetime(_tmp):
    a = np.zeros((8, 8), np.float32)
    alive = weakref.ref(a)
    m = Made((8, 8), np.uint16, 4, 16)
    r = rollout0({"numpy": Exporter(a), "made": m})
    del a, m
    gc.collect()
    assert alive() is not None, "numpy's array was freed while registered"
    assert len(LIVE) == 1, f"{len(LIVE)} of our exports alive while registered (1: the one held)"
    r.close()
    gc.collect()
    assert alive() is None, "numpy's array outlived close()"
    assert not LIVE and STATS["made"] == STATS["deleted"], (LIVE, STATS)


def test_moved(_tmp):
    e = Exporter(np.zeros(64, np.float32))
    t = trainer0({"w": e})
    was = e.a.ctypes.data
    e.a = np.zeros(64, np.float32)  # the object now exports other memory
    raises(wb.WeightbridgeError, f"trainer rank 0: version 1 not pushed: w: its memory changed since it was "
           f"registered (address {was:#x} -> {e.a.ctypes.data:#x}); weightbridge reads registered memory in "
           "place", t.push, 1)
    t.close()
    e = Exporter(np.zeros(64, np.uint16))
    r = rollout0({"w": e}, {"w": "bf16"})
    e.a = e.a.view(np.int16)
    raises(wb.WeightbridgeError, "rollout rank 0: w: its memory changed since it was registered (dtype uint16 -> "
           "int16); weightbridge writes registered memory in place: this Rollout is closed (register again)",
           r.wait, 1, 1)
    e2 = Made((4,), np.float32, 2, 32)
    t = trainer0({"w": e2})
    e2.code = 5  # its export now says complex: re-reading it fails, naming the tensor
    raises(wb.WeightbridgeError, "trainer rank 0: version 1 not pushed: w: cannot be read again (DLPack dtype "
           "complex32 (code 5, bits 32, lanes 1) is not one weightbridge moves); weightbridge reads registered "
           "memory in place", t.push, 1)
    t.close()


# ---------------------------------------------------------------- jobs


def torch_or_skip():
    try:
        import torch
    except ImportError:
        raise Skip("torch is not importable") from None
    return torch


def run_trainer(case, rank, url):
    held = ref.CASES[case][4]
    step, tensors = {}, {}
    for name, shape in ref.named_parameters(ref.CONFIG):
        off, n = ref.chunk(shape[0], TRAINERS, rank)
        lshape = (n,) + tuple(shape[1:])
        if case == "typed_bf16_fp8":
            m = Made(lshape, np.uint16, 4, 16, pad=256)  # DLPack bfloat16 at a byte_offset
            obj, arr = m, m.a
        elif case.startswith("torch"):
            import torch
            t = torch.zeros(lshape, dtype=torch.float32)
            obj, arr = Exporter(t), t.numpy()
        else:
            arr = np.zeros(lshape, ref.NP_OF[held(name)])
            obj = Exporter(arr)
        step[name] = (arr, shape, off, n)
        tensors[name] = wb.Shard(obj, shape, (off,) + (0,) * (len(shape) - 1), (0,))
    t = wb.Trainer(url, tensors=tensors, rank=rank, token=TOKEN, tx_domain="lo", timeout=60,
                   mesh=[("d0", TRAINERS)])
    for v in VERSIONS:
        for name, (arr, shape, off, n) in step.items():  # the optimizer step, in place
            arr[...] = ref.master(name, shape, v, held(name), ref.CASES[case][0])[off:off + n]
        p = t.push(v)
        p.sources(60)
        assert p.result(60).version == v
    t.close()


def run_rollout(case, rank, url, tmp):
    with open(os.path.join(tmp, "locals.json")) as f:
        local = json.load(f)
    bufs, objs, dtypes = {}, {}, {}
    for l in local:
        name, shape, dt = l["name"], l["shape"], l["dtype"]
        if case == "typed_bf16_fp8" and dt in ("bf16", "fp8_e4m3"):
            m = Made(shape, np.uint16 if dt == "bf16" else np.uint8, 4 if dt == "bf16" else 10,
                     16 if dt == "bf16" else 8)
            objs[name], bufs[name] = m, m.a
        elif case.startswith("torch"):
            import torch
            if dt == "fp8_e4m3" and getattr(torch, "float8_e4m3fn", None) is not None:
                t = torch.zeros(shape, dtype=torch.float8_e4m3fn)  # torch >= 2.1: as it is
                objs[name], bufs[name] = t, t.view(torch.uint8).numpy()
            else:
                np_t = {"bf16": np.int16, "fp8_e4m3": np.uint8, "fp32": np.float32}[dt]  # torch < 2.3: no uint16
                t = torch.from_numpy(np.zeros(shape, np_t))
                objs[name], bufs[name] = Exporter(t), t.numpy()
                if dt != "fp32":
                    dtypes[name] = dt  # torch's uint8/int16 exports: raw bits, dtype= says which
        else:
            arr = np.zeros(shape, ref.NP[dt])
            objs[name], bufs[name] = Exporter(arr), arr
            if dt != "fp32":
                dtypes[name] = dt
    total = sum(b.nbytes for b in bufs.values())
    differ = {}

    def hook(v):
        want = ref.expected(case, local, v)
        bad, differ[v] = [], 0
        for name, b in bufs.items():
            n = int((b.view(np.uint8) != want[name].view(np.uint8)).sum())
            if n:
                bad.append(f"{name}: {n} of {b.nbytes} bytes")
                differ[v] += n
        log(f"case {case}: rollout {rank} version {v}: {differ[v]} of {total} bytes differ")
        if bad:
            raise ValueError(f"{len(bad)} of {len(bufs)} tensors differ: " + "; ".join(bad[:12]))

    r = wb.Rollout(url, objs, rank=rank, token=TOKEN, dtypes=dtypes, hook=hook, tx_domain="lo", timeout=60)
    for v in VERSIONS:
        assert r.wait(v, 60) >= v
    assert sorted(differ) == list(VERSIONS) and not any(differ.values()), differ
    r.close()


def run_job(case, tmp):
    d = os.path.join(tmp, case)
    os.makedirs(d)
    paths = ref.write_case(case, d)
    plan = wb.plan(os.path.join(ROOT, "configs/models/qwen3.yaml"), paths["config.json"], paths["trainer.yaml"],
                   paths["rollout.yaml"], tables=True)
    with open(os.path.join(d, "locals.json"), "w") as f:
        json.dump(plan["receive"][0]["local"], f)
    url = f"tcp://127.0.0.1:{20000 + random.randrange(12000)}"
    env = dict(os.environ, WB_TOKEN=TOKEN)
    clog = open(os.path.join(d, "controller.log"), "w")
    cp = subprocess.Popen([os.path.join(BIN, "wb-controller"), "--config", paths["job.yaml"], "--listen", url],
                          env=env, stdout=clog, stderr=subprocess.STDOUT)
    spawn = lambda *a: subprocess.Popen([sys.executable, __file__, *map(str, a)], env=env,  # noqa: E731
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    procs = []
    try:
        procs = [("rollout", 0, spawn("rollout", case, 0, url, d))]
        procs += [("trainer", r, spawn("trainer", case, r, url, d)) for r in range(TRAINERS)]
        _procs.wait_all(procs, 120, log)
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", url, "--timeout", "10s", "shutdown"], env=env,
                       capture_output=True, timeout=30)
        try:
            cp.wait(20)
        except subprocess.TimeoutExpired:
            cp.kill()
            cp.wait()
        clog.close()


def test_torch(tmp):
    torch = torch_or_skip()
    run_job("torch_fp32_bf16", tmp)
    if getattr(torch, "float8_e4m3fn", None) is None:
        log(f"    torch {torch.__version__} has no float8_e4m3fn: its FP8 rollout buffers not run")
        return
    run_job("torch_fp32_fp8", tmp)


def main():
    tests = [("structs", test_structs), ("refusals", test_refusals), ("lifetime", test_lifetime),
             ("moved", test_moved),
             ("numpy_fp32_bf16", lambda t: run_job("numpy_fp32_bf16", t)),
             ("typed_bf16_fp8", lambda t: run_job("typed_bf16_fp8", t)),
             ("torch", test_torch)]
    return _procs.run_tests("python_dlpack", tests, sys.argv[1:], "wb-py-dlpack.", skip=Skip)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("trainer", "rollout"):
        role, case, rank, url, tmp = sys.argv[1:6]
        try:
            if role == "trainer":
                run_trainer(case, int(rank), url)
            else:
                run_rollout(case, int(rank), url, tmp)
        except wb.WeightbridgeError as e:
            print(e, flush=True)
            sys.exit(3)
    else:
        sys.exit(main())
