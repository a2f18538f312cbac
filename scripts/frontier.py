#!/usr/bin/python3
"""The traffic frontier under PyTorch DDP: accuracy against payload for every hook that
scripts/compare_ddp.py ran (seed 1 in build/compare-ddp, more seeds in build/compare-ddp-seedN),
PyTorch's PowerSGD included; the run-to-run noise from the seeds; and, for every budget where
PyTorch's PowerSGD has a point, the best sketchsgd hook at that payload or less.

    /usr/bin/python3 scripts/frontier.py [--write-docs]

Writes build/frontier/frontier.png and table.md (with --write-docs: docs/images/frontier.png,
docs/data/frontier.json and the frontier section of docs/RESULTS.md).
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import sys

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


def verdicts(runs, noise):
    """For each PyTorch PowerSGD budget: the best sketchsgd hook at that payload or less."""
    lines = []
    ours = {n: e for n, e in runs.items() if n not in ("none", "fp16") and not n.startswith("powersgd")}
    for name in sorted((n for n in runs if re.match(r"^powersgd-r\d+$", n)), key=lambda n: runs[n]["payload"]):
        t = runs[name]
        tm, _, tn = summary(t)
        fit = [(summary(e)[0], n) for n, e in ours.items() if e["payload"] <= t["payload"] * 1.001]
        if not fit:
            lines.append(f"- {name} ({t['payload']:,.0f} B): no sketchsgd hook at that payload or less")
            continue
        best, bn = max(fit)
        e = ours[bn]
        bm, _, bnn = summary(e)
        diff = bm - tm
        state = "ahead" if diff >= 0.3 else ("level (within the noise)" if diff > -noise else "behind")
        lines.append(f"- PyTorch {name} at {t['payload']:,.0f} B: {tm:.2f} % (mean of {tn}); best of ours at "
                     f"that payload or less: `{e['hook']}` {bm:.2f} % (mean of {bnn}) at {e['payload']:,.0f} B "
                     f"({t['payload'] / e['payload']:.1f}x less): {diff:+.2f} points, {state}")
        # Equal accuracy (within 0.1 points of PyTorch's mean) at the least traffic.
        level = [(e["payload"], n) for n, e in ours.items() if summary(e)[0] >= tm - 0.1]
        if level:
            lp, ln = min(level)
            lines.append(f"  - least traffic of ours within 0.1 points of it: `{ours[ln]['hook']}` "
                         f"{summary(ours[ln])[0]:.2f} % at {lp:,.0f} B: {t['payload'] / lp:.1f}x less traffic")
    return lines


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
    rows = ["| hook | payload (steady) | vs dense | accuracy, seed 1 | mean ± sd (seeds) |", "|---|---|---|---|---|"]
    for n, e in sorted(runs.items(), key=lambda kv: -kv[1]["payload"]):
        m, sd, k = summary(e)
        spread = f"{m:.2f} ± {sd:.2f} ({k})" if sd is not None else "—"
        first = e["acc"].get(1)
        rows.append(f"| `{e['hook']}` | {e['payload']:,.0f} B | {e['ratio']:.0f}× | "
                    f"{first:.2f} % | {spread} |" if first is not None else
                    f"| `{e['hook']}` | {e['payload']:,.0f} B | {e['ratio']:.0f}× | — | {spread} |")
    table = "\n".join(rows)
    v = verdicts(runs, noise)
    text = table + "\n\nRun-to-run noise (largest sd over hooks run with 3 seeds): " + f"{noise:.2f} points.\n\n" + "\n".join(v) + "\n"
    print(text)
    png = plot(runs, args.out)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    if args.write_docs:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from results_doc import write_section
        if png:
            shutil.copy(png, "docs/images/frontier.png")
        with open("docs/data/frontier.json", "w") as f:
            json.dump(runs, f, indent=1, default=str)
        write_section("frontier", "## The traffic frontier (DDP, against PyTorch's PowerSGD)\n\n"
                      "Every hook of `scripts/compare_ddp.py` on the same job (below), seed 1, and the "
                      "frontier's contested points again with seeds 2 and 3 "
                      "(`--seed N --out build/compare-ddp-seedN`); drawn by `/usr/bin/python3 "
                      "scripts/frontier.py --write-docs`. Payload: bytes one worker hands to the "
                      "collectives per step in steady state, every hook counted alike.\n\n"
                      + text + FRONTIER_NOTES + "\n![frontier](images/frontier.png)\n")


FRONTIER_NOTES = """
What the runs of 2026-11-23 say (PyTorch 1.13.1, gloo, the 2-core machine):
- **Our PowerSGD is PyTorch's**: the same payload at every rank (the same rule for which tensors
  to factor) and the same accuracy (rank 4: 86.86 % vs 86.83 %, rank 2: 86.69 % vs 86.70 % at
  seed 1), with one implementation serving the parameter server and the hook.
- **fp16 on the wire halves the traffic at no measurable cost**: rank 4 with `wire=fp16` reaches
  86.84 % (3 seeds) at 43 kB, PyTorch's rank 4 86.83 % at 86 kB: equal accuracy at 2.0x less
  traffic (the issue's target: 1.5x); rank 2 with fp16, 86.55 % at 24 kB, matches PyTorch's
  rank 2 (86.60 %) at 2.0x less. Not strictly ahead by 0.3 points at equal traffic anywhere: the
  best margin is +0.24 (ours rank 4 fp16 against PyTorch's rank 2, at 1.1x less traffic), below
  the run-to-run noise (sd up to 0.74 points between seeds), so we claim level, not ahead.
- **The new idea for the sketch family, compact tables for sketch-space momentum** (FetchSGD with
  fp16 tables, summed in fp16 by the all-reduce): 86.50 % at 184 kB against fp32 tables' 86.28 %
  at 368 kB, the same accuracy at half the traffic (over the parameter server: 86.75 % at 41x vs
  86.58 % at 26.6x). Twice the sketch in fp16 (the fp32 bytes) did not help (85.92 %). It keeps
  FetchSGD's properties (stateless workers, one round) but it stays off the frontier: the sketch
  family needs 4-8x PowerSGD's traffic for ~0.4 points less here, where low-rank structure suits
  an MLP's weight gradients. Kept as the `wire=` option; reported either way.
- Single-seed points (no ± column) carry the same noise; the verdict for rank 1 (one seed each)
  is level within it.
"""

if __name__ == "__main__":
    main()
