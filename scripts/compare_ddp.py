#!/usr/bin/python3
"""Runs examples/ddp_fashion_mnist.py once per hook — PyTorch's none, fp16 and PowerSGD (rank 1, 2,
4) and every sketchsgd codec — with the same seed, workers and epochs, then writes
build/compare-ddp/<name>.json, a PNG (test accuracy vs payload per round) and a Markdown table.

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


def report(names, args):
    rows = []
    for name, hook in HOOKS:
        path = os.path.join(args.out, f"{name}.json")
        if name in names and os.path.exists(path):
            with open(path) as f:
                rows.append((name, hook, json.load(f)))
    lines = ["| hook | test accuracy | payload per worker per round (steady) | vs dense (steady) | vs dense (mean over the run) | replicas identical | wall time |",
             "|---|---|---|---|---|---|---|"]
    for name, hook, r in rows:
        lines.append(f"| `{hook}` | {100 * r['test_accuracy']:.2f} % | {r['steady_payload_bytes_per_round']:,.0f} B | "
                     f"{r['steady_ratio']:.1f}× | {r['ratio']:.1f}× | {'yes' if r['replicas_identical'] else 'NO'} | "
                     f"{r['seconds']:.0f} s |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    plot(rows, args)
    if args.write_docs:
        write_docs(table, rows, args)


NOTES = """Reading the table:
- Payload is what one worker hands to the step's collectives, counted the same way for every hook
  (an all-reduce of n floats: 4n bytes, whatever ring or tree gloo runs; an all-gather: the
  worker's own part, padded to the step's longest message, plus 8 bytes for its length). "Steady" leaves out the warm-up (the
  first 10 steps are plain all-reduces for PowerSGD and sketchsgd alike).
- What grows with W: all-reduced payloads (dense, fp16, PowerSGD, the sketch tables) stay the
  same per worker; all-gathered ones (topk, signSGD, TernGrad) are received W times by every
  worker, so they suit small W.
- Momentum: PyTorch's hooks and `none` use SGD momentum 0.9 on the averaged gradient; sketchsgd
  codecs with their own momentum (`momentum=0.9`, or FetchSGD's momentum sketch) run SGD without it.
"""


def write_docs(table, rows, args):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from results_doc import write_section
    os.makedirs("docs/images", exist_ok=True)
    png = os.path.join(args.out, "ddp_accuracy_vs_payload.png")
    if os.path.exists(png):
        shutil.copy(png, "docs/images/ddp_accuracy_vs_payload.png")
    os.makedirs("docs/data", exist_ok=True)
    with open("docs/data/ddp-comparison.json", "w") as f:
        json.dump([{"name": n, "hook": h, **{k: v for k, v in r.items() if k != "epochs_log"}}
                   for n, h, r in rows], f, indent=1)
    version = next((r["torch"] for _, _, r in rows if "torch" in r), "")
    text = ("## Under PyTorch DDP (`sketchsgd.torch.compression_hook`)\n\n"
            f"The same job under PyTorch {version} DDP: `examples/ddp_fashion_mnist.py`, "
            f"{args.workers} gloo processes on 127.0.0.1 (CPU), the MLP (784-1024-1024-10), batch 32 per worker, "
            f"SGD lr 0.01, {args.epochs} epochs of 468 steps, seed {args.seed} for every hook, one DDP bucket "
            "(PyTorch's PowerSGD aborts on gloo with two). Worker r trains on examples r, r+4, … reshuffled "
            "every epoch. One run each.\n\n"
            "Reproduce: `/usr/bin/python3 scripts/compare_ddp.py --write-docs` (after `bash scripts/test.sh` or "
            "`cmake --build --preset default` has built the package).\n\n"
            + table + "\n\n" + NOTES + EXTRA_NOTES
            + "\n![DDP: accuracy vs payload](images/ddp_accuracy_vs_payload.png)\n")
    write_section("ddp", text)


EXTRA_NOTES = """- The run of 2026-11-23 (PyTorch 1.13.1, 2-core machine): the FetchSGD hook moves 20.2x less
  than dense in steady state (17.8x over the whole run, whose first 10 steps are plain
  all-reduces) and ends 0.79 points below both dense hooks (86.28 % vs 87.07 % without a hook and
  87.05 % with sketchsgd's dense): the issue's target (>= 20x within 1.0 point) holds in steady
  state. EF-signSGD reaches 86.72 % at 30.9x and TernGrad 87.09 % at 15.7x.
- Our own PowerSGD (`sketchsgd:powersgd:rank=R`: the codec `powersgd`, two all-reduces a step
  like PyTorch's) matches PyTorch's payload and accuracy at every rank; with `wire=fp16` it halves
  the payload at the same accuracy. The frontier across seeds is the section above.
- `sketch-p2` (workers keep momentum and error, two all-reduces a step) trails at this budget
  (83.16 %): its k = 12,000 leaves more mass behind than FetchSGD's 18,000 at the same bytes.
- Wall times compare hooks only roughly (one shared 2-core machine, 4 processes); the hooks' own
  compute is measured apart in docs/BENCHMARKS.md (`benchmarks/bench_hook.py`).
"""


def plot(rows, args):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no plot)")
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, hook, r in rows:
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
    ap.add_argument("--write-docs", action="store_true", help="write the DDP section of docs/RESULTS.md")
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
