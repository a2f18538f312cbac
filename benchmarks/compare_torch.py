#!/usr/bin/env python3
"""Side-by-side benchmark: sketchsgd's C++ count sketch vs. the PyTorch CSVec reference.

Run with the project environment's interpreter (PyTorch, NumPy: scripts/venv.sh):
    .venv/bin/python benchmarks/compare_torch.py --binary build/cpu/benchmarks/sketchsgd_compare

The torch half mirrors CSVec with precomputed hashes: int64 buckets and float32
signs per (row, coordinate), per-row bincount to accumulate, gather of all r x d
estimates, torch.median over rows (lower median for even r, as the reference),
then topk of abs. Everything runs on CPU.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

import numpy as np
import torch

# The command-line checks shared with examples/ (examples/cli.py).
from cli import count, names, natural  # noqa: E402

LARGEPRIME = 2**61 - 1  # the reference's hash modulus


def log(msg):
    print(msg, flush=True)  # the run takes a minute or more; show where it is


def proc_status_kb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def reset_hwm():
    # Writing 5 to clear_refs resets VmHWM to the current RSS, so the peak we read later
    # is not polluted by earlier temporaries (e.g. generating the input vector).
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        log("  warning: cannot reset VmHWM; RSS growth may include earlier peaks")
    return proc_status_kb("VmRSS")


def make_gradient(d, seed):
    # Gaussian noise plus a few thousand heavy coordinates with random signs and
    # Pareto magnitudes, so top-k has real heavy hitters to find.
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(d, dtype=np.float32)
    n_heavy = min(5000, max(1, d // 100))
    heavy = rng.choice(d, n_heavy, replace=False)
    mags = 20.0 * (1.0 + rng.pareto(1.5, n_heavy))
    x[heavy] = (np.where(rng.random(n_heavy) < 0.5, -1.0, 1.0) * mags).astype(np.float32)
    return x, heavy


def ms_since(t0):
    return (time.perf_counter() - t0) * 1e3


def bench_torch(x, r, c, k, reps, seed):
    d = x.numel()
    rss0_kb = reset_hwm()

    # Construction, as CSVec does it: random per-row hash coefficients, then a
    # 2-wise polynomial hash for buckets and a 4-wise one for signs.
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(seed)
    h = torch.randint(0, LARGEPRIME, (r, 6), dtype=torch.int64, generator=g)
    tokens = torch.arange(d, dtype=torch.int64).reshape(1, d)
    buckets = (h[:, 0:1] * tokens + h[:, 1:2]) % LARGEPRIME % c
    signs = ((((h[:, 2:3] * tokens + h[:, 3:4]) * tokens + h[:, 4:5]) * tokens + h[:, 5:6])
             % LARGEPRIME % 2 * 2 - 1).float()
    del tokens
    table = torch.zeros((r, c), dtype=torch.float32)
    construct_ms = ms_since(t0)
    log(f"  torch construct: {construct_ms:.1f} ms")

    acc = []
    for _ in range(reps):
        table.zero_()
        t0 = time.perf_counter()
        for i in range(r):
            table[i] += torch.bincount(buckets[i], weights=signs[i] * x, minlength=c)
        acc.append(ms_since(t0))
    log(f"  torch accumulate: {statistics.median(acc):.1f} ms (median of {reps})")

    tk = []
    for _ in range(reps):
        t0 = time.perf_counter()
        vals = torch.zeros((r, d), dtype=torch.float32)
        for i in range(r):
            vals[i] = table[i][buckets[i]] * signs[i]
        est = vals.median(dim=0)[0]
        del vals
        idx = est.abs().topk(k, sorted=False)[1]
        top_vals = est[idx]
        tk.append(ms_since(t0))
    log(f"  torch unsketch+topk: {statistics.median(tk):.1f} ms (median of {reps})")

    hwm1_kb = proc_status_kb("VmHWM")
    # Analytic tensor bytes, counted as if all alive together (the code frees vals before
    # abs, so this slightly over-states the true live peak): hashes 12rd, table 4rc,
    # r x d estimates 4rd, median values+indices 12d, abs 4d, topk values+indices 12k.
    tensor_bytes = 12 * r * d + 4 * r * c + 4 * r * d + 12 * d + 4 * d + 12 * k
    return {
        "construct_ms": construct_ms,
        "accumulate_ms": statistics.median(acc),
        "topk_ms": statistics.median(tk),
        "accumulate_ms_all": acc,
        "topk_ms_all": tk,
        "tensor_peak_bytes": tensor_bytes,
        "rss_hwm_growth_bytes": (hwm1_kb - rss0_kb) * 1024,
        "top_indices": idx,
    }


def run_binary(args, path, hashing):
    cmd = [args.binary, "--input", path, "--rows", str(args.rows), "--cols", str(args.cols),
           "--k", str(args.k), "--reps", str(args.reps), "--seed", str(args.seed),
           "--hashing", hashing, "--block", str(args.block)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    log("  $ " + " ".join(cmd))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired:
        sys.exit("error: sketchsgd_compare timed out after 600 s")
    if p.returncode != 0:
        sys.exit(f"error: sketchsgd_compare exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    try:
        out = json.loads(p.stdout.strip())
    except json.JSONDecodeError as e:
        sys.exit(f"error: sketchsgd_compare output is not JSON ({e})\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    missing = [key for key in ("construct_ms", "accumulate_ms", "topk_ms", "peak_extra_bytes")
               if not isinstance(out, dict) or key not in out]
    if missing:
        sys.exit(f"error: sketchsgd_compare JSON lacks {missing}: {p.stdout.strip()}")
    return out


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=count, default=6_500_000)
    ap.add_argument("--rows", type=count, default=5)
    ap.add_argument("--cols", type=count, default=500_000)
    ap.add_argument("--k", type=count, default=50_000)
    ap.add_argument("--reps", type=count, default=5)
    ap.add_argument("--seed", type=natural, default=42)
    ap.add_argument("--binary", default="build/cpu/benchmarks/sketchsgd_compare")
    ap.add_argument("--threads", type=count, default=os.cpu_count())
    ap.add_argument("--hashing", default="blocked,random", type=names(["random", "precomputed", "blocked"]),
                    help="sketchsgd hashing modes to run side by side (random, precomputed, blocked)")
    ap.add_argument("--block", type=count, default=1024, help="block size of blocked hashing")
    ap.add_argument("--out-json", help="write all results here")
    ap.add_argument("--save-input", metavar="FILE",
                    help="also keep the gradient (raw little-endian f32) here, e.g. for a profiler")
    args = ap.parse_args()

    # Fail before the minute of torch work, not after it.
    if not (os.path.isfile(args.binary) and os.access(args.binary, os.X_OK)):
        ap.error(f"--binary {args.binary}: not found or not executable (build it, or pass --binary)")
    if args.k > args.dim:
        ap.error(f"--k {args.k}: more than --dim {args.dim}")
    if not any(m.strip() for m in args.hashing.split(",")):
        ap.error("--hashing: no mode")

    torch.set_num_threads(args.threads)
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
               "threads": args.threads}
    log(f"machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, "
        f"{args.threads} threads")
    log(f"d={args.dim} rows={args.rows} cols={args.cols} k={args.k} reps={args.reps} seed={args.seed}")

    x_np, heavy = make_gradient(args.dim, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "grad.f32")
        x_np.astype("<f4", copy=False).tofile(path)
        if args.save_input:
            x_np.astype("<f4", copy=False).tofile(args.save_input)
        log("torch reference:")
        t = bench_torch(torch.from_numpy(x_np), args.rows, args.cols, args.k, args.reps, args.seed)
        found = np.intersect1d(t.pop("top_indices").numpy(), heavy).size
        log(f"  torch top-k holds {found}/{heavy.size} planted heavy coordinates")
        modes = [m.strip() for m in args.hashing.split(",") if m.strip()]
        all_ours = {}
        for mode in modes:
            log(f"sketchsgd, hashing={mode}:")
            all_ours[mode] = run_binary(args, path, mode)

    speedups = {}
    for mode, ours in all_ours.items():
        rows = [("construct", t["construct_ms"], ours["construct_ms"]),
                ("accumulate", t["accumulate_ms"], ours["accumulate_ms"]),
                ("unsketch+topk", t["topk_ms"], ours["topk_ms"])]
        speedup = speedups[mode] = {}
        log("")
        log(f"hashing={mode}")
        log(f"{'operation':<16}| {'torch ms':>12} | {'sketchsgd ms':>12} | {'speed-up':>9}")
        log("-" * 58)
        for name, tm, om in rows:
            speedup[name] = tm / om if om > 0 else float("inf")
            log(f"{name:<16}| {tm:12.2f} | {om:12.2f} | {speedup[name]:8.2f}x")
        mib = 1024.0 ** 2
        ob = ours["peak_extra_bytes"]
        for label, tb in (("tensors", t["tensor_peak_bytes"]), ("RSS HWM", t["rss_hwm_growth_bytes"])):
            pct = 100.0 * ob / tb if tb > 0 else float("nan")
            log(f"{'peak mem ' + label:<16}| {tb / mib:8.1f} MiB | {ob / mib:8.1f} MiB | {pct:8.1f}% (ours/torch)")
    ours = all_ours[modes[0]]
    speedup = speedups[modes[0]]
    log(f"sketchsgd threads: {ours.get('threads', '?')}")

    if args.out_json:
        result = {"machine": machine, "params": {key: getattr(args, key) for key in
                                                 ("dim", "rows", "cols", "k", "reps", "seed", "threads")},
                  "torch": dict(t, planted_heavy=int(heavy.size), heavy_in_topk=int(found)),
                  "sketchsgd": ours, "speedup": speedup,
                  "by_hashing": {m: {"sketchsgd": all_ours[m], "speedup": speedups[m]} for m in modes}}
        with open(args.out_json, "w") as f:
            json.dump(result, f, indent=2)
        log(f"wrote {args.out_json}")


if __name__ == "__main__":
    main()
