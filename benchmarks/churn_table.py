#!/usr/bin/env python3
"""The docs' churn table from sketchsgd_bench_churn's JSON lines (--out): federated rounds (C
clients sampled from N, each connecting, registering, pulling, pushing and leaving) against rounds
of C fixed workers. --write-docs first copies the inputs to docs/data/churn.jsonl, so the table can
be rebuilt from the repository alone.

    build/default/benchmarks/sketchsgd_bench_churn --out build/churn.jsonl ...
    .venv/bin/python benchmarks/churn_table.py build/churn.jsonl --write-docs
    .venv/bin/python benchmarks/churn_table.py --write-docs     # from docs/data/churn.jsonl as it is
"""
import argparse
import datetime
import os
import shutil

import doc_tables  # noqa: E402
from shards_table import MACHINE, ROOT, read_scale as read_lines  # noqa: E402

DATA = os.path.join(ROOT, "docs/data/churn.jsonl")


CHECK_IN = {"ahead": "while the round before runs", "round": "when their round starts"}


def table(runs, day):
    rows = []
    for r in runs:
        ahead = r.get("check_in", "round") == "ahead"
        rows.append([f"{r['d']:,}", f"`{r['spec']}`", r.get("io", "own"), r.get("work_ms", 0),
                     CHECK_IN[r.get("check_in", "round")], r["rounds"], f"{r['fixed_ms']:.1f}", f"{r['federated_ms']:.1f}",
                     f"{r['federated_ms'] / r['fixed_ms']:.1f}×", "—" if ahead else f"{r['join_ms']:.1f}",
                     f"{r['leave_ms']:.1f}", f"{r['server_cpu_ms_fixed']:.1f}", f"{r['server_cpu_ms_federated']:.1f}",
                     f"{r['client_cpu_ms_fixed']:.2f} / {r['client_cpu_ms_federated']:.2f}",
                     f"{r['rss_start_mb']:.1f} → {r['rss_end_mb']:.1f}"])
    first = runs[0]
    doc_tables.write(os.path.join(ROOT, "docs/data/tables/ps-churn.json"),
                     "build/default/benchmarks/sketchsgd_bench_churn --out F (options per row: d, codec, io, work-ms, rounds); "
                     ".venv/bin/python benchmarks/churn_table.py F --write-docs", day, MACHINE,
                     ["d", "codec", "clients' ZeroMQ context", "local work ms", "federated clients check in",
                      "rounds",
                      "fixed workers: round ms", "federated: round ms", "federated / fixed",
                      "join ms (median client)", "leave ms", "server CPU ms a round, fixed",
                      "server CPU ms a round, federated", "a client's CPU ms a round, fixed / federated",
                      "server memory MB, after warm-up → end (federated)"], rows,
                     data="docs/data/churn.jsonl",
                     note=f"C = {first['per_round']} clients a round from N = {first['population']:,} (federated) "
                          f"against {first['per_round']} fixed workers; the server a sketchsgd-server process, the "
                          "clients threads of the benchmark (one ZeroMQ context for all of them, or one each); a "
                          "round from the end of the one before (its last client's update) to its own end, median "
                          "after the warm-up rounds (2, or 20 in 300-round rows); local work: each client's (and "
                          "worker's) time between the model and its push, a sleep (devices compute side by side); "
                          "join: connecting, registering and the model, for clients that come when their round "
                          "starts.")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="sketchsgd_bench_churn --out files (default: docs/data/churn.jsonl)")
    ap.add_argument("--write-docs", action="store_true", help="copy the runs to docs/data/ and write the table")
    args = ap.parse_args()
    try:
        runs = read_lines(args.runs or [DATA])
    except (OSError, ValueError) as e:
        ap.error(f"runs: {e}")
    if not runs:
        ap.error("no runs")
    if not args.write_docs:
        for r in runs:
            print(r)
        return
    if args.runs:
        with open(DATA + ".new", "w") as out:
            for p in args.runs:
                with open(p) as f:
                    shutil.copyfileobj(f, out)
        os.replace(DATA + ".new", DATA)
    table(runs, datetime.date.today().isoformat())
    doc_tables.main([])


if __name__ == "__main__":
    main()
