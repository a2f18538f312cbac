#!/usr/bin/env python3
"""The docs' table sim-soak from sketchsgd_sim's JSON lines (docs/data/sim-soak.jsonl): per job
kind, the seeded fault schedules run, the faults they injected, the jobs that finished, the ones
a clear error ended (grouped by why no server could serve) and the invariants broken (the soak
stops at the first and prints its seed and trace).

    build/default/tests/sim/sketchsgd_sim --seeds 1e6 --jobs 2 --out docs/data/sim-soak.jsonl
    .venv/bin/python benchmarks/sim_table.py [--date YYYY-MM-DD]
"""
import argparse
import collections
import os

import doc_tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs/data/sim-soak.jsonl")
MACHINE = "the 2-core dev machine (AMD EPYC Zen 4 under KVM, 2 threads)"
ORDER = ["rounds", "quorum", "stale", "async", "restart", "sharded", "federated"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    doc_tables.date_flag(ap)
    date = ap.parse_args(argv).date
    lines = doc_tables.read_jsonl(ap, DATA, "runs")
    kinds = collections.OrderedDict()
    for r in lines:  # several soaks add up, kind by kind
        k = kinds.setdefault(r["kind"], {"seeds": 0, "events": 0, "faults": 0, "finished": 0,
                                         "violations": 0, "ended": collections.Counter()})
        for f in ("seeds", "events", "faults", "finished", "violations"):
            k[f] += r[f]
        for why, (n, _seed) in r["ended"].items():
            k["ended"][why] += n
    rows, total = [], collections.Counter()
    for name in sorted(kinds, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
        k = kinds[name]
        early = k["seeds"] - k["finished"]
        top = "; ".join(f"{why} ({n:,})" for why, n in k["ended"].most_common(3))
        rows.append([name, f"{k['seeds']:,}", f"{k['faults']:,}", f"{k['events']:,}",
                     f"{k['finished']:,}", f"{early:,}" + (f": {top}" if top else ""), k["violations"]])
        for f in ("seeds", "events", "faults", "finished", "violations"):
            total[f] += k[f]
    rows.append(["all", f"{total['seeds']:,}", f"{total['faults']:,}", f"{total['events']:,}",
                 f"{total['finished']:,}", f"{total['seeds'] - total['finished']:,}", total["violations"]])
    runs = {(r["first"], r["wall_seconds"]) for r in lines}  # each soak writes a line a kind
    wall = sum(w for _, w in runs)
    doc_tables.write(os.path.join(ROOT, "docs/data/tables/sim-soak.json"),
                     f"build/default/tests/sim/sketchsgd_sim --seeds {total['seeds']} --jobs 2 "
                     "--out docs/data/sim-soak.jsonl",
                     date, MACHINE,
                     ["job kind", "schedules (seeds)", "faults injected", "events", "jobs finished",
                      "ended by a clear error: why (the commonest)", "invariants broken"],
                     rows, data="docs/data/sim-soak.jsonl",
                     note=f"Each seed draws a job kind, a codec (dense, top-k, FetchSGD, the two-round sketch, "
                          f"PowerSGD; one-round codecs for staleness, asynchronous and federated jobs) and 1-6 "
                          f"faults (partitions, SIGSTOP, kill -9, restarts) in the first 0.8 s of a 3-worker, "
                          f"6-round job (federated: 3 clients a round sampled from 9, 18 in all), and runs it "
                          f"in one process on a simulated clock; {wall:,.0f} s of wall time. \"Ended by a "
                          f"clear error\": every worker either finished or failed with an error the schedule "
                          f"explains: no server left that could serve it (named: which server, in what "
                          f"state), or a federated client's round closed without it.")


if __name__ == "__main__":
    main()
