#!/usr/bin/env python3
"""The scaling study: a codec of each family on a simulated group of W workers
(examples/ddp_train.py --simulate W, W = 4 ... 256), its quality and the link bytes a rank's
link carries a step at each W, against a bf16 all-reduce at the same W, and where a summed
codec's link bytes fall below a gathered one's at equal quality.

    .venv/bin/python scripts/scale.py [--workload mlp] [--workers 4,16,64,256] [--only topk,fetchsgd]
        [--seeds 1,2] [--steps 60] [--out build/scale-mlp] [--write-docs] [--report-only]
    .venv/bin/python scripts/scale.py --smoke     # W = 16, a few steps per family (the fast tier)
    .venv/bin/python scripts/scale.py --restore ...   # a fresh clone: the docs' points taken as run

A point is one run, <out>/<name>-w<W>-s<seed>.json (ddp_train.py's summary) beside the flags it
ran with (.args): a point done before with the same flags is not run again, so a study cut short
goes on where it stopped; --restore first writes the points of the docs' data file
(docs/data/scale-<workload>[-<series>].json) into it where their flags are this run's, so that a
fresh clone adds points to the docs' study rather than running it again. A line per point shows progress (ddp_train's own lines go to the
point's .log). --write-docs writes docs/data/tables/scale-<workload>.json and
scale-<workload>-crossover.json (scripts/doc_tables.py renders them) and
docs/images/scale-<workload>.png.

The job: the workload's batch per worker at every W (so W = 256 trains on 64 times W = 4's items
in the same steps), --steps steps after --start-iter plain fp32 ones, the learning rate the
workload's scaled by sqrt(W / 4) (the square-root rule for a batch grown W / 4 times: Krizhevsky
2014, Hoffer et al. 2017; for AdamW too, Malladi et al. 2022) after a linear warm-up of --warmup
steps. Budgets: the MLP's (k = 20,000 is about 1 % of its 1.86 M parameters; the sketches hold
90,000 and 60,000 cells) and lm's (--workload lm: 1 % too, the per-step lm list's).

Series (--series, the MLP): families (a codec of each family, the batch per worker fixed);
sizing (the one-round sketch's cells per coordinate and rows); global (W = 4's global batch
split over W, the learning rate fixed); diloco (the families as DiLoCo's pseudo-gradient codecs,
a sync every 8 steps); sparse (top-k and SparseLoCo's codec gathered against their sparse
all-reduce, reduce=sparse; the gathered points are the families' own). Each writes its own tables (scale-<workload>[-<series>]).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from cli import count, items  # noqa: E402  (the command-line checks shared with examples/)

# name, ddp_train --hook, family (summed: its link bytes do not grow with W; gathered: they do).
FAMILIES = [
    ("dense-bf16", "dense:wire=bf16", "summed"),
    ("powersgd", "sketchsgd:powersgd:rank=4,wire=fp16", "summed"),
    ("sketch", "sketch:rows=1,cols=90000,k=18000,momentum=0.9", "summed"),
    ("sketch-p2", "sketch:rows=1,cols=60000,k=12000,p2=2,momentum=0.9", "summed"),
    ("fetchsgd", "sketch:rows=1,cols=90000,k=18000,fetch=1", "summed"),
    ("topk", "topk:k=20000,momentum=0.9", "gathered"),
    ("sparseloco", "sparseloco:chunk=4096,k=64", "gathered"),
    ("qsgd", "qsgd:bits=4,momentum=0.9", "gathered"),
]
# --series sizing: the one-round sketch's cells per recovered coordinate (k = 18,000 of them) and
# its rows, at the same cells (FetchSGD's own runs held 30-50 cells a coordinate).
SIZING = [(f"sketch-{c}x-r{r}", f"sketch:rows={r},cols={c * 18000 // r},k=18000,momentum=0.9", "summed")
          for c, r in [(5, 1), (10, 1), (30, 1), (50, 1), (30, 3), (30, 5)]]
# --series diloco: the families as DiLoCo's codecs (--local H: H local steps, then the
# pseudo-gradient compressed and summed or gathered, and DiLoCo's Nesterov outer step). No codec
# momentum (the outer optimizer's is the job's), so no FetchSGD: its momentum lives in the sketch.
DILOCO = [("dense-bf16", "dense:wire=bf16", "summed"),
          ("powersgd", "sketchsgd:powersgd:rank=4,wire=fp16", "summed"),
          ("sketch", "sketch:rows=1,cols=90000,k=18000,momentum=0", "summed"),
          ("sketch-p2", "sketch:rows=1,cols=60000,k=12000,p2=2,momentum=0", "summed"),
          ("topk", "topk:k=20000", "gathered"),
          ("sparseloco", "sparseloco:chunk=4096,k=64", "gathered"),
          ("qsgd", "qsgd:bits=4", "gathered")]
# --series sparse: the gathered sparse codecs against their sparse all-reduce (reduce=sparse: each
# rank's link O(k), the update at most k values, what it drops back to error feedback).
SPARSE = [("topk", "topk:k=20000,momentum=0.9", "gathered"),
          ("topk-sparse", "topk:k=20000,momentum=0.9,reduce=sparse", "sparse"),
          ("sparseloco", "sparseloco:chunk=4096,k=64", "gathered"),
          ("sparseloco-sparse", "sparseloco:chunk=4096,k=64,reduce=sparse", "sparse")]
SERIES = {"families": FAMILIES, "sizing": SIZING, "global": FAMILIES, "diloco": DILOCO, "sparse": SPARSE}
# --workload lm (AdamW: no codec momentum): the per-step lm list's budgets (scripts/experiments.json:
# k = 18,500 is 1 % of its 1.85 M parameters, the sketches hold 90,000 fp16 cells).
LM = [("dense-bf16", "dense:wire=bf16", "summed"),
      ("powersgd", "sketchsgd:powersgd:rank=4,wire=fp16", "summed"),
      ("sketch", "sketch:rows=1,cols=90000,k=18500,momentum=0,wire=fp16", "summed"),
      ("fetchsgd", "sketch:rows=1,cols=90000,k=18500,fetch=1,momentum=0,wire=fp16", "summed"),
      ("topk", "topk:k=18500,wire=fp16,index=delta", "gathered")]
LOWER_IS_BETTER = {"val_loss"}
BASE_WORKERS = 4  # the learning rate's reference group (the tables' W elsewhere)
LOCAL_STEPS = 8  # --series diloco: H


def lr_at(base: float, W: int, series: str = "families") -> float:
    """The square-root rule for a global batch grown W / 4 times; --series global keeps it fixed."""
    return base if series == "global" else base * math.sqrt(W / BASE_WORKERS)


def batch_at(workload: str, W: int, series: str):
    """The batch per worker: the workload's, or under --series global the global batch of
    W = 4's (4 x the workload's) split over W; None where W does not divide it."""
    import workloads
    batch = workloads.defaults(workload)["batch"]
    if series != "global":
        return batch
    return BASE_WORKERS * batch // W if BASE_WORKERS * batch % W == 0 else None


def command(name, hook, W, seed, args, out):
    import workloads
    base = workloads.defaults(args.workload)["lr"]
    cmd = [sys.executable, os.path.join(ROOT, "examples", "ddp_train.py"), "--workload", args.workload,
           "--simulate", str(W), "--hook", hook, "--total-steps", str(args.steps + args.start_iter),
           "--start-iter", str(args.start_iter), "--warmup", str(args.warmup),
           "--lr", f"{lr_at(base, W, args.series):.6g}", "--seed", str(seed), "--eval-items", str(args.eval_items),
           "--progress", str(max(1, args.steps // 4)), "--timeout", str(args.timeout), "--json", out]
    if args.series == "global":
        cmd += ["--batch", str(batch_at(args.workload, W, "global"))]
    if args.series == "diloco":
        cmd += ["--local", str(LOCAL_STEPS)]
    return cmd


def run_point(name, hook, W, seed, args):
    """The point's summary: from an earlier run with the same flags, or run now (None: it failed)."""
    out = os.path.join(args.out, f"{name}-w{W}-s{seed}.json")
    cmd = command(name, hook, W, seed, args, out)
    stamp = out[:-5] + ".args"
    if os.path.exists(out) and os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == cmd[2:]:
                with open(out) as g:
                    return json.load(g), True
    if args.report_only:
        return None, False
    t = time.time()
    with open(out[:-5] + ".log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not os.path.exists(out):
        with open(out[:-5] + ".log") as f:
            tail = f.read()[-400:]
        print(f"   FAILED (exit {rc}) after {time.time() - t:.0f} s: ...{tail}", flush=True)
        return None, False
    with open(stamp, "w") as f:
        json.dump(cmd[2:], f)
    with open(out) as f:
        return json.load(f), False


def data_name(args) -> str:
    """The series' tables and data file: scale-<workload>[-<series>]."""
    return f"scale-{args.workload}" + ("" if args.series == "families" else f"-{args.series}")


def recorded(args):
    """The docs' data file's points for --restore: {"<name>-w<W>": [summary, ...]}. Raises
    ValueError where there is none, or where its table ran with flags the data file does not
    record (--start-iter, --warmup, --eval-items) other than this run's."""
    name = data_name(args)
    shared = {}  # the sparse series shares the families' gathered points (the same hooks and flags)
    if args.series == "sparse" and os.path.exists(os.path.join(ROOT, "docs", "data", f"scale-{args.workload}.json")):
        with open(os.path.join(ROOT, "docs", "data", f"scale-{args.workload}.json")) as f:
            shared = json.load(f)
    if args.series == "sparse" and not os.path.exists(os.path.join(ROOT, "docs", "data", f"{name}.json")):
        return shared
    try:
        with open(os.path.join(ROOT, "docs", "data", f"{name}.json")) as f:
            points = {**shared, **json.load(f)}
        with open(os.path.join(ROOT, "docs", "data", "tables", f"{name}.json")) as f:
            table = json.load(f)["command"].split()
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"no docs' points for {name} ({e})") from None
    for flag, value, default in (("--start-iter", args.start_iter, 5), ("--warmup", args.warmup, 5),
                                 ("--eval-items", args.eval_items, 10000)):
        ran = int(table[table.index(flag) + 1]) if flag in table else default
        if ran != value:
            raise ValueError(f"the docs' {name} ran with {flag} {ran}, this run's is {value}")
    return points


def restore(points, families, worlds, seeds, args) -> int:
    """Writes into args.out the recorded points whose hook, W, seed, steps and learning rate are
    this run's, where the folder has none of its own: how many."""
    import workloads
    base, n = workloads.defaults(args.workload)["lr"], 0
    for name, hook, _ in families:
        for W in worlds:
            for r in points.get(f"{name}-w{W}", []):
                if (r.get("seed") not in seeds or r.get("hook") != hook or r.get("steps") != args.steps + args.start_iter
                        or not math.isclose(r.get("lr", -1), float(f"{lr_at(base, W, args.series):.6g}"))):
                    continue
                out = os.path.join(args.out, f"{name}-w{W}-s{r['seed']}.json")
                if os.path.exists(out):  # a point run here: its own figures
                    continue
                with open(out, "w") as f:
                    json.dump(r, f, indent=1)
                with open(out[:-5] + ".args", "w") as f:
                    json.dump(command(name, hook, W, r["seed"], args, out)[2:], f)
                n += 1
    return n


def mean(xs):
    return sum(xs) / len(xs)


def summarise(points):
    """(name, W) -> {"quality": mean, "sd" (None for one seed), "seeds", "link": bytes a step, "ratio",
    "family", "seconds"} over the seeds run."""
    out = {}
    for (name, W), rs in points.items():
        q = [r["quality"] for r in rs]
        out[name, W] = {"quality": mean(q), "sd": statistics.stdev(q) if len(q) > 1 else None, "seeds": len(rs),
                        "link": mean([r["steady_link_bytes_per_round"] for r in rs]),
                        "ratio": mean([r["steady_link_ratio_bf16"] for r in rs]),
                        "seconds": mean([r["seconds"] for r in rs])}
    return out


def within(q, of, noise, metric):
    """Whether quality q is at most `noise` worse than quality `of`."""
    return q <= of + noise if metric in LOWER_IS_BETTER else q >= of - noise


def crossover(table, worlds, families, noise, metric="test_accuracy"):
    """For each gathered family against each summed one: the smallest W at which the summed codec
    carries fewer link bytes at a quality within `noise` of the gathered one's (or better), and
    the link bytes' crossover alone (the smallest W at which it carries fewer, whatever its
    quality)."""
    kind = {n: k for n, _, k in families}
    rows = []
    for g in [n for n, _, k in families if k == "gathered"]:
        for s in [n for n, _, k in families if k == "summed" and n != "dense-bf16"]:
            both = [W for W in worlds if (g, W) in table and (s, W) in table]
            if not both:
                continue
            fewer = [W for W in both if table[s, W]["link"] < table[g, W]["link"]]
            equal = [W for W in fewer if within(table[s, W]["quality"], table[g, W]["quality"], noise, metric)]
            rows.append([g, s, fewer[0] if fewer else f"none ≤ {max(both)}", equal[0] if equal else f"none ≤ {max(both)}"])
    assert all(kind[r[0]] == "gathered" for r in rows)
    return rows


def plot(table, worlds, families, path, label, metric):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no plot)")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    colours = plt.get_cmap("viridis")
    for i, W in enumerate(worlds):
        pts = [(table[n, W]["link"], table[n, W]["quality"], n) for n, _, _ in families if (n, W) in table]
        if not pts:
            continue
        pts.sort()
        c = colours(i / max(1, len(worlds) - 1))
        a.plot([p[0] / 1e3 for p in pts], [p[1] for p in pts], "o-", color=c, label=f"W = {W}", alpha=0.8)
        for x, y, n in pts:
            a.annotate(n, (x / 1e3, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
    a.set_xscale("log")
    a.set_xlabel("link bytes a step per rank, sent + received (kB)")
    a.set_ylabel(metric.replace("_", " "))
    a.set_title(f"{label}: quality against link bytes, a curve per W", fontsize=10)
    a.grid(alpha=0.3, which="both")
    a.legend(fontsize=8)
    marks = {"summed": "o-", "gathered": "s--", "sparse": "^-."}
    tab = plt.get_cmap("tab10")
    for j, (n, _, kind) in enumerate(families):
        ws = [W for W in worlds if (n, W) in table]
        if ws:
            b.plot(ws, [table[n, W]["link"] / 1e3 for W in ws], marks[kind], color=tab(j % 10), label=f"{n} ({kind})")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xlabel("workers W")
    b.set_ylabel("link bytes a step per rank (kB)")
    b.set_title("link bytes against W (summed: flat; gathered: ~W − 1)", fontsize=10)
    b.grid(alpha=0.3, which="both")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def job_note(args) -> str:
    import workloads
    batch = workloads.defaults(args.workload)["batch"]
    if args.series == "global":
        job = (f"a global batch of {BASE_WORKERS * batch} split over W (2 items a worker at W = 64), the workload's "
               f"lr at every W")
    else:
        job = "batch per worker the workload's, lr × sqrt(W / 4)"
    local = f", DiLoCo every {LOCAL_STEPS} steps (link bytes a step: a sync's over {LOCAL_STEPS})" \
        if args.series == "diloco" else ""
    return (f"{args.steps} steps after {args.start_iter} fp32 ones, {job} after a {args.warmup}-step warm-up{local}; "
            "link bytes sent + received.")


def write_docs(table, worlds, families, args, metric, points):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import doc_tables
    doc_tables.ROOT = ROOT
    doc_tables.TABLES = os.path.join(ROOT, "docs", "data", "tables")
    cmd = (f"scripts/scale.py --workload {args.workload} --workers {args.workers} --seeds {args.seeds} "
           f"--steps {args.steps} --write-docs")
    rows = []
    for n, hook, kind in families:
        for W in worlds:
            t = table.get((n, W))
            if t is None:
                continue
            q = f"{100 * t['quality']:.2f} %" if metric == "test_accuracy" else f"{t['quality']:.3f}"
            if t["seeds"] > 1:
                q += f" ± {100 * t['sd']:.2f} ({t['seeds']} seeds)" if metric == "test_accuracy" else \
                    f" ± {t['sd']:.3f} ({t['seeds']} seeds)"
            rows.append([f"`{n}`", kind, W, q, f"{t['link'] / 1e3:,.0f}", f"{t['ratio']:.2f}×", f"{t['seconds']:.0f}"])
    date = time.strftime("%Y-%m-%d")
    name = data_name(args)
    cmd += "" if args.series == "families" else f" --series {args.series}"
    for flag, value, default in (("--start-iter", args.start_iter, 5), ("--warmup", args.warmup, 5),
                                 ("--eval-items", args.eval_items, 10000)):
        cmd += f" {flag} {value}" if value != default else ""
    data = os.path.join("docs", "data", f"{name}.json")  # every point's figures, the tables' source
    keep = ("hook", "workers", "seed", "steps", "lr", "metric", "quality", "steady_link_bytes_per_round",
            "steady_payload_bytes_per_round", "bf16_link_bytes_per_step", "steady_link_ratio_bf16", "seconds")
    with open(os.path.join(ROOT, data), "w") as f:
        json.dump({f"{n}-w{W}": [{k: r.get(k) for k in keep} for r in rs] for (n, W), rs in sorted(points.items())},
                  f, indent=1)
    doc_tables.write(os.path.join(doc_tables.TABLES, f"{name}.json"), cmd, date, args.machine,
                     ["codec", "family", "W", metric.replace("_", " "), "link kB a step per rank",
                      ("a per-step " if args.series == "diloco" else "") + "bf16 all-reduce's link bytes / these",
                      "seconds"], rows,
                     data=data,
                     note=job_note(args))
    if args.series in ("families", "global", "diloco"):
        doc_tables.write(os.path.join(doc_tables.TABLES, f"{name}-crossover.json"), cmd, date,
                         args.machine, ["gathered", "summed", "fewer link bytes from W", "and within the noise from W"],
                         crossover(table, worlds, families, args.noise, metric), data=data,
                         note=f"the grid W = {args.workers}; within the noise: quality at most {args.noise:.4f} worse "
                          "(the largest sd over points run with 3 seeds, or the workload's default).")
    label = {"families": args.workload, "sizing": f"{args.workload}, the sketch's size",
             "global": f"{args.workload}, a fixed global batch",
             "diloco": f"{args.workload}, DiLoCo every {LOCAL_STEPS} steps",
             "sparse": f"{args.workload}, the sparse all-reduce"}[args.series]
    plot(table, worlds, families, os.path.join(ROOT, "docs", "images", f"{name}.png"), label, metric)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="mlp", choices=["mlp", "lm"], help="the job (mlp: every series; lm: "
                    "the families at the per-step lm list's budgets)")
    ap.add_argument("--workers", default="4,16,64,256", type=items(count), help="comma-separated W")
    ap.add_argument("--series", default="families", choices=sorted(SERIES),
                    help="families: a codec of each family; sizing: the sketch's cells per coordinate and rows; "
                    "global: the families at W = 4's global batch split over W (the learning rate fixed); "
                    f"diloco: the families as DiLoCo's codecs, H = {LOCAL_STEPS}; sparse: top-k and SparseLoCo's "
                    "codec gathered against their sparse all-reduce")
    ap.add_argument("--only", help="comma-separated names of the series' codecs (families: " +
                    ",".join(n for n, _, _ in FAMILIES) + ")")
    ap.add_argument("--seeds", default="1", type=items(count), help="comma-separated seeds")
    ap.add_argument("--steps", type=count, default=60, help="compressed steps a point")
    ap.add_argument("--start-iter", type=count, default=5, help="plain fp32 steps first")
    ap.add_argument("--warmup", type=count, default=5, help="steps of linear learning-rate warm-up")
    ap.add_argument("--eval-items", type=count, default=10000)
    ap.add_argument("--noise", type=float, help="--write-docs: a quality difference within the noise (default: the "
                    "largest sd over points run with 3 seeds or more; 0.005 where none was)")
    ap.add_argument("--timeout", type=count, default=3600, help="seconds a point at most")
    ap.add_argument("--out", help="the points' folder (default: build/scale-<workload>)")
    ap.add_argument("--report-only", action="store_true", help="run nothing: report the points run before")
    ap.add_argument("--restore", action="store_true", help="first take the docs' data file's points with this run's "
                    "flags as run (written into --out)")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--machine", default="the 2-core dev machine")
    ap.add_argument("--smoke", action="store_true", help="W = 16, 3 steps a family, into a temporary folder: "
                    "every family runs and its link bytes are counted (the fast tier)")
    args = ap.parse_args()
    if args.workload == "lm" and args.series != "families":
        ap.error(f"--workload lm --series {args.series}: lm has the families only")
    series = LM if args.workload == "lm" else SERIES[args.series]
    names = [n for n, _, _ in series]
    only = args.only.split(",") if args.only else names
    unknown = sorted(set(only) - set(names))
    if unknown:
        ap.error(f"--only {args.only}: no such codec {unknown[0]!r} (of {','.join(names)})")
    if args.noise is not None and not 0 <= args.noise < 1:
        ap.error(f"--noise {args.noise}: a quality difference in [0, 1)")
    families = [f for f in series if f[0] in only]
    points_before = None
    if args.restore and not args.smoke:
        try:
            points_before = recorded(args)
        except ValueError as e:
            ap.error(f"--restore: {e}")
    if args.smoke:
        args.workers, args.seeds, args.steps, args.start_iter, args.warmup, args.eval_items = [16], [1], 3, 2, 1, 200
    worlds, seeds = sorted(args.workers), args.seeds
    uneven = [W for W in worlds if batch_at(args.workload, W, args.series) in (None, 0)]
    if uneven:
        ap.error(f"--series global: W = {uneven[0]} does not divide the global batch of "
                 f"{BASE_WORKERS * batch_at(args.workload, 1, 'families')} items")
    args.workers, args.seeds = ",".join(map(str, worlds)), ",".join(map(str, seeds))
    scratch = tempfile.TemporaryDirectory() if args.smoke else None
    # The sizing series' names are its own; global's and diloco's are the families' (own folders).
    folder = f"scale-{args.workload}" + ("" if args.series in ("families", "sizing", "sparse") else f"-{args.series}")
    args.out = scratch.name if scratch else (args.out or os.path.join(ROOT, "build", folder))
    os.makedirs(args.out, exist_ok=True)
    todo = [(n, h, W, s) for W in worlds for n, h, _ in families for s in seeds]
    if points_before is not None:
        print(f"scale.py --restore: {restore(points_before, families, worlds, seeds, args)} points from docs/data/"
              f"{data_name(args)}.json", flush=True)
    points, failed, began = {}, [], time.time()
    print(f"scale.py: {args.workload}, W = {args.workers}, {len(families)} codecs, seeds {args.seeds}, "
          f"{args.steps} steps a point: {len(todo)} points into {args.out}", flush=True)
    metric = None
    for i, (n, h, W, s) in enumerate(todo):
        t = time.time()
        r, before = run_point(n, h, W, s, args)
        if r is None:
            if not args.report_only:  # --report-only: a point not run is left out, not failed
                failed.append((n, W, s))
            continue
        metric = r["metric"]
        points.setdefault((n, W), []).append(r)
        print(f"[{i + 1}/{len(todo)}] W = {W}, {n}, seed {s}: {r['metric']} {r['quality']:.4f}, link "
              f"{r['steady_link_bytes_per_round'] / 1e3:,.0f} kB a step per rank (a bf16 all-reduce's: "
              f"{r['steady_link_ratio_bf16']:.2f}× that), " + ("done before" if before else f"{time.time() - t:.0f} s") +
              f"; {time.time() - began:.0f} s in all", flush=True)
    if args.smoke:
        scratch.cleanup()
        bad = [k for k, rs in points.items() if not rs[0]["steady_link_bytes_per_round"] > 0]
        if failed or bad:
            sys.exit(f"scale.py --smoke: failed {failed}, no link bytes {bad}")
        print(f"scale.py --smoke: {len(points)} codecs at W = 16 ran, link bytes counted")
        return
    if args.write_docs and points:
        table = summarise(points)
        if args.noise is None:
            seeded = [statistics.stdev([r["quality"] for r in rs]) for rs in points.values() if len(rs) >= 3]
            # Without seeds: half a point of accuracy; on lm twice dense's seed sd (0.0048 nats).
            args.noise = max(seeded) if seeded else (0.01 if metric in LOWER_IS_BETTER else 0.005)
        write_docs(table, worlds, families, args, metric, points)
    if failed:
        sys.exit(f"scale.py: {len(failed)} points failed: {failed}")


if __name__ == "__main__":
    main()
