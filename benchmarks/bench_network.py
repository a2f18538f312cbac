#!/usr/bin/env python3
"""Whole training steps over emulated links: W hosts in network namespaces joined by a switch,
each host's link shaped by tbf in both directions, the demo's job (or --workload transformer) run
across them under PyTorch DDP (one rank per host) and over the parameter server (server and
worker 0 on host 0; the MLP only). Reports the
median steady step (DDP) or round (parameter server) for every hook and link rate, the compute
floor (the same step with no communication), and for each hook the link rate below which it
beats DDP without a hook. Needs root (ip netns, tc); exits 77 with a message otherwise.

    sudo .venv/bin/python benchmarks/bench_network.py [--workload mlp|transformer]
        [--rates unshaped,1gbit,100mbit] [--hooks 'none;fp16;...'] [--buckets one,default] [--ps]
        [--steps 40] [--json out.json]
        [--png out.png] [--write-docs]

Links: a veth pair per host, the switch end on a bridge in a namespace of its own; tbf on the
host end shapes its upload, on the switch end its download (network.md: netem is missing on this
kernel, so no delay or loss is emulated). Namespaces are named after this process, so two runs
cannot collide, and are removed on every exit path (Ctrl-C included). Every job is bounded by
--timeout.
"""
import argparse
import atexit
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from cli import count, items, names, positive  # noqa: E402  (the command-line checks shared with examples/)

RATES = ["unshaped", "10gbit", "1gbit", "100mbit", "10mbit"]
BITS = {"unshaped": None, "10gbit": 10e9, "1gbit": 1e9, "100mbit": 100e6, "10mbit": 10e6}
# PyTorch's references and our frontier points (docs/RESULTS.md).
HOOKS = ["none", "fp16", "powersgd:rank=1", "powersgd:rank=4", "sketchsgd:powersgd:rank=4,wire=fp16",
         "sketchsgd:powersgd:rank=2,wire=fp16", "sketch:rows=1,cols=90000,k=18000,fetch=1,wire=fp16",
         "topk:k=20000,momentum=0.9"]
# The transformer's frontier points (docs/RESULTS.md "A transformer language model").
TRANSFORMER_HOOKS = ["none", "fp16", "powersgd:rank=4", "sketchsgd:powersgd:rank=4,wire=fp16",
                     "sketchsgd:powersgd:rank=2,wire=fp16", "qsgd:bits=4",
                     "sketch:rows=1,cols=80000,k=16000,fetch=1,momentum=0,wire=fp16",
                     "topk:k=16000,wire=fp16,index=delta"]
# What each workload's tables say of the job, where its quality comes from, and its steps there.
WORKLOADS = {
    "mlp": {"hooks": HOOKS, "what": "the demo's MLP, batch 32 a rank", "quality": "docs/data/tables/ddp-hooks.json",
            "quality_column": 1, "quality_name": "test accuracy after 3 epochs (docs/RESULTS.md)", "steps": 3 * 468},
    "transformer": {"hooks": TRANSFORMER_HOOKS,
                    "what": "the transformer language model (0.87 M parameters), batch 16 windows a rank",
                    "quality": "docs/data/tables/frontier-transformer.json", "quality_column": 3,
                    "quality_name": "validation loss after 300 steps, seed 1 (docs/RESULTS.md)", "steps": 300},
}
PS_CODECS = ["dense", "powersgd:rank=4,momentum=0.9,wire=fp16",
             "sketch:rows=1,cols=100000,k=20000,momentum=0.9,fetch=1,wire=fp16"]


def log(msg):
    print(msg, flush=True)


class Testbed:
    """W hosts (namespaces) on a switch (a bridge in a namespace of its own), addresses
    198.18.0.1 … in the benchmarking range, links shaped with tbf. A context manager: leaving it
    kills every process started in it and removes the namespaces."""

    def __init__(self, hosts, tcp=None):
        self.tcp = tcp  # TCP congestion control in every namespace (None: the system's default)
        tag = f"skn{os.getpid() % 100000}"
        self.switch = f"{tag}sw"
        self.hosts = [f"{tag}h{i}" for i in range(hosts)]
        self.host_dev = [f"{tag}e{i}" for i in range(hosts)]  # host end (upload)
        self.port_dev = [f"{tag}p{i}" for i in range(hosts)]  # switch end (download)
        self.procs = []
        self.made = []

    @staticmethod
    def ip(*args):
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)

    def address(self, i):
        return f"198.18.0.{i + 1}"

    def __enter__(self):
        try:
            for ns in [self.switch] + self.hosts:
                self.ip("netns", "add", ns)
                self.made.append(ns)
                self.ip("-n", ns, "link", "set", "lo", "up")
                if self.tcp:
                    self.set_tcp(ns)
            self.ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            self.ip("-n", self.switch, "link", "set", "br0", "up")
            for i, ns in enumerate(self.hosts):
                self.ip("link", "add", self.host_dev[i], "netns", ns, "type", "veth", "peer", "name",
                        self.port_dev[i], "netns", self.switch)
                self.ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", self.host_dev[i])
                self.ip("-n", ns, "link", "set", self.host_dev[i], "up")
                self.ip("-n", self.switch, "link", "set", self.port_dev[i], "master", "br0")
                self.ip("-n", self.switch, "link", "set", self.port_dev[i], "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def set_tcp(self, ns):
        key = "net.ipv4.tcp_congestion_control"
        r = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={self.tcp}"], capture_output=True,
                           text=True, timeout=20)
        if r.returncode != 0:
            with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
                allowed = f.read().strip()
            raise SystemExit(f"--tcp {self.tcp}: {r.stderr.strip()} (this kernel allows: {allowed})")

    def congestion(self):
        """The TCP congestion control the hosts use."""
        return subprocess.run(["ip", "netns", "exec", self.hosts[0], "cat", "/proc/sys/net/ipv4/tcp_congestion_control"],
                              capture_output=True, text=True, timeout=20).stdout.strip()

    def shape(self, rate, hosts=None):
        """tbf at `rate` on both ends of every link, or of the given hosts' (None: unshaped)."""
        for i in range(len(self.hosts)) if hosts is None else hosts:
            for ns, dev in ((self.hosts[i], self.host_dev[i]), (self.switch, self.port_dev[i])):
                subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True, timeout=20)
                if rate is not None:
                    burst = max(32 * 1024, int(BITS[rate] / 8 / 250))  # a tick's worth at 250 Hz
                    subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                                    "burst", str(burst), "latency", "100ms"], check=True, capture_output=True, timeout=20)

    def start(self, host, cmd, out, env=None):
        p = subprocess.Popen(["ip", "netns", "exec", self.hosts[host], *cmd], stdout=out, stderr=subprocess.STDOUT,
                             env=env, start_new_session=True)
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()
        self.procs = []

    def __exit__(self, *exc):
        self.stop()
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        self.made = []
        return False


def wait_all(procs, timeout):
    """Exit codes of procs, or None for each still running at the deadline (then killed)."""
    deadline = time.time() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def ddp_command(hook, buckets, workers, master, out, args):
    cmd = [sys.executable, os.path.join(ROOT, "examples", "ddp_train.py"), "--hook", hook, "--workers",
           str(workers), "--epochs", "1", "--max-steps", str(args.steps + 11), "--progress", "100000", "--master",
           master, "--json", out, "--workload", args.workload]
    if buckets == "one":
        return cmd
    # DDP's default caps: two buckets here; "coalesced": our hooks' collectives go out together
    return cmd + ["--first-bucket-mb", "1"] + (["--coalesce"] if buckets == "coalesced" else [])


def finish(bed, procs, outs, tmp, args):
    """The jobs' summaries once every process has exited (None for all when one failed)."""
    codes = wait_all(procs, args.timeout)
    bed.stop()
    if any(c != 0 for c in codes) or not all(os.path.exists(o) for o in outs):
        why = "timed out" if None in codes else f"exit codes {codes}"
        with open(os.path.join(tmp, "run.log")) as f:
            tail = f.read()[-600:]
        log(f"    failed ({why}): ...{tail}")
        return None
    summaries = []
    for o in outs:
        with open(o) as f:
            summaries.append(json.load(f))
        os.remove(o)
    return summaries


def run_ddp(bed, hook, buckets, args, tmp):
    """One DDP job with a rank per host; rank 0's summary (step times, payload)."""
    W = len(bed.hosts)
    out = os.path.join(tmp, "ddp.json")
    master = f"{bed.address(0)}:{29500 + os.getpid() % 1000}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.abspath(args.python))
    with open(os.path.join(tmp, "run.log"), "w") as logf:
        procs = [bed.start(r, ddp_command(hook, buckets, W, master, out, args) + ["--rank", str(r)], logf,
                           env=dict(env, GLOO_SOCKET_IFNAME=bed.host_dev[r])) for r in range(W)]
        s = finish(bed, procs, [out], tmp, args)
    return s[0] if s else None


def run_floor(bed, args, tmp):
    """The compute floor: every host trains a job of its own (one rank, no hook) at the same time,
    so the step pays the same contention for the machine's cores as in the real jobs, and nothing
    is communicated. The median of their median steps."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.abspath(args.python), GLOO_SOCKET_IFNAME="lo")
    outs = [os.path.join(tmp, f"floor{r}.json") for r in range(len(bed.hosts))]
    with open(os.path.join(tmp, "run.log"), "w") as logf:
        procs = [bed.start(r, ddp_command("none", "one", 1, f"127.0.0.1:{29500 + os.getpid() % 1000}", outs[r], args)
                           + ["--rank", "0"], logf, env=env) for r in range(len(bed.hosts))]
        s = finish(bed, procs, outs, tmp, args)
    return statistics.median(x["step_ms_median"] for x in s) if s else None


def run_ps(bed, codec, args, tmp, shards=1):
    """The parameter-server demo for --ps-rounds rounds: one server on host 0 beside worker 0, or
    S co-located shards, shard i on host i mod W beside worker i mod W (the model cut in S
    ranges; S > W puts several on a host, whose rounds then overlap on its link)."""
    W = len(bed.hosts)
    outdir = os.path.join(tmp, "ps")
    subprocess.run(["rm", "-rf", outdir])
    os.makedirs(outdir)
    binary = os.path.abspath(args.demo)
    common = [binary, "--workers", str(W), "--codec", codec, "--epochs", "1", "--subset",
              str(args.ps_rounds * W * 32), "--out", outdir, "--threads", "1", "--shards", str(shards)]
    port = 5555 + os.getpid() % 1000
    endpoints = [f"tcp://{bed.address(i % W)}:{port + i}" for i in range(shards)]
    metrics = os.path.join(outdir, "rounds.jsonl" if shards == 1 else "rounds.shard0.jsonl")
    env = dict(os.environ, OMP_NUM_THREADS="1")  # one thread a process, as the DDP ranks and run_all have
    with open(os.path.join(tmp, "ps.log"), "w") as logf:
        servers = [bed.start(i % W, common + ["--role", "server", "--shard", str(i), "--bind", endpoints[i]], logf, env)
                   for i in range(shards)]
        workers = [bed.start(r, common + ["--role", "worker", "--rank", str(r), "--server", ",".join(endpoints)], logf,
                             env) for r in range(W)]
        seen, stamps, began = 0, [], time.time()
        while time.time() < began + args.timeout and servers[0].poll() is None:
            n = sum(1 for _ in open(metrics)) if os.path.exists(metrics) else 0
            stamps += [time.perf_counter()] * (n - seen)
            seen = n
            time.sleep(0.01)
        codes = [servers[0].poll()] + wait_all(servers[1:] + workers, 30)
    bed.stop()
    if args.keep_logs:
        os.makedirs(args.keep_logs, exist_ok=True)
        shutil.copy(os.path.join(tmp, "ps.log"), os.path.join(args.keep_logs, f"ps-{shards}-{time.time():.0f}.log"))
    if any(c != 0 for c in codes) or len(stamps) < 3:
        log(f"    failed (exit codes {codes}, {len(stamps)} rounds in {time.time() - began:.0f} s); the log's end:")
        with open(os.path.join(tmp, "ps.log")) as f:
            log("".join(f.readlines()[-15:]))
        return None
    gaps = [1e3 * (b - a) for a, b in zip(stamps[1:], stamps[2:])]  # past the first round's start-up
    return {"round_ms_median": statistics.median(gaps), "rounds": len(stamps)}


def crossover(points, base):
    """The highest rate at which the hook's step is shorter than no hook's (None: at none)."""
    faster = [r for r in points if r in base and points[r] < base[r] and BITS[r]]
    return max(faster, key=lambda r: BITS[r]) if faster else None


def plot(results, floor, png, workload="mlp"):
    """Step time against link rate, log-log: a colour per hook, dashed with DDP's default buckets
    (dash-dotted coalesced);
    unshaped links drawn right of the fastest rate."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("(no matplotlib: no plot)")
        return
    shaped = [r for r in RATES if BITS[r]]
    used = [r for r in shaped if any(r in pts for pts in results.values())]
    top = max((BITS[r] for r in used), default=1e9)
    x = lambda r: BITS[r] or top * 4  # unshaped
    fig, ax = plt.subplots(figsize=(10, 5.5))
    hooks = sorted({h for h, _ in results})
    colours = plt.get_cmap("tab10")
    for (hook, buckets), pts in sorted(results.items()):
        rs = [r for r in RATES if r in pts]
        rs.sort(key=x)
        ax.plot([x(r) for r in rs], [pts[r] for r in rs], marker="o", color=colours(hooks.index(hook) % 10),
                linestyle={"default": "--", "coalesced": "-."}.get(buckets, "-"),
                label=f"{hook}" + {"default": " (DDP's default buckets)",
                                   "coalesced": " (default buckets, coalesced)"}.get(buckets, ""))
    if floor:
        ax.axhline(floor, color="black", linestyle=":", label="compute floor (no communication)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = sorted({x(r) for pts in results.values() for r in pts})
    ax.set_xticks(ticks)
    ax.set_xticklabels([next(r for r in RATES if x(r) == t) for t in ticks])
    ax.set_xlabel("link rate, each direction")
    ax.set_ylabel("median step (ms)")
    ax.set_title(f"DDP steps of the {workload} over tbf-shaped links, one rank a host (network namespaces)",
                 fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    log(f"plot: {png}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=count, default=4)
    ap.add_argument("--rates", default="unshaped,1gbit,100mbit", type=names(RATES), help=f"comma-separated, of {','.join(RATES)}")
    ap.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS),
                    help="the DDP job (examples/workloads.py); the parameter-server demo is the MLP's")
    ap.add_argument("--hooks", help="DDP hooks separated by ';' (examples/ddp_train.py; default: the workload's "
                                    "references and frontier points)")
    ap.add_argument("--buckets", default="one,default", type=names(["one", "default", "coalesced"]), help="one: the model in one DDP bucket; default: DDP's caps; coalesced: "
                    "DDP's caps, our hooks' collectives issued together at the last bucket (coalesce=True)")
    ap.add_argument("--steps", type=count, default=40, help="steady steps timed per job (after 11 warm-up steps)")
    ap.add_argument("--ps", action="store_true", help="also the parameter-server demo")
    ap.add_argument("--ps-codecs", default=";".join(PS_CODECS), help="codecs separated by ';'")
    ap.add_argument("--ps-rounds", type=count, default=30)
    ap.add_argument("--ps-shards", default="1", type=items(count),
                    help="comma-separated S: 1 is one server on host 0; S > 1 co-located shards, shard i on host i mod W")
    ap.add_argument("--tcp", help="TCP congestion control in every namespace, e.g. cubic (default: the system's)")
    ap.add_argument("--timeout", type=positive, default=300, help="seconds per job at most")
    ap.add_argument("--python", default=os.path.join(ROOT, "build/default/python"), help="where the sketchsgd package is")
    ap.add_argument("--demo", default=os.path.join(ROOT, "build/default/demo/sketchsgd-train"))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy each parameter-server job's log here")
    ap.add_argument("--png", help="draw step time against link rate here")
    ap.add_argument("--report", metavar="JSON", help="run nothing: --write-docs from a --json of an earlier run")
    ap.add_argument("--replot", metavar="JSON", help="run nothing: draw --png from a --json of an earlier run")
    ap.add_argument("--write-docs", action="store_true",
                    help="write docs/data/network.json, the tables' data files and docs/images/network.png")
    ap.add_argument("--machine", help="the machine, as the tables' captions name it (default: the --report's, or "
                                      "the 2-core dev machine)")
    ap.add_argument("--name", help="the docs' files are network-NAME… (default: the workload's; none for the MLP)")
    args = ap.parse_args()
    earlier = "report" if args.report else "replot" if args.replot else None  # an earlier run's --json
    if earlier:
        try:
            with open(getattr(args, earlier)) as f:
                old = json.load(f)
        except (OSError, ValueError) as e:
            ap.error(f"--{earlier} {getattr(args, earlier)}: {e}")
    if args.report:
        args.steps, args.workers, args.workload = old["steps"], old["workers"], old.get("workload", "mlp")
        args.ps_rounds = old.get("ps_rounds", args.ps_rounds)
        args.machine = args.machine or old.get("machine")
        write_docs(old, {(d["hook"], d["buckets"]): d["step_ms"] for d in old["ddp"]},
                   {d["codec"]: d["round_ms"] for d in old["ps"]}, old["floor_ms"], old["rates"], args,
                   {(d["hook"], d["buckets"]): d["payload_bytes"] for d in old["ddp"] if "payload_bytes" in d})
        return
    if args.replot:
        plot({(d["hook"], d["buckets"]): d["step_ms"] for d in old["ddp"]}, old["floor_ms"], args.png or "network.png",
             old.get("workload", "mlp"))
        return
    args.machine = args.machine or "the 2-core dev machine"
    if args.ps and args.workload != "mlp":
        ap.error("--ps runs the demo, whose job is the MLP: leave --ps out with --workload " + args.workload)
    if args.ps and not os.access(args.demo, os.X_OK):
        ap.error(f"--demo {args.demo}: no such program (build it: cmake --build --preset default)")
    if not os.path.isdir(args.python):
        ap.error(f"--python {args.python}: no such folder (build the package: cmake --build --preset default)")
    rates = [r for r in args.rates.split(",") if r]
    if os.geteuid() != 0:
        print("SKIP: bench_network.py needs root (ip netns, tc)", file=sys.stderr)
        sys.exit(77)
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        print("SKIP: ip netns is not available here", file=sys.stderr)
        sys.exit(77)

    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: a shell may start us ignoring it
        signal.signal(sig, interrupted)

    hooks = [h for h in (args.hooks or ";".join(WORKLOADS[args.workload]["hooks"])).split(";") if h]
    results, ps, floor, payloads = {}, {}, None, {}
    jobs = len(rates) * len(hooks) * len(args.buckets.split(","))
    done = 0
    with tempfile.TemporaryDirectory() as tmp, Testbed(args.workers, args.tcp) as bed:
        atexit.register(bed.__exit__, None, None, None)
        args.tcp = bed.congestion()
        log(f"{args.workload}; testbed: {args.workers} hosts in namespaces {bed.hosts[0]}… on switch {bed.switch}, "
            f"TCP {args.tcp}")
        bed.shape(None)
        log("compute floor (a one-rank job on every host at once: the same cores, no communication):")
        floor = run_floor(bed, args, tmp)
        log(f"  {floor:.1f} ms a step" if floor else "  failed")
        for rate in rates:
            bed.shape(BITS[rate] and rate)
            for buckets in args.buckets.split(","):
                for hook in hooks:
                    done += 1
                    if buckets == "default" and hook.startswith(("powersgd", "torch:powersgd")):
                        continue  # PyTorch's PowerSGD fails on gloo when buckets interleave (1.13 always, 2.13 at times)
                    if buckets == "coalesced" and (hook in ("none", "fp16") or hook.startswith(("powersgd", "torch:"))):
                        continue  # an option of our hooks alone
                    log(f"[{done}/{jobs}] {rate}, {buckets} bucket(s), {hook}")
                    s = run_ddp(bed, hook, buckets, args, tmp)
                    if s:
                        results.setdefault((hook, buckets), {})[rate] = s["step_ms_median"]
                        payloads[(hook, buckets)] = s["steady_payload_bytes_per_round"]
                        summary(args, rates, floor, results, ps, payloads)  # a run cut short keeps what it measured
                        log(f"    {s['step_ms_median']:.1f} ms a step (p10 {s['step_ms_p10']:.1f}, p90 "
                            f"{s['step_ms_p90']:.1f}), {s['steady_payload_bytes_per_round'] / 1e3:.0f} kB a step")
            if args.ps:
                for shards in args.ps_shards:
                    for codec in args.ps_codecs.split(";"):
                        name = codec if shards == 1 else f"{codec}, {shards} co-located shards"
                        log(f"  parameter server, {rate}, {name}")
                        r = run_ps(bed, codec, args, tmp, shards)
                        if r:
                            ps.setdefault(name, {})[rate] = r["round_ms_median"]
                            log(f"    {r['round_ms_median']:.1f} ms a round")
                            summary(args, rates, floor, results, ps, payloads)
    base = results.get(("none", "one"), {})
    log("\nmedian step (ms):")
    for (hook, buckets), pts in sorted(results.items()):
        cells = "  ".join(f"{r}: {pts[r]:7.1f}" for r in rates if r in pts)
        log(f"  {hook:58s} {buckets:7s} {cells}  crossover: {crossover(pts, base)}")
    out = summary(args, rates, floor, results, ps, payloads)
    if args.png:
        plot(results, floor, args.png, args.workload)
    if args.write_docs:
        write_docs(out, results, ps, floor, rates, args, payloads)


def summary(args, rates, floor, results, ps, payloads):
    """The run's results as --json writes them (written after every job, so a run cut short
    keeps what it measured)."""
    base = results.get(("none", "one"), {})
    out = {"workload": args.workload, "workers": args.workers, "steps": args.steps, "ps_rounds": args.ps_rounds,
           "machine": args.machine, "torch": torch_version(), "date": time.strftime("%Y-%m-%d"),
           "command": " ".join(["benchmarks/bench_network.py"] + sys.argv[1:]),
           "floor_ms": floor, "rates": rates, "tcp": args.tcp,
           "ddp": [{"hook": h, "buckets": b, "step_ms": pts, "crossover": crossover(pts, base),
                    "payload_bytes": payloads.get((h, b))} for (h, b), pts in sorted(results.items())],
           "ps": [{"codec": c, "round_ms": pts} for c, pts in ps.items()]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


@functools.cache
def torch_version():
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                          text=True).stdout.strip()


def gathered(hook, python):
    """Whether the hook all-gathers its messages (sketchsgd's topk, signsgd, terngrad, qsgd) rather
    than all-reducing them (PyTorch's hooks, sketchsgd's summable codecs); None if unknown."""
    spec = hook.removeprefix("sketchsgd:")
    if hook in ("none", "fp16") or spec.startswith("powersgd"):  # PyTorch's hooks; PowerSGD's factors sum
        return False
    try:
        sys.path.insert(0, os.path.abspath(python))
        import sketchsgd
        return sketchsgd.gathered(spec)
    except Exception:  # noqa: BLE001 - no package, or a spec it refuses: the column stays empty
        return None


def link_ms(payload, rate, workers, is_gathered):
    """The bandwidth term of docs/BENCHMARKS.md's model for one step's payload (bytes a worker
    contributes): a ring all-reduce moves 2(W − 1)/W of it over each link, an all-gather the other
    W − 1 workers' parts."""
    share = (workers - 1) if is_gathered else 2 * (workers - 1) / workers
    return 1e3 * share * payload * 8 / BITS[rate]


def write_docs(out, results, ps, floor, rates, args, payloads=None):
    import doc_tables
    job = WORKLOADS[args.workload]
    name = args.name if args.name is not None else ("" if args.workload == "mlp" else args.workload)
    tag = f"-{name}" if name else ""  # the MLP's files keep their names
    data = f"docs/data/network{tag}.json"
    with open(os.path.join(ROOT, data), "w") as f:
        json.dump(out, f, indent=1)
    plot(results, floor, os.path.join(ROOT, f"docs/images/network{tag}.png"), args.workload)
    day = out.get("date") or time.strftime("%Y-%m-%d")
    machine = f"{args.machine or 'the 2-core dev machine'}, {args.workers} ranks in network namespaces, gloo, torch {out.get('torch') or torch_version()}"
    machine += f", TCP {out['tcp']}" if out.get("tcp") else ""
    base = results.get(("none", "one"), {})
    slow = [r for r in rates if BITS[r]]
    slowest = min(slow, key=lambda r: BITS[r]) if slow else None
    payloads = payloads or {}
    cols = ["hook", "DDP buckets"] + [f"{r} ms" for r in rates] + [
        "× floor (slowest shaped rate)", "floor + link ms (model, slowest rate)", "× floor + link",
        "faster than no hook from"]
    rows = []
    for (hook, buckets), pts in sorted(results.items(), key=lambda kv: (kv[0][0] != "none", kv[0])):
        # The slowest rate this hook was measured at (a run cut short may lack the table's).
        mine = min((r for r in pts if BITS[r]), key=lambda r: BITS[r], default=None)
        at = "" if mine == slowest else f" ({mine})"
        kind = gathered(hook, args.python)
        bound = (floor + link_ms(payloads[(hook, buckets)], mine, args.workers, kind)
                 if floor and mine and kind is not None and payloads.get((hook, buckets)) else None)
        rows.append([f"`{hook}`", buckets] + [f"{pts[r]:.1f}" if r in pts else "" for r in rates] +
                    [f"{pts[mine] / floor:.2f}{at}" if floor and mine else "",
                     f"{bound:.1f}{at}" if bound else "", f"{pts[mine] / bound:.2f}{at}" if bound else "",
                     (crossover(pts, base) if hook != "none" else None) or "—"])
    rows.append(["compute floor (no communication)", ""] + [f"{floor:.1f}" if floor else ""] * len(rates) +
                ["1.00", "", "", ""])
    cmd = "sudo .venv/bin/python benchmarks/bench_network.py --write-docs" + \
        ("" if args.workload == "mlp" else f" --workload {args.workload}")
    if args.report:  # the run's own command, then this report
        cmd = f"{out.get('command', 'benchmarks/bench_network.py')}; {' '.join(['bench_network.py'] + sys.argv[1:])}"
    doc_tables.write(os.path.join(ROOT, f"docs/data/tables/network-ddp{tag}.json"), cmd, day, machine, cols, rows,
                     data=data,
                     note=f"Median steady step of {args.steps} (after 11 warm-up steps), {job['what']}; "
                          "'floor + link': the compute floor plus the time the step's payload takes on the slowest "
                          "link by the model below (bandwidth only, nothing overlapped), the least a step can take there; "
                          "'faster than no hook from': the fastest shaped rate at which the hook's step is shorter than "
                          "DDP's without a hook (one bucket).")
    if ps:
        doc_tables.write(os.path.join(ROOT, f"docs/data/tables/network-ps{tag}.json"), cmd + " --ps", day, machine,
                         ["codec"] + [f"{r} ms a round" for r in rates],
                         [[f"`{c}`"] + [f"{pts[r]:.0f}" if r in pts else "" for r in rates] for c, pts in ps.items()],
                         data=data,
                         note=f"The parameter-server demo, server and worker 0 on host 0, {args.ps_rounds} rounds; "
                              "median time between rounds past the first.")
    if args.name is None:  # a named run (another machine) adds its step times, not another quality table
        accuracy_table(doc_tables, results, rates, cmd, day, machine, job, tag, data)
    doc_tables.main([])


def accuracy_table(doc_tables, results, rates, cmd, day, machine, job, tag, data):
    """Time to quality: what the RESULTS job (the same hooks under DDP, seed 1) reached, and how
    long its steps take at each rate with the step times measured here (one bucket)."""
    try:
        with open(os.path.join(ROOT, job["quality"])) as f:
            quality = {r[0].strip("`"): r[job["quality_column"]] for r in json.load(f)["rows"]}
    except (OSError, ValueError, KeyError, IndexError):
        return
    steps = job["steps"]
    rows = [[f"`{hook}`", quality[hook]] + [f"{steps * pts[r] / 60e3:.1f}" if r in pts else "" for r in rates]
            for (hook, buckets), pts in sorted(results.items(), key=lambda kv: (kv[0][0] != "none", kv[0]))
            if buckets == "one" and hook in quality]
    doc_tables.write(os.path.join(ROOT, f"docs/data/tables/network-accuracy{tag}.json"), cmd, day, machine,
                     ["hook", job["quality_name"]] + [f"{r}: minutes" for r in rates], rows,
                     data=f"{data}, {job['quality']}",
                     note=f"Minutes for the {steps} steps of that job at each rate: this benchmark's median step "
                          "(one DDP bucket) times the steps.")


if __name__ == "__main__":
    main()
