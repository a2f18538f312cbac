#!/usr/bin/env python3
"""Compression under FSDP2 on the transformer: examples/ddp_train.py --fsdp full (4 ranks, the
reduce-scatter compressed) and --fsdp hsdp (2 replicas × 2 shards, the replicas' all-reduce
compressed), each codec against FSDP2's own fp32 reduction and its
MixedPrecisionPolicy(reduce_dtype=bf16), same seed, data order and steps; then a table of
gradient bytes per rank per step and validation loss, with each codec's DDP result at the same
budget beside it (docs/data/frontier-transformer.json), and a PNG.

    .venv/bin/python scripts/compare_fsdp.py [--only full:none,hsdp:bf16] [--report-only] [--write-docs]

The runs are data (scripts/experiments.json, "fsdp"); a run is skipped when its JSON exists
(delete build/compare-fsdp to start again). About 2.5 minutes a run on 2 cores; 16 runs.
Verdicts: "within the noise" when a run's validation loss is at most twice the sd of the
uncompressed full-sharding seeds above their mean; the same codec's DDP run, against uncompressed
DDP's mean by the same margin.
"""
import argparse
import json
import os
import statistics
import sys
import time

import experiments  # noqa: E402  (the runs: experiments.json)
import launch  # noqa: E402

OUT = "build/compare-fsdp"
FRONTIER = "docs/data/frontier-transformer.json"


def runs():
    """(mode, run entry, seed) of the matrix, in order."""
    w = experiments._data()["fsdp"]["transformer"]
    return [(mode, e, seed) for mode, es in w["modes"].items() for e in es for seed in e.get("seeds", [1])], \
        w["max_steps"]


def path(mode, e, seed):
    return os.path.join(OUT, f"{mode}-{e['name']}-seed{seed}.json")


def run(mode, e, seed, steps):
    cmd = [sys.executable, "examples/ddp_train.py", "--workload", "transformer", "--fsdp", mode, "--workers", "4",
           "--hook", e["hook"], "--epochs", "1", "--max-steps", str(steps), "--seed", str(seed), "--progress", "100",
           "--json", path(mode, e, seed)]
    return launch.job(f"{mode} {e['name']} seed {seed}: {e['hook']}", cmd)


def report(matrix, write_docs):
    got = {}
    for mode, e, seed in matrix:
        if os.path.exists(path(mode, e, seed)):
            with open(path(mode, e, seed)) as f:
                got.setdefault((mode, e["name"]), []).append(json.load(f))
    plain = [r["val_loss"] for r in got.get(("full", "none"), [])]
    if len(plain) < 2:
        sys.exit("compare_fsdp.py: the uncompressed full-sharding seeds are missing (run without --report-only)")
    mean, noise = statistics.mean(plain), 2 * statistics.stdev(plain)
    with open(FRONTIER) as f:
        ddp = json.load(f)
    ddp_plain = statistics.mean(ddp["none"]["acc"].values())  # uncompressed DDP, its seeds
    rows, points = [], []
    for mode, e, seed in matrix:
        rs = got.get((mode, e["name"]))
        if not rs or seed != e.get("seeds", [1])[0]:
            continue
        bf16 = got.get((mode, "bf16"))
        loss = statistics.mean(r["val_loss"] for r in rs)
        sent = rs[0]["steady_payload_bytes_per_round"]
        vs = f"{bf16[0]['steady_payload_bytes_per_round'] / sent:.1f}×" if bf16 else "—"
        diff = loss - mean
        verdict = "within" if diff <= noise else "behind"
        theirs = ddp.get(e.get("ddp", ""), {})
        if theirs:
            ddp_loss = statistics.mean(theirs["acc"].values())
            ddp_cell = f"{ddp_loss:.4f} at {theirs['payload']:,.0f} B"
            ddp_verdict = "within" if ddp_loss - ddp_plain <= noise else "behind"
        else:
            ddp_cell = ddp_verdict = "—"
        rows.append([mode, f"`{e['hook']}`", f"{sent:,.0f} B", vs, f"{loss:.4f}" + (f" ({len(rs)})" if len(rs) > 1 else ""),
                     f"{diff:+.4f}", verdict, ddp_cell, ddp_verdict,
                     "yes" if all(r["replicas_identical"] for r in rs) else "NO"])
        points.append((mode, e["name"], sent, loss))
    columns = ["mode", "reduction", "gradient bytes per rank per step", "vs bf16 reduce_dtype", "validation loss",
               "vs uncompressed FSDP2", f"within the noise ({noise:.4f})", "same codec under DDP (its payload)",
               "under DDP: within the noise of uncompressed DDP", "replicas identical"]
    print(" | ".join(columns))
    for r in rows:
        print(" | ".join(r))
    png = os.path.join(OUT, "fsdp-transformer.png")
    plot(points, mean, noise, png)
    if write_docs:
        import doc_tables
        import shutil
        steps = runs()[1]
        doc_tables.write("docs/data/tables/fsdp-transformer.json", ".venv/bin/python scripts/compare_fsdp.py --write-docs",
                         time.strftime("%Y-%m-%d"), f"the 2-core dev machine, PyTorch {rs[0]['torch']}, gloo, 4 ranks",
                         columns, rows, key=None,
                         note=f"{steps} steps, seed 1 (uncompressed full sharding: seeds 1-3, mean {mean:.4f}); "
                              "full: the reduce-scatter's input (a codec: its payload); hsdp: a rank's shard across "
                              "the 2 replicas. DDP: the frontier's mean over its seeds.",
                         data="docs/data/fsdp-transformer.json")
        with open("docs/data/fsdp-transformer.json", "w") as f:
            json.dump({f"{m}:{n}": [{k: r[k] for k in ("hook", "fsdp", "replicas", "seed", "val_loss",
                                                        "steady_payload_bytes_per_round", "payload_bytes_per_round",
                                                        "replicas_identical", "seconds", "torch")} for r in rs]
                       for (m, n), rs in got.items()}, f, indent=1)
        os.makedirs("docs/images", exist_ok=True)
        shutil.copy(png, "docs/images/fsdp-transformer.png")
        doc_tables.main([])


def plot(points, mean, noise, png):
    import matplotlib  # in the project environment (python/requirements.txt)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for mode, colour, marker in (("full", "tab:blue", "o"), ("hsdp", "tab:green", "^")):
        for m, name, x, y in points:
            if m == mode:
                ax.scatter(x, y, color=colour, marker=marker, label=mode if name == "none" else None)
                ax.annotate(name, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.axhspan(mean - noise, mean + noise, color="grey", alpha=0.2, label="uncompressed FSDP2 ± 2 sd")
    ax.set_xscale("log")
    ax.set_xlabel("gradient bytes per rank per step over the compressed links (log)")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title("FSDP2, transformer, 4 gloo ranks: full sharding and HSDP 2 × 2", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"plot: {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated mode:name (full:none, hsdp:bf16, ...)")
    ap.add_argument("--report-only", action="store_true", help="run nothing: the table and plot from " + OUT)
    ap.add_argument("--write-docs", action="store_true", help="write the table's data file, the raw data and the plot")
    args = ap.parse_args()
    matrix, steps = runs()
    only = set(filter(None, args.only.split(",")))
    unknown = only - {f"{m}:{e['name']}" for m, e, _ in matrix}
    if unknown:
        ap.error(f"--only: unknown run(s) {sorted(unknown)}")
    os.makedirs(OUT, exist_ok=True)
    failed = []
    if not args.report_only:
        for mode, e, seed in matrix:
            if (not only or f"{mode}:{e['name']}" in only) and not os.path.exists(path(mode, e, seed)):
                if not run(mode, e, seed, steps):
                    failed.append(f"{mode}:{e['name']}:{seed}")
    report(matrix, args.write_docs)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
