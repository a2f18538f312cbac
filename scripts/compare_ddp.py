#!/usr/bin/env python3
"""Runs examples/ddp_train.py once per hook — PyTorch's none, fp16 and PowerSGD (rank 1, 2, 4;
alone and inside fp16_compress_wrapper)
and sketchsgd's codecs at budgets that suit the workload — with the same seed, workers, steps and
data order, then writes <out>/<name>.json, a PNG (quality vs payload per round) and a Markdown
table (--write-docs: docs/data/tables/ddp-hooks.json for the MLP, whose rows for the hooks run
replace theirs, or --table NAME for a set of runs of its own, such as lm's untied-*; the other
workloads' frontier tables come from scripts/frontier.py).

    .venv/bin/python scripts/compare_ddp.py [--workload mlp|resnet8|transformer|lm] [--only none,fetchsgd]
                                            [--seed N] [--report-only] [--write-docs [--table NAME]] [--local]

The runs (names, hooks, flags) and their budgets are data: scripts/experiments.json.

--local runs the workload's local-steps list instead (transformer, mlp; ddp_train.py --local H:
DiLoCo with each pseudo-gradient codec, PyTorch's PeriodicModelAverager) into
build/compare-local[-<workload>]; scripts/local_frontier.py tabulates them beside the per-step
runs.

Each workload's run length: mlp 3 epochs, resnet8 1 epoch (the rate decayed to 0 on a cosine),
transformer 300 steps, lm 2 x 1,216 steps (~1.5, 1.5, 3 and 20 minutes a run on 2 cores). Output: build/compare-ddp (mlp) or build/compare-ddp-<workload>,
with -seedN appended for seeds other than 1 (where scripts/frontier.py looks for them).

The sketchsgd package is taken from build/default/python (build it first: bash scripts/test.sh or
cmake --build --preset default).
"""
import argparse
import json
import os
import re
import shutil
import sys
import time

# The command-line checks shared with examples/ (examples/cli.py).
from cli import count, natural  # noqa: E402
import launch  # noqa: E402  (how a job of the matrix runs)

import experiments  # noqa: E402  (the runs of each workload, their budgets and why: experiments.json)
import frontier  # noqa: E402  (the ring model for runs made before link bytes were counted)
from frontier import LOSSES  # noqa: E402  (the workloads scored by validation loss, and its unit)


def run(e, args):
    """One run of the matrix (experiments.json: name, hook, optional flags and every)."""
    name, hook = e["name"], e["hook"]
    out = os.path.join(args.out, f"{name}.json")
    cmd = [sys.executable, "examples/ddp_train.py", "--workload", args.workload, "--hook", hook, "--epochs",
           str(args.epochs), "--max-steps", str(args.max_steps), "--workers", str(args.workers), "--seed",
           str(args.seed), "--json", out, "--progress", "100", *e.get("flags", ())]
    if "every" in e:
        cmd += ["--local", str(e["every"])]
    return launch.job(f"{name}: {hook}", cmd, python=args.python)


def quality(r):
    """The run's quality as the table shows it: test accuracy (%), or validation loss."""
    if r.get("metric", "test_accuracy") == "test_accuracy":
        return f"{100 * r['test_accuracy']:.2f} %"
    return f"{r['val_loss']:.4f}"


COLUMNS = ["hook", "test accuracy", "link bytes a step per rank (steady)", "bf16 all-reduce's link bytes / these",
           "payload per worker per round (steady)", "payload vs fp32 (steady)", "payload vs fp32 (mean over the run)",
           "replicas identical", "wall time"]
# The tables' columns before link bytes were counted: kept rows in them are restated (restate()).
PAYLOAD_COLUMNS = ["hook", "test accuracy", "payload per worker per round (steady)", "vs dense (steady)",
                   "vs dense (mean over the run)", "replicas identical", "wall time"]


def link_cells(hook, payload, ratio, run=None, world=4):
    """A row's link bytes a step per rank (sent + received) and a bf16 all-reduce's over them: as the
    run counted them, or for a run made before it did, from its payload by the ring model."""
    if run and run.get("steady_link_bytes_per_round"):
        link, bf16 = run["steady_link_bytes_per_round"], run["bf16_link_bytes_per_step"]
    else:
        e = {"hook": hook, "payload": payload, "ratio": ratio}
        link, bf16 = frontier.link_of(e, world), frontier.bf16_link(e, world)
    return [f"{link:,.0f} B", f"{bf16 / link:.1f}×"]


def restate(path, columns, world=4):
    """Rows of a table data file still in PAYLOAD_COLUMNS, in COLUMNS (link bytes from the payload
    by the ring model, said in the note); other files untouched. Returns whether it rewrote it."""
    if not os.path.exists(path):
        return False
    with open(path) as f:
        t = json.load(f)
    old = [c if c != "test accuracy" else columns[1] for c in PAYLOAD_COLUMNS]
    if t.get("columns") != old:
        return False
    rows = []
    for r in t["rows"]:
        hook, payload, ratio = r[0].strip("`"), float(r[2].rstrip(" B").replace(",", "")), float(r[3].rstrip("×"))
        rows.append([r[0], r[1], *link_cells(hook, payload, ratio, world=world), *r[2:]])
    t["columns"], t["rows"] = columns, rows
    t["note"] = (t.get("note", "") + f" Link bytes at W = {world}: from each run's payload by the ring model "
                 "(all-reduce 2(W − 1)/W each way, all-gather W − 1 messages; the runs predate counting them).").strip()
    with open(path, "w") as f:
        json.dump(t, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return True


def report(names, args):
    runs = []
    for name, hook in args.hooks:
        path = os.path.join(args.out, f"{name}.json")
        if name in names and os.path.exists(path):
            with open(path) as f:
                runs.append((name, hook, json.load(f)))
    rows = [[f"`{hook}`", quality(r),
             *link_cells(hook, r["steady_payload_bytes_per_round"], r["steady_ratio"], r, args.workers),
             f"{r['steady_payload_bytes_per_round']:,.0f} B", f"{r['steady_ratio']:.1f}×", f"{r['ratio']:.1f}×",
             "yes" if r["replicas_identical"] else "NO", f"{r['seconds']:.0f} s"] for _, hook, r in runs]
    columns = columns_of(args.workload)
    table = "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] +
                      ["| " + " | ".join(r) + " |" for r in rows])
    print(table)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    plot(runs, args)
    if args.write_docs:
        write_docs(rows, runs, args)


def columns_of(workload):
    return COLUMNS if workload not in LOSSES else [c if c != "test accuracy" else "validation loss" for c in COLUMNS]


def write_docs(rows, runs, args):
    """The table's data file (the rows of the hooks run, the others kept) and, for a full run, the
    plot; then the docs' tables. What the figures mean is written in docs/RESULTS.md."""
    import doc_tables
    version = next((r["torch"] for _, _, r in runs if "torch" in r), "?")
    command = ".venv/bin/python scripts/compare_ddp.py --write-docs"
    if args.table != "ddp-hooks":
        command += f"{' --local' if args.local else ''} --workload {args.workload} --only {args.only} --table {args.table}"
    path = f"docs/data/tables/{args.table}.json"
    restate(path, columns_of(args.workload), args.workers)  # so that its kept rows merge with these
    doc_tables.write(path, command, time.strftime("%Y-%m-%d"), f"the 2-core dev machine, PyTorch {version}, gloo",
                     columns_of(args.workload), rows, key=0,
                     note=f"{args.workers} processes, {args.epochs} epochs, seed {args.seed}, one run each.")
    png = os.path.join(args.out, "ddp_accuracy_vs_payload.png")
    if os.path.exists(png) and args.table != "ddp-hooks":
        os.makedirs("docs/images", exist_ok=True)
        shutil.copy(png, f"docs/images/{args.table}.png")
    elif os.path.exists(png) and not args.only:
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
        y = 100 * r["test_accuracy"] if r.get("metric", "test_accuracy") == "test_accuracy" else r["val_loss"]
        ax.scatter(r["steady_payload_bytes_per_round"], y, marker="o" if ours else "s",
                   color="tab:blue" if ours else "tab:orange")
        ax.annotate(name, (r["steady_payload_bytes_per_round"], y), fontsize=8, xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("payload per worker per round, steady state (bytes, log)")
    ax.set_ylabel(f"validation loss ({LOSSES[args.workload]})" if args.workload in LOSSES else "test accuracy (%)")
    kind = "local steps (a sync every H steps, its bytes spread over them)" if args.local else "DDP"
    ax.set_title(f"{kind}, {args.workload}, {args.workers} gloo workers: sketchsgd (circles) vs PyTorch (squares)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = os.path.join(args.out, "ddp_accuracy_vs_payload.png")
    fig.savefig(png, dpi=120)
    print(f"plot: {png}")


def table_name(s):
    """A docs table's name (letters, digits, '.', '_', '-': what a <!-- table:NAME --> block takes)."""
    if not re.fullmatch(r"[\w.-]+", s) or s.startswith("."):
        raise argparse.ArgumentTypeError(f"{s!r} is not a table name (letters, digits, '.', '_', '-')")
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="mlp", choices=sorted(experiments.workloads("ddp")))
    ap.add_argument("--epochs", type=count, help="default: the workload's")
    ap.add_argument("--max-steps", type=natural, help="steps per epoch at most (default: the workload's; 0: all)")
    ap.add_argument("--workers", type=count, default=4)
    ap.add_argument("--seed", type=natural, default=1)
    ap.add_argument("--only", default="", help="comma-separated names")
    ap.add_argument("--out", help="default: build/compare-ddp[-WORKLOAD][-seedN]")
    ap.add_argument("--python", default="build/default/python", help="where the sketchsgd package is")
    ap.add_argument("--report-only", action="store_true", help="run nothing: table and plot from --out")
    ap.add_argument("--write-docs", action="store_true", help="write the table's data file (and plot) into docs/")
    ap.add_argument("--table", default="ddp-hooks", type=table_name,
                    help="the data file --write-docs writes: docs/data/tables/TABLE.json (default ddp-hooks)")
    ap.add_argument("--restate", action="store_true", help="run nothing: rewrite --table's rows kept from before "
                    "link bytes were counted with link columns (from their payload by the ring model), and the docs")
    ap.add_argument("--local", action="store_true",
                    help="the local-steps list (DiLoCo with each codec, PeriodicModelAverager) instead of per-step hooks")
    args = ap.parse_args()
    per_step = experiments.workload("ddp", args.workload)
    epochs, steps, args.runs = per_step["epochs"], per_step["max_steps"], per_step["runs"]
    if args.local:
        if args.workload not in experiments.workloads("local"):
            ap.error(f"--local: lists for {sorted(experiments.workloads('local'))}")
        args.runs = experiments.workload("local", args.workload)["runs"]
    args.hooks = [(e["name"], e["hook"]) for e in args.runs]
    args.epochs = epochs if args.epochs is None else args.epochs
    args.max_steps = steps if args.max_steps is None else args.max_steps
    if args.out is None:
        args.out = ("build/compare-local" if args.local else "build/compare-ddp") + \
            ("" if args.workload == "mlp" else f"-{args.workload}") + ("" if args.seed == 1 else f"-seed{args.seed}")
    if args.write_docs and args.workload != "mlp" and args.table == "ddp-hooks":
        ap.error("--write-docs: ddp-hooks is the MLP's table (--table NAME for other runs); the other "
                 "workloads' frontier tables: scripts/frontier.py --write-docs")
    if args.restate:
        import doc_tables
        path = f"docs/data/tables/{args.table}.json"
        if not os.path.exists(path):
            ap.error(f"--restate: no table {path}")
        try:
            done = restate(path, columns_of(args.workload), args.workers)
        except (ValueError, KeyError, IndexError, AttributeError) as e:  # not a table data file, or a row cut short
            ap.error(f"--restate: {path}: not a table compare_ddp.py wrote ({type(e).__name__}: {e})")
        print(f"{path}: " + ("restated" if done else "not in the payload columns compare_ddp.py wrote before link "
                              "bytes: left as it is"))
        doc_tables.main([])
        return
    if args.table != "ddp-hooks" and not (args.write_docs and args.only):
        ap.error("--table NAME goes with --write-docs and --only (the runs the table holds)")
    only = set(filter(None, args.only.split(",")))
    unknown = only - {n for n, _ in args.hooks}
    if unknown:
        ap.error(f"--only: unknown hook name(s) for {args.workload}: {sorted(unknown)}")
    if not args.report_only and not os.path.isdir(args.python):
        ap.error(f"--python {args.python}: no such folder (build the package: cmake --build --preset default)")
    names = [n for n, _ in args.hooks if not only or n in only]
    os.makedirs(args.out, exist_ok=True)
    failed = []
    if not args.report_only:
        for e in args.runs:
            if e["name"] in names and not run(e, args):
                failed.append(e["name"])
    report(names, args)
    if failed:  # the others ran and are reported; the exit status says some did not
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
