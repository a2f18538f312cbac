#!/usr/bin/env python3
"""How dense is a pseudo-gradient? One worker trains a workload with its usual optimiser; at a few
points of the run it takes the change of H steps (H = 1 is one step's update, θ_t − θ_{t+1}) and
reports which share of its energy (squared L2 norm) the largest 2 % and 10 % of coordinates hold,
and which share rank-4 approximations of each weight matrix hold (what top-k and PowerSGD would
keep of it). One process, the workload's defaults, seed 1.

    .venv/bin/python scripts/density.py [--workload transformer] [--steps 240] [--write-docs]

Writes build/density-WORKLOAD.json; --write-docs: docs/data/tables/density-WORKLOAD.json.
"""
import argparse
import json
import os
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402
from cli import count, one_line  # noqa: E402

HS = (1, 4, 16, 64)


def shares(delta):
    """Energy shares of the top 2 % and 10 % coordinates and of rank-4 per matrix."""
    flat = torch.cat([d.reshape(-1) for d in delta])
    energy = float(flat.pow(2).sum())
    order = flat.pow(2).sort(descending=True).values
    top = {p: float(order[: max(1, int(p * flat.numel()))].sum()) / energy for p in (0.02, 0.10)}
    kept = 0.0
    for d in delta:
        if d.dim() >= 2 and min(d.shape[0], d.reshape(d.shape[0], -1).shape[1]) > 4:
            s = torch.linalg.svdvals(d.reshape(d.shape[0], -1).double())
            kept += float(s[:4].pow(2).sum())
        else:
            kept += float(d.pow(2).sum())  # vectors travel whole under PowerSGD
    return top[0.02], top[0.10], kept / energy


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="transformer")
    ap.add_argument("--steps", type=count, default=256, help="windows start at each quarter of these steps")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if args.steps // 4 * 3 + max(HS) > args.steps:
        ap.error(f"--steps {args.steps}: at least {4 * max(HS)} (the last window of {max(HS)} steps must fit)")
    torch.manual_seed(1)
    torch.set_num_threads(2)
    try:
        job = workloads.make(args.workload)
    except (ValueError, OSError) as e:
        ap.error(f"--workload {args.workload}: {one_line(e)}")
    d = workloads.defaults(args.workload)
    model = job.model(1)
    params = list(model.parameters())
    if d["optimizer"] == "adamw":
        opt = torch.optim.AdamW(params, lr=d["lr"])
    else:
        opt = torch.optim.SGD(params, lr=d["lr"], momentum=d["momentum"])
    order = job.order(0, 1, 0, 1)
    batch = d["batch"]
    marks = {args.steps // 4 * q: q for q in range(1, 4)}  # where the windows start
    snaps, rows = {}, []  # windows may overlap: the last H of one start runs past the next start
    t0 = time.time()
    for step in range(args.steps + 1):  # the last pass only measures
        if step in marks:
            snaps[step] = [p.detach().clone() for p in params]
        for start in list(snaps):
            for h in HS:
                if step == start + h:
                    delta = [a - p.detach() for a, p in zip(snaps[start], params)]
                    t2, t10, r4 = shares(delta)
                    rows.append({"step": start, "H": h, "top2": t2, "top10": t10, "rank4": r4})
                    print(f"step {start} H {h:3d}: top 2 % {100 * t2:5.1f} %, top 10 % {100 * t10:5.1f} %, "
                          f"rank 4 {100 * r4:5.1f} % of the energy", flush=True)
        if step == args.steps:
            break
        x, y = job.batch(order[step * batch:(step + 1) * batch], torch.device("cpu"), torch.float32)
        loss = job.loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if d.get("clip"):
            torch.nn.utils.clip_grad_norm_(params, d["clip"])
        opt.step()
        if (step + 1) % 40 == 0:
            print(f"  {step + 1}/{args.steps} steps, loss {loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    with open(os.path.join(ROOT, "build", f"density-{args.workload}.json"), "w") as f:
        json.dump(rows, f, indent=1)
    columns = ["H (steps in the change)", "top 2 % of coordinates", "top 10 %", "rank 4 per matrix"]
    table = []
    for h in HS:
        mine = [r for r in rows if r["H"] == h]
        mean = lambda k: sum(r[k] for r in mine) / len(mine)
        table.append([h, f"{100 * mean('top2'):.1f} %", f"{100 * mean('top10'):.1f} %", f"{100 * mean('rank4'):.1f} %"])
    print("\n".join("| " + " | ".join(str(c) for c in r) + " |" for r in [columns] + table))
    if args.write_docs:
        import doc_tables
        doc_tables.write(os.path.join(ROOT, "docs/data/tables", f"density-{args.workload}.json"),
                         f".venv/bin/python scripts/density.py --workload {args.workload} --steps {args.steps} --write-docs",
                         time.strftime("%Y-%m-%d"), "the 2-core dev machine, PyTorch 1.13", columns, table,
                         note=f"Share of the squared L2 norm of θ_t − θ_(t+H), one worker, the workload's optimiser; "
                              f"means over windows starting at steps {', '.join(str(s) for s in sorted(marks))}.")
        doc_tables.main([])


if __name__ == "__main__":
    main()
