"""How the comparison scripts run a job of this repository (a Python driver of examples/ or a
built program): the job's label first, then its wall time or its exit status, so a long matrix
shows progress and a failed run is named once. Returns whether it succeeded."""

import json
import os
import subprocess
import time


def job(label: str, cmd, python: str = None, log: str = None, timeout: float = None) -> bool:
    """Runs cmd (a list) and waits. python: a build's package folder put first on the job's
    PYTHONPATH (an A/B of two builds). log: a file for the job's output (else it is ours).
    timeout: seconds before the job is killed (counted as failed)."""
    env = os.environ.copy()
    if python is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(python), env.get("PYTHONPATH")]))
    print(f"== {label}", flush=True)
    t = time.time()
    try:
        if log is None:
            rc = subprocess.run(cmd, env=env, timeout=timeout).returncode
        else:
            with open(log, "w") as f:
                rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"   FAILED: still running after {timeout:g} s" + (f" (see {log})" if log else ""), flush=True)
        return False
    if rc != 0:
        print(f"   FAILED (exit {rc})" + (f": see {log}" if log else ""), flush=True)
        return False
    print(f"   {time.time() - t:.0f} s", flush=True)
    return True


def cached(label: str, args, out: str, timeout: float = 1800) -> bool:
    """Runs a built program (args: the program, then its flags) with its output in the folder out
    (log.txt, and its own files), unless a run with the same flags finished there before (its
    summary.json and an args.json of those flags)."""
    stamp = os.path.join(out, "args.json")
    if os.path.exists(os.path.join(out, "summary.json")) and os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == list(args[1:]):
                print(f"  {label}: done before ({out})", flush=True)
                return True
    os.makedirs(out, exist_ok=True)
    if not job(label, args, log=os.path.join(out, "log.txt"), timeout=timeout):
        return False
    with open(stamp, "w") as f:
        json.dump(list(args[1:]), f)
    return True
