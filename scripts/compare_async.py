#!/usr/bin/env python3
"""The demo's job with a straggler: one of its 4 workers computing 2× or 5× slower (sketchsgd-train
--slow 3:F), trained with synchronous rounds, quorum rounds (3 of 4 at a short deadline), bounded
staleness, asynchronous Downpour (--mode async) with the server's SGD or Adagrad, and DiLoCo (8
local steps a push) in rounds and asynchronously. For each: the
time until rank 0's test accuracy first reaches the target, and the accuracy at the end. Each run
is sketchsgd-train on this machine (a server process and 4 workers); runs already in
build/async-demo/ with the same arguments are not repeated. --write-docs writes docs/data/async/
runs.json (every run's accuracy curve), the table async-stragglers and docs/async-stragglers.png.

    .venv/bin/python scripts/compare_async.py [--slow 1,2,5] [--seeds 1,2] [--workers 4,8] [--only NAME,...]
                                              [--no-run] [--write-docs]
"""
import argparse
import datetime
import json
import os
import statistics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from cli import integer, items, names  # noqa: E402  (the command-line checks shared with examples/)
import launch  # noqa: E402  (how a job of the matrix runs)

CODEC = "topk:k=18000,momentum=0.9"
# The job: the MLP on 12,000 training examples (93 steps of 32 per worker an epoch with 4), 4
# epochs, rank 0 testing on the 10,000 test images after each. Each step computes for at least
# 50 ms (--step-ms): a fleet of machines of that speed, whose timing the 2 cores shared by all
# processes here do not decide (unshaped, the cores are the bottleneck and a sleeping straggler
# only hands its core to the others).
JOB = ["--codec", CODEC, "--subset", "12000", "--epochs", "4", "--device", "cpu", "--step-ms", "50"]
TARGET = 0.80
# name, what it is, its flags
MODES = [
    ("rounds", "synchronous rounds (wait for all 4)", []),
    ("quorum", "quorum rounds: 3 of 4 at a 20 ms deadline", ["--min-workers", "3", "--deadline-ms", "20"]),
    ("stale", "bounded staleness 2", ["--staleness", "2"]),
    ("async", "asynchronous (Downpour), SGD", ["--mode", "async", "--age-scale", "0"]),
    ("async-age", "asynchronous, SGD, step / (1 + age)", ["--mode", "async"]),
    ("async-adagrad", "asynchronous, Adagrad on the server (lr 0.01)",
     ["--mode", "async", "--age-scale", "0", "--server-opt", "adagrad", "--lr", "0.01"]),
    # The pseudo-gradient's top-k without the codec's momentum: the outer step has its own.
    ("diloco", "DiLoCo rounds, H = 8 (outer Nesterov, lr 0.7), `topk:k=18000`",
     ["--push-every", "8", "--codec", "topk:k=18000"]),
    # Asynchronously, DiLoCo's Nesterov step on stale pseudo-gradients swings (44 → 61 → 56 → 75 %
    # by epoch in a trial): each push is applied alone, as averaging would weigh it (lr 1 / W).
    ("async-diloco", "asynchronous DiLoCo, H = 8, `topk:k=18000`, outer SGD lr 1 (no momentum)",
     ["--mode", "async", "--age-scale", "0", "--push-every", "8", "--codec", "topk:k=18000",
      "--outer-momentum", "0", "--outer-lr", "1"]),
]


def run(train, label, flags, out):
    return launch.cached(label, [train, *JOB, *flags, "--out", out], out)


def curve(out):
    """Rank 0's (wall s, test accuracy) after each epoch, and the run's summary."""
    with open(os.path.join(out, "summary.json")) as f:  # a run still going has none
        summary = json.load(f)
    points = []
    with open(os.path.join(out, "results.csv")) as f:
        next(f)
        for line in f:
            epoch, _, acc, _, wall = line.strip().split(",")
            points.append((float(wall), float(acc)))
    return points, summary


def reach(points, target):
    return next((t for t, a in points if a >= target), None)


def plot(runs, slows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(slows), figsize=(5 * len(slows), 4), sharey=True, squeeze=False)
    for ax, slow in zip(axes[0], slows):
        for name, _, _ in MODES:
            curves = [r["points"] for r in runs if r["mode"] == name and r["slow"] == slow]
            if not curves:
                continue
            c = curves[0]  # the first seed
            ax.plot([t for t, _ in c], [100 * a for _, a in c], marker="o", label=name)
        ax.axhline(100 * TARGET, color="grey", lw=0.8, ls="--")
        ax.set_title("no straggler" if slow == 1 else f"rank 3 {slow:g}× slower")
        ax.set_xlabel("wall time (s)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("rank 0's test accuracy (%)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"sketchsgd-train, MLP on Fashion-MNIST, 4 workers, {CODEC}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slow", default="1,2,5", type=items(integer(1, 100)), help="the straggler's factors")
    ap.add_argument("--seeds", default="1,2", type=items(integer(1, 1 << 30)), help="comma-separated")
    ap.add_argument("--workers", default="4", type=items(integer(4, 64)),
                    help="comma-separated worker counts (the straggler is rank 3)")
    ap.add_argument("--only", default="", type=names(m[0] for m in MODES),
                    help="comma-separated names of " + ", ".join(m[0] for m in MODES))
    ap.add_argument("--train", default=os.path.join(ROOT, "build/default/demo/sketchsgd-train"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build/async-demo"))
    ap.add_argument("--no-run", action="store_true", help="only report the runs already there")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if not os.access(args.train, os.X_OK):
        ap.error(f"--train {args.train}: no such program (build it: cmake --build --preset default)")
    modes = [m for m in MODES if not args.only or m[0] in args.only.split(",")]
    todo = [(m, s, seed, w) for w in args.workers for s in args.slow for m in modes for seed in args.seeds]
    folder = lambda name, slow, seed, w: os.path.join(
        args.out, f"{name}-slow{slow}-seed{seed}" + ("" if w == 4 else f"-w{w}"))
    for i, ((name, _, flags), slow, seed, w) in enumerate([] if args.no_run else todo):
        extra = ["--seed", str(seed)] + (["--workers", str(w)] if w != 4 else []) + \
            (["--slow", f"3:{slow}"] if slow > 1 else [])
        run(args.train, f"[{i + 1}/{len(todo)}] {name}, {w} workers, straggler {slow}×, seed {seed}",
            flags + extra, folder(name, slow, seed, w))
    runs = []
    for w in args.workers:
        for name, _, _ in MODES:
            for slow in args.slow:
                for seed in args.seeds:
                    try:
                        points, summary = curve(folder(name, slow, seed, w))
                    except OSError:
                        continue
                    runs.append({"mode": name, "workers": w, "slow": slow, "seed": seed, "points": points,
                                 "final": summary["test_accuracy"], "wall_s": summary["wall_s"],
                                 "traffic_ratio": summary["traffic_ratio"]})
    rows = []
    for w, slow in [(w, s) for w in args.workers for s in args.slow]:
        here = [r for r in runs if r["workers"] == w and r["slow"] == slow]
        base = [reach(r["points"], TARGET) for r in here if r["mode"] == "rounds"]
        base = [t for t in base if t is not None]
        for name, what, _ in MODES:
            mine = [r for r in here if r["mode"] == name]
            if not mine:
                continue
            times = [reach(r["points"], TARGET) for r in mine]
            got = [t for t in times if t is not None]
            t = statistics.mean(got) if len(got) == len(times) else None
            speed = f"{statistics.mean(base) / t:.2f}×" if t and base and name != "rounds" else ""
            finals = [100 * r["final"] for r in mine]
            rows.append([w, f"{slow}×" if slow > 1 else "none", what,
                         f"{t:.1f}" if t else f"not reached ({len(got)} of {len(times)})", speed,
                         " / ".join(f"{a:.2f}" for a in finals),
                         f"{statistics.mean(r['wall_s'] for r in mine):.1f}",
                         f"{statistics.mean(r['traffic_ratio'] for r in mine):.1f}×"])
            print(f"W={w} straggler {slow}x {name:14s} to {100 * TARGET:.0f} %: {rows[-1][3]:>8s} s {speed:>6s}  "
                  f"final {rows[-1][5]} %  wall {rows[-1][6]} s")
    if args.write_docs and rows:
        import doc_tables
        data = os.path.join(ROOT, "docs/data/async/runs.json")
        os.makedirs(os.path.dirname(data), exist_ok=True)
        with open(data, "w") as f:
            json.dump({"job": JOB, "target": TARGET, "runs": runs}, f, indent=1)
            f.write("\n")
        plot([r for r in runs if r["workers"] == 4], args.slow, os.path.join(ROOT, "docs/async-stragglers.png"))
        doc_tables.write(os.path.join(ROOT, "docs/data/tables/async-stragglers.json"),
                         "S=\".venv/bin/python scripts/compare_async.py\"; $S --seeds 1; $S --seeds 2 --only rounds,async; "
                         "$S --workers 8 --slow 1 --seeds 1 --only rounds,async,async-adagrad; "
                         "$S --no-run --workers 4,8 --write-docs",
                         datetime.date.today().isoformat(),
                         "the 2-core dev machine (AMD EPYC Zen 4 under KVM, 2 threads)",
                         ["workers", "straggler", "training", f"s to {100 * TARGET:.0f} % (mean of seeds)",
                          "faster than rounds", "final test accuracy (%), by seed", "wall s",
                          "less traffic than dense"], rows, data="docs/data/async/runs.json",
                         note="sketchsgd-train: the MLP on Fashion-MNIST (12,000 training examples, 4 "
                              f"epochs, batch 32, split over the workers), `{CODEC}`, lr 0.01 unless said; "
                              "every step lasts at least 50 ms (--step-ms 50: a machine of that speed), rank 3's F times "
                              "as long (--slow 3:F); rank 0 tests after "
                              "each of its epochs. Asynchronous jobs fetch the dense model with every "
                              "push (Downpour's n_fetch = 1), hence their traffic.")
        doc_tables.main([])


if __name__ == "__main__":
    main()
