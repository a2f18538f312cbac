#!/usr/bin/env python3
"""Runs examples/ddp_train.py once per hook — PyTorch's none, fp16 and PowerSGD (rank 1, 2, 4;
alone and inside fp16_compress_wrapper)
and sketchsgd's codecs at budgets that suit the workload — with the same seed, workers, steps and
data order, then writes <out>/<name>.json, a PNG (quality vs payload per round) and a Markdown
table (--write-docs, MLP only: docs/data/tables/ddp-hooks.json, whose rows for the hooks run
replace theirs; the other workloads' tables come from scripts/frontier.py).

    .venv/bin/python scripts/compare_ddp.py [--workload mlp|resnet8|transformer] [--only none,fetchsgd]
                                            [--seed N] [--report-only] [--write-docs] [--local]

--local runs the workload's local-steps list instead (transformer, mlp; ddp_train.py --local H:
DiLoCo with each pseudo-gradient codec, PyTorch's PeriodicModelAverager) into
build/compare-local[-<workload>]; scripts/local_frontier.py tabulates them beside the per-step
runs.

Each workload's run length: mlp 3 epochs, resnet8 1 epoch (the rate decayed to 0 on a cosine),
transformer 300 steps (~1.5, 1.5 and 3 minutes a run on 2 cores). Output: build/compare-ddp (mlp) or build/compare-ddp-<workload>,
with -seedN appended for seeds other than 1 (where scripts/frontier.py looks for them).

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

# The command-line checks shared with examples/ (examples/cli.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from cli import count, natural  # noqa: E402

# name, hook. Budgets for the MLP (d = 1,863,690; dense = 7.45 MB per worker per round): 20x less
# is 373 kB. sketchsgd payloads include the 2,058 bias values sent uncompressed (8 kB).
MLP = [
    ("none", "none"),
    ("fp16", "fp16"),
    ("powersgd-r1", "powersgd:rank=1"),
    ("powersgd-r2", "powersgd:rank=2"),
    ("powersgd-r4", "powersgd:rank=4"),
    # PyTorch's PowerSGD inside its fp16_compress_wrapper: fp16 on the wire, as our wire=fp16.
    ("powersgd-r1-fp16", "torch:fp16:powersgd:rank=1"),
    ("powersgd-r2-fp16", "torch:fp16:powersgd:rank=2"),
    ("powersgd-r4-fp16", "torch:fp16:powersgd:rank=4"),
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

# The points every new workload compares: no hook, PyTorch's fp16 and PowerSGD hooks, and our
# PowerSGD at the same ranks (fp32, and fp16 on the wire).
POWERSGD = [
    ("none", "none"),
    ("fp16", "fp16"),
    ("powersgd-r1", "powersgd:rank=1"),
    ("powersgd-r2", "powersgd:rank=2"),
    ("powersgd-r4", "powersgd:rank=4"),
    ("powersgd-r1-fp16", "torch:fp16:powersgd:rank=1"),
    ("powersgd-r2-fp16", "torch:fp16:powersgd:rank=2"),
    ("powersgd-r4-fp16", "torch:fp16:powersgd:rank=4"),
    ("ours-psgd-r2", "sketchsgd:powersgd:rank=2"),
    ("ours-psgd-r1-fp16", "sketchsgd:powersgd:rank=1,wire=fp16"),
    ("ours-psgd-r2-fp16", "sketchsgd:powersgd:rank=2,wire=fp16"),
    ("ours-psgd-r4-fp16", "sketchsgd:powersgd:rank=4,wire=fp16"),
]

# ResNet-8 (77,754 parameters, 311 kB dense; SGD with momentum 0.9, so codecs with momentum of
# their own take it and SGD's is 0). PyTorch's PowerSGD spans ~11 kB (rank 1) to ~36 kB (rank 4):
# every codec has a point or two in or near that range. The 3x3 convolutions are matrices
# (out, in·9); batch norm's 672 values travel whole.
RESNET = POWERSGD + [
    ("fetchsgd-fp16", "sketch:rows=1,cols=10000,k=2000,fetch=1,wire=fp16"),
    ("fetchsgd-2x-fp16", "sketch:rows=1,cols=20000,k=4000,fetch=1,wire=fp16"),
    ("topk", "topk:k=2000,momentum=0.9"),
    ("topk-fp16-delta", "topk:k=4000,momentum=0.9,wire=fp16,index=delta"),
    ("qsgd-4bit", "qsgd:bits=4,momentum=0.9"),
    ("qsgd-2bit-ef", "qsgd:bits=2,ef=1,momentum=0.9"),
    ("ef-signsgd", "signsgd:ef=1,momentum=0.9"),
    ("terngrad", "terngrad:momentum=0.9"),
]

# The transformer (0.87 M parameters, 3.47 MB dense; AdamW for every hook, so no codec has
# momentum of its own). PyTorch's PowerSGD spans ~65 kB (rank 1) to ~175 kB (rank 4), of which
# 28 kB are the 6,912 LayerNorm and bias values that every method sends whole.
TRANSFORMER = POWERSGD + [
    ("fetchsgd-fp16", "sketch:rows=1,cols=40000,k=8000,fetch=1,momentum=0,wire=fp16"),
    ("fetchsgd-2x-fp16", "sketch:rows=1,cols=80000,k=16000,fetch=1,momentum=0,wire=fp16"),
    ("topk-fp16-delta", "topk:k=16000,wire=fp16,index=delta"),
    ("topk-4k-fp16-delta", "topk:k=4000,wire=fp16,index=delta"),
    ("qsgd-4bit", "qsgd:bits=4"),
    ("qsgd-2bit-ef", "qsgd:bits=2,ef=1"),
    ("ef-signsgd", "signsgd:ef=1"),
]

# Local steps (--local): name, hook, H[, extra flags]. The pseudo-gradient's compressor is a
# sketchsgd spec ("dense": DiLoCo with fp32 pseudo-gradients; Nesterov SGD lr 0.7 momentum 0.9
# outside) or PyTorch's PeriodicModelAverager (torch:average) at the same H. Per-step DDP's
# points (H = 1) are the runs of the list above, in the per-step output folder.
# The outer step as plain averaging (lr 1, no momentum: PeriodicModelAverager's rule) for the
# compressed pseudo-gradients, whose error feedback carries what a sync did not send.
AVERAGE = ["--outer-lr", "1", "--outer-momentum", "0"]
TRANSFORMER_LOCAL = [
    ("average-h4", "torch:average", 4),
    ("average-h16", "torch:average", 16),
    ("average-h64", "torch:average", 64),
    # Equal-traffic baselines for the compressed points: averaging twice or once more in 300 steps.
    ("average-h128", "torch:average", 128),
    ("average-h256", "torch:average", 256),
    ("diloco-h4", "dense", 4),
    ("diloco-h16", "dense", 16),
    ("diloco-h64", "dense", 64),
    ("avg-dense-h16", "dense", 16, AVERAGE),
    ("avg-fp16-h16", "dense:wire=fp16", 16, AVERAGE),
    ("avg-qsgd4-h4", "qsgd:bits=4", 4, AVERAGE),
    ("avg-qsgd4-h16", "qsgd:bits=4", 16, AVERAGE),
    ("avg-topk-2pct-h4", "topk:k=17000,wire=fp16,index=delta", 4, AVERAGE),
    ("avg-topk-2pct-h16", "topk:k=17000,wire=fp16,index=delta", 16, AVERAGE),
    ("avg-topk-05pct-h4", "topk:k=4300,wire=fp16,index=delta", 4, AVERAGE),
    ("avg-topk-05pct-h16", "topk:k=4300,wire=fp16,index=delta", 16, AVERAGE),
    ("avg-psgd-r4-h4", "sketchsgd:powersgd:rank=4,wire=fp16", 4, AVERAGE),
    ("avg-fetchsgd-h4", "sketch:rows=1,cols=40000,k=8000,fetch=1,momentum=0,wire=fp16", 4, AVERAGE),
    # With DiLoCo's Nesterov outer step instead.
    ("qsgd4-h16", "qsgd:bits=4", 16),
    ("psgd-r4-h16", "sketchsgd:powersgd:rank=4,wire=fp16", 16),
]

# The MLP (3 epochs, 1,404 steps a worker; SGD lr 0.01 momentum 0.9 inside): H = 64 leaves 22
# syncs, and a sparse pseudo-gradient reaches 1000x less traffic than per-step DDP.
MLP_LOCAL = [
    ("average-h16", "torch:average", 16),
    ("average-h64", "torch:average", 64),
    ("diloco-h16", "dense", 16),
    ("diloco-h64", "dense", 64),
    ("qsgd4-h64", "qsgd:bits=4", 64),
    ("topk-2pct-h64", "topk:k=37000,wire=fp16,index=delta", 64),
    ("avg-qsgd4-h64", "qsgd:bits=4", 64, AVERAGE),
    ("avg-topk-2pct-h64", "topk:k=37000,wire=fp16,index=delta", 64, AVERAGE),
    ("avg-topk-2pct-h16", "topk:k=37000,wire=fp16,index=delta", 16, AVERAGE),
    # Equal-traffic baselines for the sparse points (6 syncs in 1,404 steps) and sparser codecs.
    ("average-h256", "torch:average", 256),
    ("diloco-h256", "dense", 256),
    ("average-h1024", "torch:average", 1024),
    ("diloco-h1024", "dense", 1024),
    ("topk-2pct-h16", "topk:k=37000,wire=fp16,index=delta", 16),
    ("topk-05pct-h64", "topk:k=9300,wire=fp16,index=delta", 64),
    ("qsgd4-h16", "qsgd:bits=4", 16),
]

LOCAL = {"transformer": TRANSFORMER_LOCAL, "mlp": MLP_LOCAL}

WORKLOADS = {  # hooks, and the run length: (epochs, steps per epoch at most; 0: all)
    "mlp": (MLP, 3, 0),
    "resnet8": (RESNET, 1, 0),
    "transformer": (TRANSFORMER, 1, 300),
}


def run(name, hook, args, local=0, extra=()):
    out = os.path.join(args.out, f"{name}.json")
    cmd = [sys.executable, "examples/ddp_train.py", "--workload", args.workload, "--hook", hook, "--epochs",
           str(args.epochs), "--max-steps", str(args.max_steps), "--workers", str(args.workers), "--seed",
           str(args.seed), "--json", out, "--progress", "100", *extra]
    if local:
        cmd += ["--local", str(local)]
    if name == "signsgd":
        cmd += ["--lr", "0.0005"]  # majority vote of signs: a step of ±lr per coordinate
    env = dict(os.environ, PYTHONPATH=os.path.abspath(args.python))
    t = time.time()
    print(f"== {name}: {hook}", flush=True)
    done = subprocess.run(cmd, env=env)
    print(f"   {time.time() - t:.0f} s" + (f"; FAILED (exit {done.returncode})" if done.returncode else ""), flush=True)
    return done.returncode == 0


def quality(r):
    """The run's quality as the table shows it: test accuracy (%), or validation loss."""
    if r.get("metric", "test_accuracy") == "test_accuracy":
        return f"{100 * r['test_accuracy']:.2f} %"
    return f"{r['val_loss']:.4f}"


COLUMNS = ["hook", "test accuracy", "payload per worker per round (steady)", "vs dense (steady)",
           "vs dense (mean over the run)", "replicas identical", "wall time"]


def report(names, args):
    runs = []
    for name, hook in args.hooks:
        path = os.path.join(args.out, f"{name}.json")
        if name in names and os.path.exists(path):
            with open(path) as f:
                runs.append((name, hook, json.load(f)))
    rows = [[f"`{hook}`", quality(r), f"{r['steady_payload_bytes_per_round']:,.0f} B",
             f"{r['steady_ratio']:.1f}×", f"{r['ratio']:.1f}×", "yes" if r["replicas_identical"] else "NO",
             f"{r['seconds']:.0f} s"] for _, hook, r in runs]
    columns = COLUMNS if args.workload != "transformer" else [c if c != "test accuracy" else "validation loss" for c in COLUMNS]
    table = "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] +
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
                     ".venv/bin/python scripts/compare_ddp.py --write-docs",
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
        y = 100 * r["test_accuracy"] if r.get("metric", "test_accuracy") == "test_accuracy" else r["val_loss"]
        ax.scatter(r["steady_payload_bytes_per_round"], y, marker="o" if ours else "s",
                   color="tab:blue" if ours else "tab:orange")
        ax.annotate(name, (r["steady_payload_bytes_per_round"], y), fontsize=8, xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("payload per worker per round, steady state (bytes, log)")
    ax.set_ylabel("test accuracy (%)" if args.workload != "transformer" else "validation loss (nats/byte)")
    ax.set_title(f"DDP, {args.workload}, {args.workers} gloo workers: sketchsgd (circles) vs PyTorch (squares)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = os.path.join(args.out, "ddp_accuracy_vs_payload.png")
    fig.savefig(png, dpi=120)
    print(f"plot: {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS))
    ap.add_argument("--epochs", type=count, help="default: the workload's")
    ap.add_argument("--max-steps", type=natural, help="steps per epoch at most (default: the workload's; 0: all)")
    ap.add_argument("--workers", type=count, default=4)
    ap.add_argument("--seed", type=natural, default=1)
    ap.add_argument("--only", default="", help="comma-separated names")
    ap.add_argument("--out", help="default: build/compare-ddp[-WORKLOAD][-seedN]")
    ap.add_argument("--python", default="build/default/python", help="where the sketchsgd package is")
    ap.add_argument("--report-only", action="store_true", help="run nothing: table and plot from --out")
    ap.add_argument("--write-docs", action="store_true", help="write the table's data file (and plot) into docs/")
    ap.add_argument("--local", action="store_true",
                    help="the local-steps list (DiLoCo with each codec, PeriodicModelAverager) instead of per-step hooks")
    args = ap.parse_args()
    args.hooks, epochs, steps = WORKLOADS[args.workload]
    args.local_of = {}
    if args.local:
        if args.workload not in LOCAL:
            ap.error(f"--local: lists for {sorted(LOCAL)}")
        args.hooks = [(e[0], e[1]) for e in LOCAL[args.workload]]
        args.local_of = {e[0]: (e[2], tuple(e[3]) if len(e) > 3 else ()) for e in LOCAL[args.workload]}
    args.epochs = epochs if args.epochs is None else args.epochs
    args.max_steps = steps if args.max_steps is None else args.max_steps
    if args.out is None:
        args.out = ("build/compare-local" if args.local else "build/compare-ddp") + \
            ("" if args.workload == "mlp" else f"-{args.workload}") + ("" if args.seed == 1 else f"-seed{args.seed}")
    if args.write_docs and args.workload != "mlp":
        ap.error("--write-docs: the MLP's table only; the other workloads' tables: scripts/frontier.py --write-docs")
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
        for name, hook in args.hooks:
            if name in names and not run(name, hook, args, *args.local_of.get(name, (0, ()))):
                failed.append(name)
    report(names, args)
    if failed:  # the others ran and are reported; the exit status says some did not
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
