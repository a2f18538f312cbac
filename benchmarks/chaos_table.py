#!/usr/bin/env python3
"""The docs' table chaos-soak from scripts/chaos.py's JSON lines (docs/data/chaos-soak.jsonl): real
replicated jobs (a primary, its backup, W workers on test hosts in network namespaces) under kill
-9, SIGSTOP/SIGCONT and link cuts, by codec: the faults injected, the jobs that finished, those
whose every round had every worker (and so must end bit for bit as without faults), updates lost
or applied twice, the jobs that ended with a clear error and why, the time from a fault's end to
the next round.

    sudo .venv/bin/python scripts/chaos.py --minutes 30 --out docs/data/chaos-soak.jsonl
    .venv/bin/python benchmarks/chaos_table.py [--date YYYY-MM-DD]
"""
import argparse
import collections
import os
import re
import statistics

import doc_tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs/data/chaos-soak.jsonl")
MACHINE = "the 2-core dev machine (AMD EPYC Zen 4 under KVM, 2 threads)"



def settle(job):
    """The fields of a record from before chaos.py told a worker that outlived the job's bound
    from a server left waiting: a process killed at the end (-9) that no fault killed."""
    if "servers_left" in job:
        return job
    killed = {f["who"] for f in job["faults"] if f["kind"] == "kill"}
    job["servers_left"] = [s for s in ("primary", "backup")
                           if job["exit"].get(s) == -9 and s not in killed]
    job["hung"] = any(code == -9 for who, code in job["exit"].items() if who.startswith("w"))
    job["problems"] = [p for p in job["problems"] if "outlived" not in p or job["hung"]]
    return job


def why(job):
    """What ended a job early: how its workers ended, and what became of each server."""
    errors = " ".join(job["worker_errors"].values())
    killed = {f["who"] for f in job["faults"] if f["kind"] == "kill"}

    def fate(s):
        if s in killed:
            return "killed"
        if s in job["servers_left"]:
            return "left waiting"
        # Status 0 is a server that stopped on its own: its job done, or (a backup) behind the
        # workers and silent for ten finish-waits.
        return {0: "stopped", 4: "deposed"}.get(job["exit"].get(s), f"exit {job['exit'].get(s)}")

    if "keeps away from older servers" in errors:
        # The worker's promise to a probing backup (docs/ARCHITECTURE.md, "Replicated servers").
        return (f"workers timed out, promised to a backup taking over: primary {fate('primary')}, "
                f"backup {fate('backup')}")
    if "no answer from" in errors:
        return f"workers timed out: primary {fate('primary')}, backup {fate('backup')}"
    return errors[:80] or "unknown"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    doc_tables.date_flag(ap)
    date = ap.parse_args(argv).date
    jobs = [settle(j) for j in doc_tables.read_jsonl(ap, DATA, "jobs")]
    by = collections.OrderedDict()
    for j in jobs:
        by.setdefault(j["codec"], []).append(j)
    rows = []

    def row(name, js):
        faults = collections.Counter(f["kind"] for j in js for f in j["faults"])
        rec = [x for j in js for x in j["recover_s"]]
        early = collections.Counter(why(j) for j in js if not j["finished"])
        rows.append([name, len(js), sum(faults.values()),
                     ", ".join(f"{k} {faults[k]}" for k in ("kill", "sigstop", "cut") if faults[k]),
                     sum(j["finished"] for j in js), sum(j["whole"] and j["finished"] for j in js),
                     sum(j["lost_or_twice"] for j in js), sum(j["duplicate_rounds"] for j in js),
                     "; ".join(f"{w} ({n})" for w, n in early.most_common(2)) or "none",
                     sum(bool(j["servers_left"]) for j in js),
                     f"{statistics.median(rec):.2f} / {max(rec):.2f}" if rec else "",
                     sum(bool(j["problems"]) for j in js)])

    for codec, js in by.items():
        row(f"`{codec}`", js)
    row("all", jobs)
    minutes = sum(j["seconds"] for j in jobs) / 60
    doc_tables.write(os.path.join(ROOT, "docs/data/tables/chaos-soak.json"),
                     "sudo .venv/bin/python scripts/chaos.py --minutes 30 --out docs/data/chaos-soak.jsonl",
                     date, MACHINE,
                     ["codec", "jobs", "faults", "of which", "finished", "whole (bit for bit checked)",
                      "updates lost or applied twice", "rounds ended twice on a server",
                      "ended early by a clear error: why", "servers left waiting",
                      "recovery s, median / max", "invariants broken"],
                     rows, data="docs/data/chaos-soak.jsonl",
                     note=f"{len(jobs)} jobs one after another, {minutes:.0f} minutes of jobs: a "
                          f"sketchsgd-server primary, its backup (`--replica-of`) and 3 sketchsgd_test_worker "
                          f"processes, each on a test host of its own (network namespaces on one bridge), "
                          f"`--policy wait`, 120 rounds at d = 4,000; up to 8 faults a job, one every 0.4-2 s: "
                          f"kill -9 of a server (one a job, while both run), SIGSTOP of any process for "
                          f"0.2-2 s, a host's link cut for 0.2-2 s. \"Whole\": every round had every worker, "
                          f"so the job must end bit for bit as the same job without faults (run first); "
                          f"\"recovery\": from a fault's end (or a kill) to the next round's end.")


if __name__ == "__main__":
    main()
