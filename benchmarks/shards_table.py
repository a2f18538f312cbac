#!/usr/bin/env python3
"""The docs' sharding tables and plot from the benchmarks' data: sketchsgd_bench_shards JSON lines
(on loopback, or over shaped links from bench_shards_links.py) become the table ps-shards and
docs/images/shards.png (round time against S, one line per codec and link); a bench_network.py
--ps --ps-shards JSON (one per TCP congestion control) becomes the table ps-shards-links
(co-located shards against one server and DDP's ring all-reduce); sketchsgd_bench_shards --replicas
0,1 (and --failover) lines become the table ps-replicas (each shard with and without a backup, and
the round a primary died in). --write-docs first copies the inputs to docs/data/
(shards-scale.jsonl, shards-network.json, shards-replicas.jsonl) so the tables can be rebuilt from
the repository alone.

    .venv/bin/python benchmarks/shards_table.py --scale build/shards-links.jsonl build/shards-loop.jsonl \\
        --network build/shards-bbr.json build/shards-reno.json --replicas build/replicas-*.jsonl --write-docs
    .venv/bin/python benchmarks/shards_table.py --write-docs     # from docs/data/ as they are
"""
import argparse
import datetime
import json
import os
import re
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCALE = os.path.join(ROOT, "docs/data/shards-scale.jsonl")
NETWORK = os.path.join(ROOT, "docs/data/shards-network.json")
REPLICAS = os.path.join(ROOT, "docs/data/shards-replicas.jsonl")
MACHINE = "the 2-core dev machine (AMD EPYC Zen 4 under KVM, 2 threads)"


def date_of(table, given, day):
    """The date a table is written with: this run's when its data were given, else the one it has
    (rebuilding a table from docs/data as it is does not make its measurements newer)."""
    path = os.path.join(ROOT, "docs/data/tables", table)
    if given or not os.path.exists(path):
        return day
    with open(path) as f:
        return json.load(f).get("date", day)


def read_scale(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def scale_table(doc_tables, runs, day):
    base = {(r["links"], r["spec"]): r["round_ms"] for r in runs if r["shards"] == 1}
    rows = []
    for r in runs:
        b = base.get((r["links"], r["spec"]))
        rows.append([r["links"], f"`{r['spec']}`", r["shards"], f"{r['round_ms']:.0f}",
                     f"{b / r['round_ms']:.2f}×" if b else "", f"{r['link_mb']:.2f}",
                     f"{r['server_cpu_ms_sum']:.0f} / {r['server_cpu_ms_max']:.0f}",
                     f"{r['rss_mb_sum']:.0f} / {r['rss_mb_max']:.0f}"])
    w, d = runs[0]["workers"], runs[0]["d"]
    doc_tables.write(os.path.join(ROOT, "docs/data/tables/ps-shards.json"),
                     "sudo .venv/bin/python benchmarks/bench_shards_links.py --rounds 6 (100mbit); "
                     "OMP_NUM_THREADS=1 build/default/benchmarks/sketchsgd_bench_shards --rounds 8 (loopback)", day, MACHINE,
                     ["links", "codec", "S", "round ms", "vs S = 1", "MB a round on the busiest server link",
                      "servers' CPU ms a round (all / busiest)", "servers' memory MB (all / largest)"], rows,
                     data="docs/data/shards-scale.jsonl",
                     note=f"W = {w} lightweight workers (threads of one process, one synthetic gradient for all), "
                          f"d = {d:,}, S sketchsgd-server processes; median round after 2 warm-up rounds. 100mbit: "
                          "each shard on a host of its own behind a tbf-shaped 100 Mbit/s link (both directions), "
                          "the workers on an unshaped one; loopback: everything on 127.0.0.1. A server's memory "
                          "includes the ~165 MB an idle sketchsgd-server process holds.")


def replicas_table(doc_tables, runs, day):
    """Per links and codec: the round without backups and with them (runs without a failover), and
    the round shard 0's primary was killed in (--failover runs, with their heartbeat)."""
    keys = list(dict.fromkeys((r["links"], r["spec"], r["shards"]) for r in runs))
    rows = []
    for links, spec, shards in keys:
        same = [r for r in runs if (r["links"], r["spec"], r["shards"]) == (links, spec, shards)]
        plain = next((r for r in same if not r.get("replicas") and not r.get("failover_ms")), None)
        rep = next((r for r in same if r.get("replicas") and not r.get("failover_ms")), None)
        fail = next((r for r in same if r.get("failover_ms")), None)
        ratio = f"{rep['round_ms'] / plain['round_ms']:.2f}×" if plain and rep else ""
        rows.append([links, f"`{spec}`", shards,
                     f"{plain['round_ms']:.0f}" if plain else "", f"{rep['round_ms']:.0f}" if rep else "", ratio,
                     f"{plain['server_cpu_ms_sum']:.0f} / {rep['server_cpu_ms_sum']:.0f}" if plain and rep else "",
                     f"{fail['failover_ms']:.0f} ({fail['heartbeat_ms']:,} ms)" if fail else ""])
    w, d = runs[0]["workers"], runs[0]["d"]
    doc_tables.write(os.path.join(ROOT, "docs/data/tables/ps-replicas.json"),
                     "OMP_NUM_THREADS=1 build/default/benchmarks/sketchsgd_bench_shards --shards 4 --replicas 0,1 "
                     "--rounds 40 (loopback); … --replicas 1 --failover --heartbeat-ms 200 --rounds 20; "
                     "sudo .venv/bin/python benchmarks/bench_shards_links.py --shards 4 --replicas 0,1 --rounds 6 "
                     "(100mbit); … --replicas 1 --failover --heartbeat-ms 3000", day, MACHINE,
                     ["links", "codec", "S", "round ms, no backups", "round ms, a backup per shard", "with / without",
                      "servers' CPU ms a round (without / with)", "round with shard 0's primary killed, ms (heartbeat)"],
                     rows, data="docs/data/shards-replicas.jsonl",
                     note=f"W = {w} lightweight workers, d = {d:,}, S sketchsgd-server processes and, with backups, "
                          "S more (`--replica-of`); median round after 2 warm-up rounds, both setups in one run. "
                          "100mbit: every server (backups too) on a host of its own behind a tbf-shaped 100 Mbit/s "
                          "link; loopback: everything on 127.0.0.1. The failover runs kill shard 0's primary "
                          "(SIGKILL) before the middle round and time that round: the workers notice the silence "
                          "after 3 heartbeats, move to the backup, which takes over, and run the round again.")


def network_table(doc_tables, nets, day):
    """nets: bench_network.py runs of the same jobs, one per TCP congestion control; a column pair
    (round, against DDP's ring in that run) per run and rate."""
    jobs, cols = {}, ["job"]
    for net in nets:
        ddp = next((d["step_ms"] for d in net["ddp"] if d["hook"] == "none"), {})
        tcp = f", TCP {net['tcp']}" if net.get("tcp") else ""
        for r in net["rates"]:
            cols += [f"{r}{tcp}: ms a round (step)", f"{r}{tcp}: vs DDP"]
            cells = {f"`{p['codec']}`": p["round_ms"].get(r) for p in net["ps"]}
            for d in net["ddp"]:
                name = "DDP, ring all-reduce (no hook)" if d["hook"] == "none" else f"DDP, hook `{d['hook']}`"
                cells[name] = d["step_ms"].get(r)
            for name, ms in cells.items():
                jobs.setdefault(name, {})[len(cols)] = (f"{ms:.0f}", f"{ms / ddp[r]:.2f}×" if ddp.get(r) else "") \
                    if ms else ("", "")
    rows = [[name] + sum((list(cells.get(i, ("", ""))) for i in range(3, len(cols) + 1, 2)), [])
            for name, cells in sorted(jobs.items(), key=lambda kv: kv[0].startswith("DDP"))]
    net = nets[0]
    doc_tables.write(os.path.join(ROOT, "docs/data/tables/ps-shards-links.json"),
                     "sudo .venv/bin/python benchmarks/bench_network.py --tcp bbr|reno --hooks 'none;…' --buckets one "
                     "--rates 100mbit --ps --ps-shards 1,4,16", day, MACHINE, cols, rows, data="docs/data/shards-network.json",
                     note=f"{net['workers']} hosts in network namespaces on tbf-shaped links, the demo's MLP "
                          f"(1.86 M parameters), {net['ps_rounds']} rounds of the parameter-server demo (median time "
                          "between rounds past the first) against DDP's median step in the same run. One server: on "
                          "host 0 beside worker 0; S co-located shards: shard i on host i mod 4 beside worker i mod 4 "
                          "(16: four a host). One run per TCP congestion control (the namespaces' sysctl).")


def plot(runs, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    for ax, links in zip(axes, ["100mbit", "loopback"]):
        for spec in dict.fromkeys(r["spec"] for r in runs if r["links"] == links):
            pts = sorted((r["shards"], r["round_ms"]) for r in runs if r["links"] == links and r["spec"] == spec)
            ax.plot([s for s, _ in pts], [ms for _, ms in pts], marker="o", label=spec)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
        ax.set_xlabel("servers S")
        ax.set_ylabel("round (ms)")
        ax.set_title({"100mbit": "each shard behind its own 100 Mbit/s link",
                      "loopback": "all on 127.0.0.1 (2 cores)"}[links], fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    w = runs[0]["workers"]
    fig.suptitle(f"{w} workers against S sharded parameter servers", fontsize=11)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"plot: {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", nargs="*", default=[], help="sketchsgd_bench_shards JSON-lines files")
    ap.add_argument("--network", nargs="*", default=[],
                    help="bench_network.py --ps --ps-shards JSONs of the same jobs (one per --tcp)")
    ap.add_argument("--replicas", nargs="*", default=[],
                    help="sketchsgd_bench_shards --replicas (and --failover) JSON-lines files")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if not args.write_docs:
        ap.error("nothing to do without --write-docs")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", args.date):
        ap.error(f"--date {args.date!r}: expected YYYY-MM-DD")
    for name in ("scale", "network", "replicas"):  # all readable before any is copied into docs/data
        for p in getattr(args, name):
            try:
                if name in ("scale", "replicas"):
                    read_scale([p])
                else:
                    with open(p) as f:
                        json.load(f)
            except (OSError, ValueError) as e:
                ap.error(f"--{name} {p}: {e}")
    import doc_tables
    if args.scale:
        with open(SCALE, "w") as out:
            for p in args.scale:
                with open(p) as f:
                    shutil.copyfileobj(f, out)
    if args.replicas:
        with open(REPLICAS, "w") as out:
            for p in args.replicas:
                with open(p) as f:
                    shutil.copyfileobj(f, out)
    if args.network:
        nets = []
        for p in args.network:
            with open(p) as f:
                nets.append(json.load(f))
        with open(NETWORK, "w") as f:
            json.dump(nets, f, indent=1)
    runs = read_scale([SCALE])
    scale_table(doc_tables, runs, date_of("ps-shards.json", args.scale, args.date))
    plot(runs, os.path.join(ROOT, "docs/images/shards.png"))
    with open(NETWORK) as f:
        nets = json.load(f)
    network_table(doc_tables, nets if isinstance(nets, list) else [nets],
                  date_of("ps-shards-links.json", args.network, args.date))
    if os.path.exists(REPLICAS):
        replicas_table(doc_tables, read_scale([REPLICAS]), date_of("ps-replicas.json", args.replicas, args.date))
    doc_tables.main([])


if __name__ == "__main__":
    main()
