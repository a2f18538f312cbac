#!/usr/bin/env python3
"""Federated training in one process: N clients each hold a shard of Fashion-MNIST and C of them
are sampled every round. A participant downloads the model, computes its upload (the gradient of
one local batch, or with --local-steps H the change that H local SGD steps made: FedAvg), encodes
it with a sketchsgd codec and leaves; the server merges the C messages with the codec's
aggregator (the C++ code the parameter server runs) and steps the model.

    .venv/bin/python examples/federated.py --codec "sketch:fetch=1,rows=1,cols=100000,k=20000" --split classes:1
    .venv/bin/python examples/federated.py --codec dense --local-steps 5 --lr 1 --split dirichlet:0.3   # FedAvg
    .venv/bin/python examples/federated.py --codec topk:k=20000 --client-state --server-momentum 0.9

Client state. Clients are stateless by default: every participation builds a fresh codec (no
error feedback, no momentum, PowerSGD from the round's shared random Q), so nothing of a client
survives its round. --client-state keeps each client's codec (its error feedback) from one
participation to its next, however many rounds later; that memory is reported (client_state_bytes:
the state every client holds at the end, summed). FetchSGD (sketch with fetch=1) keeps momentum
and error as sketches on the server, for everyone; the other codecs may take the server's momentum
on their decoded mean (--server-momentum: m = ρ·m + step, w −= lr·m; FedAvgM's "global momentum").

Splits (--split): iid (an equal random share each); classes:K (the items sorted by label, cut into
N·K equal pieces, K random pieces a client: the FedAvg paper's pathological split; a piece straddles
two labels only where a class's size is not a multiple of the piece's); dirichlet:α (each client
draws its label mix q ~ Dir(α) and takes its n = items / N images by that mix from what is left of
each class; α → ∞ is iid, α → 0 one class a client). Items beyond N·⌊items / N⌋ are left out.

Randomness comes from the seed alone: the model (its initial weights), the split, round r's
participants (C of the N drawn from (seed, r) by sketchsgd.sample_clients, as the parameter
server draws them) and a participant's batches (drawn from (seed, r, client)) — the same for every
codec, so runs differ only by what the codec does. A run resumes bit for bit from --checkpoint.

Traffic per participant: upload = its messages (the gradient, and the answer of two-phase codecs);
download = the model (fp32) and any query, plus the update when it keeps state (it applies the
update to its error feedback). The JSON result holds the means and the job's totals.
"""

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import time

import numpy as np
import torch

import workloads
from cli import count, momentum, natural, one_line, positive

SPLITS = ("iid", "classes:K", "dirichlet:ALPHA")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_split(text: str):
    """("iid", None), ("classes", K) or ("dirichlet", α) from the --split text."""
    kind, _, arg = text.partition(":")
    try:
        if kind == "iid" and not arg:
            return kind, None
        if kind == "classes" and int(arg) >= 1:
            return kind, int(arg)
        if kind == "dirichlet" and math.isfinite(float(arg)) and float(arg) > 0:
            return kind, float(arg)
    except ValueError:
        pass
    raise ValueError(f"split {text!r}: expected one of {', '.join(SPLITS)} (K ≥ 1, α > 0)")


def split(labels: torch.Tensor, clients: int, how: str, seed: int) -> list:
    """Each client's item indices (a sorted LongTensor of ⌊items / clients⌋), as --split says."""
    kind, arg = parse_split(how)
    n = len(labels)
    if isinstance(clients, bool) or not isinstance(clients, int) or not 1 <= clients <= n:
        raise ValueError(f"clients: expected 1 … {n} (one item each at least), got {clients!r}")
    rng = np.random.default_rng([seed, 0x5EED])
    each = n // clients
    y = labels.numpy()
    if kind == "iid":
        parts = rng.permutation(n)[:clients * each].reshape(clients, each)
    elif kind == "classes":
        pieces = clients * arg
        if pieces > n:
            raise ValueError(f"--split {how}: {pieces} pieces for {n} items")
        size = n // pieces
        by_label = np.argsort(y, kind="stable")[:pieces * size].reshape(pieces, size)
        parts = by_label[rng.permutation(pieces).reshape(clients, arg)].reshape(clients, -1)
    else:
        parts = _dirichlet(y, clients, each, arg, rng)
    return [torch.from_numpy(np.sort(p)).long() for p in parts]


def _dirichlet(y, clients, each, alpha, rng):
    classes = int(y.max()) + 1
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in range(classes)]
    left = np.array([len(p) for p in pools])
    taken = np.zeros(classes, dtype=np.int64)
    parts = []
    for _ in range(clients):
        q = rng.dirichlet(np.full(classes, alpha))
        want = rng.multinomial(each, q)
        # A class that has run out hands its share to the classes that have items left, by q (or
        # evenly where q is 0 there); each pass empties a class or places everything, so it ends
        # within `classes` passes.
        for _ in range(classes + 1):
            over = np.maximum(want - left, 0)
            excess = int(over.sum())
            if excess == 0:
                break
            want -= over
            room = left - want
            w = np.where(room > 0, q, 0.0)
            w = w / w.sum() if w.sum() > 0 else (room > 0) / (room > 0).sum()
            want += rng.multinomial(excess, w)
        assert want.sum() == each and (want <= left).all()
        parts.append(np.concatenate([pools[c][taken[c]:taken[c] + want[c]] for c in range(classes)]))
        taken += want
        left -= want
    return parts


def sample(clients: int, per_round: int, round: int, seed: int) -> list:
    """Round `round`'s participants, in client order: drawn from (seed, round) by the library's
    sampler, as the parameter server draws them."""
    import sketchsgd

    return sketchsgd.sample_clients(clients, per_round, seed, round)


def batches(shard: torch.Tensor, size: int, steps: int, seed: int, round: int, client: int):
    """The items of a participant's `steps` local batches: its shard reshuffled (from the seed, the
    round and the client), cut into batches of `size` (the whole shard when it is smaller), cycling."""
    rng = np.random.default_rng([seed, round, client, 1])
    size = min(size, len(shard))
    order = shard[torch.from_numpy(rng.permutation(len(shard)))]
    per = len(order) // size
    return [order[(s % per) * size:(s % per + 1) * size] for s in range(steps)]


class Job:
    """The server's side and its clients, one round at a time."""

    def __init__(self, args, work):
        import sketchsgd

        self.args, self.work = args, work
        self.model = work.model(args.seed)
        self.params = list(self.model.parameters())
        self.shapes = [tuple(p.shape) for p in self.params]
        self.dim = sum(p.numel() for p in self.params)
        self.make_codec = lambda: _codec(sketchsgd, args.codec, self.dim, self.shapes)
        self.server = self.make_codec()  # decodes updates; never encodes
        if "fetch=1" in self.server.spec.split(",") and args.server_momentum:
            raise ValueError("FetchSGD keeps its momentum on the server already: no --server-momentum with fetch=1")
        self.agg = self.server.make_aggregator(args.per_round)
        self.shards = split(work.ytr, args.clients, args.split, args.seed)
        self.w = torch.nn.utils.parameters_to_vector(self.params).detach().clone()
        self.m = torch.zeros(self.dim) if args.server_momentum else None
        self.kept = {}  # client -> its codec, with --client-state
        self.round = 0
        self.up = self.down = 0
        self.curve = []

    # ---- one participant --------------------------------------------------------------------
    def upload(self, client: int) -> torch.Tensor:
        """The vector a participant encodes: its gradient on one batch, or w − w' after H local steps."""
        a = self.args
        # A copy: vector_to_parameters makes the parameters views of the vector, and local steps
        # must not move the server's model.
        torch.nn.utils.vector_to_parameters(self.w.clone(), self.params)
        steps = max(a.local_steps, 1)
        for items in batches(self.shards[client], a.batch, steps, a.seed, self.round, client):
            x, y = self.work.batch(items, "cpu", torch.float32)
            self.model.zero_grad(set_to_none=True)
            self.work.loss(self.model(x), y).backward()
            if a.local_steps == 0:
                return torch.cat([p.grad.reshape(-1) for p in self.params])
            with torch.no_grad():
                for p in self.params:
                    p -= a.local_lr * p.grad
        return self.w - torch.nn.utils.parameters_to_vector(self.params).detach()

    def codec_of(self, client: int):
        if not self.args.client_state:
            return self.make_codec()
        if client not in self.kept:
            self.kept[client] = self.make_codec()
        return self.kept[client]

    # ---- one round over the parameter server --------------------------------------------------
    def step_ps(self, endpoint: str):
        """The round run by sketchsgd-server: the sampled clients register for it (each a new
        connection, its id as the rank), get the model with their Welcome, compute their uploads
        and push them together (a thread each: a push waits for the round); the model is then the
        server's, as every client received it."""
        import concurrent.futures

        from sketchsgd.ps import Client

        a = self.args
        who = sample(a.clients, a.per_round, self.round, a.seed)
        init = self.w if self.round == 0 else None  # the first client in gives the server its model
        clients = [Client(endpoint, self.server.spec, dim=self.dim, rank=c, world=a.per_round, job=a.job,
                          population=a.clients, join_round=self.round, init=init, quiet=True, timeout=a.timeout,
                          shared_io=True)  # every client of the simulation lives in this process
                   for c in who]
        self.w = clients[0].params()
        uploads = [self.upload(who[c.rank]).contiguous() for c in clients]
        with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
            results = list(pool.map(lambda cu: cu[0].step(cu[1]), zip(clients, uploads)))
        for r in results:
            self.up += r["bytes_up"]
            self.down += r["bytes_down"] + 4 * self.dim * (2 if a.server_momentum else 1)
        if results[0]["outcome"] == "updated":
            self.w = clients[0].params()
        for c in clients:
            c.close()
        self.round += 1

    # ---- one round --------------------------------------------------------------------------
    def step(self):
        import sketchsgd

        who = sample(self.args.clients, self.args.per_round, self.round, self.args.seed)
        codecs = []
        model_bytes = 4 * self.dim
        for slot, client in enumerate(who):
            c = self.codec_of(client)
            msg = c.encode(self.upload(client).contiguous(), self.round, slot)
            self.agg.add(msg)
            codecs.append(c)
            self.up += len(msg)
            self.down += model_bytes
        two_phases = self.agg.replying == "query"
        reply = self.agg.finish()
        if two_phases:
            for slot, c in enumerate(codecs):
                answer = c.answer(reply, slot)
                self.agg.add(answer)
                self.up += len(answer)
                self.down += len(reply)
            reply = self.agg.finish()
        if self.args.client_state:
            for c in codecs:
                c.apply(reply)
                self.down += len(reply)
        # The parameter server's arithmetic (ps/outer.hpp), so a job there ends on the same bits.
        if self.m is None:
            self.server.apply_step(reply, self.w, self.args.lr)
        else:
            self.m.mul_(self.args.server_momentum).add_(self.server.apply(reply))
            self.w.sub_(self.args.lr * self.m)
        if not torch.isfinite(self.w).all():
            raise sketchsgd.NonFiniteError(f"round {self.round}: the model is not finite")
        self.round += 1

    def quality(self) -> float:
        torch.nn.utils.vector_to_parameters(self.w, self.params)
        return self.work.evaluate(self.model, "cpu", torch.float32)[self.work.metric]

    def client_state_bytes(self) -> int:
        return sum(int(c.state_dict()["state"].numel()) for c in self.kept.values())

    # ---- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"args": _identity(self.args), "round": self.round, "w": self.w, "m": self.m,
                "server": self.agg.state_dict(), "up": self.up, "down": self.down, "curve": self.curve,
                "clients": {k: c.state_dict() for k, c in self.kept.items()}}

    def load_state_dict(self, d: dict):
        if d["args"] != _identity(self.args):
            raise ValueError(f"checkpoint of another job: {d['args']} (this one: {_identity(self.args)})")
        self.round, self.up, self.down, self.curve = d["round"], d["up"], d["down"], list(d["curve"])
        self.w.copy_(d["w"])
        if self.m is not None:
            self.m.copy_(d["m"])
        self.agg.load_state_dict(d["server"])
        self.kept = {}
        for k, s in d["clients"].items():
            self.kept[int(k)] = self.make_codec()
            self.kept[int(k)].load_state_dict(s)


def _codec(sketchsgd, spec, dim, shapes):
    """The codec for the model's vector: with the model's layout where the codec takes one."""
    try:
        return sketchsgd.Compressor(spec, layout=shapes)
    except sketchsgd.InvalidArgument as e:
        if "does not use a layout" not in str(e):
            raise
        return sketchsgd.Compressor(spec, dim)


# What a checkpoint must match to resume: everything that changes the run's numbers.
IDENTITY = ("workload", "codec", "clients", "per_round", "split", "batch", "local_steps", "local_lr", "lr",
            "server_momentum", "client_state", "seed")


def _identity(args) -> dict:
    return {k: getattr(args, k) for k in IDENTITY}


def start_server(args, job):
    """sketchsgd-server for this job (its settings from the job's), and its endpoint."""
    cmd = [args.server_bin, "--bind", "tcp://127.0.0.1:*", "--job", str(args.job), "--world", str(args.per_round),
           "--population", str(args.clients), "--sample-seed", str(args.seed), "--dim", str(job.dim),
           "--codec", job.server.spec, "--lr", repr(args.lr), "--rounds", str(args.rounds), "--policy", "quorum",
           "--deadline-ms", str(int(args.timeout * 1000)), "--quiet", "--no-status"]
    if args.server_momentum:
        cmd += ["--outer-momentum", repr(args.server_momentum), "--outer-nesterov", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    endpoint = proc.stdout.readline().strip()
    if not endpoint.startswith("tcp://"):
        proc.kill()
        raise SystemExit(f"sketchsgd-server did not start: {' '.join(cmd)}")
    return proc, endpoint


def run(args, p=None) -> dict:
    """The job; what its setup refuses (the data, the codec's spec, a checkpoint of another job)
    ends it with one line (p.error, exit status 2)."""
    import sketchsgd
    p = p or parser()
    try:
        work = workloads.make(args.workload, fashion=args.fashion)
    except (FileNotFoundError, ValueError) as e:
        p.error(f"--fashion {args.fashion}: {one_line(e)}")
    try:
        job = Job(args, work)
    except sketchsgd.Error as e:
        p.error(f"--codec {args.codec}: {one_line(e)}")
    except ValueError as e:  # --split for this population, FetchSGD with --server-momentum
        p.error(one_line(e))
    server = None
    if args.server == "auto":
        server, endpoint = start_server(args, job)
    else:
        endpoint = args.server
    if args.checkpoint and os.path.exists(args.checkpoint):
        try:
            job.load_state_dict(torch.load(args.checkpoint))
        except (ValueError, RuntimeError, EOFError, OSError, pickle.UnpicklingError) as e:  # another job's; no checkpoint
            p.error(f"--checkpoint {args.checkpoint}: {one_line(e)}")
        print(f"resumed from {args.checkpoint} at round {job.round}", flush=True)
    start = time.time()
    diverged = None
    try:
        while job.round < args.rounds:
            try:
                job.step_ps(endpoint) if endpoint else job.step()
            except Exception as e:  # a codec refusing a non-finite gradient: the run diverged
                if type(e).__name__ != "NonFiniteError":
                    raise
                diverged = f"round {job.round}: {e}"
                print(f"diverged at {diverged}", flush=True)
                break
            if job.round % args.eval_every == 0 or job.round == args.rounds:
                q = job.quality()
                job.curve.append([job.round, q])
                print(f"round {job.round}/{args.rounds}  {work.describe(q)}  {time.time() - start:.0f} s", flush=True)
            if args.checkpoint and args.checkpoint_every and job.round % args.checkpoint_every == 0:
                torch.save(job.state_dict(), args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
            if args.stop_after and job.round >= args.stop_after:
                break
    finally:
        if server is not None:
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
    participations = job.round * args.per_round
    return {
        "workload": args.workload, "codec": args.codec, "spec": job.server.spec, "split": args.split,
        "clients": args.clients, "per_round": args.per_round, "rounds": job.round, "batch": args.batch,
        "local_steps": args.local_steps, "local_lr": args.local_lr, "lr": args.lr,
        "server_momentum": args.server_momentum, "client_state": args.client_state, "seed": args.seed,
        "dim": job.dim, "metric": work.metric, work.metric: None if diverged else job.quality(),
        "diverged": diverged, "curve": job.curve,
        "upload_bytes_per_participant": job.up / max(participations, 1),
        "download_bytes_per_participant": job.down / max(participations, 1),
        "dense_upload_bytes": 4 * job.dim, "upload_bytes": job.up, "total_bytes": job.up + job.down,
        "client_state_bytes": job.client_state_bytes(), "seconds": time.time() - start,
        "parameter_server": bool(endpoint),
    }


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--codec", default="sketch:fetch=1,rows=1,cols=100000,k=20000",
                   help="the upload's codec, a sketchsgd spec (dense: uncompressed)")
    p.add_argument("--workload", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--clients", type=count, default=1000, help="N, clients in the population")
    p.add_argument("--per-round", type=count, default=20, help="C, clients sampled each round")
    p.add_argument("--split", default="iid", type=_split, help="iid, classes:K or dirichlet:ALPHA")
    p.add_argument("--rounds", type=count, default=300)
    p.add_argument("--batch", type=count, default=32, help="items in a participant's batch")
    p.add_argument("--local-steps", type=natural, default=0,
                   help="0: upload one batch's gradient (FedSGD); H ≥ 1: upload w − w' after H local SGD steps (FedAvg)")
    p.add_argument("--local-lr", type=positive, default=0.05, help="learning rate of the local steps")
    p.add_argument("--lr", type=positive, default=0.05, help="the server's learning rate (w −= lr · step)")
    p.add_argument("--server-momentum", type=momentum, default=0.0, help="ρ of the server's momentum on the decoded mean")
    p.add_argument("--client-state", action="store_true", help="clients keep their codec's state between participations")
    p.add_argument("--seed", type=natural, default=1)
    p.add_argument("--eval-every", type=count, default=25)
    p.add_argument("--checkpoint", default="", help="resume from this file when it exists; write it every --checkpoint-every rounds")
    p.add_argument("--checkpoint-every", type=natural, default=0)
    p.add_argument("--stop-after", type=natural, default=0, help="stop at this round (a job to resume later)")
    p.add_argument("--server", default="",
                   help="run the rounds on the parameter server: auto (start sketchsgd-server for this job) or the "
                        "endpoint of one started with the job's settings (--world C --population N --sample-seed SEED …)")
    p.add_argument("--server-bin", default=os.path.join(ROOT, "build", "default", "server", "sketchsgd-server"),
                   help="the sketchsgd-server program, for --server auto")
    p.add_argument("--job", type=natural, default=1, help="the parameter server's job id")
    p.add_argument("--timeout", type=positive, default=60.0,
                   help="with --server: seconds a client waits for the server; the round's deadline too")
    p.add_argument("--fashion", default=workloads.FASHION)
    p.add_argument("--out", default="", help="write the result here as JSON")
    return p


def _split(text):
    """--split's type: the text, once parse_split() takes it."""
    try:
        parse_split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def check(args, p=None):
    """What the option types cannot check alone; a bad value ends the run (p.error: one line,
    exit status 2)."""
    p = p or parser()
    if args.per_round > args.clients:
        p.error(f"--per-round {args.per_round} > --clients {args.clients}")
    if args.server and (args.client_state or args.checkpoint):
        p.error("--server runs stateless clients and keeps its checkpoints itself: "
                "no --client-state or --checkpoint with it")
    if args.server == "auto" and not (os.path.isfile(args.server_bin) and os.access(args.server_bin, os.X_OK)):
        p.error(f"--server-bin {args.server_bin}: no such program (build it: cmake --build --preset default)")
    if args.server and args.server != "auto" and "://" not in args.server:
        p.error(f"--server {args.server!r}: auto or an endpoint (tcp://HOST:PORT)")
    if args.checkpoint and os.path.isdir(args.checkpoint):
        p.error(f"--checkpoint {args.checkpoint}: a folder, not a file")


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    check(args, p)
    result = run(args, p)
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
