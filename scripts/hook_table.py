#!/usr/bin/env python3
"""The PowerSGD hooks side by side from bench_hook.py --json runs: PyTorch's powerSGD_hook and
ours at each rank, median (minimum) ms per step and PyTorch's time over ours, one column group per
run. Prints the markdown table; --out writes it as a table data file (docs/data/tables/NAME.json)
for scripts/doc_tables.py, which puts it into the docs.

    .venv/bin/python scripts/hook_table.py W=1024=docs/data/a.json W=4096=docs/data/b.json \\
        [--out docs/data/tables/hook-h100.json --command "..." --date YYYY-MM-DD --machine "..."]
"""
import argparse
import json
import re
import sys


def table(runs):
    """runs: [(label, bench_hook json)]. One row per rank both hooks were timed at."""
    def by_spec(d):
        return {r["spec"]: r for r in d["results"]}

    specs = [by_spec(d) for _, d in runs]
    ranks = sorted({int(m.group(1)) for s in specs for k in s if (m := re.fullmatch(r"powersgd:rank=(\d+)", k))})
    columns = ["rank"] + [c for label, _ in runs for c in (f"{label}: PyTorch ms", "ours ms", "PyTorch / ours")]
    rows = []
    for r in ranks:
        cells = [str(r)]
        for s in specs:
            t, o = s.get(f"torch:powersgd:rank={r}"), s.get(f"powersgd:rank={r}")
            if t is None or o is None:
                cells += ["", "", ""]
                continue
            ratio = t["ms_median"] / o["ms_median"]
            cells += [f"{t['ms_median']:.2f} ({t['ms_min']:.2f})", f"{o['ms_median']:.2f} ({o['ms_min']:.2f})",
                      f"**{ratio:.2f}x**" if ratio >= 2 else f"{ratio:.2f}x"]
        rows.append(cells)
    base = [s.get("none") for s in specs]
    if all(base):
        rows.append(["all-reduce alone"] + [c for b in base for c in (f"{b['ms_median']:.2f} ({b['ms_min']:.2f})", "", "")])
    return columns, rows


def write_block(path, name, text):
    with open(path) as f:
        doc = f.read()
    begin, end = f"<!-- table:{name} -->\n", f"<!-- end:{name} -->\n"
    if begin not in doc or end not in doc:
        sys.exit(f"hook_table.py: {path} has no {begin.strip()} … {end.strip()} block")
    doc = doc[:doc.index(begin) + len(begin)] + text + doc[doc.index(end):]
    with open(path, "w") as f:
        f.write(doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=path.json")
    ap.add_argument("--out", help="write a table data file here")
    ap.add_argument("--command", help="the benchmark's command, for the caption")
    ap.add_argument("--date", help="YYYY-MM-DD of the runs")
    ap.add_argument("--machine", help="where they ran")
    ap.add_argument("--note", help="more caption text")
    args = ap.parse_args()
    if args.out and not (args.command and args.date and args.machine):
        ap.error("--out needs --command, --date and --machine")
    if args.date and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", args.date):
        ap.error(f"--date {args.date!r}: expected YYYY-MM-DD")
    runs = []
    for item in args.runs:
        label, _, path = item.rpartition("=")
        if not label:
            ap.error(f"{item!r}: expected LABEL=path.json")
        try:
            with open(path) as f:
                runs.append((label, json.load(f)))
        except (OSError, ValueError) as e:
            ap.error(f"{item!r}: {e}")
    columns, rows = table(runs)
    print("| " + " | ".join(columns) + " |")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if args.out:
        from doc_tables import write
        write(args.out, args.command, args.date, args.machine, columns, rows,
              data=", ".join(i.rpartition("=")[2] for i in args.runs), note=args.note)

if __name__ == "__main__":
    main()
