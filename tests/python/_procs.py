"""What the Python end-to-end tests share: waiting for the processes of a job."""

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
