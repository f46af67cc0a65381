#!/usr/bin/env python3
"""errors_e2e.py — the C library's error codes reach Python as exception classes (issue #31
item 7): one subclass of WeightbridgeError per project code and per errno value an endpoint
returns, so a retry loop tells "the job ended" from "timed out" from "refused" by class.

  classes     every class is a WeightbridgeError; the code -> class table covers every WB_E_*
              code the package knows; Timeout is also the built-in TimeoutError
  job_ended   a rollout of the demo job (a real controller): wait() before anything happened
              raises Timeout; `wb-ctl shutdown` makes the next wait() raise JobEnded with the
              endpoint's reason; after close(), Closed
  refused     a rollout registering a tensor the job does not have: ConfigError listing it
  invalid     a trainer pushing a version twice: InvalidArgument

Prints harness lines and the tally "N passed, N failed, N skipped".
"""

import os
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import endpoint_e2e as ee  # noqa: E402  (the demo model's tensors, the controller)

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402
from weightbridge import _errors, _lib  # noqa: E402

TOKEN = ee.TOKEN


def raises(exc, want, fn, *args, **kw):
    """fn(*args, **kw) raises exactly class exc with the text want."""
    try:
        fn(*args, **kw)
    except wb.WeightbridgeError as e:
        if type(e) is not exc or str(e) != want:
            raise AssertionError(f"{type(e).__name__}: {e}\nexpected {exc.__name__}: {want}") from None
        return e
    raise AssertionError(f"no {exc.__name__}: expected\n  {want}")


def rollout_bufs(rank):
    locs = ee.rollout_locals(rank)
    bufs = {name: np.zeros(shape, dtype=ee.NP[dt]) for name, (dt, shape) in locs.items()}
    return bufs, {n: dt for n, (dt, _) in locs.items()}


def test_classes(tmp):
    codes = {name: getattr(_lib, name) for name in dir(_lib) if name.startswith("WB_E_")}
    assert len(codes) == 12, codes
    for name, code in codes.items():
        e = _errors.error(-code, "x")
        assert type(e) is not wb.WeightbridgeError and isinstance(e, wb.WeightbridgeError), name
        assert e.code == -code and str(e) == "x"
    assert type(_errors.error(-_lib.WB_E_ENDED, "")) is wb.JobEnded
    assert type(_errors.error(-_lib.WB_E_PEER, "")) is wb.PeerError
    t = _errors.error(-110, "late")
    assert isinstance(t, TimeoutError) and isinstance(t, wb.Timeout) and isinstance(t, wb.WeightbridgeError)
    assert type(_errors.error(-12345, "?")) is wb.WeightbridgeError  # a code without a class
    for n in _errors.NAMES:
        assert n in wb.__all__ and issubclass(getattr(wb, n), wb.WeightbridgeError), n


def test_job_ended(tmp):
    c = ee.Controller(tmp)
    try:
        bufs, dtypes = rollout_bufs(0)
        r = wb.Rollout(c.url, bufs, rank=0, token=TOKEN, dtypes=dtypes, tx_domain="lo", timeout=0)
        e = raises(wb.Timeout, "version 1 did not complete within 0.3 s (this rank holds 0)", r.wait, 1, 0.3)
        assert isinstance(e, TimeoutError)
        res = c.ctl("shutdown")
        assert res.returncode == 0, res.stdout + res.stderr
        raises(wb.JobEnded, "rollout rank 0: the controller ended the job", r.wait, 1, 60)
        r.close()
        raises(wb.Closed, "rollout rank 0: closed", r.wait, 1, 1)
    finally:
        c.stop()


def test_refused(tmp):
    c = ee.Controller(tmp)
    try:
        bufs, dtypes = rollout_bufs(0)
        bufs["model.extra.weight"] = np.zeros(8, np.uint16)
        dtypes["model.extra.weight"] = "bf16"
        try:
            wb.Rollout(c.url, bufs, rank=0, token=TOKEN, dtypes=dtypes, tx_domain="lo", timeout=60)
            raise AssertionError("a registration with an extra tensor was accepted")
        except wb.ConfigError as e:
            assert e.code == -_lib.WB_E_CONFIG and "model.extra.weight" in str(e), str(e)
    finally:
        c.stop()


def test_invalid(tmp):
    t = wb.Trainer("tcp://127.0.0.1:9", tensors={"w": np.zeros(8, np.uint16)}, rank=0, token=TOKEN,
                   dtypes={"w": "bf16"}, timeout=0)
    try:
        t.push(1)
        raises(wb.InvalidArgument, "push: version 1 is not newer than the versions pushed before", t.push, 1)
    finally:
        t.close()


def main():
    tests = [("classes", test_classes), ("job_ended", test_job_ended), ("refused", test_refused),
             ("invalid", test_invalid)]
    passed = failed = 0
    only = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="wb-py-err.") as tmp:
        for name, fn in tests:
            if only and name not in only:
                continue
            print(f"python_errors {name} ...", flush=True)
            t0 = time.time()
            try:
                fn(tmp)
                print(f"ok python_errors {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                passed += 1
            except Exception:  # noqa: BLE001 - a test's failure is reported and counted
                print("    " + traceback.format_exc().replace("\n", "\n    "))
                print(f"FAIL python_errors {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                failed += 1
    print(f"{passed} passed, {failed} failed, 0 skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
