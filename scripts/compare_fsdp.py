#!/usr/bin/env python3
"""Compression under FSDP2 on a transformer: examples/ddp_train.py --fsdp full (4 ranks, the
reduce-scatter compressed) and --fsdp hsdp (2 replicas × 2 shards, the replicas' all-reduce
compressed) and --fsdp fsdp1 (FSDP1 FULL_SHARD, its communication hook compressed), each codec
against FSDP2's own fp32 reduction and its MixedPrecisionPolicy(reduce_dtype=bf16), same seed,
data order and steps; then a table of
gradient bytes per rank per step and validation loss, with each codec's DDP result at the same
budget beside it (docs/data/frontier-<workload>.json where there is one), and a PNG.

    .venv/bin/python scripts/compare_fsdp.py [--workload transformer|lm] [--only full:none,hsdp:bf16]
                                             [--report-only] [--write-docs]

The runs are data (scripts/experiments.json, "fsdp"); a run is skipped when its JSON exists
(delete build/compare-fsdp[-lm] to start again). About 2.5 minutes a transformer run on 2 cores
(16 runs), 15-20 minutes an lm run. Verdicts: "within the noise" when a run's validation loss is
at most twice the sd of the uncompressed seeds above their mean; the same codec's DDP run, against
uncompressed DDP's mean by the same margin. Uncompressed FSDP2 computes DDP's steps (equal to four
decimals on every seed compared), so where a workload's FSDP2 seeds are fewer than its DDP ones
(lm), per-step dense DDP's seeds from scripts/compare_ddp.py stand in for the missing ones.
"""
import argparse
import json
import os
import statistics
import sys
import time

import experiments  # noqa: E402  (the runs: experiments.json)
import launch  # noqa: E402
import frontier  # noqa: E402  (the DDP runs' link bytes)
from frontier import LOSSES  # noqa: E402  (the workloads' loss units)

def link_share(mode, hook, run):
    """The bytes a rank's handed bytes put on each of its links, over them, on a ring: FSDP2's own
    reduce-scatter (W − 1)/W, a summable codec's all-reduce 2(W − 1)/W, a gathered codec's
    all-to-all per destination (W − 1)/W under full sharding, its all-gather R − 1 across the R
    replicas under HSDP (W: the ranks of the collective)."""
    world = (run.get("replicas") or 2) if mode == "hsdp" else (run.get("workers") or 4)
    if hook in ("none", "bf16"):
        return (2 if mode == "hsdp" else 1) * (world - 1) / world  # HSDP: FSDP2's all-reduce
    sys.path.insert(0, os.path.abspath("build/default/python"))  # where compare_ddp.py takes it from
    import sketchsgd
    if sketchsgd.gathered(hook.removeprefix("sketchsgd:")):
        return world - 1 if mode == "hsdp" else (world - 1) / world
    return 2 * (world - 1) / world


def out_dir(workload):
    return "build/compare-fsdp" + ("" if workload == "transformer" else f"-{workload}")


def runs(workload):
    """(mode, run entry, seed) of the matrix in order, and the workload's entry (its steps)."""
    w = experiments._data()["fsdp"][workload]
    return [(mode, e, seed) for mode, es in w["modes"].items() for e in es for seed in e.get("seeds", [1])], w


def path(workload, mode, e, seed):
    return os.path.join(out_dir(workload), f"{mode}-{e['name']}-seed{seed}.json")


def run(workload, mode, e, seed, w):
    cmd = [sys.executable, "examples/ddp_train.py", "--workload", workload, "--fsdp", mode, "--workers", "4",
           "--hook", e["hook"], "--epochs", str(w.get("epochs", 1)), "--max-steps", str(w["max_steps"]),
           "--seed", str(seed), "--progress", "100", "--json", path(workload, mode, e, seed)]
    return launch.job(f"{mode} {e['name']} seed {seed}: {e['hook']}", cmd)


def ddp_dense(workload):
    """Per-step dense DDP's validation loss by seed on the workload: the docs' data (the local
    frontier's "none" point, or the per-step frontier's), then compare_ddp.py's run folders."""
    found = {}
    for data, get in ((f"docs/data/local-{workload}.json", lambda d: d.get("none", {}).get("loss", {})),
                      (f"docs/data/frontier-{workload}.json", lambda d: d.get("none", {}).get("acc", {}))):
        if os.path.exists(data):
            with open(data) as f:
                found.update({int(s): v for s, v in get(json.load(f)).items()})
    for seed in range(1, 10):
        run_json = f"build/compare-ddp-{workload}{'' if seed == 1 else f'-seed{seed}'}/none.json"
        if os.path.exists(run_json):
            with open(run_json) as f:
                found[seed] = json.load(f)["val_loss"]
    return found


def report(workload, matrix, write_docs):
    got = {}
    # An earlier --write-docs' runs (docs/data/fsdp-WORKLOAD.json) stand for the run files this
    # checkout's build folder lacks (run on another machine).
    kept = {}
    if os.path.exists(f"docs/data/fsdp-{workload}.json"):
        with open(f"docs/data/fsdp-{workload}.json") as f:
            kept = {(*key.split(":", 1), r["seed"]): r for key, rs in json.load(f).items() for r in rs}
    for mode, e, seed in matrix:
        if os.path.exists(path(workload, mode, e, seed)):
            with open(path(workload, mode, e, seed)) as f:
                got.setdefault((mode, e["name"]), []).append(json.load(f))
        elif (mode, e["name"], seed) in kept:
            got.setdefault((mode, e["name"]), []).append(kept[(mode, e["name"], seed)])
    fsdp_plain = {r["seed"]: r["val_loss"] for r in got.get(("full", "none"), [])}
    ddp_plain_seeds = ddp_dense(workload)
    plain = {**ddp_plain_seeds, **fsdp_plain}
    if len(plain) < 2:
        sys.exit("compare_fsdp.py: fewer than two uncompressed seeds (full:none, or per-step dense DDP's "
                 "from scripts/compare_ddp.py --only none --seed N): run without --report-only")
    mean, noise = statistics.mean(plain.values()), 2 * statistics.stdev(plain.values())
    stand_in = sorted(set(plain) - set(fsdp_plain))
    frontier_data = f"docs/data/frontier-{workload}.json"
    ddp = {}
    if os.path.exists(frontier_data):
        with open(frontier_data) as f:
            ddp = json.load(f)
    ddp_plain = statistics.mean(ddp_plain_seeds.values()) if ddp_plain_seeds else mean
    rows, points = [], []
    # Full sharding's bf16 reduce-scatter, as every full-sharding run records it.
    full_bf16 = next((r["fsdp_bf16_bytes_per_step"] for (m, _), rs in got.items() if m == "full" for r in rs
                      if r.get("fsdp_bf16_bytes_per_step")), None)
    for mode, e, seed in matrix:
        rs = got.get((mode, e["name"]))
        if not rs and (mode, e["name"]) == ("full", "none") and stand_in and full_bf16:
            # No FSDP2 run: uncompressed DDP's seeds (the same steps), fp32 bytes twice bf16's.
            share = link_share(mode, "none", {"workers": 4})
            rows.append([mode, "`none` (per-step dense DDP's runs)", f"{2 * share * 2 * full_bf16:,.0f} B", "0.5×",
                         f"{2 * full_bf16:,.0f} B", "0.5×", f"{mean:.4f} ({len(plain)})", "+0.0000", "within", "—",
                         "—", "—"])
            points.append((mode, "none", 2 * share * 2 * full_bf16, mean))
            continue
        if not rs or seed != e.get("seeds", [1])[0]:
            continue
        bf16 = got.get((mode, "bf16"))
        loss = statistics.mean(plain.values()) if (mode, e["name"]) == ("full", "none") else \
            statistics.mean(r["val_loss"] for r in rs)
        count = len(plain) if (mode, e["name"]) == ("full", "none") else len(rs)
        sent = rs[0]["steady_payload_bytes_per_round"]
        # FSDP2's bf16 reduce_dtype: its run, or what the run records it would send.
        bf16_bytes = bf16[0]["steady_payload_bytes_per_round"] if bf16 else rs[0].get("fsdp_bf16_bytes_per_step")
        vs = f"{bf16_bytes / sent:.1f}×" if bf16_bytes else "—"
        # Sent + received: a ring's collectives carry as much into a rank as out of it.
        on_link = 2 * sent * link_share(mode, e["hook"], rs[0])
        link = f"{2 * bf16_bytes * link_share(mode, 'bf16', rs[0]) / on_link:.1f}×" if bf16_bytes else "—"
        diff = loss - mean
        verdict = "within" if diff <= noise else "behind"
        theirs = ddp.get(e.get("ddp", ""), {})
        if theirs:
            ddp_loss = statistics.mean(theirs["acc"].values())
            ddp_cell = f"{ddp_loss:.4f} at {frontier.link_of(theirs):,.0f} B"
            ddp_verdict = "within" if ddp_loss - ddp_plain <= noise else "behind"
        else:
            ddp_cell = ddp_verdict = "—"
        rows.append([mode, f"`{e['hook']}`", f"{on_link:,.0f} B", link, f"{sent:,.0f} B", vs,
                     f"{loss:.4f}" + (f" ({count})" if count > 1 else ""),
                     f"{diff:+.4f}", verdict, ddp_cell, ddp_verdict,
                     "yes" if all(r["replicas_identical"] for r in rs) else "NO"])
        points.append((mode, e["name"], on_link, loss))
    columns = ["mode", "reduction", "link bytes a step per rank (ring, sent + received)",
               "bf16 reduce_dtype's link bytes / these", "payload handed a step per rank", "payload: bf16's / this",
               "validation loss", "vs uncompressed FSDP2", f"within the noise ({noise:.4f})",
               "same codec under DDP (its link bytes at W = 4)",
               "under DDP: within the noise of uncompressed DDP", "replicas identical"]
    print(" | ".join(columns))
    for r in rows:
        print(" | ".join(r))
    png = os.path.join(out_dir(workload), f"fsdp-{workload}.png")
    plot(workload, points, mean, noise, png)
    if write_docs:
        import doc_tables
        import shutil
        w = runs(workload)[1]
        steps = w["max_steps"] * w.get("epochs", 1)
        seeds = ", ".join(map(str, sorted(plain)))
        if len(stand_in) == len(plain):
            where = f"per-step dense DDP's seeds {seeds}"
        else:
            where = f"seeds {seeds}" + (f", seed{'s' if len(stand_in) > 1 else ''} "
                                        f"{', '.join(map(str, stand_in))} of them per-step dense DDP's" if stand_in else "")
        flag = "" if workload == "transformer" else f" --workload {workload}"
        doc_tables.write(f"docs/data/tables/fsdp-{workload}.json",
                         f".venv/bin/python scripts/compare_fsdp.py{flag} --write-docs",
                         time.strftime("%Y-%m-%d"), f"the 2-core dev machine, PyTorch {rs[0]['torch']}, gloo, 4 ranks",
                         columns, rows, key=None,
                         note=f"{steps} steps, seed 1 (uncompressed: {where}, mean {mean:.4f}); "
                              "full: the reduce-scatter's input (a summable codec: its payload, all-reduced; a "
                              "gathered codec, sent per destination: its messages for every chunk, its own "
                              "included); hsdp: a rank's shard across the 2 replicas; fsdp1: as full, over FSDP1's flat gradients. Link bytes: what "
                              "that payload puts through a rank's link on a ring, sent + received (docs/PYTORCH.md, "
                              "\"FSDP2: what the bytes are\"); the traffic to compare. DDP: the frontier's mean over "
                              "its seeds.",
                         data=f"docs/data/fsdp-{workload}.json")
        with open(f"docs/data/fsdp-{workload}.json", "w") as f:
            json.dump({f"{m}:{n}": [{k: r.get(k) for k in ("hook", "fsdp", "replicas", "seed", "val_loss",
                                                            "steady_payload_bytes_per_round", "payload_bytes_per_round",
                                                            "fsdp_bf16_bytes_per_step", "replicas_identical", "seconds",
                                                            "torch")} for r in rs]
                       for (m, n), rs in got.items()}, f, indent=1)
        os.makedirs("docs/images", exist_ok=True)
        shutil.copy(png, f"docs/images/fsdp-{workload}.png")
        doc_tables.main([])


def plot(workload, points, mean, noise, png):
    import matplotlib  # in the project environment (python/requirements.txt)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for mode, colour, marker in (("full", "tab:blue", "o"), ("hsdp", "tab:green", "^"), ("fsdp1", "tab:orange", "s")):
        first = True
        for m, name, x, y in points:
            if m == mode:
                ax.scatter(x, y, color=colour, marker=marker, label=mode if first else None)
                first = False
                ax.annotate(name, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.axhspan(mean - noise, mean + noise, color="grey", alpha=0.2, label="uncompressed FSDP2 ± 2 sd")
    ax.set_xscale("log")
    ax.set_xlabel("link bytes a step per rank over the compressed links, sent + received, W = 4 (log)")
    ax.set_ylabel(f"validation loss ({LOSSES[workload]})")
    ax.set_title(f"FSDP, {workload}, 4 gloo ranks: FSDP2 full sharding and HSDP 2 × 2, FSDP1 FULL_SHARD", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"plot: {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="transformer", choices=sorted(experiments._data()["fsdp"]))
    ap.add_argument("--only", default="", help="comma-separated mode:name (full:none, hsdp:bf16, ...)")
    ap.add_argument("--report-only", action="store_true", help="run nothing: the table and plot from build/")
    ap.add_argument("--write-docs", action="store_true", help="write the table's data file, the raw data and the plot")
    args = ap.parse_args()
    matrix, w = runs(args.workload)
    only = set(filter(None, args.only.split(",")))
    unknown = only - {f"{m}:{e['name']}" for m, e, _ in matrix}
    if unknown:
        ap.error(f"--only: unknown run(s) {sorted(unknown)}")
    os.makedirs(out_dir(args.workload), exist_ok=True)
    failed = []
    if not args.report_only:
        for mode, e, seed in matrix:
            if (not only or f"{mode}:{e['name']}" in only) and not os.path.exists(path(args.workload, mode, e, seed)):
                if not run(args.workload, mode, e, seed, w):
                    failed.append(f"{mode}:{e['name']}:{seed}")
    report(args.workload, matrix, args.write_docs)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
