"""What the Python end-to-end tests share: waiting for the processes of a job, the harness, an
exact-error check."""

import os
import shutil
import subprocess
import time


def stacks(pid):
    """Every thread's stack of a live process, as gdb prints them (the evidence of a hang), or
    why there is none."""
    gdb = shutil.which("gdb")
    if not gdb:
        return "(no stacks: gdb is not installed)"
    try:
        # not under the sanitizer runtime the tests preload for the library
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
        r = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"],
                           capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        return "(no stacks: gdb did not finish in 60 s)"
    lines = [l for l in r.stdout.splitlines() if l.startswith(("Thread ", "#"))]
    return "\n".join(lines) or f"(no stacks: gdb printed none: {r.stderr.strip()[-300:]})"


def wait_all(procs, seconds, log):
    """Waits for every (role, rank, Popen) in procs within one deadline of `seconds`. Lines a
    process printed that start with "case " are logged. The first failure (an exit status not 0,
    or no exit in time) kills the others, which would only wait for it, and is raised as an
    AssertionError with that process's output (and, for one that did not exit, its threads'
    stacks). $WB_TEST_WAIT_S, when set, replaces `seconds` (to catch a rare hang sooner)."""
    seconds = float(os.environ.get("WB_TEST_WAIT_S") or seconds)
    deadline = time.time() + seconds
    failed = None
    for role, r, p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            st = stacks(p.pid)
            p.kill()
            out, _ = p.communicate()
            failed = failed or (f"{role} {r} did not finish in {seconds:g} s:\n{out.decode()}\n"
                                f"its stacks:\n{st}")
            continue
        text = out.decode()
        for line in text.splitlines():
            if line.startswith("case "):
                log("    " + line)
        if p.returncode != 0:
            failed = failed or f"{role} {r} exited {p.returncode}:\n{text}"
            for _, _, q in procs:
                if q.poll() is None:
                    q.kill()
    if failed:
        raise AssertionError(failed)


def chunk(n, parts, i):
    """torch.chunk's (and FSDP2's Shard(0)) piece i of n rows in `parts` pieces: (offset, length)."""
    size = -(-n // parts)
    off = min(i * size, n)
    return off, max(0, min(size, n - off))


def run_tests(prefix, tests, only, tmp_prefix, skip=None):
    """Runs the (name, fn(tmpdir)) pairs named in `only` (all when empty) in one temporary
    directory, printing the harness lines ("<prefix> <name> ...", "ok ...", "FAIL ..." with the
    traceback, "SKIP <prefix> <name>: skipped: <reason>" for a test that raised `skip`, an
    exception class) and the tally; returns the exit status (2 for a name no test has)."""
    import tempfile
    import traceback

    names = [n for n, _ in tests]
    unknown = [c for c in only if c not in names]
    if unknown:
        print(f"unknown case(s) {unknown}; cases: {' '.join(names)}")
        return 2
    passed = failed = skipped = 0
    with tempfile.TemporaryDirectory(prefix=tmp_prefix) as tmp:
        for name, fn in tests:
            if only and name not in only:
                continue
            print(f"{prefix} {name} ...", flush=True)
            t0 = time.time()
            try:
                fn(tmp)
                print(f"ok {prefix} {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                passed += 1
            except Exception as e:  # noqa: BLE001 - a skip, or a test's failure, reported and counted
                if skip is not None and isinstance(e, skip):
                    print(f"SKIP {prefix} {name}: skipped: {e}", flush=True)
                    skipped += 1
                    continue
                print("    " + traceback.format_exc().replace("\n", "\n    "))
                print(f"FAIL {prefix} {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                failed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def raises(exc, want, fn, *args, **kw):
    """fn(*args, **kw) raises exc with exactly the text want."""
    try:
        fn(*args, **kw)
    except exc as e:
        if str(e) != want:
            raise AssertionError(f"{exc.__name__} text\n  {e}\nexpected\n  {want}") from None
        return
    raise AssertionError(f"no {exc.__name__}: expected\n  {want}")


def checked_rollout(wb, url, rank, token, case, local, want_of, versions, log):
    """A rollout process's whole life in the byte-checking tests: numpy buffers for `local` (the
    local tensors wb.plan() lists for this rank: name, dtype, shape), registered with wb.Rollout;
    its post-update hook compares every byte with want_of(v) ({name: array}, computed by the
    test independently) before the version counts, so no later version can land meanwhile, and
    fails the version naming the tensors that differ. Waits for every version and asserts each
    was checked and none differed."""
    import numpy as np

    np_of = {"bf16": np.uint16, "fp8_e4m3": np.uint8, "fp32": np.float32}
    bufs = {l["name"]: np.zeros(l["shape"], np_of[l["dtype"]]) for l in local}
    total = sum(b.nbytes for b in bufs.values())
    differ = {}

    def hook(v):
        want = want_of(v)
        bad, differ[v] = [], 0
        for name, b in bufs.items():
            w = want[name]
            if list(w.shape) != list(b.shape):
                raise ValueError(f"{name}: rank {rank} holds {list(b.shape)}, expected {list(w.shape)}")
            # the same element size: the expected bits as they are (a uint32 array may hold
            # FP32 bits); another size: converted to the buffer's type
            w = w.view(b.dtype) if w.dtype.itemsize == b.dtype.itemsize else w.astype(b.dtype)
            n = int((b.view(np.uint8) != w.view(np.uint8)).sum())
            if n:
                bad.append(f"{name}: {n} of {b.nbytes} bytes")
                differ[v] += n
        log(f"case {case}: rollout {rank} version {v}: {differ[v]} of {total} bytes differ")
        if bad:
            raise ValueError(f"{len(bad)} of {len(bufs)} tensors differ: " + "; ".join(bad[:12]))

    r = wb.Rollout(url, bufs, rank=rank, token=token, dtypes={l["name"]: l["dtype"] for l in local},
                   hook=hook, tx_domain="lo", timeout=60)
    for v in versions:
        assert r.wait(v, 60) >= v
    assert sorted(differ) == list(versions) and not any(differ.values()), differ
    r.close()


def child_or_main(argv, run_trainer, run_rollout, main, error):
    """A test file's entry: `trainer|rollout CASE RANK URL TMP` runs that process of a job (exit 3
    with the message on an `error`, the weightbridge exception type), anything else the tests."""
    if len(argv) > 1 and argv[1] in ("trainer", "rollout"):
        role, case, rank, url, tmp = argv[1:6]
        try:
            (run_trainer if role == "trainer" else run_rollout)(case, int(rank), url, tmp)
        except error as e:
            print(e, flush=True)
            return 3
        return 0
    return main()
