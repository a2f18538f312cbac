#!/usr/bin/python3
"""Runs examples/ddp_fashion_mnist.py once per hook — PyTorch's none, fp16 and PowerSGD (rank 1, 2,
4) and every sketchsgd codec — with the same seed, workers and epochs, then writes
build/compare-ddp/<name>.json, a PNG (test accuracy vs payload per round) and a Markdown table
(--write-docs: docs/data/tables/ddp-hooks.json, whose rows for the hooks run replace theirs).

    /usr/bin/python3 scripts/compare_ddp.py [--epochs 3] [--only none,fetchsgd] [--report-only]
                                            [--write-docs]

The sketchsgd package is taken from build/default/python (build it first: bash scripts/test.sh or
cmake --build --preset default).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

# name, hook. Budgets for the MLP (d = 1,863,690; dense = 7.45 MB per worker per round): 20x less
# is 373 kB. sketchsgd payloads include the 2,058 bias values sent uncompressed (8 kB).
HOOKS = [
    ("none", "none"),
    ("fp16", "fp16"),
    ("powersgd-r1", "powersgd:rank=1"),
    ("powersgd-r2", "powersgd:rank=2"),
    ("powersgd-r4", "powersgd:rank=4"),
    ("dense", "dense"),
    ("fetchsgd", "sketch:rows=1,cols=90000,k=18000,fetch=1"),
    ("sketch-p2", "sketch:rows=1,cols=60000,k=12000,p2=2"),
    ("topk", "topk:k=20000,momentum=0.9"),
    ("ef-signsgd", "signsgd:ef=1,momentum=0.9"),
    ("signsgd", "signsgd:momentum=0.9"),
    ("terngrad", "terngrad:momentum=0.9"),
    ("qsgd-4bit", "qsgd:bits=4,momentum=0.9"),
    ("qsgd-2bit-ef", "qsgd:bits=2,ef=1,momentum=0.9"),
    ("ours-psgd-r1", "sketchsgd:powersgd:rank=1"),
    ("ours-psgd-r2", "sketchsgd:powersgd:rank=2"),
    ("ours-psgd-r4", "sketchsgd:powersgd:rank=4"),
    ("ours-psgd-r1-fp16", "sketchsgd:powersgd:rank=1,wire=fp16"),
    ("ours-psgd-r2-fp16", "sketchsgd:powersgd:rank=2,wire=fp16"),
    ("ours-psgd-r4-fp16", "sketchsgd:powersgd:rank=4,wire=fp16"),
    # FetchSGD with compact tables: the sketch-space momentum's tables summed in fp16, at the same
    # sketch (half the bytes) and at twice the sketch for the same bytes.
    ("fetchsgd-fp16", "sketch:rows=1,cols=90000,k=18000,fetch=1,wire=fp16"),
    ("fetchsgd-2x-fp16", "sketch:rows=1,cols=180000,k=36000,fetch=1,wire=fp16"),
]


def run(name, hook, args):
    out = os.path.join(args.out, f"{name}.json")
    cmd = [sys.executable, "examples/ddp_fashion_mnist.py", "--hook", hook, "--epochs", str(args.epochs),
           "--workers", str(args.workers), "--seed", str(args.seed), "--json", out, "--progress", "200"]
    if name == "signsgd":
        cmd += ["--lr", "0.0005"]  # majority vote of signs: a step of ±lr per coordinate
    env = dict(os.environ, PYTHONPATH=os.path.abspath(args.python))
    t = time.time()
    print(f"== {name}: {hook}", flush=True)
    subprocess.run(cmd, check=True, env=env)
    print(f"   {time.time() - t:.0f} s", flush=True)


COLUMNS = ["hook", "test accuracy", "payload per worker per round (steady)", "vs dense (steady)",
           "vs dense (mean over the run)", "replicas identical", "wall time"]


def report(names, args):
    runs = []
    for name, hook in HOOKS:
        path = os.path.join(args.out, f"{name}.json")
        if name in names and os.path.exists(path):
            with open(path) as f:
                runs.append((name, hook, json.load(f)))
    rows = [[f"`{hook}`", f"{100 * r['test_accuracy']:.2f} %", f"{r['steady_payload_bytes_per_round']:,.0f} B",
             f"{r['steady_ratio']:.1f}×", f"{r['ratio']:.1f}×", "yes" if r["replicas_identical"] else "NO",
             f"{r['seconds']:.0f} s"] for _, hook, r in runs]
    table = "\n".join(["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)] +
                      ["| " + " | ".join(r) + " |" for r in rows])
    print(table)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    plot(runs, args)
    if args.write_docs:
        write_docs(rows, runs, args)


def write_docs(rows, runs, args):
    """The table's data file (the rows of the hooks run, the others kept) and, for a full run, the
    plot; then the docs' tables. What the figures mean is written in docs/RESULTS.md."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import doc_tables
    version = next((r["torch"] for _, _, r in runs if "torch" in r), "?")
    doc_tables.write("docs/data/tables/ddp-hooks.json",
                     "/usr/bin/python3 scripts/compare_ddp.py --write-docs",
                     time.strftime("%Y-%m-%d"), f"the 2-core dev machine, PyTorch {version}, gloo", COLUMNS, rows, key=0,
                     note=f"{args.workers} processes, {args.epochs} epochs, seed {args.seed}, one run each.")
    png = os.path.join(args.out, "ddp_accuracy_vs_payload.png")
    if os.path.exists(png) and not args.only:
        os.makedirs("docs/images", exist_ok=True)
        shutil.copy(png, "docs/images/ddp_accuracy_vs_payload.png")
    doc_tables.main([])


def plot(rows, args):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no plot)")
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, hook, r in rows:  # (name, hook, result)
        ours = not (hook in ("none", "fp16") or hook.startswith(("powersgd", "torch:")))
        ax.scatter(r["steady_payload_bytes_per_round"], 100 * r["test_accuracy"], marker="o" if ours else "s",
                   color="tab:blue" if ours else "tab:orange")
        ax.annotate(name, (r["steady_payload_bytes_per_round"], 100 * r["test_accuracy"]), fontsize=8,
                    xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("payload per worker per round, steady state (bytes, log)")
    ax.set_ylabel(f"test accuracy after {args.epochs} epochs (%)")
    ax.set_title("DDP on Fashion-MNIST (MLP, 4 gloo workers): sketchsgd (circles) vs PyTorch (squares)", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = os.path.join(args.out, "ddp_accuracy_vs_payload.png")
    fig.savefig(png, dpi=120)
    print(f"plot: {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated names")
    ap.add_argument("--out", default="build/compare-ddp")
    ap.add_argument("--python", default="build/default/python", help="where the sketchsgd package is")
    ap.add_argument("--report-only", action="store_true", help="run nothing: table and plot from --out")
    ap.add_argument("--write-docs", action="store_true", help="write the table's data file (and plot) into docs/")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    unknown = only - {n for n, _ in HOOKS}
    if unknown:
        sys.exit(f"unknown hook name(s): {sorted(unknown)}")
    names = [n for n, _ in HOOKS if not only or n in only]
    os.makedirs(args.out, exist_ok=True)
    if not args.report_only:
        for name, hook in HOOKS:
            if name in names:
                run(name, hook, args)
    report(names, args)


if __name__ == "__main__":
    main()
