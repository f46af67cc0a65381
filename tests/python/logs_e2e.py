#!/usr/bin/env python3
"""logs_e2e.py — what a user reads (issue #31 item 7): a healthy run prints no warning, and a job
that is not ready names every rank it waits for.

  healthy_quiet  the demo job with Python endpoints (4 trainers, 2 rollouts, three versions,
                 each closing its endpoint at the end), everything at WB_LOG=info: no process
                 prints a "warn" line (no "unknown session ... registering again", no "is
                 dead"); the controller logs each clean close as "<role> rank <r> left (it closed
                 its endpoint)"
  missing_ranks  the demo job with 2 of its 6 agents (wb-agent trainers 0 and 3): `wb-ctl status`
                 and `wb-ctl transfer` name the 4 missing ranks; a Python rollout (rank 0) whose
                 wait for the job times out names the 3 still missing in its Timeout; once it
                 closed, the status says it left; once trainer 3 is killed, that it is dead

Prints harness lines and the tally "N passed, N failed, N skipped".
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import endpoint_e2e as ee  # noqa: E402  (the demo model's tensors, processes, the controller)

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402

BIN = ee.BIN
TOKEN = ee.TOKEN


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def test_healthy_quiet(tmp):
    dump = os.path.join(tmp, "dump-quiet")
    os.makedirs(dump)
    old = os.environ.get("WB_LOG")
    os.environ["WB_LOG"] = "info"  # the controller and every endpoint say everything but debug
    try:
        c = ee.Controller(tmp)
        procs = []
        try:
            for r in range(2):
                procs.append((f"rollout {r}", ee.spawn("rollout", r, c.url, dump)))
            for r in range(ee.FSDP * ee.EP):
                procs.append((f"trainer {r}", ee.spawn("trainer", r, c.url)))
            outs = {}
            for name, p in procs:
                out, _ = p.communicate(timeout=180)
                outs[name] = out.decode()
                check(p.returncode == 0, f"{name} exited {p.returncode}:\n{outs[name]}")
        finally:
            for _, p in procs:
                if p.poll() is None:
                    p.kill()
            c.stop()
        outs["controller"] = open(c.log.name).read()
    finally:
        if old is None:
            os.environ.pop("WB_LOG")
        else:
            os.environ["WB_LOG"] = old
    for name, text in outs.items():
        warns = [line for line in text.splitlines() if re.search(r"\bwarn\b", line, re.I)]
        check(not warns, f"{name} warned in a healthy run:\n" + "\n".join(warns))
        check("registered, session" in text or name == "controller", f"{name} logged no info:\n{text}")
    left = [line for line in outs["controller"].splitlines() if " left (" in line]
    want = sorted(f"wb info controller: {role} rank {r} left (it closed its endpoint)"
                  for role, n in (("trainer", 4), ("rollout", 2)) for r in range(n))
    check(sorted(left) == want, "the controller's 'left' lines:\n" + "\n".join(left))


def ctl(c, *args):
    return subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", c.url, "--timeout", "10s", *args],
                          env=dict(os.environ, WB_TOKEN=TOKEN), capture_output=True, text=True, timeout=60)


def status_line(c):
    lines = [l for l in ctl(c, "status").stdout.splitlines() if l.startswith("waiting for ")]
    return lines[0] if lines else ""


def wait_status(c, want, what):
    for _ in range(600):  # a hang guard: the state changes as soon as the controller hears of it
        if status_line(c) == want:
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: status says\n  {status_line(c)}\nexpected\n  {want}")


def test_missing_ranks(tmp):
    c = ee.Controller(tmp)
    env = dict(os.environ, WB_TOKEN=TOKEN)
    procs = []
    try:
        for r in (0, 3):
            procs.append(subprocess.Popen([os.path.join(BIN, "wb-agent"), "--role", "trainer", "--rank", str(r),
                                           "--controller", c.url, "--tx-domain", "lo"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_status(c, "waiting for trainer ranks 1-2 (not registered); rollout ranks 0-1 "
                    "(not registered)", "2 trainers of 6 agents")
        res = ctl(c, "transfer", "--version", "1")
        check(res.returncode == 1 and res.stderr.strip() == "wb-ctl: not ready: waiting for trainer ranks 1-2 "
              "(not registered); rollout ranks 0-1 (not registered)", res.stdout + res.stderr)
        locs = ee.rollout_locals(0)
        bufs = {n: np.zeros(s, dtype=ee.NP[d]) for n, (d, s) in locs.items()}
        r = wb.Rollout(c.url, bufs, rank=0, token=TOKEN, dtypes={n: d for n, (d, _) in locs.items()},
                       tx_domain="lo", timeout=0)
        try:
            r.wait_ready(2)
            raise AssertionError("the job became ready with 3 agents of 6")
        except wb.Timeout as e:
            want = ("rollout rank 0: the job was not ready within 2.0 s: waiting for trainer ranks 1-2 "
                    "(not registered); rollout rank 1 (not registered)")
            check(str(e) == want, f"Timeout text\n  {e}\nexpected\n  {want}")
        r.close()
        wait_status(c, "waiting for trainer ranks 1-2 (not registered); rollout rank 0 (left); "
                    "rollout rank 1 (not registered)", "after the rollout closed")
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        wait_status(c, "waiting for trainer ranks 1-2 (not registered); trainer rank 3 (dead); "
                    "rollout rank 0 (left); rollout rank 1 (not registered)", "after trainer 3 was killed")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        c.stop()


def main():
    tests = [("healthy_quiet", test_healthy_quiet), ("missing_ranks", test_missing_ranks)]
    passed = failed = 0
    only = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="wb-py-logs.") as tmp:
        for name, fn in tests:
            if only and name not in only:
                continue
            print(f"python_logs {name} ...", flush=True)
            t0 = time.time()
            try:
                fn(tmp)
                print(f"ok python_logs {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                passed += 1
            except Exception:  # noqa: BLE001 - a test's failure is reported and counted
                print("    " + traceback.format_exc().replace("\n", "\n    "))
                print(f"FAIL python_logs {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                failed += 1
    print(f"{passed} passed, {failed} failed, 0 skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
