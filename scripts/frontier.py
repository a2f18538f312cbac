#!/usr/bin/python3
"""The traffic frontier under PyTorch DDP: accuracy against payload for every hook that
scripts/compare_ddp.py ran (seed 1 in build/compare-ddp, more seeds in build/compare-ddp-seedN),
PyTorch's PowerSGD included; the run-to-run noise from the seeds; and, for every budget where
PyTorch's PowerSGD has a point, the best sketchsgd hook at that payload or less.

    /usr/bin/python3 scripts/frontier.py [--write-docs]

Writes build/frontier/frontier.png and table.md (with --write-docs: docs/images/frontier.png,
docs/data/frontier.json and the data files of the frontier tables in docs/data/tables).
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import sys
import time

# Lines of the plot: a family of hooks whose points differ by budget only.
FAMILIES = [
    ("PyTorch PowerSGD", re.compile(r"^powersgd-r\d+$"), "tab:orange", "s"),
    ("sketchsgd PowerSGD (fp32)", re.compile(r"^ours-psgd-r\d+$"), "tab:blue", "o"),
    ("sketchsgd PowerSGD (fp16 wire)", re.compile(r"^ours-psgd-r\d+-fp16$"), "tab:green", "o"),
    ("sketchsgd FetchSGD", re.compile(r"^fetchsgd.*$"), "tab:purple", "D"),
]


def load(args):
    """name -> {"hook", "payload", "ratio", "acc": {seed: accuracy}}"""
    runs = {}
    dirs = [(1, args.runs)] + sorted((int(re.search(r"seed(\d+)$", d).group(1)), d)
                                     for d in glob.glob(args.runs + "-seed*") if re.search(r"seed(\d+)$", d))
    for seed, d in dirs:
        for path in glob.glob(os.path.join(d, "*.json")):
            name = os.path.basename(path)[:-5]
            with open(path) as f:
                r = json.load(f)
            if "test_accuracy" not in r:
                continue
            e = runs.setdefault(name, {"hook": r.get("hook", name), "payload": r["steady_payload_bytes_per_round"],
                                       "ratio": r["steady_ratio"], "acc": {}})
            e["acc"][seed] = 100 * r["test_accuracy"]
    return runs


def summary(e):
    accs = list(e["acc"].values())
    mean = statistics.mean(accs)
    sd = statistics.stdev(accs) if len(accs) > 1 else None
    return mean, sd, len(accs)


VERDICT_COLUMNS = ["PyTorch PowerSGD", "its payload", "its accuracy", "best of ours at that payload or less",
                   "accuracy", "payload", "difference", "verdict", "least traffic of ours within 0.1 points"]


def verdicts(runs, noise):
    """For each PyTorch PowerSGD budget: the best sketchsgd hook at that payload or less ("ahead":
    0.3 points or more; "level": within the run-to-run noise; else "behind"), and our least traffic
    at PyTorch's accuracy (within 0.1 points)."""
    rows = []
    ours = {n: e for n, e in runs.items() if n not in ("none", "fp16") and not n.startswith("powersgd")}
    for name in sorted((n for n in runs if re.match(r"^powersgd-r\d+$", n)), key=lambda n: runs[n]["payload"]):
        t = runs[name]
        tm, _, tn = summary(t)
        row = [name, f"{t['payload']:,.0f} B", f"{tm:.2f} % ({tn})"]
        fit = [(summary(e)[0], n) for n, e in ours.items() if e["payload"] <= t["payload"] * 1.001]
        if not fit:
            rows.append(row + ["none"] + [""] * 5)
            continue
        _, bn = max(fit)
        e = ours[bn]
        bm, _, bnn = summary(e)
        diff = bm - tm
        state = "ahead" if diff >= 0.3 else ("level" if diff > -noise else "behind")
        row += [f"`{e['hook']}`", f"{bm:.2f} % ({bnn})", f"{e['payload']:,.0f} B ({t['payload'] / e['payload']:.1f}x less)",
                f"{diff:+.2f}", state]
        level = [(e["payload"], n) for n, e in ours.items() if summary(e)[0] >= tm - 0.1]
        if level:
            lp, ln = min(level)
            row.append(f"`{ours[ln]['hook']}`: {summary(ours[ln])[0]:.2f} % at {lp:,.0f} B ({t['payload'] / lp:.1f}x less)")
        else:
            row.append("none")
        rows.append(row)
    return rows


def plot(runs, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no plot)")
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    placed = set()
    for label, pattern, color, marker in FAMILIES:
        pts = sorted((e["payload"], *summary(e)[:2], n) for n, e in runs.items() if pattern.match(n))
        if not pts:
            continue
        placed.update(p[3] for p in pts)
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, marker=marker, color=color, label=label)
        for x, y, sd, _ in pts:
            if sd:
                ax.errorbar([x], [y], yerr=[sd], color=color, capsize=3)
    for n, e in runs.items():
        if n in placed:
            continue
        m = summary(e)[0]
        ax.scatter([e["payload"]], [m], color="gray", marker="x")
        ax.annotate(n, (e["payload"], m), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("payload per worker per round, steady state (bytes, log)")
    ax.set_ylabel("test accuracy after 3 epochs (%; mean over seeds, bars: ±1 sd)")
    ax.set_title("Traffic frontier under DDP: Fashion-MNIST MLP, 4 gloo workers", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    png = os.path.join(out, "frontier.png")
    fig.savefig(png, dpi=120)
    print(f"plot: {png}")
    return png


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="build/compare-ddp")
    ap.add_argument("--out", default="build/frontier")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    runs = load(args)
    if not runs:
        sys.exit(f"no results in {args.runs}: run scripts/compare_ddp.py first")
    seeded = [summary(e)[1] for e in runs.values() if summary(e)[2] >= 3]
    noise = max(seeded) if seeded else 0.5
    columns = ["hook", "payload (steady)", "vs dense", "accuracy, seed 1", "mean ± sd (seeds)"]
    rows = []
    for n, e in sorted(runs.items(), key=lambda kv: -kv[1]["payload"]):
        m, sd, k = summary(e)
        first = e["acc"].get(1)
        rows.append([f"`{e['hook']}`", f"{e['payload']:,.0f} B", f"{e['ratio']:.0f}×",
                     f"{first:.2f} %" if first is not None else "—",
                     f"{m:.2f} ± {sd:.2f} ({k})" if sd is not None else "—"])
    v = verdicts(runs, noise)
    text = "\n".join("| " + " | ".join(r) + " |" for r in [columns] + rows) + \
        f"\n\nRun-to-run noise (largest sd over hooks run with 3 seeds): {noise:.2f} points.\n\n" + \
        "\n".join("| " + " | ".join(r) + " |" for r in [VERDICT_COLUMNS] + v) + "\n"
    print(text)
    png = plot(runs, args.out)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    if args.write_docs:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import doc_tables
        if png:
            shutil.copy(png, "docs/images/frontier.png")
        with open("docs/data/frontier.json", "w") as f:
            json.dump(runs, f, indent=1, default=str)
        cmd, day = "/usr/bin/python3 scripts/frontier.py --write-docs", time.strftime("%Y-%m-%d")
        where = "the 2-core dev machine, gloo"
        doc_tables.write("docs/data/tables/frontier.json", cmd, day, where, columns, rows, data="docs/data/frontier.json",
                         note="Every hook of compare_ddp.py, seed 1; the contested points again with seeds 2 and 3.")
        doc_tables.write("docs/data/tables/frontier-verdicts.json", cmd, day, where, VERDICT_COLUMNS, v,
                         data="docs/data/frontier.json",
                         note=f"Accuracies are means over the seeds run (their count in brackets); the run-to-run noise "
                              f"(the largest sd over hooks run with 3 seeds) is {noise:.2f} points.")
        doc_tables.main([])


if __name__ == "__main__":
    main()
