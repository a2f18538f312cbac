#!/usr/bin/env python3
"""The docs' table ps-flood from sketchsgd_bench_flood JSON lines (docs/data/ps-flood.jsonl): a
replicated primary's rounds without and with a flood of Follow requests, one row a run, and what
the flood cost the primary (its CPU a Follow, its memory).

    build/default/benchmarks/sketchsgd_bench_flood --rounds 40 [--flood-cpu 1] --out docs/data/ps-flood.jsonl
    .venv/bin/python benchmarks/flood_table.py [--date YYYY-MM-DD]
"""
import argparse
import os

import doc_tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs/data/ps-flood.jsonl")
MACHINE = "the 2-core dev machine (AMD EPYC Zen 4 under KVM, 2 threads)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    doc_tables.date_flag(ap)
    date = ap.parse_args(argv).date
    runs = doc_tables.read_jsonl(ap, DATA, "runs")
    rows = []
    for r in runs:
        # The primary's extra CPU over the flooded phase (its rounds less one), a Follow sent.
        extra = (r["cpu_ms_round_flooded"] - r["cpu_ms_round_quiet"]) * (r["rounds"] - 1)
        rss = r["rss_mb"]
        pinned = r.get("flood_cpu", -1)
        rows.append([f"{r['follows']:,}", r["connections"],
                     f"CPU {pinned}, the job on the others" if pinned >= 0 else "no (shares the job's CPUs)", f"{r['quiet_ms']:.2f}", f"{r['flooded_ms']:.2f}",
                     f"{r['flooded_ms'] / r['quiet_ms']:.2f}×",
                     f"{r['cpu_ms_round_quiet']:.2f} / {r['cpu_ms_round_flooded']:.2f}",
                     f"{1000 * extra / r['follows']:.1f}", f"{rss[3] - rss[2]:+.1f}",
                     "finished" if r["primary_exit"] == 0 else f"exit {r['primary_exit']}"])
    r0 = runs[0]
    doc_tables.write(os.path.join(ROOT, "docs/data/tables/ps-flood.json"),
                     "build/default/benchmarks/sketchsgd_bench_flood --rounds 40 [--follows 100000] [--flood-cpu 1]", date,
                     MACHINE,
                     ["Follows sent", "connections", "flood pinned", "round ms, quiet", "round ms, flooded", "flooded / quiet",
                      "primary's CPU ms a round (quiet / flooded)", "primary's CPU µs a Follow",
                      "primary's memory over the flood, MB", "the job"],
                     rows, data="docs/data/ps-flood.jsonl",
                     note=f"A sketchsgd-server primary and its backup (`--replica-of`), two worker threads, "
                          f"`{r0['spec']}` at d = {r0['d']:,}, all on 127.0.0.1; {r0['rounds']} quiet rounds, then "
                          f"{r0['rounds']} while a thread of the benchmark sends valid Follows of the job as fast as "
                          "ZeroMQ takes them (they reach the primary over the first few of those rounds). Median "
                          "round; CPU and resident memory of the primary process from /proc. One row a run, "
                          "one after another. Pinned (`--flood-cpu`), the flooding thread and its ZeroMQ I/O "
                          "thread run on one CPU and everything else on the other, as a flood from another "
                          "host would leave the primary's machine.")
    doc_tables.main([])


if __name__ == "__main__":
    main()
