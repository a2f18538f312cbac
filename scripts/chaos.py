#!/usr/bin/env python3
"""A chaos soak of real processes: replicated jobs (a sketchsgd-server primary, its backup and W
sketchsgd_test_worker processes, each on a test host of its own: network namespaces on one
bridge, addresses from 198.18.0.0/15) one after another for --minutes, each under random faults:
kill -9 of a server, SIGSTOP/SIGCONT of a server or a worker, a host's link cut and restored.
After each job the invariants are checked from what the processes left: the servers' rounds
(--metrics lines) and the workers' final models (--out). Every worker that finished holds the
same model; a job whose every round had every worker ends bit for bit as the same job without
faults (run first, once a codec): no update lost or applied twice; a worker that did not finish
ended with a clear error; no worker outlives the job's bound (a server still running then is
left waiting with its reason, killed and counted, as the simulator allows). Writes one JSON line a job
(--out) and prints a summary; benchmarks/chaos_table.py makes the docs' table.

    sudo .venv/bin/python scripts/chaos.py --minutes 30 --out docs/data/chaos-soak.jsonl

Needs root (ip netns); exits 77 without it, 1 when an invariant broke, 2 for bad flags.
Namespaces are removed on every way out.
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODECS = ["dense", "topk:k=40", "sketch:k=40,cols=400,fetch=1", "sketch:k=40,cols=400,p2=2",
          "powersgd:rank=2,layout=40x100"]


def positive(kind):
    def parse(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {s!r}")
        if v <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {s}")
        return v
    return parse


class Hosts:
    """A bridge in a namespace of its own and one namespace a host, removed by close()."""

    def __init__(self, count, tag):
        self.tag, self.names = tag, []
        self.sw = f"ckw{tag}"
        self.ip = lambda *a: subprocess.run(["ip", *a], check=True, capture_output=True)
        self.ip("netns", "add", self.sw)
        self.names.append(self.sw)
        self.ip("-n", self.sw, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.sw, "link", "set", "br0", "up")
        self.hosts = []
        for i in range(count):
            h = f"ck{tag}h{i}"
            self.ip("netns", "add", h)
            self.names.append(h)
            self.ip("-n", h, "link", "set", "lo", "up")
            self.ip("link", "add", f"ch{i}x{tag}", "netns", h, "type", "veth", "peer", "name",
                    f"cs{i}x{tag}", "netns", self.sw)
            self.ip("-n", self.sw, "link", "set", f"cs{i}x{tag}", "master", "br0")
            self.ip("-n", self.sw, "link", "set", f"cs{i}x{tag}", "up")
            self.ip("-n", h, "addr", "add", f"198.18.2.{i + 1}/24", "dev", f"ch{i}x{tag}")
            self.ip("-n", h, "link", "set", f"ch{i}x{tag}", "up")
            self.hosts.append(h)

    def link(self, i, up):
        self.ip("-n", self.sw, "link", "set", f"cs{i}x{self.tag}", "up" if up else "down")

    def close(self):
        for n in reversed(self.names):
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        self.names = []


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        return []


def run_job(args, hosts, codec, rng, faults_on, tmp):
    """One job; returns its record (faults, outcome, checks)."""
    W = args.world
    common = ["--job", "7", "--world", str(W), "--dim", "4000", "--codec", codec,
              "--rounds", str(args.rounds)]
    server = ["--policy", "wait", "--heartbeat-ms", "100", "--deadline-ms", "20000", "--lr", "0.2",
              "--finish-wait-ms", "5000"]
    primary, backup = "tcp://198.18.2.1:5555", "tcp://198.18.2.2:5555"
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    procs = {}

    def start(name, host, cmd, log):
        procs[name] = subprocess.Popen(["ip", "netns", "exec", hosts.hosts[host], *cmd],
                                       stdout=open(log + ".out", "w"), stderr=open(log + ".err", "w"))

    start("primary", 0, [args.server_bin, *common, *server, "--bind", primary,
                         "--metrics", f"{tmp}/p.jsonl"], f"{tmp}/p")
    time.sleep(0.3)
    start("backup", 1, [args.server_bin, *common, *server, "--bind", backup, "--replica-of", primary,
                        "--metrics", f"{tmp}/b.jsonl"], f"{tmp}/b")
    time.sleep(0.3)
    for r in range(W):
        start(f"w{r}", 2 + r, [args.worker_bin, *common, "--server", f"{primary}|{backup}",
                               "--rank", str(r), "--sleep-ms", "15", "--timeout-ms", "20000",
                               "--out", f"{tmp}/w{r}"], f"{tmp}/w{r}")
    host_of = {"primary": 0, "backup": 1, **{f"w{r}": 2 + r for r in range(W)}}
    t0 = time.monotonic()
    faults, active, recover = [], [], []
    killed = None
    next_fault = t0 + rng.uniform(0.3, 1.2)
    rounds_seen = 0
    waiting = []  # faults over, waiting for the next round to end: their end times
    bound = t0 + 90
    hung = False
    workers = [f"w{r}" for r in range(W)]
    while any(procs[w].poll() is None for w in workers):
        now = time.monotonic()
        if now > bound:
            hung = True
            break
        n = len(lines(f"{tmp}/p.jsonl")) + len(lines(f"{tmp}/b.jsonl"))
        if n > rounds_seen:
            rounds_seen = n
            recover += [now - t for t in waiting]
            waiting = []
        for a in list(active):  # faults whose time is up
            if now >= a["until"]:
                if a["kind"] == "sigstop":
                    procs[a["who"]].send_signal(signal.SIGCONT)
                else:
                    hosts.link(host_of[a["who"]], True)
                active.remove(a)
                waiting.append(now)
        if faults_on and now >= next_fault and len(faults) < args.faults_per_job:
            next_fault = now + rng.uniform(0.4, 2.0)
            kind = rng.choice(["kill", "sigstop", "sigstop", "cut", "cut"])
            alive = [p for p in procs if procs[p].poll() is None
                     and not any(a["who"] == p for a in active)]
            if kind == "kill":
                # One server a job, while both run: a replicated job survives the loss of either,
                # not both (a primary deposed after a pause is lost too).
                both = all(procs[s].poll() is None for s in ("primary", "backup"))
                choices = [s for s in ("primary", "backup") if s in alive] if both and killed is None else []
                if choices:
                    who = rng.choice(choices)
                    procs[who].send_signal(signal.SIGKILL)
                    killed = who
                    faults.append({"kind": "kill", "who": who, "at": round(now - t0, 3)})
                    waiting.append(now)
            elif alive:
                who = rng.choice(alive)
                d = rng.uniform(0.2, 2.0)
                if kind == "sigstop":
                    procs[who].send_signal(signal.SIGSTOP)
                else:
                    hosts.link(host_of[who], False)
                active.append({"kind": kind, "who": who, "until": now + d})
                faults.append({"kind": kind, "who": who, "at": round(now - t0, 3), "ms": int(d * 1000)})
        time.sleep(0.02)
    for a in active:  # the job ended (or hung) under a fault: undo it
        if a["kind"] == "sigstop":
            procs[a["who"]].send_signal(signal.SIGCONT)
        else:
            hosts.link(host_of[a["who"]], True)
    # The servers stop on their own once the workers said goodbye (a following backup after its
    # primary's, or --finish-wait-ms); a deposed primary when its link is back.
    # One still running then is left waiting with its reason (as the simulator allows: a primary
    # of an epoch before its backup's takeover, that backup then killed, waits for its workers).
    left = []
    for name in ("primary", "backup"):
        try:
            procs[name].wait(timeout=max(1, bound + 10 - time.monotonic()))
        except subprocess.TimeoutExpired:
            left.append(name)
    for p in procs.values():
        if p.poll() is None:
            p.kill()
            p.wait()
    seconds = time.monotonic() - t0
    # What the processes left.
    codes = {k: p.returncode for k, p in procs.items()}
    models = {}
    for r in range(W):
        try:
            models[r] = open(f"{tmp}/w{r}", "rb").read() if codes[f"w{r}"] == 0 else None
        except OSError:
            models[r] = None
    errors = {}
    for r in range(W):
        if codes[f"w{r}"] != 0:
            # The worker's own line (a sanitizer's report may follow it).
            err = [x for x in open(f"{tmp}/w{r}.err").read().splitlines()
                   if x.startswith("sketchsgd_test_worker:")]
            errors[r] = err[-1] if err else f"exit {codes[f'w{r}']}"
    by_round = {}
    for name in ("p", "b"):  # the backup's, where it ran a round again, is what the workers got
        for m in lines(f"{tmp}/{name}.jsonl"):
            by_round[m["round"]] = m
    whole = (len(by_round) == args.rounds
             and all(m["contributors"] == W and not m["aborted"] and not m["reason"]
                     for m in by_round.values()))
    duplicates = 0
    for name in ("p", "b"):
        rs = [m["round"] for m in lines(f"{tmp}/{name}.jsonl")]
        duplicates += len(rs) - len(set(rs))
    done = [m for m in models.values() if m is not None]
    return {"codec": codec, "faults": faults, "seconds": round(seconds, 2), "hung": hung,
            "servers_left": left,
            "exit": codes, "finished": len(done) == W, "worker_errors": errors,
            "same_model": len(set(done)) <= 1, "whole": whole, "duplicate_rounds": duplicates,
            "model": done[0] if done else None,
            "recover_s": [round(x, 3) for x in recover]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=positive(float), default=30.0)
    ap.add_argument("--world", type=positive(int), default=3)
    ap.add_argument("--rounds", type=positive(int), default=120)
    ap.add_argument("--faults-per-job", type=positive(int), default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="", help="append one JSON line a job")
    ap.add_argument("--logs", default="", help="keep the processes' logs of each job that did not "
                                               "finish here, a folder a job")
    ap.add_argument("--server-bin", default=os.path.join(ROOT, "build/default/server/sketchsgd-server"))
    ap.add_argument("--worker-bin", default=os.path.join(ROOT, "build/default/tests/sketchsgd_test_worker"))
    args = ap.parse_args(argv)
    for b in (args.server_bin, args.worker_bin):
        if not os.access(b, os.X_OK):
            ap.error(f"no program {b} (build first)")
    if os.geteuid() != 0:
        print("SKIP: needs root for ip netns")
        return 77
    rng = random.Random(args.seed)
    hosts = None
    interrupted = []

    def stop(signum, frame):
        interrupted.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    jobs, broken = [], []
    try:
        hosts = Hosts(2 + args.world, os.getpid() % 100000)
        with tempfile.TemporaryDirectory() as tmp:
            # The same jobs without faults, once a codec: what a whole job must end with.
            reference = {}
            for codec in CODECS:
                r = run_job(args, hosts, codec, rng, False, tmp)
                if not (r["finished"] and r["same_model"] and r["whole"]):
                    print(f"FAIL: the fault-free {codec} job did not finish whole: {r['worker_errors']}")
                    return 1
                reference[codec] = r["model"]
            t_end = time.monotonic() + 60 * args.minutes
            k = 0
            while time.monotonic() < t_end:
                codec = CODECS[k % len(CODECS)]
                k += 1
                r = run_job(args, hosts, codec, rng, True, tmp)
                problems = []
                if r["hung"]:
                    problems.append("a worker outlived the job's bound")
                if not r["same_model"]:
                    problems.append("workers that finished hold different models")
                if r["duplicate_rounds"]:
                    problems.append(f"{r['duplicate_rounds']} rounds ended twice on one server")
                if r["finished"] and r["whole"] and r["model"] != reference[codec]:
                    problems.append("a whole job ended with another model than without faults")
                for rank, why in r["worker_errors"].items():
                    if not why.startswith("sketchsgd_test_worker:"):
                        problems.append(f"worker {rank} ended without a clear error: {why}")
                r["lost_or_twice"] = int(r["finished"] and r["whole"] and r["model"] != reference[codec])
                r["problems"] = problems
                del r["model"]
                jobs.append(r)
                if problems:
                    broken.append((k, r))
                if args.logs and (problems or not r["finished"]):
                    import shutil
                    shutil.copytree(tmp, os.path.join(args.logs, f"job{k}"), dirs_exist_ok=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(r) + "\n")
                n = sum(len(j["faults"]) for j in jobs)
                fin = sum(j["finished"] for j in jobs)
                print(f"\rjob {k}: {n} faults so far, {fin}/{len(jobs)} jobs finished, "
                      f"{len(broken)} broke an invariant   ", end="", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
    finally:
        if hosts:
            hosts.close()
    print(file=sys.stderr)
    n = sum(len(j["faults"]) for j in jobs)
    rec = [x for j in jobs for x in j["recover_s"]]
    kinds = {}
    for j in jobs:
        for f in j["faults"]:
            kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    print(f"{len(jobs)} jobs, {n} faults ({kinds}), {sum(j['finished'] for j in jobs)} finished, "
          f"{sum(j['whole'] for j in jobs)} whole, updates lost or applied twice in "
          f"{sum(j['lost_or_twice'] for j in jobs)}, recovery median "
          f"{statistics.median(rec) if rec else 0:.2f} s, max {max(rec) if rec else 0:.2f} s")
    for k, r in broken:
        print(f"job {k} ({r['codec']}): {'; '.join(r['problems'])}; faults {r['faults']}")
    return 1 if broken or interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
