#!/usr/bin/env python3
"""The federated frontier: examples/federated.py for FetchSGD and its baselines on the same
population, sampling, seeds, data and rounds, on an iid split and two non-iid ones; then test
accuracy against upload bytes per participant, a verdict for each baseline (the best FetchSGD
point at that upload or less) and a PNG.

    .venv/bin/python scripts/compare_federated.py                       # every split, seed 1
    .venv/bin/python scripts/compare_federated.py --split classes:1 --seed 2 --only fetchsgd-100k,topk-50k
    .venv/bin/python scripts/compare_federated.py --report-only --write-docs

The job: the demo's MLP (d = 1,863,690) on Fashion-MNIST, N = 1,000 clients of 60 images, C = 20
sampled a round, 300 rounds, batches of 32 (~1 minute a run on 2 cores). Clients are stateless
unless the name says "state" (they keep their codec's error feedback between participations,
however stale). Every codec but FetchSGD gets the server's momentum (0.9) on its decoded mean;
FetchSGD keeps momentum and error as sketches on the server. FedAvg: 5 local steps at the same
rate, the change averaged (server rate 1, no server momentum). Runs land in
build/federated-SPLIT[-seedN]/NAME.json and are not run again while their file exists (--force).

Verdicts: for each baseline point, the best FetchSGD point at that upload or less — ahead when
better by more than the noise (the largest sd over points run with 3 seeds on that split), level
within it, else behind — and FetchSGD's least upload within the noise of it.
"""
import argparse
import json
import os
import shutil
import sys
import time

import frontier  # noqa: E402  (summary, Scale, verdicts, pyplot)
from cli import names, natural  # noqa: E402  (the command-line checks shared with examples/)
import launch  # noqa: E402  (how a job of the matrix runs)

SPLITS = ["iid", "dirichlet:0.3", "classes:1"]
MOMENTUM = ["--server-momentum", "0.9"]
# name, codec, extra arguments, label of its line in the plot (FetchSGD's first).
POINTS = [
    # k = cols / 5 (the FetchSGD points of docs/RESULTS.md's other tables); cols / 10 at the smallest
    # sketch, where k = 5,000 of 25,000 columns diverged on classes:1.
    ("fetchsgd-25k", "sketch:fetch=1,rows=1,cols=25000,k=2500", [], "FetchSGD"),
    ("fetchsgd-50k", "sketch:fetch=1,rows=1,cols=50000,k=10000", [], "FetchSGD"),
    ("fetchsgd-100k", "sketch:fetch=1,rows=1,cols=100000,k=20000", [], "FetchSGD"),
    ("fetchsgd-400k", "sketch:fetch=1,rows=1,cols=400000,k=80000", [], "FetchSGD"),
    ("dense", "dense", MOMENTUM, "uncompressed SGD"),
    ("fedavg", "dense", ["--local-steps", "5", "--lr", "1"], "FedAvg (5 local steps)"),
    ("fedavg-fp16", "dense:wire=fp16", ["--local-steps", "5", "--lr", "1"], "FedAvg (5 local steps)"),
    ("topk-12k", "topk:k=12500", MOMENTUM, "local top-k"),
    ("topk-50k", "topk:k=50000", MOMENTUM, "local top-k"),
    ("topk-200k", "topk:k=200000", MOMENTUM, "local top-k"),
    ("topk-50k-state", "topk:k=50000", MOMENTUM + ["--client-state"], "local top-k, clients keep error feedback"),
    ("powersgd-r4", "powersgd:rank=4,warm=0", MOMENTUM, "PowerSGD"),
    ("powersgd-r16", "powersgd:rank=16,warm=0", MOMENTUM, "PowerSGD"),
    ("powersgd-r4-state", "powersgd:rank=4,warm=0", MOMENTUM + ["--client-state"], "PowerSGD, clients keep error feedback"),
    ("powersgd-r16-state", "powersgd:rank=16,warm=0", MOMENTUM + ["--client-state"], "PowerSGD, clients keep error feedback"),
    ("signsgd", "signsgd", MOMENTUM + ["--lr", "0.0005"], "signSGD (majority vote)"),
    ("ef-signsgd", "signsgd:ef=1", MOMENTUM, "EF-signSGD"),
    ("ef-signsgd-state", "signsgd:ef=1", MOMENTUM + ["--client-state"], "EF-signSGD, clients keep error feedback"),
]
JOB = ["--clients", "1000", "--per-round", "20", "--rounds", "300", "--batch", "32", "--eval-every", "50"]


def folder(split, seed):
    return "build/federated-" + split.replace(":", "") + ("" if seed == 1 else f"-seed{seed}")


def current(path, codec, extra):
    """The result at path, when it exists and was run with this codec and these arguments."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        r = json.load(f)
    got = {"codec": r["codec"], "client_state": r["client_state"], "local_steps": r["local_steps"],
           "server_momentum": r["server_momentum"], "lr": r["lr"]}
    a = argparse.ArgumentParser()
    for flag, default in (("--server-momentum", 0.0), ("--local-steps", 0), ("--lr", 0.05)):
        a.add_argument(flag, type=type(default), default=default)
    a.add_argument("--client-state", action="store_true")
    want = vars(a.parse_args(extra))
    return r if got == {"codec": codec, **want} else None


def run(name, codec, extra, split, seed, args):
    out = os.path.join(folder(split, seed), name + ".json")
    if current(out, codec, extra) and not args.force:
        return True
    cmd = [sys.executable, "examples/federated.py", "--codec", codec, "--split", split, "--seed", str(seed),
           *JOB, *extra, "--out", out]
    return launch.job(f"{split} seed {seed} {name}: {codec} {' '.join(extra)}", cmd, python=args.python)


def load(split):
    """name -> {"hook", "payload" (upload per participant), "acc": {seed: %}, "state", "total"}"""
    runs = {}
    for seed in range(1, 10):
        d = folder(split, seed)
        for name, codec, extra, _ in POINTS:
            r = current(os.path.join(d, name + ".json"), codec, extra)
            if r is None:
                continue
            e = runs.setdefault(name, {"hook": codec + (" (clients keep state)" if r["client_state"] else ""),
                                       "payload": r["upload_bytes_per_participant"], "acc": {},
                                       "state": r["client_state_bytes"], "total": r["total_bytes"],
                                       "dense": r["dense_upload_bytes"], "rounds": r["rounds"]})
            # a diverged run scores as chance (10 %): it is a failure at that setting, not a gap
            e["acc"][seed] = 10.0 if r["diverged"] else 100 * r["test_accuracy"]
            if r["diverged"]:
                e.setdefault("diverged", {})[seed] = r["diverged"].split(":")[0]
    return runs


def noise(runs):
    sds = [frontier.summary(e)[1] for e in runs.values() if len(e["acc"]) >= 3]
    return max(sds) if sds else 0.5


def rows(runs):
    out = []
    for name, codec, extra, _ in POINTS:
        if name not in runs:
            continue
        e = runs[name]
        mean, sd, n = frontier.summary(e)
        acc = f"{mean:.2f} %" + (f" ± {sd:.2f} ({n})" if sd is not None else "")
        if len(e.get("diverged", {})) == n:
            acc = "diverged (" + ", ".join(e["diverged"].values()) + ")"
        out.append([name, f"`{e['hook']}`", f"{e['payload'] / 1e3:,.1f} kB", f"{e['dense'] / e['payload']:.1f}×", acc,
                    f"{e['state'] / 1e6:,.0f} MB" if e["state"] else "none", f"{e['total'] / 1e9:.2f} GB"])
    return out


COLUMNS = ["point", "codec", "upload per participant", "less than dense", "test accuracy (mean ± sd, seeds)",
           "client state kept (all clients)", "total traffic (up + down)"]


def plot(all_runs, path):
    plt = frontier.pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(all_runs), figsize=(5.2 * len(all_runs), 4.8), sharey=True, squeeze=False)
    axes = axes[0]
    labels = list(dict.fromkeys(p[3] for p in POINTS))
    colors = dict(zip(labels, plt.get_cmap("tab10").colors))
    for ax, (split, runs) in zip(axes, all_runs.items()):
        for label in labels:
            pts = sorted((runs[n]["payload"], *frontier.summary(runs[n])[:2]) for n, _, _, lab in POINTS
                         if lab == label and n in runs and not runs[n].get("diverged"))
            for n in (n for n, _, _, lab in POINTS if lab == label and runs.get(n, {}).get("diverged")):
                ax.scatter([runs[n]["payload"]], [10], marker="x", color=colors[label], s=60)
                ax.annotate("diverged", (runs[n]["payload"], 10), fontsize=7, xytext=(4, 3), textcoords="offset points")
            if not pts:
                continue
            fetch = label == "FetchSGD"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="D" if fetch else "o", color=colors[label],
                    linewidth=2.5 if fetch else 1, label=label)
            for x, y, sd in pts:
                if sd:
                    ax.errorbar([x], [y], yerr=[sd], color=colors[label], capsize=3)
        ax.set_xscale("log")
        ax.set_title(f"split {split}", fontsize=10)
        ax.set_xlabel("upload per participant per round (bytes, log)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy after 300 rounds (%)")
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle("Federated Fashion-MNIST MLP: 1,000 clients, 20 sampled a round, stateless unless marked", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"plot: {path}")
    return True


def report(args):
    os.makedirs("build/federated", exist_ok=True)
    all_runs = {s: load(s) for s in SPLITS}
    all_runs = {s: r for s, r in all_runs.items() if r}
    text = []
    tables = {}
    for split, runs in all_runs.items():
        sc = frontier.Scale("fashion", noise(runs), first_rule=False)
        fetch = [n for n in runs if n.startswith("fetchsgd")]
        theirs = [n for n in runs if not n.startswith("fetchsgd")]
        v = frontier.verdicts(runs, sc, theirs=theirs, ours=fetch, label=lambda n: n)
        tag = split.replace(":", "")
        tables[tag] = (rows(runs), v, sc)
        text += [f"## {split} (noise {sc.noise:.2f} points)", "", _md(COLUMNS, rows(runs)), "",
                 _md(frontier.verdict_columns(sc, theirs="baseline", traffic="upload"), v), ""]
    with open("build/federated/table.md", "w") as f:
        f.write("\n".join(text))
    print("\n".join(text))
    png = "build/federated/federated.png"
    drawn = plot(all_runs, png)
    if args.write_docs:
        import doc_tables
        when = time.strftime("%Y-%m-%d")
        machine = "the 2-core dev machine, PyTorch 1.13 (CPU)"
        for tag, (r, v, sc) in tables.items():
            doc_tables.write(f"docs/data/tables/federated-{tag}.json", ".venv/bin/python scripts/compare_federated.py --write-docs",
                             when, machine, COLUMNS, r, data=f"build/federated-{tag}*/",
                             note="One run each unless seeds are given; seeds 1-3 where a verdict was contested.")
            doc_tables.write(f"docs/data/tables/federated-{tag}-verdicts.json",
                             ".venv/bin/python scripts/compare_federated.py --write-docs", when, machine,
                             frontier.verdict_columns(sc, theirs="baseline", traffic="upload"), v,
                             note=f"Noise: {sc.noise:.2f} points (the largest sd over points run with 3 seeds).")
        if drawn:
            shutil.copy(png, "docs/images/federated.png")
        doc_tables.main([])


def _md(columns, rows):
    return "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] +
                     ["| " + " | ".join(r) + " |" for r in rows])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="", type=names(SPLITS), help=f"comma-separated, of {SPLITS} (default: all)")
    ap.add_argument("--seed", type=natural, default=1)
    ap.add_argument("--only", default="", type=names(p[0] for p in POINTS), help="comma-separated point names")
    ap.add_argument("--force", action="store_true", help="run points whose result exists again")
    ap.add_argument("--python", default="build/default/python", help="where the sketchsgd package is")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--write-docs", action="store_true", help="the tables' data files and the PNG into docs/")
    args = ap.parse_args()
    splits = [s for s in args.split.split(",") if s] or SPLITS
    only = set(filter(None, args.only.split(",")))
    if not args.report_only and not os.path.isdir(args.python):
        ap.error(f"--python {args.python}: no such folder (build the package: cmake --build --preset default)")
    failed = []
    if not args.report_only:
        for split in splits:
            for name, codec, extra, _ in POINTS:
                if (not only or name in only) and not run(name, codec, extra, split, args.seed, args):
                    failed.append(f"{split}/{name}")
    report(args)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
