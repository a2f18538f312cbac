#!/usr/bin/env python3
"""The docs' table sparse-reduce and docs/images/sparse-reduce.png from sketchsgd_bench_sparse's
JSON (docs/data/sparse-reduce.json: one run a budget): per W, the link bytes a rank's collectives
move a step under the all-gather of top-k lists and under the sparse all-reduce, against a bf16
all-reduce of the whole vector, and how well each step's update follows the mean gradient.

    for b in 1 4; do build/default/benchmarks/sketchsgd_bench_sparse --dim 1048576 --density 0.01 \\
        --worlds 4,16,64,256 --steps 8 --budget $b --json /tmp/b$b.json; done
    .venv/bin/python benchmarks/sparse_table.py /tmp/b1.json /tmp/b4.json [--date YYYY-MM-DD]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import doc_tables  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "docs/data/sparse-reduce.json"
MACHINE = "the 2-core dev machine (AMD EPYC Zen 4 under KVM, 2 threads)"


def plot(runs, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    first = runs[0]["results"]
    ws = [r["world"] for r in first]
    a.plot(ws, [r["gather_bytes"] / 1e3 for r in first], "s--", label="all-gather of top-k lists")
    a.plot(ws, [r["bf16_bytes"] / 1e3 for r in first], "k:", label="bf16 all-reduce (dense)")
    for run in runs:
        a.plot(ws, [r["sparse_bytes"] / 1e3 for r in run["results"]], "^-",
               label=f"sparse all-reduce, ≤ {run['budget']:g}·k kept")
        b.plot(ws, [r["sparse_drift"] for r in run["results"]], "^-", label=f"sparse, ≤ {run['budget']:g}·k")
    b.plot(ws, [r["gather_drift"] for r in first], "s--", label="all-gather")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks W")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    a.set_yscale("log")
    a.set_ylabel("link kB a step per rank")
    a.set_title("top-k at 1 %: link bytes against W", fontsize=10)
    b.set_ylabel("‖Σ updates − Σ mean gradients‖ / ‖Σ mean gradients‖")
    b.set_title("how far the updates drift from the mean gradient", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"plot: {png}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="sketchsgd_bench_sparse --json files (default: the docs' data)")
    doc_tables.date_flag(ap)
    args = ap.parse_args(argv)
    if args.runs:
        runs = []
        for path in args.runs:
            try:
                with open(path) as f:
                    runs.append(json.load(f))
            except (OSError, ValueError) as e:
                ap.exit(2, f"sparse_table.py: {path}: {e}\n")
        with open(os.path.join(ROOT, DATA), "w") as f:
            json.dump({"runs": runs}, f, indent=1)
    else:
        with open(os.path.join(ROOT, DATA)) as f:
            runs = json.load(f)["runs"]
    rows = []
    for run in runs:
        for r in run["results"]:
            rows.append([r["world"], f"{run['budget']:g} k", f"{r['gather_bytes'] / 1e3:,.0f}",
                         f"{r['sparse_bytes'] / 1e3:,.0f}", f"{r['gather_bytes'] / r['sparse_bytes']:.1f}×",
                         f"{r['bf16_bytes'] / r['sparse_bytes']:.1f}×", f"{r['kept_per_k']:.2f}",
                         f"{r['imbalance']:.2f} ({r['first_imbalance']:.1f})",
                         f"{r['gather_cos']:.3f} / {r['sparse_cos']:.3f}",
                         f"{r['gather_drift']:.3f} / {r['sparse_drift']:.3f}"])
    d = runs[0]
    budgets = " ".join(f"--budget {r['budget']:g}" for r in runs)
    doc_tables.write(os.path.join(ROOT, "docs/data/tables/sparse-reduce.json"),
                     f"build/default/benchmarks/sketchsgd_bench_sparse --dim {d['dim']} --density {d['density']:g} "
                     f"--worlds 4,16,64,256 --steps {d['steps']} [{budgets}]",
                     args.date, MACHINE,
                     ["W", "kept at most", "all-gather kB/rank", "sparse kB/rank", "all-gather / sparse",
                      "bf16 all-reduce / sparse", "kept / k", "busiest owner / mean (first step)",
                      "cosine to the mean gradient: gather / sparse", "drift: gather / sparse"],
                     rows, data=DATA,
                     note=f"W ranks simulated in one process, d = {d['dim']:,}, top-k at {d['density']:g} "
                          "(index=delta, fp16 values); synthetic gradients (a shared signal and each rank's own "
                          "noise, log-normal scales, an eighth of the coordinates 8× larger), each rank's error "
                          "feedback kept. Link bytes a rank receives a step (= sends), as the Round's collectives "
                          "move them by the ring model, the all-gathers padded to the longest; figures from the "
                          "second step on (the first runs on even ranges).")
    plot(runs, os.path.join(ROOT, "docs/images/sparse-reduce.png"))


if __name__ == "__main__":
    main()
