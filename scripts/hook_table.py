#!/usr/bin/python3
"""The PowerSGD hooks side by side from bench_hook.py --json runs: PyTorch's powerSGD_hook and
ours at each rank, median (minimum) ms per step and PyTorch's time over ours, one column group per
run. Prints the markdown table; --doc FILE --name NAME also writes it into FILE between
<!-- table:NAME --> and <!-- end:NAME --> (BENCHMARKS.md's tables are made this way).

    /usr/bin/python3 scripts/hook_table.py W=1024=docs/data/a.json W=4096=docs/data/b.json \\
        [--doc docs/BENCHMARKS.md --name hook-h100]
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
    head = "| rank | " + " | ".join(f"{label}: PyTorch ms | ours ms | PyTorch / ours" for label, _ in runs) + " |"
    rule = "|---|" + "---|---|---|" * len(runs)
    rows = [head, rule]
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
        rows.append("| " + " | ".join(cells) + " |")
    base = [s.get("none") for s in specs]
    if all(base):
        rows.append("| all-reduce alone | " + " | ".join(f"{b['ms_median']:.2f} ({b['ms_min']:.2f}) | | " for b in base) + "|")
    return "\n".join(rows) + "\n"


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
    ap.add_argument("--doc")
    ap.add_argument("--name")
    args = ap.parse_args()
    runs = []
    for item in args.runs:
        label, _, path = item.rpartition("=")
        if not label:
            sys.exit(f"hook_table.py: {item!r}: expected LABEL=path.json")
        with open(path) as f:
            runs.append((label, json.load(f)))
    text = table(runs)
    print(text, end="")
    if args.doc:
        if not args.name:
            sys.exit("hook_table.py: --doc needs --name")
        write_block(args.doc, args.name, text)


if __name__ == "__main__":
    main()
