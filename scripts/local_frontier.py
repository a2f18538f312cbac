#!/usr/bin/env python3
"""The local-steps frontier: quality against traffic per example seen, for every run of
scripts/compare_ddp.py --local (DiLoCo with each pseudo-gradient codec, PyTorch's
PeriodicModelAverager, each at H local steps between syncs) beside the per-step DDP hooks of
scripts/compare_ddp.py (H = 1, from the per-step frontier's data file docs/data/frontier[-WORKLOAD].json)
on the same workload, seeds, data order and examples seen.

    .venv/bin/python scripts/local_frontier.py [--workload transformer] [--write-docs]

Traffic is link bytes, what one worker's link carries per training example it sees (sent +
received, at W = 4, from the payload by the ring model for runs made before stats() counted
them: scripts/frontier.py's link_of): a local run's over all its steps (the sync before the
evaluation included), a per-step hook's per step in the steady state (past its dense warm-up
steps), each over the batch; against per-step DDP's bf16 all-reduce. Payload (what the worker
hands to the collectives) and its ratio against per-step DDP's fp32 payload stay as columns. Verdicts: for each baseline (DiLoCo with fp32
pseudo-gradients, PeriodicModelAverager, per-step DDP and PyTorch's PowerSGD) the best sketchsgd
local point at that traffic or less — ahead when better by more than the noise (the largest sd
over points run with 3 seeds), level within it — and our least traffic within the noise.
Seeds 2 and 3 of the local runs are read from build/compare-local[-WORKLOAD]-seedN, as
scripts/frontier.py does, and per-step seeds that the data file lacks from
build/compare-ddp[-WORKLOAD]-seedN; runs and seeds that no build folder holds (run on another
machine) from the last --write-docs' docs/data/local-WORKLOAD.json.

Writes build/local-frontier-WORKLOAD/{frontier.png,table.md}; --write-docs: the PNG in
docs/images, the runs in docs/data/local-WORKLOAD.json and the tables' data files.
"""
import argparse
import glob
import json
import math
import os
import shutil
import statistics
import time

import experiments  # noqa: E402
import frontier  # noqa: E402  (load: runs by name over the seed folders)

# Per-step points shown beside the local runs (names of compare_ddp.py's per-step list): label,
# and whether it is a baseline (theirs) rather than one of ours.
PER_STEP = {"none": ("DDP dense", True), "fp16": ("DDP fp16 (PyTorch)", True),
            "powersgd-r1": ("PyTorch PowerSGD r1", True), "powersgd-r2": ("PyTorch PowerSGD r2", True),
            "powersgd-r4": ("PyTorch PowerSGD r4", True),
            "powersgd-r4-fp16": ("PyTorch PowerSGD r4 in fp16_compress_wrapper", True),
            "ours-psgd-r4-fp16": ("sketchsgd PowerSGD r4 fp16", False), "qsgd-4bit": ("sketchsgd QSGD 4-bit", False)}
# Lines of the plot, and each local run's family and H: experiments.json.
FAMILIES = experiments.families("local")
FAMILY = experiments.family_of("local")
# The issues' targets: how much less traffic than per-step dense a local point must reach (1000x elsewhere).
LEAST = {"lm": 5000}
EVERY = {r["name"]: r["every"] for w in experiments.workloads("local") for r in experiments.workload("local", w)["runs"]}


def family(name):
    return next((f for f in FAMILIES if f["family"] == FAMILY.get(name)), None)


def h_of(name):
    return EVERY.get(name, 1)


def points(args):
    """(name -> {label, H, hook, per_example, less, loss: {seed: value}, baseline}, the runs' batch
    and steps per worker). The local runs come from their build folders; the per-step points from
    the per-step frontier's data file (scripts/frontier.py --write-docs), so the docs' per-step
    figures are the ones compared with."""
    out = {}
    batch = steps = None
    # An earlier --write-docs' points (docs/data/local-WORKLOAD.json), for the runs and seeds that
    # this checkout's build folders lack (run on another machine): the folders' runs come first.
    kept = {}
    if os.path.exists(args.data):
        with open(args.data) as f:
            kept = json.load(f)
    for name, e in frontier.load(argparse.Namespace(runs=args.local_runs)).items():
        # Its seed 1's run, or another seed's where seed 1 ran elsewhere (the data file has it).
        runs = [os.path.join(args.local_runs, name + ".json")] + \
            sorted(glob.glob(os.path.join(args.local_runs + "-seed*", name + ".json")))
        with open(next(p for p in runs if os.path.exists(p))) as f:
            r = json.load(f)
        batch, steps = r["batch"], r["steps"]
        fam = family(name)
        # Everything the run sent over its steps: a run that ends between syncs syncs once more
        # before the evaluation, which the steady figure (taken inside the loop) leaves out.
        out[name] = {"label": fam["label"] if fam else name, "H": h_of(name), "hook": e["hook"],
                     "per_example": r["payload_bytes_per_round"] / batch, "less": r["ratio"], "loss": e["acc"],
                     "baseline": bool(fam and fam["baseline"]), "torch": r.get("torch", "?")}
    if batch is None and kept:
        batch, steps = next(iter(kept.values())).get("batch"), next(iter(kept.values())).get("steps")
    if batch is None:
        return out, batch, steps
    per_step = {}
    if os.path.exists(args.step_data):
        with open(args.step_data) as f:
            per_step = json.load(f)
    # Seeds run since the per-step frontier was written (compare_ddp.py --only none --seed N), and
    # the per-step runs themselves where no frontier was written (a workload with few of them).
    for name, e in frontier.load(argparse.Namespace(runs=args.step_runs)).items():
        if name not in per_step:
            per_step[name] = {**e, "acc": {str(s): q for s, q in e["acc"].items()}}
            continue
        for seed, q in e["acc"].items():
            per_step[name]["acc"].setdefault(str(seed), q)
    for name, (label, theirs) in PER_STEP.items():
        if name in per_step:
            e = per_step[name]
            out[name] = {"label": label, "H": 1, "hook": e["hook"], "per_example": e["payload"] / batch,
                         "less": e["ratio"], "loss": {int(s): v for s, v in e["acc"].items()}, "baseline": theirs,
                         "torch": e.get("torch", "?")}
    for name, p in kept.items():
        seeds = {int(s): v for s, v in p["loss"].items()}
        if name in out:
            for seed, v in seeds.items():
                out[name]["loss"].setdefault(seed, v)
        else:
            out[name] = {**{k: v for k, v in p.items() if k not in ("batch", "steps")}, "loss": seeds}
    return out, batch, steps


def link(p):
    """A point's link bytes per example (frontier.link_of over its payload per example)."""
    return frontier.link_of({"hook": p["hook"], "payload": p["per_example"]})


def mean_sd(p):
    v = list(p["loss"].values())
    return statistics.mean(v), (statistics.stdev(v) if len(v) > 1 else None), len(v)


def verdicts(pts, sc):
    """frontier.verdicts over bytes per example: for each baseline (DiLoCo with fp32 pseudo-gradients,
    PeriodicModelAverager, per-step DDP and PyTorch's PowerSGD), the best sketchsgd local point
    at that traffic or less, and our least traffic within the noise of its quality."""
    runs = {n: {"hook": p["hook"], "payload": link(p), "acc": p["loss"]} for n, p in pts.items()}
    theirs = [n for n, p in pts.items() if p["baseline"]]
    ours = [n for n, p in pts.items() if not p["baseline"] and p["H"] > 1]
    return frontier.verdicts(runs, sc, theirs, ours, label=lambda n: f"{pts[n]['label']}, H = {pts[n]['H']}")


def plot(pts, out, workload, dense, target):
    plt = frontier.pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(11.5, 5.2))
    # Methods ending at about the same place (H = 64 at ~15 kB on lm) would print their H labels
    # over each other: each is written a line above its near neighbours'.
    ys = [mean_sd(p)[0] for p in pts.values()]
    span = (max(ys) - min(ys)) or 1.0
    tagged = []
    for f in FAMILIES:
        label, colour, marker = f["label"], f["colour"], f["marker"]
        line = sorted((link(p), *mean_sd(p)[:2], p["H"]) for n, p in pts.items()
                      if FAMILY.get(n) == f["family"])
        if not line:
            continue
        ax.plot([x for x, _, _, _ in line], [y for _, y, _, _ in line], marker=marker, color=colour, label=label)
        for x, y, sd, h in line:
            above = sum(1 for tx, ty in tagged if abs(math.log10(x / tx)) < 0.15 and abs(y - ty) < 0.04 * span)
            tagged.append((x, y))
            ax.annotate(f"H={h}", (x, y), fontsize=7, xytext=(3, 3 + 8 * above), textcoords="offset points",
                        color=colour)
            if sd:
                ax.errorbar([x], [y], yerr=[sd], color=colour, capsize=3)
    # Per-step points close together (PowerSGD at rank 4: ours and PyTorch's, alone and in fp16)
    # would print their labels over each other: each is written a line below its near neighbours'.
    placed = []
    for n, p in sorted(pts.items(), key=lambda item: link(item[1])):
        if p["H"] == 1:
            x, y = link(p), mean_sd(p)[0]
            ax.scatter(x, y, marker="x", color="black")
            lines = sum(1 for px, py in placed if abs(math.log10(x / px)) < 0.5 and abs(y - py) < 0.1)
            placed.append((x, y))
            ax.annotate(p["label"], (x, y), fontsize=7, xytext=(3, -9 - 8 * lines), textcoords="offset points")
    ax.axhline(target, color="tab:red", ls=":", lw=1,
               label=f"per-step dense {'+ 2 %' if workload in frontier.LOSSES else '- 0.5 points'} ({target:.3f})")
    least = LEAST.get(workload, 1000)
    ax.axvline(dense / least, color="tab:red", ls="--", lw=1, label=f"{least:,}x fewer link bytes than bf16 DDP")
    ax.set_xscale("log")
    ax.set_xlabel("link bytes per worker per training example, W = 4, sent + received (log)")
    ax.set_ylabel(f"validation loss ({frontier.LOSSES[workload]})" if workload in frontier.LOSSES else "test accuracy (%)")
    ax.set_title(f"{workload}, 4 gloo workers: local steps (a line: one method at several H; bars: ±1 sd over "
                 "seeds) vs per-step DDP (x)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: no point hidden
    fig.tight_layout()
    png = os.path.join(out, "frontier.png")
    fig.savefig(png, dpi=120)
    print(f"plot: {png}")
    return png


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="transformer", choices=["transformer", "mlp", "lm"])
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    suffix = "" if args.workload == "mlp" else f"-{args.workload}"  # compare_ddp.py's folders
    args.local_runs = f"build/compare-local{suffix}"
    args.step_data = f"docs/data/frontier{suffix}.json"
    args.step_runs = f"build/compare-ddp{suffix}"
    args.data = f"docs/data/local-{args.workload}.json"
    pts, batch, steps = points(args)
    if not any(p["H"] > 1 for p in pts.values()):
        ap.error(f"no local runs in {args.local_runs}: run scripts/compare_ddp.py --workload {args.workload} --local")
    if "none" not in pts:
        ap.error(f"no per-step dense point in {args.step_data} or {args.step_runs}: scripts/compare_ddp.py --workload "
                 f"{args.workload} --only none")
    lower = args.workload in frontier.LOSSES
    seeded = [mean_sd(p)[1] for p in pts.values() if mean_sd(p)[2] >= 3]
    noise = max(seeded) if seeded else (0.02 if lower else 0.3)
    sc = frontier.Scale(args.workload, noise, first_rule=False)
    dense_q = mean_sd(pts["none"])[0]
    fp32 = pts["none"]["per_example"] * pts["none"]["less"]  # per-step dense fp32 payload per example
    dense = 2 * 2 * 3 / 4 * fp32 / 2  # its bf16 all-reduce's link bytes per example at W = 4
    target = dense_q * 1.02 if lower else dense_q - 0.5

    def paired(p):
        """(this point, per-step dense) as means over the seeds both ran (seeds move every method
        alike); the means over all their seeds where they share none."""
        common = [s for s in p["loss"] if s in pts["none"]["loss"]]
        if not common:
            return mean_sd(p)[0], dense_q
        return (statistics.mean(p["loss"][s] for s in common),
                statistics.mean(pts["none"]["loss"][s] for s in common))

    def gap(p):
        m, d = paired(p)
        return f"{100 * (m / d - 1):+.1f} %" if lower else f"{m - d:+.2f} points"

    def good(p):
        m, d = paired(p)
        return m <= d * 1.02 if lower else m >= d - 0.5

    columns = ["method", "H", "pseudo-gradient", "link bytes per example", "fewer than bf16 per-step DDP",
               "payload per example", "payload less than fp32 DDP's", f"{sc.name}, seed 1", "mean ± sd (seeds)",
               "vs per-step dense (same seeds)"]
    rows = []
    for n, p in sorted(pts.items(), key=lambda kv: (-link(kv[1]))):
        m, sd, k = mean_sd(p)
        fewer = dense / link(p)
        rows.append([p["label"], p["H"], f"`{p['hook']}`", f"{link(p):,.0f} B",
                     f"{fewer:,.0f}×" if fewer >= 10 else f"{fewer:.1f}×",
                     f"{p['per_example']:,.0f} B", f"{fp32 / p['per_example']:,.0f}×",
                     sc.fmt(p["loss"][1]) if 1 in p["loss"] else "—",
                     f"{sc.fmt(m)} ± {sd:.{4 if lower else 2}f} ({k})" if sd is not None else "—",
                     gap(p)])
    v = verdicts(pts, sc)
    vcols = frontier.verdict_columns(sc, theirs="baseline", traffic="link bytes per example")
    least = LEAST.get(args.workload, 1000)
    met = [p for p in pts.values() if p["H"] > 1 and good(p) and dense / link(p) >= least]
    rule = "loss within 2 % of" if lower else "accuracy within 0.5 points of"
    rule += f" per-step dense at the same seeds (all seeds: {target:.4f}" if lower else \
        f" per-step dense at the same seeds (all seeds: {target:.2f} %"
    text = "\n".join("| " + " | ".join(str(c) for c in r) + " |" for r in [columns] + rows) + \
        f"\n\nNoise (largest sd over points with 3 seeds): {noise:.4f}. Target: {rule}) at " \
        f"≥ {least:,}× fewer link bytes than bf16 per-step DDP ({dense / least:,.0f} B per example or less): " + \
        (", ".join(f"{p['label']} H={p['H']}" for p in met) if met else "no point meets it") + ".\n\n" + \
        "\n".join("| " + " | ".join(str(c) for c in r) + " |" for r in [vcols] + v) + "\n"
    print(text)
    out = f"build/local-frontier-{args.workload}"
    os.makedirs(out, exist_ok=True)
    png = plot(pts, out, args.workload, dense, target)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    if args.write_docs:
        import doc_tables
        if png:
            shutil.copy(png, f"docs/images/local-{args.workload}.png")
        data = args.data
        with open(data, "w") as f:
            json.dump({n: {**p, "batch": batch, "steps": steps} for n, p in pts.items()}, f, indent=1)
        cmd = f".venv/bin/python scripts/local_frontier.py --workload {args.workload} --write-docs"
        day = time.strftime("%Y-%m-%d")
        torches = sorted({p.get("torch", "?") for p in pts.values()})
        where = f"the 2-core dev machine, PyTorch {', '.join(torches)}, gloo"
        doc_tables.write(f"docs/data/tables/local-{args.workload}.json", cmd, day, where, columns, rows, data=data,
                         note=f"4 workers, batch {batch} each, the same {steps} steps and data order for "
                              "every row; seed 1, contested points with seeds 2 and 3.")
        doc_tables.write(f"docs/data/tables/local-{args.workload}-verdicts.json", cmd, day, where, vcols, v, data=data,
                         note=f"Quality as means over the seeds run (their count in brackets). Noise: {noise:.4f} "
                              "(the largest sd over points run with 3 seeds): ahead by more, level within it.")
        doc_tables.main([])


if __name__ == "__main__":
    main()
