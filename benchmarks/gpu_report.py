#!/usr/bin/env python3
"""GPU side-by-side: times the PyTorch baselines on this GPU and prints them next to
sketchsgd's Google Benchmark results (one JSON from sketchsgd_bench_gpu), with the targets set
for the GPU backend. Run by scripts/gpu.sh check; needs PyTorch with CUDA.

    python3 benchmarks/gpu_report.py --bench gpu.json [--markdown table.md] [--json r.json] [--png r.png]
    python3 benchmarks/gpu_report.py --replot r.json --png r.png     # the chart of an earlier run

Baselines (CUDA events, median of several runs after warm-up):
  copy      x.clone() of the same size: the bandwidth ceiling
  topk      torch.topk(x.abs(), k)
  compress  the reference count-sketch method (CSVec): momentum + error feedback, then per row
            torch.bincount over precomputed int64 buckets with float signs as weights
  unsketch  table[r][buckets[r]] * signs[r] for all r (an r x d tensor), torch.median over rows,
            torch.topk of the absolute values
"""
import argparse, importlib, json, statistics, sys

torch = None  # imported by main() when measuring: --replot needs no PyTorch


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def time_ms(fn, reps=10, warm=2):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def gradient(d, seed=42):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(d, device="cuda", generator=g)
    x[::997] *= 50.0  # the same heavy tail as bench_gpu.cpp
    return x


def torch_baselines(D, C, R, K):
    res = {}
    x = gradient(D)
    res["copy"] = time_ms(lambda: x.clone())
    x100 = gradient(100_000_000)
    res["copy_1e8"] = time_ms(lambda: x100.clone())
    res["topk_1e8_1e6"] = time_ms(lambda: torch.topk(x100.abs(), 1_000_000))
    res["topk_1e8_1e3"] = time_ms(lambda: torch.topk(x100.abs(), 1000))
    res["topk_D_1e6"] = time_ms(lambda: torch.topk(x.abs(), K))
    del x100
    log("torch: copy and topk done")
    gen = torch.Generator(device="cuda").manual_seed(7)
    for rows in (R, 1):
        buckets = torch.randint(0, C, (rows, D), device="cuda", generator=gen, dtype=torch.int64)
        signs = (torch.randint(0, 2, (rows, D), device="cuda", generator=gen).float() * 2 - 1)
        u = torch.zeros(D, device="cuda")
        v = torch.zeros(D, device="cuda")
        table = torch.zeros(rows, C, device="cuda")

        def compress():
            u.mul_(0.9).add_(x)
            v.add_(u)
            table.zero_()
            for r in range(rows):
                table[r] += torch.bincount(buckets[r], weights=signs[r] * v, minlength=C)

        def unsketch():
            vals = torch.stack([table[r][buckets[r]] * signs[r] for r in range(rows)])
            est = vals.median(dim=0).values if rows > 1 else vals[0]
            return torch.topk(est.abs(), K)

        res[f"compress_r{rows}"] = time_ms(compress, reps=5)
        res[f"unsketch_r{rows}"] = time_ms(unsketch, reps=5)
        del buckets, signs, u, v, table
        torch.cuda.empty_cache()
        log(f"torch: reference sketch r={rows} done")
    return res


def ours(path):
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = b["run_name"] if "run_name" in b else b["name"]
        unit = {"ms": 1.0, "us": 1e-3, "ns": 1e-6}[b["time_unit"]]
        out[name] = (b["real_time"] * unit, b.get("bytes_per_second"))
    return out, data.get("context", {})


def chart(report, path):
    """Two panels: speed-up over the PyTorch baselines, and share of copy bandwidth; the targets as
    marks. report: {"gpu": ..., "points": [{"label", "kind": "speedup"|"bandwidth", "value",
    "goal" (None for information rows)}]}."""
    try:
        import matplotlib
    except ImportError:  # the table is the result; the chart is a convenience
        log("no chart: matplotlib is missing")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kinds = (("speedup", "times faster than the PyTorch baseline (log)", True),
             ("bandwidth", "share of device-to-device copy bandwidth", False))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, (kind, xlabel, log_x) in zip(axes, kinds):
        pts = [p for p in report["points"] if p["kind"] == kind][::-1]
        y = range(len(pts))
        colors = ["tab:gray" if p["goal"] is None else
                  ("tab:green" if p["value"] >= p["goal"] else "tab:red") for p in pts]
        ax.barh(list(y), [p["value"] for p in pts], color=colors)
        for i, p in enumerate(pts):
            if p["goal"] is not None:
                ax.plot([p["goal"]] * 2, [i - 0.4, i + 0.4], color="black", linewidth=2)
            v = p["value"]
            text = f"{v:.1f}x" if kind == "speedup" else (f"{v:.1%}" if v < 0.1 else f"{v:.0%}")
            ax.text(p["value"], i, " " + text, va="center", fontsize=8)
        ax.set_yticks(list(y), [p["label"] for p in pts], fontsize=8)
        ax.set_xlabel(xlabel)
        if log_x:
            ax.set_xscale("log")
            ax.axvline(1.0, color="gray", linewidth=0.8)
        else:
            ax.set_xlim(0, 1.1)
    fig.suptitle(f"sketchsgd on {report['gpu']}: green met, red missed, gray information; "
                 "black marks: the targets", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", help="sketchsgd_bench_gpu JSON output")
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("--json", help="also write the chart's data here")
    ap.add_argument("--png", help="also draw the chart here (needs matplotlib)")
    ap.add_argument("--replot", help="draw --png from an earlier --json instead of measuring")
    a = ap.parse_args()
    for name in ("bench", "replot"):  # JSON files of earlier runs
        path = getattr(a, name)
        if path:
            try:
                with open(path) as f:
                    json.load(f)
            except (OSError, ValueError) as e:
                ap.error(f"--{name} {path}: {e}")
    if a.replot:
        if not a.png:
            ap.error("--replot needs --png")
        with open(a.replot) as f:
            chart(json.load(f), a.png)
        return
    if not a.bench:
        ap.error("--bench (or --replot) is required")
    global torch
    torch = importlib.import_module("torch")
    D, C, R, K = 1 << 27, 1 << 20, 5, 1_000_000
    mine, ctx = ours(a.bench)
    t = torch_baselines(D, C, R, K)
    gpu = torch.cuda.get_device_name()

    def m(name):
        # Names carry suffixes such as /manual_time; match whole path segments only.
        for key, v in mine.items():
            if key == name or key.startswith(name + "/"):
                return v
        raise KeyError(name)

    copy_ms, copy_bw = m(f"BM_CopyDeviceToDevice/{D}")
    table, points = [], []
    def add(what, ours_ms, ref_ms, ref_name, target, ok):
        table.append((what, ours_ms, ref_ms, ref_name, target, "met" if ok else "MISSED"))
    def point(label, kind, value, goal=None):
        points.append({"label": label, "kind": kind, "value": value, "goal": goal})

    acc_ms, acc_bw = m(f"BM_Accumulate/{D}/5/{C}/0")
    add("accumulate d=2^27 r=5 c=2^20 (hashes on the fly)", acc_ms, copy_ms, "D2D copy (ours)",
        f">= 50% of copy bw: {acc_bw / copy_bw:.0%}", acc_bw >= 0.5 * copy_bw)
    point("accumulate r=5", "bandwidth", acc_bw / copy_bw, 0.5)
    accp_ms, accp_bw = m(f"BM_Accumulate/{D}/5/{C}/1")
    add("accumulate, precomputed hashes", accp_ms, copy_ms, "D2D copy (ours)",
        f"(info) {accp_bw / copy_bw:.0%} of copy bw", True)
    acc1_ms, acc1_bw = m(f"BM_Accumulate/{D}/1/{C}/0")
    add("accumulate r=1", acc1_ms, copy_ms, "D2D copy (ours)", f"(info) {acc1_bw / copy_bw:.0%} of copy bw", True)
    point("accumulate r=1", "bandwidth", acc1_bw / copy_bw)
    # Blocked hashing (the default): absolute targets, and the share of copy bandwidth.
    for rows, goal in ((5, 0.8), (1, 0.35)):
        ms, bw = m(f"BM_Accumulate/{D}/{rows}/{C}/2")
        add(f"accumulate blocked r={rows}", ms, copy_ms, "D2D copy (ours)",
            f"<= {goal} ms ({bw / copy_bw:.0%} of copy bw)", ms <= goal)
        point(f"accumulate blocked r={rows}", "bandwidth", bw / copy_bw)
    for name, ref, label in ((f"BM_Topk/100000000/1000000", "topk_1e8_1e6", "top-k d=1e8 k=1e6"),
                             (f"BM_Topk/100000000/1000", "topk_1e8_1e3", "top-k d=1e8 k=1e3"),
                             (f"BM_Topk/{D}/1000000", "topk_D_1e6", "top-k d=2^27 k=1e6")):
        ms, _ = m(name)
        add(label, ms, t[ref], "torch.topk(|x|)", f"not slower: {t[ref] / ms:.1f}x", ms <= t[ref])
        point(label, "speedup", t[ref] / ms, 1.0 if ref == "topk_1e8_1e6" else None)
    for rows in (R, 1):
        ms, _ = m(f"BM_Compress/{D}/{rows}/{C}/0") if rows == R else (None, None)
        if ms is not None:
            add(f"compress (EF + accumulate) r={rows}", ms, t[f"compress_r{rows}"], "torch CSVec method",
                f">= 20x: {t[f'compress_r{rows}'] / ms:.1f}x", t[f"compress_r{rows}"] >= 20 * ms)
            point(f"compress r={rows}", "speedup", t[f"compress_r{rows}"] / ms, 20.0)
        ms, _ = m(f"BM_UnsketchTopk/{D}/{rows}/{C}/{K}/0")
        if rows == R:
            add(f"unsketch + top-k r={rows} k=1e6", ms, t[f"unsketch_r{rows}"], "torch CSVec method",
                f">= 20x: {t[f'unsketch_r{rows}'] / ms:.1f}x", t[f"unsketch_r{rows}"] >= 20 * ms)
            point(f"unsketch + top-k r={rows}", "speedup", t[f"unsketch_r{rows}"] / ms, 20.0)
        else:  # one row: the reference is a single gather and top-k, no median to win on
            add(f"unsketch + top-k r={rows} k=1e6", ms, t[f"unsketch_r{rows}"], "torch CSVec method",
                f"(info) {t[f'unsketch_r{rows}'] / ms:.1f}x", True)
            point(f"unsketch + top-k r={rows}", "speedup", t[f"unsketch_r{rows}"] / ms)
    ms, _ = m(f"BM_Compress/{D}/{R}/{C}/2")
    add(f"compress blocked r={R}", ms, t[f"compress_r{R}"], "torch CSVec method",
        f">= 20x: {t[f'compress_r{R}'] / ms:.1f}x", t[f"compress_r{R}"] >= 20 * ms)
    point(f"compress blocked r={R}", "speedup", t[f"compress_r{R}"] / ms, 20.0)
    for rows, goal in ((R, 1.0), (1, None)):
        ms, _ = m(f"BM_UnsketchTopk/{D}/{rows}/{C}/{K}/2")
        add(f"unsketch + top-k blocked r={rows} k=1e6", ms, t[f"unsketch_r{rows}"], "torch CSVec method",
            (f"<= {goal} ms" if goal else "(info)") + f" ({t[f'unsketch_r{rows}'] / ms:.0f}x)",
            goal is None or ms <= goal)
        point(f"unsketch + top-k blocked r={rows}", "speedup", t[f"unsketch_r{rows}"] / ms)
    for name, label in ((f"BM_EstimateAll/{D}/{R}/{C}/0", f"estimate all d, random r={R}"),
                        (f"BM_EstimateAll/{D}/{R}/{C}/2", f"estimate all d, blocked r={R}"),
                        (f"BM_UnsketchTwoStep/{D}/{R}/{C}/{K}/2",
                         f"unsketch blocked r={R} in two steps (estimates written, then top-k)")):
        ms, _ = m(name)
        add(label, ms, t[f"unsketch_r{R}"], "torch CSVec method", "(info)", True)
    for name, label in (("BM_PackSigns", "sign packing"), ("BM_Ternarize", "TernGrad (Philox)"),
                        ("BM_PackTernary", "ternary packing")):
        ms, bw = m(f"{name}/{D}")
        add(f"{label} d=2^27", ms, copy_ms, "D2D copy (ours)", f">= 80% of copy bw: {bw / copy_bw:.0%}",
            bw >= 0.8 * copy_bw)
        point(label, "bandwidth", bw / copy_bw, 0.8)

    lines = [f"GPU: {gpu}; copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write, d=2^27 floats); "
             f"torch {torch.__version__}",
             "",
             "| what | ours ms | baseline ms | baseline | target |",
             "|---|---|---|---|---|"]
    for what, o, r, rn, tg, ok in table:
        lines.append(f"| {what} | {o:.3f} | {r:.3f} | {rn} | {tg}: {ok} |")
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n")
    report = {"gpu": gpu, "torch": torch.__version__, "points": points}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    if a.png:
        chart(report, a.png)


if __name__ == "__main__":
    main()
