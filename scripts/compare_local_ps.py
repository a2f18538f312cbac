#!/usr/bin/env python3
"""The same local-steps job two ways: over the ZeroMQ parameter server (sketchsgd-train
--push-every H: workers push compressed pseudo-gradients, the server applies the outer Nesterov
step, every worker mirrors it) and over torch.distributed (examples/ddp_train.py --local H:
sketchsgd.torch.DiLoCo). Same model shape (the MLP), workers, batch, epochs, inner SGD (lr 0.01,
momentum 0.9) and outer step (lr 0.7, Nesterov 0.9); the two differ in initialisation and data
order, so their accuracies agree within the seed noise, not bit for bit.

    .venv/bin/python scripts/compare_local_ps.py [--only NAME,...] [--seeds 1,2] [--report-only] [--write-docs]

Output: build/local-ps/<name>-<ps|ddp>-seedN/ (sketchsgd-train's folder, ddp_train's JSON) and a
table (--write-docs: docs/data/tables/local-ps.json). Needs the release build (sketchsgd-train is
built where libtorch is found) and build/default/python.
"""
import argparse
import json
import os
import statistics
import sys
import time

# The command-line checks shared with examples/ (examples/cli.py).
from cli import items, names, natural  # noqa: E402
import launch  # noqa: E402  (how a job of the matrix runs)

# name, codec, H
POINTS = [
    ("dense-h8", "dense", 8),
    ("qsgd4-h8", "qsgd:bits=4", 8),
    ("dense-h32", "dense", 32),
    ("topk-2pct-h64", "topk:k=37000,wire=fp16,index=delta", 64),
]
TRAIN = "build/default/demo/sketchsgd-train"


def run_ps(name, codec, h, seed, out):
    folder = os.path.join(out, f"{name}-ps-seed{seed}")
    cmd = [TRAIN, "--workers", "4", "--epochs", "3", "--batch", "32", "--lr", "0.01", "--local-momentum", "0.9",
           "--outer-lr", "0.7", "--outer-momentum", "0.9", "--push-every", str(h), "--codec", codec,
           "--seed", str(seed), "--out", folder]
    return launch.job(f"{name} on the parameter server, seed {seed}", cmd)


def run_ddp(name, codec, h, seed, out, python):
    path = os.path.join(out, f"{name}-ddp-seed{seed}.json")
    cmd = [sys.executable, "examples/ddp_train.py", "--workload", "mlp", "--workers", "4", "--epochs", "3",
           "--batch", "32", "--lr", "0.01", "--momentum", "0.9", "--outer-lr", "0.7", "--outer-momentum", "0.9",
           "--local", str(h), "--hook", codec, "--seed", str(seed), "--json", path, "--progress", "500"]
    return launch.job(f"{name} under DDP, seed {seed}", cmd, python=python)


def results(name, seeds, out):
    ps, ddp, ratio_ps, ratio_ddp = [], [], None, None
    for s in seeds:
        p = os.path.join(out, f"{name}-ps-seed{s}", "summary.json")
        if os.path.exists(p):
            with open(p) as f:
                r = json.load(f)
            ps.append(100 * r["test_accuracy"])
            ratio_ps = r["traffic_ratio"]
        d = os.path.join(out, f"{name}-ddp-seed{s}.json")
        if os.path.exists(d):
            with open(d) as f:
                r = json.load(f)
            ddp.append(100 * r["test_accuracy"])
            ratio_ddp = r["ratio"]
    return ps, ddp, ratio_ps, ratio_ddp


def fmt(v):
    if not v:
        return "—"
    return f"{statistics.mean(v):.2f} %" + (f" ± {statistics.stdev(v):.2f} ({len(v)})" if len(v) > 1 else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", type=names(n for n, _, _ in POINTS))
    ap.add_argument("--seeds", default="1", type=items(natural), help="comma-separated")
    ap.add_argument("--out", default="build/local-ps")
    ap.add_argument("--python", default="build/default/python")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    seeds = args.seeds
    if not args.report_only and not os.access(TRAIN, os.X_OK):
        ap.error(f"no {TRAIN}: build the release preset where libtorch is found (cmake --build --preset default)")
    if not args.report_only and not os.path.isdir(args.python):
        ap.error(f"--python {args.python}: no such folder (build the package: cmake --build --preset default)")
    os.makedirs(args.out, exist_ok=True)
    failed = []
    if not args.report_only:
        for name, codec, h in POINTS:
            if only and name not in only:
                continue
            for s in seeds:
                t = time.time()
                print(f"== {name} seed {s}: parameter server", flush=True)
                if not run_ps(name, codec, h, s, args.out):
                    failed.append(f"{name}-ps-seed{s}")
                print(f"== {name} seed {s}: torch.distributed ({time.time() - t:.0f} s so far)", flush=True)
                if not run_ddp(name, codec, h, s, args.out, args.python):
                    failed.append(f"{name}-ddp-seed{s}")
    columns = ["codec", "H", "parameter server: accuracy", "traffic vs per-step dense (up + down)",
               "torch.distributed DiLoCo: accuracy", "payload vs per-step dense", "difference"]
    rows = []
    all_seeds = sorted({int(f.rsplit("seed", 1)[1].split(".")[0]) for f in os.listdir(args.out) if "seed" in f})
    for name, codec, h in POINTS:
        ps, ddp, rps, rddp = results(name, all_seeds, args.out)
        if not ps and not ddp:
            continue
        diff = f"{statistics.mean(ps) - statistics.mean(ddp):+.2f} points" if ps and ddp else "—"
        rows.append([f"`{codec}`", h, fmt(ps), f"{rps:.0f}×" if rps else "—", fmt(ddp), f"{rddp:.0f}×" if rddp else "—",
                     diff])
    text = "\n".join("| " + " | ".join(str(c) for c in r) + " |" for r in [columns] + rows)
    print(text)
    if args.write_docs:
        import doc_tables
        doc_tables.write("docs/data/tables/local-ps.json", ".venv/bin/python scripts/compare_local_ps.py --seeds 1,2 --write-docs",
                         time.strftime("%Y-%m-%d"), "the 2-core dev machine, PyTorch 1.13 (gloo), libtorch 1.13", columns,
                         rows, note="The MLP, 4 workers, batch 32, 3 epochs; inner SGD lr 0.01 momentum 0.9, outer "
                                    "Nesterov lr 0.7 momentum 0.9 in both. The parameter server's traffic counts pushes "
                                    "and updates; torch.distributed's the payload each worker hands to the collectives.")
        doc_tables.main([])
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
