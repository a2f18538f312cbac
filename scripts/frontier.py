#!/usr/bin/env python3
"""The traffic frontier under PyTorch DDP: quality against payload for every hook that
scripts/compare_ddp.py ran on a workload (seed 1 in build/compare-ddp[-WORKLOAD], more seeds in
the same folder name with -seedN), PyTorch's PowerSGD included; the run-to-run noise from the
seeds; and, for every budget where PyTorch's PowerSGD has a point, the best sketchsgd hook at that
payload or less.

    .venv/bin/python scripts/frontier.py [--workload mlp|resnet8|transformer|lm] [--write-docs]
    .venv/bin/python scripts/frontier.py --half build/half [--write-docs]   # bf16 models vs fp32

Quality is test accuracy (%, higher is better) or, for the language models, validation loss (nats
per byte or per token, lower is better). Verdicts: "ahead" when better than PyTorch's point by more than the noise
(the largest sd over hooks run with 3 seeds), "level" within it, else "behind" (the MLP's table
keeps its first rule: ahead from +0.3 points, level within the noise, ours "within 0.1 points").

Writes build/frontier[-WORKLOAD]/frontier.png and table.md (with --write-docs: the PNG in
docs/images, the runs in docs/data/frontier[-WORKLOAD].json and the frontier tables' data files
in docs/data/tables).
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

import experiments  # noqa: E402  (scripts/: the runs and their plot families)

WORKERS = 4  # compare_ddp.py's

# Lines of the plot: a family of hooks whose points differ by budget only (experiments.json).
FAMILIES = experiments.families("ddp")
FAMILY = experiments.family_of("ddp")  # run name -> family
PYTORCH = ("torch-powersgd", "torch-powersgd-fp16")  # the families the verdicts compare against
LOSSES = {"transformer": "nats/byte", "lm": "nats/token"}  # workloads scored by validation loss, its unit


def load(args):
    """name -> {"hook", "payload", "ratio", "acc": {seed: quality}} (accuracy in %, or loss)"""
    runs = {}
    dirs = [(1, args.runs)] + sorted((int(re.search(r"seed(\d+)$", d).group(1)), d)
                                     for d in glob.glob(args.runs + "-seed*") if re.search(r"seed(\d+)$", d))
    own = {**experiments.own_tables("ddp"), **experiments.own_tables("local")}  # another job's runs (own tables)
    for seed, d in dirs:
        for path in glob.glob(os.path.join(d, "*.json")):
            name = os.path.basename(path)[:-5]
            if name in own:
                continue
            with open(path) as f:
                r = json.load(f)
            metric = r.get("metric", "test_accuracy")
            if metric not in r:
                continue
            torch_version = ".".join(str(r.get("torch", "?")).split("+")[0].split(".")[:2])
            e = runs.setdefault(name, {"hook": r.get("hook", name), "payload": r["steady_payload_bytes_per_round"],
                                       "ratio": r["steady_ratio"], "acc": {}, "metric": metric,
                                       "torch": torch_version})
            if "steady_link_bytes_per_round" in r:  # counted by stats() (runs before it: link_of)
                e["link"] = r["steady_link_bytes_per_round"]
            e["acc"][seed] = 100 * r[metric] if metric == "test_accuracy" else r[metric]
    return runs


def with_earlier(runs, path):
    """runs, plus the runs of an earlier --write-docs (docs/data/frontier*.json) for the hooks not
    run again (those files before the torch field were all made with PyTorch 1.13); and the
    earlier runs on another PyTorch that the new ones replace, whose seeds still measure the
    job's noise (an earlier run on the same PyTorch adds the seeds the run folders lack)."""
    with open(path) as f:
        earlier = json.load(f)
    replaced = []
    for name, e in earlier.items():
        e = dict(e, acc={int(k): v for k, v in e["acc"].items()}, torch=e.get("torch", "1.13"))
        base = name.split("@")[0]
        if base in runs and runs[base]["torch"] == e["torch"]:
            # The same hook on the same PyTorch: seeds the run folders no longer hold join it.
            for seed, v in e["acc"].items():
                runs[base]["acc"].setdefault(seed, v)
            continue
        if "@" in name or name in runs:  # "name@1.13": a run replaced before, kept for its seeds
            replaced.append((name.split("@")[0], e))
        else:
            runs[name] = e
    return runs, replaced


def gathered_hook(hook: str) -> bool:
    """Whether a hook's messages go out by all-gather (sketchsgd's gathered codecs) rather than
    by all-reduce (PyTorch's hooks, none, fp16, sketchsgd's summed codecs)."""
    if not hook.startswith("sketchsgd:") and (hook in ("none", "fp16", "average") or
                                              hook.startswith(("powersgd", "torch:", "torchft:"))):
        return False  # PyTorch's and torchft's own: all-reduces
    import sketchsgd
    return sketchsgd.gathered(hook[len("sketchsgd:"):] if hook.startswith("sketchsgd:") else hook)


def link_of(e, world: int = WORKERS) -> float:
    """A run's link bytes a step per rank, sent + received: counted (ddp_train.py's
    steady_link_bytes_per_round) or, for a run made before they were, from its payload by the
    ring model: an all-reduce's link carries 2(W − 1)/W of it each way, an all-gather's W − 1
    times. A gathered hook's whole payload is counted as gathered (its biases, sent whole, are
    summed: on the MLP ~5 % of top-k's payload, so its link bytes read up to ~2 % high at W = 4)."""
    if "link" in e:
        return e["link"]
    per = (world - 1) if gathered_hook(e["hook"]) else 2 * (world - 1) / world
    return 2 * per * e["payload"]


def bf16_link(e, world: int = WORKERS) -> float:
    """What a bf16 ring all-reduce of the run's gradient carries through a rank's link a step:
    2 · 2(W − 1)/W · 2d bytes (d from the run's payload and its payload ratio against dense in
    the model's dtype, fp32 here)."""
    d = e["ratio"] * e["payload"] / 4
    return 2 * 2 * (world - 1) / world * 2 * d


def summary(e):
    accs = list(e["acc"].values())
    mean = statistics.mean(accs)
    sd = statistics.stdev(accs) if len(accs) > 1 else None
    return mean, sd, len(accs)


class Scale:
    """How a workload's quality reads: its direction, format and the verdicts' margins."""

    def __init__(self, workload, noise, first_rule=True):
        self.loss = workload in LOSSES
        self.sign = -1 if self.loss else 1  # better = sign * (ours - theirs) > 0
        self.noise = noise
        # The MLP's per-step table keeps its first rule (it was made with it); the rest use the noise.
        self.ahead, self.level = (0.3, 0.1) if workload == "mlp" and first_rule else (noise, noise)
        self.name = "validation loss" if self.loss else "accuracy"

    def fmt(self, q):
        return f"{q:.4f}" if self.loss else f"{q:.2f} %"

    def diff(self, d):
        return f"{d:+.4f}" if self.loss else f"{d:+.2f}"

    def tol(self):
        return f"{self.level:.4f}" if self.loss else f"{self.level:.1f} points"


def verdict_columns(sc, theirs="PyTorch PowerSGD", traffic="payload"):
    return [theirs, f"its {traffic}", f"its {sc.name}", f"best of ours at that {traffic} or less", sc.name,
            traffic, "difference", "verdict", f"least traffic of ours within {sc.tol()}"]


def verdicts(runs, sc, theirs=None, ours=None, label=None):
    """For each of their points (default: PyTorch's PowerSGD budgets): the best of ours (default:
    every sketchsgd hook) at that traffic or less ("ahead": better by sc.ahead or more; "level":
    within the run-to-run noise; else "behind"), and our least traffic at their quality (within
    sc.level). runs: name -> {"hook", "payload" (the traffic compared), "acc": {seed: quality}};
    label(name) names a point in the table (default: theirs by name, ours by hook)."""
    rows = []
    versions = {runs[n].get("torch") for n in runs}
    name_of = label or (lambda n: n)
    # With runs of two PyTorch versions in one table, each of ours says which it ran on.
    hook_of = label or (lambda n: f"`{runs[n]['hook']}`" + (f" (torch {runs[n]['torch']})" if len(versions) > 1 else ""))
    if theirs is None:
        theirs = [n for n in runs if FAMILY.get(n) in PYTORCH]
    if ours is None:
        ours = [n for n in runs if n not in ("none", "fp16") and not n.startswith("powersgd")]
    ours = {n: runs[n] for n in ours}
    for name in sorted(theirs, key=lambda n: runs[n]["payload"]):
        t = runs[name]
        tm, _, tn = summary(t)
        row = [name_of(name), f"{t['payload']:,.0f} B", f"{sc.fmt(tm)} ({tn})"]
        fit = [(sc.sign * summary(e)[0], n) for n, e in ours.items() if e["payload"] <= t["payload"] * 1.001]
        if not fit:
            rows.append(row + ["none"] + [""] * 5)
            continue
        _, bn = max(fit)
        e = ours[bn]
        bm, _, bnn = summary(e)
        better = sc.sign * (bm - tm)
        state = "ahead" if better >= sc.ahead else ("level" if better > -sc.noise else "behind")
        row += [hook_of(bn), f"{sc.fmt(bm)} ({bnn})", f"{e['payload']:,.0f} B ({t['payload'] / e['payload']:.1f}x less)",
                sc.diff(bm - tm), state]
        level = [(e["payload"], n) for n, e in ours.items() if sc.sign * (summary(e)[0] - tm) >= -sc.level]
        if level:
            lp, ln = min(level)
            row.append(f"{hook_of(ln)}: {sc.fmt(summary(ours[ln])[0])} at {lp:,.0f} B ({t['payload'] / lp:.1f}x less)")
        else:
            row.append("none")
        rows.append(row)
    return rows


def pyplot():
    """matplotlib.pyplot drawing to files, or None (said once) where matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("(no matplotlib: no plot)")
        return None


def plot(runs, out, workload, sc):
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    placed = set()
    for f in FAMILIES:
        label, color, marker = f["label"], f["colour"], f["marker"]
        pts = sorted((link_of(e), *summary(e)[:2], n) for n, e in runs.items() if FAMILY.get(n) == f["family"])
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
        ax.scatter([link_of(e)], [m], color="gray", marker="x")
        ax.annotate(n, (link_of(e), m), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel(f"link bytes a step per rank at W = {WORKERS}, sent + received, steady state (log)")
    what = {"mlp": "Fashion-MNIST MLP, 3 epochs", "resnet8": "ResNet-8 on Fashion-MNIST, 1 epoch",
            "transformer": "byte-level transformer LM, 300 steps", "lm": "GPT-2 LM (BPE), 2,432 steps"}.get(workload,
                                                                                                      workload)
    ax.set_ylabel((f"validation loss ({LOSSES[workload]}" if sc.loss else "test accuracy (%") +
                  "; mean over seeds, bars: ±1 sd)")
    ax.set_title(f"Traffic frontier under DDP: {what}, 4 gloo workers", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right" if sc.loss else "lower right")
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    png = os.path.join(out, "frontier.png")
    fig.savefig(png, dpi=120)
    print(f"plot: {png}")
    return png


HALF_COLUMNS = ["workload", "hook", "model", "quality", "the fp32 model's (mean ± sd, seeds)", "difference",
                "within the fp32 runs' noise", "replicas identical"]


def half_precision(args):
    """Each half-precision run in args.half (examples/ddp_train.py --dtype bf16 --json) against
    the fp32 runs of the same workload and hook that compare_ddp.py made (every seed): within
    the noise when the difference is at most twice the fp32 runs' sd (or the frontier's noise
    where only one seed ran)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(args.half, "*.json"))):
        with open(path) as f:
            r = json.load(f)
        w = r["workload"]
        suffix = "" if w == "mlp" else f"-{w}"
        fp32 = load(argparse.Namespace(runs=f"build/compare-ddp{suffix}"))
        same = next((e for e in fp32.values() if e["hook"] == r["hook"]), None)
        if same is None:
            sys.exit(f"{path}: no fp32 run of {r['hook']!r} in build/compare-ddp{suffix}")
        sc = Scale(w, 0)
        q = 100 * r[r["metric"]] if r["metric"] == "test_accuracy" else r[r["metric"]]
        m, sd, k = summary(same)
        seeded = [summary(e)[1] for e in fp32.values() if summary(e)[2] >= 3]
        tol = 2 * max(sd or 0, max(seeded) if seeded else 0)
        rows.append([w, f"`{r['hook']}`", r["dtype"], sc.fmt(q),
                     f"{sc.fmt(m)} ± {sd:.{4 if sc.loss else 2}f} ({k})" if sd is not None else f"{sc.fmt(m)} (1)",
                     sc.diff(q - m),
                     "yes" if abs(q - m) <= tol else "NO", "yes" if r["replicas_identical"] else "NO"])
    text = "\n".join("| " + " | ".join(row) + " |" for row in [HALF_COLUMNS] + rows)
    print(text)
    if args.write_docs:
        import doc_tables
        doc_tables.write("docs/data/tables/half-precision.json", f".venv/bin/python scripts/frontier.py --half "
                         f"{args.half} --write-docs", time.strftime("%Y-%m-%d"), "the 2-core dev machine, gloo",
                         HALF_COLUMNS, rows, note="Half-precision runs: `examples/ddp_train.py --dtype bf16` with the "
                         "workload's compare_ddp.py settings; within the noise: at most twice the fp32 runs' largest "
                         "sd over 3 seeds.")
        doc_tables.main([])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--half", help="a folder of half-precision runs (ddp_train.py --dtype bf16 --json): their table")
    ap.add_argument("--workload", default="mlp", choices=["mlp", "resnet8", "transformer", "lm"],
                    help="what compare_ddp.py ran")
    ap.add_argument("--runs", help="default: build/compare-ddp[-WORKLOAD]")
    ap.add_argument("--out", help="default: build/frontier[-WORKLOAD]")
    ap.add_argument("--earlier", help="an earlier run's data file (docs/data/frontier[-WORKLOAD].json): its hooks "
                                      "not run again join the table, marked with their PyTorch version")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if args.earlier and not os.path.isfile(args.earlier):
        ap.error(f"--earlier {args.earlier}: no such file")
    for name in ("half", "runs"):
        if getattr(args, name) and not os.path.isdir(getattr(args, name)):
            ap.error(f"--{name} {getattr(args, name)}: no such folder")
    if args.half:
        return half_precision(args)
    suffix = "" if args.workload == "mlp" else f"-{args.workload}"
    args.runs = args.runs or f"build/compare-ddp{suffix}"
    args.out = args.out or f"build/frontier{suffix}"
    runs, replaced = load(args) if os.path.isdir(args.runs) else {}, []
    if args.earlier:  # with no runs here, the earlier file's alone (a table restated from its data)
        runs, replaced = with_earlier(runs, args.earlier)
    if not runs:
        ap.error(f"no results in {args.runs}: run scripts/compare_ddp.py --workload {args.workload} first")
    seeded = [summary(e)[1] for e in [*runs.values(), *(e for _, e in replaced)] if summary(e)[2] >= 3]
    loss = args.workload in LOSSES
    noise = max(seeded) if seeded else (0.02 if loss else 0.5)
    sc = Scale(args.workload, noise)
    unit = "" if loss else " %"
    columns = ["hook", f"link bytes a step per rank (W = {WORKERS})", "bf16 all-reduce's link bytes / these",
               "payload (steady)", "payload vs fp32", f"{sc.name}, seed 1", "mean ± sd (seeds)", "PyTorch"]
    rows = []
    for n, e in sorted(runs.items(), key=lambda kv: -link_of(kv[1])):
        m, sd, k = summary(e)
        first = e["acc"].get(1)
        digits = 4 if loss else 2
        rows.append([f"`{e['hook']}`", f"{link_of(e):,.0f} B", f"{bf16_link(e) / link_of(e):.1f}×",
                     f"{e['payload']:,.0f} B", f"{e['ratio']:.0f}×",
                     sc.fmt(first) if first is not None else "—",
                     f"{m:.{digits}f} ± {sd:.{digits}f}{unit} ({k})" if sd is not None else "—",
                     e.get("torch", "?")])
    # Verdicts on link bytes: what a rank's link carries, not what it hands to the collectives.
    v = verdicts({n: dict(e, payload=link_of(e)) for n, e in runs.items()}, sc)
    noise_text = f"{noise:.4f}" if loss else f"{noise:.2f} points"
    text = "\n".join("| " + " | ".join(r) + " |" for r in [columns] + rows) + \
        f"\n\nRun-to-run noise (largest sd over hooks run with 3 seeds, earlier runs included): {noise_text}.\n\n" + \
        "\n".join("| " + " | ".join(r) + " |" for r in [verdict_columns(sc, traffic="link bytes")] + v) + "\n"
    print(text)
    png = plot(runs, args.out, args.workload, sc)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    if args.write_docs:
        import doc_tables
        if png:
            shutil.copy(png, f"docs/images/frontier{suffix}.png")
        data = f"docs/data/frontier{suffix}.json"
        kept = {**runs, **{f"{n}@{e['torch']}": e for n, e in replaced}}
        with open(data, "w") as f:
            json.dump(kept, f, indent=1, default=str)
        cmd = ".venv/bin/python scripts/frontier.py " + (f"--workload {args.workload} " if suffix else "") + \
            (f"--earlier {args.earlier} " if args.earlier else "") + "--write-docs"
        day = time.strftime("%Y-%m-%d")
        where = "the 2-core dev machine, gloo"
        doc_tables.write(f"docs/data/tables/frontier{suffix}.json", cmd, day, where, columns, rows, data=data,
                         note=f"Every hook of compare_ddp.py --workload {args.workload}, seed 1; the contested points "
                              "again with seeds 2 and 3.")
        doc_tables.write(f"docs/data/tables/frontier{suffix}-verdicts.json", cmd, day, where,
                         verdict_columns(sc, traffic="link bytes"), v,
                         data=data,
                         note=f"{sc.name.capitalize()} values are means over the seeds run (their count in brackets); the "
                              f"run-to-run noise (the largest sd over hooks run with 3 seeds) is {noise_text}.")
        doc_tables.main([])


if __name__ == "__main__":
    main()
