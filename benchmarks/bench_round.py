#!/usr/bin/env python3
"""The sketch server's round and the FetchSGD worker's accumulate, through the public Python API,
on the CPU or a GPU: for each k and index format, a worker's encode_sum() (FetchSGD: the gradient's
sketch, no worker state) and the server's round on the summed table — Aggregator.add_sum() then
finish(): estimates, top-k, the update's bytes on the host (Sketched-SGD's plain sketch, and
FetchSGD's momentum and error sketches with their reset); each round also once more with
finish(copy=False), the update as a view over the aggregator's message instead of a bytes copy.
Medians over --rounds after two warm-up rounds; the GPU synchronised around each timed call.

    .venv/bin/python benchmarks/bench_round.py                       (CPU, d = 2^24)
    python3 benchmarks/bench_round.py --device cuda --dim 134217728  (d = 2^27 on a GPU)
    .venv/bin/python benchmarks/bench_round.py --python /tmp/old/build/default/python --json old.json

--python points at another build of the package, to compare two builds in alternating runs.
--report RUNS --table NAME makes the docs' table docs/data/tables/NAME.json from runs' JSON (a
comma-separated list: each row the median over them), --before OLD,... adding the other build's
round and its ratio:

    .venv/bin/python benchmarks/bench_round.py --report new-1.json,new-2.json --before old-1.json,old-2.json \
        --table sketch-round-cpu --machine "the 2-core dev machine"
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import time

from cli import count, integer, items, names, one_line  # noqa: E402  (examples/cli.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(fn, sync):
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return (time.perf_counter() - t) * 1e3, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dim", type=count, default=1 << 24)
    ap.add_argument("--rows", type=integer(1, 32), default=5)
    ap.add_argument("--cols", type=count, default=1 << 20)
    ap.add_argument("--k", type=items(count), default=[100000, 1000000],
                    help="comma-separated update sizes")
    ap.add_argument("--index", type=names(["u32", "delta"]), default="u32,delta")
    ap.add_argument("--rounds", type=count, default=10, help="timed rounds (after 2 warm-up rounds)")
    ap.add_argument("--threads", type=count, default=None, help="torch's and OpenMP's threads (CPU)")
    ap.add_argument("--python", default=os.path.join(ROOT, "build/default/python"), help="where the sketchsgd package is")
    ap.add_argument("--json", help="write the medians here")
    ap.add_argument("--report", type=items(str), help="make a table of these runs' JSON instead of running")
    ap.add_argument("--before", type=items(str), help="with --report: runs of the build before, for a ratio")
    ap.add_argument("--table", help="with --report: the table's name (docs/data/tables/NAME.json)")
    ap.add_argument("--machine", default="the 2-core dev machine", help="with --report: the table's machine")
    args = ap.parse_args()
    if args.report or args.before or args.table:
        if not (args.report and args.table):
            ap.error("--report and --table go together (--before is optional)")
        if not re.fullmatch(r"[\w-]+", args.table):
            ap.error(f"--table {args.table!r}: a name (letters, digits, - and _), written to docs/data/tables/NAME.json")
        for f in args.report + (args.before or []):
            if not os.path.isfile(f):
                ap.error(f"no such run file: {f}")
        return report(args)
    if max(args.k) > args.dim:
        ap.error(f"--k {max(args.k)} exceeds --dim {args.dim}")
    sys.path.insert(0, os.path.abspath(args.python))
    import torch
    try:
        import sketchsgd
    except ImportError as e:
        ap.error(f"--python {args.python}: the sketchsgd package does not load ({one_line(e)})")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this PyTorch sees no GPU")
    if args.threads:
        torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    g = torch.Generator(device=args.device).manual_seed(1)
    grad = torch.randn(args.dim, generator=g, device=args.device)
    grad[:: 997] *= 50.0  # heavy hitters, as the kernel benchmarks plant them
    rows = []
    for k in args.k:
        for index in [n for n in args.index.split(",") if n] or ["u32"]:
            for fetch in (0, 1):
                spec = f"sketch:rows={args.rows},cols={args.cols},k={k},index={index},fetch={fetch}"
                try:
                    codec = sketchsgd.Compressor(spec, args.dim, device=args.device)
                except (sketchsgd.Error, ValueError) as e:
                    ap.error(f"{spec}: {one_line(e)}")
                agg = codec.make_aggregator(1)
                table = torch.empty(codec.sum_size("gradient"), device=args.device)
                enc, rnd, view = [], [], []
                nbytes = 0
                for it in range(args.rounds + 2):
                    te, _ = timed(lambda: codec.encode_sum(grad, it, out=table), sync)
                    tr, update = timed(lambda: (agg.add_sum(table, 1, it), agg.finish())[1], sync)
                    tv, _ = timed(lambda: (agg.add_sum(table, 1, it), agg.finish(copy=False))[1], sync)
                    nbytes = len(update)
                    if it >= 2:
                        enc.append(te)
                        rnd.append(tr)
                        view.append(tv)
                    print(f"\r{spec}: round {it + 1}/{args.rounds + 2}", end="", file=sys.stderr, flush=True)
                print(file=sys.stderr)
                rows.append({"spec": spec, "k": k, "index": index, "fetch": fetch,
                             "encode_sum_ms": statistics.median(enc), "round_ms": statistics.median(rnd),
                             "round_ms_min": min(rnd), "round_view_ms": statistics.median(view),
                             "update_bytes": nbytes})
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or platform.machine()
    print(f"d = {args.dim}, r = {args.rows}, c = {args.cols}, {args.device} ({name}): median ms of {args.rounds}")
    print(f"{'k':>9} {'index':>6} {'codec':>10} {'encode_sum':>11} {'round':>8} {'(min)':>8} {'view':>8} {'update B':>10}")
    for r in rows:
        print(f"{r['k']:>9} {r['index']:>6} {'FetchSGD' if r['fetch'] else 'sketch':>10} "
              f"{r['encode_sum_ms']:>11.3f} {r['round_ms']:>8.3f} {r['round_ms_min']:>8.3f} {r['round_view_ms']:>8.3f} "
              f"{r['update_bytes']:>10}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "name": name, "torch": torch.__version__, "dim": args.dim,
                       "rows": args.rows, "cols": args.cols, "rounds": args.rounds, "command": " ".join(sys.argv),
                       "results": rows}, f, indent=1)


def medians(files):
    """Per (k, index, fetch): the median round and encode_sum over the runs, and the first run."""
    runs = [json.load(open(f)) for f in files]
    out = {}
    for r in runs[0]["results"]:
        key = (r["k"], r["index"], r["fetch"])
        same = [x for run in runs for x in run["results"] if (x["k"], x["index"], x["fetch"]) == key]
        out[key] = dict(r, round_ms=statistics.median(x["round_ms"] for x in same),
                        encode_sum_ms=statistics.median(x["encode_sum_ms"] for x in same))
        if all("round_view_ms" in x for x in same):  # runs before finish(copy=False) lack it
            out[key]["round_view_ms"] = statistics.median(x["round_view_ms"] for x in same)
    return runs[0], out


def report(args):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import doc_tables
    first, new = medians(args.report)
    old = medians(args.before)[1] if args.before else {}
    columns = ["k", "index", "codec", "worker encode_sum ms", "server round ms"]
    views = all("round_view_ms" in r for r in new.values())
    if views:
        columns += ["round, finish(copy=False) ms"]
    if old:
        columns += ["encode_sum: before / now", "round: before / now"]
    columns += ["update bytes"]
    rows = []
    for key, r in new.items():
        row = [f"{r['k']:,}", r["index"], "FetchSGD" if r["fetch"] else "sketch", f"{r['encode_sum_ms']:.3f}",
               f"**{r['round_ms']:.3f}**"] + ([f"{r['round_view_ms']:.3f}"] if views else [])
        if old:
            b = old[key]
            row += [f"{b['encode_sum_ms'] / r['encode_sum_ms']:.2f}×", f"{b['round_ms'] / r['round_ms']:.2f}×"]
        rows.append(row + [f"{r['update_bytes']:,}"])
    runs = len(args.report)
    note = (f"d = {first['dim']:,}, r = {first['rows']}, c = {first['cols']:,}, {first['device']} "
            f"({first['name']}, torch {first['torch']}); medians of {first['rounds']} rounds"
            + (f", the median over {runs} runs" if runs > 1 else "")
            + (f" alternating with the build before ({len(args.before)} runs)" if old else "") + ".")
    doc_tables.write(os.path.join(ROOT, "docs/data/tables", args.table + ".json"), first["command"],
                     datetime.date.today().isoformat(), args.machine, columns, rows,
                     data=", ".join(args.report + (args.before or [])), note=note)
    print(f"wrote docs/data/tables/{args.table}.json")


if __name__ == "__main__":
    main()
