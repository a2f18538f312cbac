#!/usr/bin/env python3
"""The demo's job over S = 1 and S = 4 sharded servers, codec by codec: does the sharded job reach
the same accuracy (dense and PowerSGD shards separate by range and should end on the same bits;
top-k and the sketch choose their k per shard, in proportion to its range, instead of over the
whole model)? Each run is sketchsgd-train on this machine (its server processes and 4 workers);
results in build/shards-demo/NAME-sS/, a run already there with the same arguments is not
repeated. --write-docs writes the table shards-accuracy.

    .venv/bin/python scripts/compare_shards.py [--shards 1,4] [--only NAME,...] [--write-docs]
"""
import argparse
import datetime
import filecmp
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from cli import integer, items, names  # noqa: E402  (the command-line checks shared with examples/)
import launch  # noqa: E402  (how a job of the matrix runs)

# name, spec, lr: the demo's default and the parameter-server frontier's points (compare_codecs.py)
CODECS = [
    ("dense", "dense", 0.01),
    ("powersgd", "powersgd:rank=4,momentum=0.9,wire=fp16", 0.01),
    ("topk", "topk:k=18000,momentum=0.9", 0.01),
    ("fetchsgd", "sketch:rows=1,cols=100000,k=20000,momentum=0.9,fetch=1", 0.01),
]


def run(train, name, spec, lr, shards, out):
    args = [train, "--codec", spec, "--lr", str(lr), "--shards", str(shards), "--out", out,
            "--dump", os.path.join(out, "params"), "--device", "cpu"]
    return launch.cached(f"{name}, S = {shards}", args, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", default="1,4", type=items(integer(1, 64)), help="comma-separated")
    ap.add_argument("--only", default="", type=names(c[0] for c in CODECS), help="comma-separated names of " + ", ".join(c[0] for c in CODECS))
    ap.add_argument("--train", default=os.path.join(ROOT, "build/default/demo/sketchsgd-train"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build/shards-demo"))
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    shards = args.shards
    if shards[0] != 1:
        ap.error("--shards must start with 1 (the reference)")
    if not os.access(args.train, os.X_OK):
        ap.error(f"--train {args.train}: no such program (build it: cmake --build --preset default)")
    codecs = [c for c in CODECS if not args.only or c[0] in args.only.split(",")]
    for name, spec, lr in codecs:
        for s in shards:
            run(args.train, name, spec, lr, s, os.path.join(args.out, f"{name}-s{s}"))
    rows = []
    for name, spec, lr in codecs:
        res = {}
        for s in shards:
            d = os.path.join(args.out, f"{name}-s{s}")
            try:
                with open(os.path.join(d, "summary.json")) as f:
                    res[s] = json.load(f)
            except OSError:
                pass
        if 1 not in res:
            continue
        for s in shards[1:]:
            if s not in res:
                continue
            a, b = res[1], res[s]
            same = filecmp.cmp(os.path.join(args.out, f"{name}-s1", "params.rank0"),
                               os.path.join(args.out, f"{name}-s{s}", "params.rank0"), shallow=False)
            rows.append([f"`{spec}`", s, f"{100 * a['test_accuracy']:.2f}", f"{100 * b['test_accuracy']:.2f}",
                         f"{100 * (b['test_accuracy'] - a['test_accuracy']):+.2f}", "yes" if same else "no",
                         f"{a['traffic_ratio']:.1f}×", f"{b['traffic_ratio']:.1f}×", f"{a['wall_s']:.0f} / {b['wall_s']:.0f}"])
            print(f"{name:10s} S=1 {100 * a['test_accuracy']:.2f} %  S={s} {100 * b['test_accuracy']:.2f} %  "
                  f"bit-identical: {same}  traffic {a['traffic_ratio']:.1f}x / {b['traffic_ratio']:.1f}x")
    if args.write_docs and rows:
        import doc_tables
        doc_tables.write(os.path.join(ROOT, "docs/data/tables/shards-accuracy.json"),
                         ".venv/bin/python scripts/compare_shards.py --write-docs",
                         datetime.date.today().isoformat(), "the 2-core dev machine (AMD EPYC Zen 4 under KVM, 2 threads)",
                         ["codec", "S", "test accuracy, one server (%)", "test accuracy, S shards (%)", "difference",
                          "same bits as one server", "less traffic than dense, one server", "S shards",
                          "wall s (one / S)"], rows,
                         note="sketchsgd-train: the MLP on Fashion-MNIST, 4 workers, 3 epochs, seed 1, lr 0.01; "
                              "S shards as S server processes on this machine, all on 127.0.0.1.")
        doc_tables.main([])


if __name__ == "__main__":
    main()
