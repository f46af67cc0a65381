#!/usr/bin/env python3
"""signals_e2e.py — `import weightbridge` and a running endpoint leave the process's signal
handling alone (issue #31 item 3). Debian's libfabric loads libinfinipath, whose constructor
installs its own SIGINT/SIGTERM/SIGSEGV handlers (Ctrl-C: exit 1, no KeyboardInterrupt, no
`finally:`); the library loads libfabric only when a transport opens, with those handlers kept.

  sigint_sigterm  the demo job (a controller, wb-agent rollouts and trainers 2 and 3) with two
                  Python trainer processes, ranks 0 and 1, that import weightbridge, register
                  their shards and wait until the job is ready (the transport open, libfabric and
                  its provider libraries loaded: each reports which from /proc/self/maps). Then
                  SIGINT to rank 0 gives KeyboardInterrupt there: it prints "KeyboardInterrupt",
                  runs its `finally:` and exits 7; SIGTERM to rank 1 ends it by the signal
                  (returncode -15) without a line after "ready".

Prints harness lines and the tally "N passed, N failed, N skipped".
"""

import faulthandler
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# A process started in the background by a shell without job control (`make test &`, some CI
# runners) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the
# child would sleep through the test's SIGINT. Give it the handler an interactive python has,
# before weightbridge is imported — what the test checks is that the library leaves it there.
if sys.argv[1:2] == ["child"] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import endpoint_e2e as ee  # noqa: E402  (the demo model's shards, the controller)

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402

BIN = ee.BIN
TOKEN = ee.TOKEN


def child(rank, url):
    """A trainer rank that waits for a signal once its job is ready."""
    faulthandler.register(signal.SIGUSR1)  # the test asks where it stands before a kill
    shards = ee.trainer_shards(rank)
    arrays = {name: np.zeros(local, dtype=np.uint16) for name, (_, _, local) in shards.items()}
    tensors = {name: wb.Shard(arrays[name], shape, off) for name, (shape, off, _) in shards.items()}
    t = wb.Trainer(url, tensors=tensors, rank=rank, token=TOKEN, dtypes={n: "bf16" for n in shards},
                   tx_domain="lo", timeout=120)
    with open("/proc/self/maps") as f:
        maps = f.read()
    libs = [lib for lib in ("libfabric.so", "libpsm_infinipath.so", "libinfinipath.so") if lib in maps]
    print("loaded: " + " ".join(libs), flush=True)
    try:  # before "ready": the signal may come as soon as the line is out
        print("ready", flush=True)
        for _ in range(12000):  # two minutes at most (longer than the test waits for the exit)
            time.sleep(0.01)
        print("no signal came", flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
        sys.exit(7)
    finally:
        print("finally", flush=True)
        t.close()


def read_until(p, want, limit):
    """Lines of p's output up to and including `want` (fails at EOF or after `limit` seconds)."""
    lines = []
    end = time.time() + limit
    while time.time() < end:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line.decode().rstrip("\n"))
        if lines[-1] == want:
            return lines
    raise AssertionError(f"no '{want}' line; output so far:\n" + "\n".join(lines))


def finish(p, what):
    """p's output after the signal; a process still running 60 s later is killed and its output
    (where it stood: no KeyboardInterrupt, or stuck in `finally:`) is the failure."""
    try:
        out, _ = p.communicate(timeout=60)
        return out
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)  # its threads' Python stacks, then the kill
        time.sleep(1)
        p.kill()
        out, _ = p.communicate()
        raise AssertionError(f"{what}: still running 60 s later; output after ready: {out.decode()!r}")


def test_sigint_sigterm(tmp):
    c = ee.Controller(tmp)
    env = dict(os.environ, WB_TOKEN=TOKEN)
    env.pop("IPATH_NO_BACKTRACE", None)  # the library sets it itself
    procs = []
    try:
        for r in range(2):
            procs.append(subprocess.Popen([os.path.join(BIN, "wb-agent"), "--role", "rollout", "--rank", str(r),
                                           "--controller", c.url, "--tx-domain", "lo"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for r in (2, 3):
            procs.append(subprocess.Popen([os.path.join(BIN, "wb-agent"), "--role", "trainer", "--rank", str(r),
                                           "--controller", c.url, "--tx-domain", "lo"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        kids = [subprocess.Popen([sys.executable, __file__, "child", str(r), c.url], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in (0, 1)]
        procs += kids
        for k in kids:
            lines = read_until(k, "ready", 120)
            loaded = [l for l in lines if l.startswith("loaded:")]
            if not loaded or "libfabric.so" not in loaded[0]:
                raise AssertionError("the transport did not load libfabric:\n" + "\n".join(lines))
        kids[0].send_signal(signal.SIGINT)
        out0 = finish(kids[0], "SIGINT")
        rest0 = out0.decode().splitlines()
        if kids[0].returncode != 7 or rest0[:2] != ["KeyboardInterrupt", "finally"]:
            raise AssertionError(f"SIGINT: exit {kids[0].returncode}, output after ready: {rest0}")
        kids[1].send_signal(signal.SIGTERM)
        out1 = finish(kids[1], "SIGTERM")
        if kids[1].returncode != -signal.SIGTERM or out1.decode().strip():
            raise AssertionError(f"SIGTERM: exit {kids[1].returncode}, output after ready: {out1.decode()!r}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        c.stop()


def main():
    tests = [("sigint_sigterm", test_sigint_sigterm)]
    passed = failed = 0
    only = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="wb-py-sig.") as tmp:
        for name, fn in tests:
            if only and name not in only:
                continue
            print(f"python_signals {name} ...", flush=True)
            t0 = time.time()
            try:
                fn(tmp)
                print(f"ok python_signals {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                passed += 1
            except Exception:  # noqa: BLE001 - a test's failure is reported and counted
                print("    " + traceback.format_exc().replace("\n", "\n    "))
                print(f"FAIL python_signals {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                failed += 1
    print(f"{passed} passed, {failed} failed, 0 skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(int(sys.argv[2]), sys.argv[3])
    else:
        random.seed()
        sys.exit(main())
