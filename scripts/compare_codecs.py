#!/usr/bin/env python3
"""Runs sketchsgd-train once per codec with the same model, seeds, workers and epochs, then writes
build/compare/all.csv, two PNG plots (test accuracy vs epoch, vs total traffic) and a Markdown
table. --write-docs writes the table's data file (docs/data/tables/ps-codecs.json; with --only,
the rows of those codecs, the others kept) and the plots into docs/, and regenerates the docs'
tables (scripts/doc_tables.py); what the figures mean is written in docs/RESULTS.md by people.

    .venv/bin/python scripts/compare_codecs.py [--epochs 3] [--only dense,sketch] [--write-docs]
"""
import argparse
import csv
import json
import os
import shutil
import sys
import time

# The command-line checks shared with examples/ (examples/cli.py).
from cli import count, names, natural  # noqa: E402
import launch  # noqa: E402  (how a job of the matrix runs)

# The demo's MLP (784-1024-1024-10) as a layout, for codecs that take one optionally.
MLP_LAYOUT = "1024x784+1024+1024x1024+1024+10x1024+10"

# name, codec spec, learning rate. Budgets: at W = 4 and d = 1.86M (MLP), 20x less traffic than
# dense leaves ~745 KB per worker and round for uplink + downlink.
CONFIGS = [
    ("dense", "dense:momentum=0.9", 0.01),
    ("sketch", "sketch:rows=5,cols=25000,k=10000,momentum=0.5", 0.005),  # no second round
    ("sketch-p2", "sketch:rows=1,cols=100000,k=20000,p2=1,momentum=0.9", 0.01),
    ("sketch-p2-r5", "sketch:rows=5,cols=20000,k=10000,p2=2,momentum=0.9", 0.01),
    ("sketch-p2-7x", "sketch:rows=1,cols=300000,k=60000,p2=1,momentum=0.9", 0.01),
    ("fetchsgd", "sketch:rows=1,cols=100000,k=20000,momentum=0.9,fetch=1", 0.01),  # the old default
    ("topk", "topk:k=18000,momentum=0.9", 0.01),  # about the sketch's traffic
    ("terngrad", "terngrad:momentum=0.9", 0.01),
    ("signsgd", "signsgd:momentum=0.9", 0.0005),
    ("ef-signsgd", "signsgd:ef=1,momentum=0.9", 0.01),
    ("qsgd-4bit", "qsgd:bits=4,momentum=0.9", 0.01),  # 8x less uplink than dense
    ("qsgd-2bit-ef", "qsgd:bits=2,ef=1,momentum=0.9", 0.01),  # 16x
    # Blocked hashing (the default) against random buckets on the same jobs, and the run-to-run
    # noise: the demo's job again with another model seed.
    ("fetchsgd-seed2", "sketch:rows=1,cols=100000,k=20000,momentum=0.9,fetch=1", 0.01, 2),
    ("fetchsgd-random", "sketch:rows=1,cols=100000,k=20000,momentum=0.9,fetch=1,hashing=random", 0.01),
    ("sketch-p2-random", "sketch:rows=1,cols=100000,k=20000,p2=1,momentum=0.9,hashing=random", 0.01),
    ("sketch-p2-r5-random", "sketch:rows=5,cols=20000,k=10000,p2=2,momentum=0.9,hashing=random", 0.01),
    # The traffic frontier: PowerSGD of our own (the demo hands it the model's layout) at three
    # ranks, with 16-bit wire values, and FetchSGD's tables in fp16 at two budgets.
    ("psgd-r1", "powersgd:rank=1,momentum=0.9", 0.01),
    ("psgd-r2", "powersgd:rank=2,momentum=0.9", 0.01),
    ("psgd-r4", "powersgd:rank=4,momentum=0.9", 0.01),
    ("psgd-r4-fp16", "powersgd:rank=4,momentum=0.9,wire=fp16", 0.01),  # demo default
    ("psgd-r2-fp16", "powersgd:rank=2,momentum=0.9,wire=fp16", 0.01),
    ("fetchsgd-fp16", "sketch:rows=1,cols=100000,k=20000,momentum=0.9,fetch=1,wire=fp16", 0.01),
    ("fetchsgd-2x-fp16", "sketch:rows=1,cols=200000,k=40000,momentum=0.9,fetch=1,wire=fp16", 0.01),
    # A layout for the sketch: the biases whole beside the table, k chosen past them.
    ("fetchsgd-layout", f"sketch:rows=1,cols=100000,k=20000,momentum=0.9,fetch=1,layout={MLP_LAYOUT}", 0.01),
    ("fetchsgd-fp16-layout",
     f"sketch:rows=1,cols=100000,k=20000,momentum=0.9,fetch=1,wire=fp16,layout={MLP_LAYOUT}", 0.01),
    ("sketch-p2-layout", f"sketch:rows=1,cols=100000,k=20000,p2=1,momentum=0.9,layout={MLP_LAYOUT}", 0.01),
    # ... and the quantisers scaled per tensor (the papers' per-layer scales).
    ("ef-signsgd-layout", f"signsgd:ef=1,momentum=0.9,layout={MLP_LAYOUT}", 0.01),
    ("terngrad-layout", f"terngrad:momentum=0.9,layout={MLP_LAYOUT}", 0.01),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/default/demo/sketchsgd-train")
    ap.add_argument("--epochs", type=count, default=3)
    ap.add_argument("--workers", type=count, default=4)
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--subset", type=natural, default=0)
    ap.add_argument("--only", default="", type=names(c[0] for c in CONFIGS), help="comma-separated config names")
    ap.add_argument("--out", default="build/compare")
    ap.add_argument("--write-docs", action="store_true", help="write the table's data file and plots into docs/")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: rebuild the CSV, plots and table from the last runs in --out")
    args = ap.parse_args()
    if args.write_docs:
        try:  # the docs embed the plots: fail now rather than leave stale images after the runs
            import matplotlib  # noqa: F401
        except ImportError:
            ap.error("--write-docs needs matplotlib (apt-get install python3-matplotlib)")
    if not args.report_only and not os.access(args.binary, os.X_OK):
        ap.error(f"--binary {args.binary}: no such program (build it: cmake --build --preset default)")

    only = set(filter(None, args.only.split(",")))
    configs = [c for c in CONFIGS if not only or c[0] in only]
    os.makedirs(args.out, exist_ok=True)
    rows, summaries = [], []
    for i, (name, spec, lr, *rest) in enumerate(configs):
        seed = rest[0] if rest else 1
        out = os.path.join(args.out, name)
        summary = os.path.join(out, "summary.json")
        t0 = time.time()
        if not args.report_only:
            if os.path.exists(summary):
                os.remove(summary)
            cmd = [args.binary, "--codec", spec, "--lr", str(lr), "--epochs", str(args.epochs),
                   "--workers", str(args.workers), "--model", args.model, "--subset", str(args.subset),
                   "--seed", str(seed), "--out", out]
            launch.job(f"[{i + 1}/{len(configs)}] {name}: {spec}, lr {lr}, seed {seed}", cmd)
        s = json.load(open(summary)) if os.path.exists(summary) else None
        if s is None or s.get("codec") != spec:  # (the demo echoes the spec it was given)
            print(f"  {name}: no result (the run failed: diverged or crashed)", flush=True)
            summaries.append({"name": name, "codec": spec, "lr": lr, "failed": True})
            continue
        s["name"], s["lr"] = name, lr
        summaries.append(s)
        with open(os.path.join(out, "results.csv")) as f:
            per_round = s["bytes_up"] + s["bytes_down"]
            for r in csv.DictReader(f):
                frac = int(r["round"]) / max(s["rounds"], 1)
                rows.append({"name": name, "epoch": int(r["epoch"]), "test_accuracy": float(r["test_accuracy"]),
                             "train_loss": float(r["train_loss"]), "bytes": per_round * frac})
        print(f"  {100 * s['test_accuracy']:.2f}% test accuracy, {s['traffic_ratio']:.1f}x less traffic, "
              f"{time.time() - t0:.0f} s", flush=True)

    with open(os.path.join(args.out, "all.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["name", "epoch", "test_accuracy", "train_loss", "bytes"])
        w.writeheader()
        w.writerows(rows)
    plot(rows, args.out)
    table = markdown(summaries, args)
    print(table)
    if args.write_docs:
        write_docs(summaries, args)


def plot(rows, out):
    try:
        import matplotlib
    except ImportError:
        print("no plots: matplotlib is missing (apt-get install python3-matplotlib)", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(dict.fromkeys(r["name"] for r in rows))
    for xkey, fname, xlabel in (("epoch", "accuracy_vs_epoch.png", "epoch"),
                                ("bytes", "accuracy_vs_bytes.png", "total traffic (bytes, log)")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for n in names:
            pts = [r for r in rows if r["name"] == n]
            ax.plot([p[xkey] for p in pts], [100 * p["test_accuracy"] for p in pts], marker="o", label=n)
        if xkey == "bytes":
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (%)")
        ax.set_title("Fashion-MNIST, 4 workers: accuracy vs " + ("epoch" if xkey == "epoch" else "traffic"))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, fname), dpi=110)
        plt.close(fig)


COLUMNS = ["codec", "spec", "lr", "test accuracy", "vs dense (pp)", "traffic (MB)", "less than dense", "wall (s)"]


def dense_accuracy(summaries):
    """Dense's test accuracy: from this run, or (a run with --only) from the docs' table."""
    dense = next((s for s in summaries if s["name"] == "dense" and not s.get("failed")), None)
    if dense:
        return dense["test_accuracy"]
    try:
        with open("docs/data/tables/ps-codecs.json") as f:
            row = next(r for r in json.load(f)["rows"] if r[0] == "dense")
        return float(row[3].rstrip("%")) / 100
    except (OSError, StopIteration, ValueError):
        return None


def table_rows(summaries):
    dense = dense_accuracy(summaries)
    rows = []
    for s in summaries:
        if s.get("failed"):
            rows.append([s["name"], f"`{s['codec']}`", s["lr"], "**failed: training diverged (NaN)**", "", "", "", ""])
            continue
        gap = f"{100 * (s['test_accuracy'] - dense):+.2f}" if dense is not None else "n/a"
        rows.append([s["name"], f"`{s['codec']}`", s["lr"], f"{100 * s['test_accuracy']:.2f}%", gap,
                     f"{(s['bytes_up'] + s['bytes_down']) / 1e6:.0f}", f"{s['traffic_ratio']:.1f}x", f"{s['wall_s']:.0f}"])
    return rows


def markdown(summaries, args):
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in table_rows(summaries)]
    return "\n".join(lines)


def write_docs(summaries, args):
    import doc_tables
    doc_tables.write("docs/data/tables/ps-codecs.json",
                     ".venv/bin/python scripts/compare_codecs.py --write-docs",
                     time.strftime("%Y-%m-%d"), "the 2-core dev machine",
                     COLUMNS, table_rows(summaries), key=0,
                     note=f"`{args.model}` model, {args.workers} workers + server over ZeroMQ (loopback), "
                          f"{args.epochs} epochs, batch 32 per worker, model seed 1 unless the name says otherwise.")
    os.makedirs("docs/images", exist_ok=True)
    for png in ("accuracy_vs_epoch.png", "accuracy_vs_bytes.png"):
        src = os.path.join(args.out, png)
        if os.path.exists(src) and not args.only:  # a partial run would draw only its own codecs
            shutil.copy(src, os.path.join("docs/images", png))
    doc_tables.main([])


if __name__ == "__main__":
    main()
