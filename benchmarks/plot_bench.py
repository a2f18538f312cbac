#!/usr/bin/env python3
"""Plots Google Benchmark JSON from sketchsgd_bench: coordinates/s against d, one line per
benchmark, kernels and codecs in separate PNGs.  Usage: plot_bench.py bench.json OUTDIR"""
import argparse
import json
import os
import re
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", help="sketchsgd_bench --benchmark_format=json output")
    ap.add_argument("outdir", help="where the PNGs go")
    args = ap.parse_args()
    src, outdir = args.bench, args.outdir
    try:
        with open(src) as f:
            runs = json.load(f)["benchmarks"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        ap.error(f"{src}: not a Google Benchmark JSON file ({type(e).__name__}: {e})")
    if not os.path.isdir(outdir):
        ap.error(f"{outdir}: no such folder")
    series = defaultdict(list)
    for r in runs:
        m = re.match(r"(.+)/d:(\d+)", r["name"])
        if m and r.get("items_per_second"):
            series[m.group(1).replace("/real_time", "")].append((int(m.group(2)), r["items_per_second"]))
    groups = {
        "kernels": [k for k in series if not k.startswith(("BM_Encode", "BM_Aggregate"))],
        "codecs": [k for k in series if k.startswith(("BM_Encode", "BM_Aggregate"))],
    }
    for group, names in groups.items():
        if not names:
            continue
        fig, ax = plt.subplots(figsize=(9, 6))
        for name in sorted(names):
            pts = sorted(series[name])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    linestyle="--" if "Aggregate" in name else "-", label=name.replace("BM_", ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("d (coordinates)")
        ax.set_ylabel("coordinates / second")
        ax.set_title(f"sketchsgd {group} throughput (CPU)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        path = f"{outdir}/{group}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        print("wrote", path)


if __name__ == "__main__":
    main()
