"""What the Python end-to-end tests share: waiting for the processes of a job, the harness, an
exact-error check."""

import subprocess
import time


def wait_all(procs, seconds, log):
    """Waits for every (role, rank, Popen) in procs within one deadline of `seconds`. Lines a
    process printed that start with "case " are logged. The first failure (an exit status not 0,
    or no exit in time) kills the others, which would only wait for it, and is raised as an
    AssertionError with that process's output."""
    deadline = time.time() + seconds
    failed = None
    for role, r, p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            failed = failed or f"{role} {r} did not finish in {seconds} s:\n{out.decode()}"
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
