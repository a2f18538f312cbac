#!/usr/bin/env python3
"""The count sketch's accumulate on a GPU by tiles against by columns, as a docs table: reads what
`bash scripts/gpu.sh accumulate` writes (Google Benchmark's JSON, Nsight Compute's counters of
both kernels, bench_round.py's JSON) and writes docs/data/tables/accumulate-gpu.json.

    python3 benchmarks/accumulate_table.py --kernels K.json --ncu-tiles T.txt --ncu-columns C.txt \\
        --round R.json --machine "the lent H200 (...)" --date YYYY-MM-DD
    python3 scripts/doc_tables.py      # then the block in docs/BENCHMARKS.md
"""
import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import doc_tables  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
D, C = 134217728, 1048576
UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "inst": 1, "sector": 1, "%": 1,
         "us": 1, "ms": 1e3, "ns": 1e-3}


def medians(path):
    """Benchmark name (without /manual_time) → median real time in ms."""
    with open(path) as f:
        runs = json.load(f)["benchmarks"]
    return {b["run_name"].removesuffix("/manual_time"): b["real_time"] for b in runs
            if b.get("aggregate_name") == "median"}


def counters(path):
    """Nsight Compute's `metric unit value` lines of one kernel → metric: value in base units."""
    out = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"\s+([a-z_]+__[\w.]+)\s+(\S+)\s+([\d,.]+)\s*$", line)
            if m and m.group(2) in UNITS:
                out[m.group(1)] = float(m.group(3).replace(",", "")) * UNITS[m.group(2)]
    if "gpu__time_duration.sum" not in out:
        raise SystemExit(f"accumulate_table.py: no Nsight Compute counters in {path}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", required=True)
    ap.add_argument("--ncu-tiles", required=True)
    ap.add_argument("--ncu-columns", required=True)
    ap.add_argument("--round", required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "data", "tables", "accumulate-gpu.json"))
    a = ap.parse_args()
    for path in (a.kernels, a.ncu_tiles, a.ncu_columns, a.round):
        if not os.path.isfile(path):
            ap.error(f"no file {path}")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", a.date):
        ap.error(f"--date {a.date!r} is not YYYY-MM-DD")
    try:
        ms = medians(a.kernels)
    except (OSError, ValueError, KeyError) as e:
        ap.error(f"{a.kernels}: not Google Benchmark's JSON ({e})")
    ncu = {"tiles": counters(a.ncu_tiles), "columns": counters(a.ncu_columns)}
    with open(a.round) as f:
        fetch = [r["encode_sum_ms"] for r in json.load(f)["results"] if r["fetch"]]

    def row(what, name, base, kernel=None):
        for n in (name, base):
            if n not in ms:
                ap.error(f"{a.kernels} has no {n} (gpu.sh accumulate's benchmarks)")
        t = ms[name]
        cells = [what, f"{t:.3f}", f"{ms[base] / t:.2f}×"]
        if kernel:
            n = ncu[kernel]
            cells += [f"{n['lts__t_sectors_op_red.sum'] / 1e6:.1f} M", f"{n['dram__bytes_read.sum'] / 1e9:.2f}",
                      f"{n['lts__t_sector_hit_rate.pct']:.0f} %", f"{n['smsp__inst_executed.sum'] / 1e6:.0f} M"]
        else:
            cells += [""] * 4
        return cells

    acc = f"BM_Accumulate/{D}/{{}}/{C}/{{}}"
    rows = [row("accumulate r = 5, by tiles", acc.format(5, 2), acc.format(5, 2), "tiles"),
            row("accumulate r = 5, by columns (T = 8,192)", acc.format(5, 3), acc.format(5, 2), "columns")]
    for shift in (12, 11):
        name = f"BM_AccumulateColumns/{D}/5/{C}/23/{shift}"
        if name in ms:
            rows.append(row(f"… T = {1 << shift:,}", name, acc.format(5, 2)))
    rows.append(row("accumulate r = 1, by tiles (what r = 1 takes)", acc.format(1, 2), acc.format(1, 2)))
    if acc.format(1, 3) in ms:  # runs from before r = 1 was left to the tiles
        rows.append(row("accumulate r = 1, by columns", acc.format(1, 3), acc.format(1, 2)))
    rows += [row("compress (momentum + EF + accumulate) r = 5, by tiles",
                 f"BM_Compress/{D}/5/{C}/2", f"BM_Compress/{D}/5/{C}/2"),
             row("… by columns", f"BM_Compress/{D}/5/{C}/3", f"BM_Compress/{D}/5/{C}/2")]
    rows.append([f"FetchSGD encode_sum through Python (bench_round.py, {len(fetch)} runs)",
                 f"{min(fetch):.3f}-{max(fetch):.3f}", "", "", "", "", ""])
    copy = ms[f"BM_CopyDeviceToDevice/{D}"]
    rel = lambda p: os.path.relpath(os.path.abspath(p), ROOT)
    doc_tables.write(
        a.out, "bash scripts/gpu.sh accumulate", a.date, a.machine,
        ["kernel (d = 2^27, c = 2^20)", "ms", "× by tiles", "L2 reductions (sectors)", "DRAM read GB",
         "L2 hit rate", "instructions"],
        rows, data=", ".join(rel(p) for p in (a.kernels, a.ncu_tiles, a.ncu_columns, a.round)),
        note=f"Medians of 5 (Google Benchmark, CUDA events); a 512 MiB device copy {copy:.3f} ms in the "
             "same run; the counters from one launch each under Nsight Compute.")
    print(f"wrote {rel(a.out)}")


if __name__ == "__main__":
    main()
