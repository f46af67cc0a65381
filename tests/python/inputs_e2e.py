#!/usr/bin/env python3
"""inputs_e2e.py — what the Python package does with buffers it must not write or read as
registered: each case gets its exact error, naming the tensor, before anything is sent, and no
byte outside the buffer is touched.

  itemsize        a uint8 array registered as bf16 (half the bytes the dtype needs): refused
                  for rollouts and trainers; synth_fill leaves the bytes after it alone
  read_only       a rollout buffer backed by bytes, or with flags.writeable False: refused;
                  a trainer's (only read) is accepted
  resize_pinned   a registered array, or the array it is a view of, cannot be reallocated
                  (resize, even with refcheck=False) while registered; after close() it can
  changed_push    a trainer tensor whose memory changed since registration (here its dtype):
                  push() raises naming it, and nothing is pushed
  changed_wait    the same at a rollout: wait() raises naming it and closes the Rollout (which
                  then answers version/torn as they were, and raises "closed" for the rest)
  released        after close() nothing of the package refers to a registered array any more
                  (a Rollout's hook held them until the Rollout itself was collected)
  torch_raw       torch uint8/int8/uint16 tensors holding float8/bfloat16 bits: accepted with
                  dtype= (as numpy's are), refused without; torch.float8_e4m3fn accepted as is
                  (skipped where torch is not importable)

No controller is needed: endpoints are made with timeout=0 against a port nothing listens on
(a registration that was refused never opened one). The in-flight case — a rollout's tensor
changed while a version lands, which fails the version at every trainer — is
endpoint_e2e.py's moved_buffer.

Prints harness lines and the tally "N passed, N failed, N skipped".
"""

import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402

import _procs  # noqa: E402

URL = "tcp://127.0.0.1:9"  # the discard port: nothing of ours listens there
TOKEN = "inputs-test"


raises = _procs.raises


def rollout(tensors, dtypes=None):
    return wb.Rollout(URL, tensors, rank=0, token=TOKEN, dtypes=dtypes, timeout=0)


def trainer(tensors, dtypes=None):
    return wb.Trainer(URL, tensors=tensors, rank=0, token=TOKEN, dtypes=dtypes, timeout=0)


def test_itemsize():
    guard = np.full(512, 0xAB, dtype=np.uint8)
    buf = guard[:256]  # 256 bytes, which bf16 [256] would need twice over
    want = "{} rank 0: w: dtype bf16 has 2-byte elements, but the buffer's itemsize is 1 (numpy uint8)"
    raises(ValueError, want.format("rollout"), rollout, {"w": buf}, {"w": "bf16"})
    raises(ValueError, want.format("trainer"), trainer, {"w": buf}, {"w": "bf16"})
    # a float32 array named as bf16, and a float8 name for uint16 bits, likewise
    raises(ValueError, "rollout rank 0: x: dtype bf16 has 2-byte elements, but the buffer's itemsize is 4 "
           "(numpy float32)", rollout, {"x": np.zeros(8, np.float32)}, {"x": "bf16"})
    raises(ValueError, "rollout rank 0: y: dtype fp8_e4m3 has 1-byte elements, but the buffer's itemsize "
           "is 2 (numpy uint16)", rollout, {"y": np.zeros(8, np.uint16)}, {"y": "fp8_e4m3"})
    # synth_fill writes in the dtype's elements too: refused before a byte is written
    raises(ValueError, "synth_fill w: dtype bf16 has 2-byte elements, but the buffer's itemsize is 1 "
           "(numpy uint8)", wb.synth_fill, buf, "w", 42, 1, (256,), (0,), "bf16")
    assert (guard == 0xAB).all(), "bytes of the guard were written"
    # the right buffer is accepted: uint16 bits of bf16, float16 bits named bf16 (same size)
    r = rollout({"w": np.zeros(256, np.uint16), "v": np.zeros(4, np.float16)}, {"w": "bf16", "v": "bf16"})
    r.close()


def test_read_only():
    data = np.frombuffer(b"\0" * 64, dtype=np.uint16)
    raises(ValueError, "rollout rank 0: w: the buffer is read-only (numpy uint16, flags.writeable is "
           "False); a rollout's tensors are written in place", rollout, {"w": data}, {"w": "bf16"})
    frozen = np.zeros(16, np.float32)
    frozen.flags.writeable = False
    raises(ValueError, "rollout rank 0: f: the buffer is read-only (numpy float32, flags.writeable is "
           "False); a rollout's tensors are written in place", rollout, {"f": frozen})
    raises(ValueError, "synth_fill f: out is read-only (numpy float32)", wb.synth_fill, frozen, "f", 42, 1,
           (16,), (0,), "fp32")
    assert (frozen == 0).all()
    t = trainer({"w": data}, {"w": "bf16"})  # a trainer only reads its tensors
    t.close()


def test_resize_pinned():
    a = np.zeros(64, np.uint16)
    big = np.zeros(256, np.uint16)
    view = big[:64]
    r = rollout({"a": a, "v": view}, {"a": "bf16", "v": "bf16"})
    where = (a.ctypes.data, big.ctypes.data)
    for arr in (a, big):
        try:
            arr.resize(4096, refcheck=False)
            raise AssertionError("a registered array was reallocated")
        except ValueError as e:
            assert str(e).startswith("cannot resize an array that references or is referenced"), str(e)
    assert (a.ctypes.data, big.ctypes.data) == where and a.shape == (64,) and big.shape == (256,)
    r.close()
    a.resize(4096, refcheck=False)  # no longer registered: the pins went with the endpoint
    assert a.shape == (4096,)


def test_changed_push():
    a = np.zeros(64, np.uint16)
    t = trainer({"w": a}, {"w": "bf16"})
    a.dtype = np.float16  # same memory, another element type: the trainer would send it as bf16
    raises(wb.WeightbridgeError, "trainer rank 0: version 1 not pushed: w: its memory changed since it "
           "was registered (dtype uint16 -> float16); weightbridge reads registered memory in place",
           t.push, 1)
    a.dtype = np.uint16
    t.close()
    raises(wb.WeightbridgeError, "trainer rank 0: closed", t.push, 1)
    raises(wb.WeightbridgeError, "trainer rank 0: closed", wb.Push(t, 1).result, 1)
    assert t.version == 0


def test_changed_wait():
    a = np.zeros(64, np.uint16)
    r = rollout({"w": a}, {"w": "bf16"})
    a.dtype = np.float16
    raises(wb.WeightbridgeError, "rollout rank 0: w: its memory changed since it was registered (dtype "
           "uint16 -> float16); weightbridge writes registered memory in place: this Rollout is closed "
           "(register again)", r.wait, 1, 1)
    raises(wb.WeightbridgeError, "rollout rank 0: closed", r.wait, 1, 1)
    raises(wb.WeightbridgeError, "rollout rank 0: closed", r.wait_ready, 1)
    assert r.version == 0 and r.torn is False  # as they were when it closed, no crash
    a.dtype = np.uint16
    a.resize(128, refcheck=False)  # closed: nothing holds it any more


def test_released():
    import gc
    import weakref

    for make, dtypes in ((rollout, {"w": "bf16"}), (trainer, {"w": "bf16"})):
        a = np.zeros(64, np.uint16)
        alive = weakref.ref(a)
        ep = make({"w": a}, dtypes)
        del a
        gc.collect()
        assert alive() is not None, "a registered array was freed while registered"
        ep.close()
        gc.collect()
        assert alive() is None, f"{type(ep).__name__}.close() left the registered array referenced"


class Skip(Exception):
    pass


def test_torch_raw():
    """torch uint8/int8/uint16 buffers hold float8/bfloat16 bits as numpy's do: accepted with
    dtype=, refused without (the same message as numpy's); torch.float8_e4m3fn needs no dtype=;
    a float8 format weightbridge does not move is refused by name."""
    try:
        import torch
    except ImportError:
        raise Skip("torch is not importable") from None
    w8 = torch.zeros(256, dtype=torch.uint8)
    s = torch.zeros(2, dtype=torch.float32)
    r = rollout({"w": w8, "s": s}, {"w": "fp8_e4m3"})
    r.close()
    t = trainer({"w": torch.zeros(8, dtype=torch.int8)}, {"w": "fp8_e4m3"})
    t.close()
    if getattr(torch, "uint16", None) is not None:
        r = rollout({"w": torch.zeros(8, dtype=torch.uint16)}, {"w": "bf16"})
        r.close()
    raises(ValueError, "rollout rank 0: w: this array's dtype does not say which floating-point format it "
           "holds: pass dtype= ('bf16', 'fp8_e4m3', ...)", rollout, {"w": w8})
    raises(ValueError, "rollout rank 0: w: dtype bf16 has 2-byte elements, but the buffer's itemsize is 1 "
           "(torch.uint8)", rollout, {"w": w8}, {"w": "bf16"})
    if getattr(torch, "float8_e4m3fn", None) is not None:
        r = rollout({"w": torch.zeros(8, dtype=torch.float8_e4m3fn)})
        r.close()
    if getattr(torch, "float8_e5m2", None) is not None:
        raises(ValueError, "rollout rank 0: w: dtype torch.float8_e5m2 is not one weightbridge moves", rollout,
               {"w": torch.zeros(8, dtype=torch.float8_e5m2)})


def main():
    tests = [("itemsize", test_itemsize), ("read_only", test_read_only), ("resize_pinned", test_resize_pinned),
             ("changed_push", test_changed_push), ("changed_wait", test_changed_wait),
             ("released", test_released), ("torch_raw", test_torch_raw)]
    passed = failed = skipped = 0
    only = sys.argv[1:]
    for name, fn in tests:
        if only and name not in only:
            continue
        print(f"python_inputs {name} ...", flush=True)
        t0 = time.time()
        try:
            fn()
            print(f"ok python_inputs {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
            passed += 1
        except Skip as e:
            print(f"SKIP python_inputs {name}: skipped: {e}", flush=True)
            skipped += 1
        except Exception:  # noqa: BLE001 - a test's failure is reported and counted
            print("    " + traceback.format_exc().replace("\n", "\n    "))
            print(f"FAIL python_inputs {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
            failed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
