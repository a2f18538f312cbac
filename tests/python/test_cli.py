"""Every command-line entry point (examples/, scripts/, benchmarks/, sketchsgd-train,
sketchsgd-server) refuses a bad value the same way: exit status 2, one line on stderr that names
the option (argparse's usage lines may come before it), no traceback and nothing started (nothing
on stdout). Each case fails while the arguments are checked, so the processes are short; they run
side by side, in a scratch folder (relative defaults such as build/demo land there). The C++
programs come from the build tree (PYTHONPATH=<build>/python): their cases are skipped where
they are not built."""
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _build():
    """The build tree: the parent of the PYTHONPATH entry that holds the sketchsgd package."""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and os.path.isdir(os.path.join(entry, "sketchsgd")):
            return os.path.dirname(os.path.abspath(entry))
    return os.path.join(ROOT, "build", "default")


BUILD = _build()
TRAIN = os.path.join(BUILD, "demo", "sketchsgd-train")
SERVER = os.path.join(BUILD, "server", "sketchsgd-server")

# (program: a script under ROOT or a C++ program's path, its arguments, what the error line names)
CASES = [
    ("examples/ddp_train.py", ["--progress", "0"], "--progress"),
    ("examples/ddp_train.py", ["--workers", "0"], "--workers"),
    ("examples/ddp_train.py", ["--simulate", "100000"], "--simulate"),
    ("examples/ddp_train.py", ["--total-steps", "-1"], "--total-steps"),
    ("examples/ddp_train.py", ["--interface-bytes", "nosuchdev0"], "--interface-bytes"),
    ("examples/ddp_train.py", ["--lr", "nan"], "--lr"),
    # Valid-looking, but no codec takes it: refused once, not by every rank.
    ("examples/ddp_train.py", ["--hook", "sketch:rows=0"], "--hook"),
    ("examples/ddp_train.py", ["--local", "4", "--hook", "none"], "--hook"),
    ("examples/ddp_train.py", ["--json", "/nonexistent/run.json"], "--json"),
    ("examples/ddp_train.py", ["--workload", "resnet7"], "6n+2"),
    ("examples/ddp_train.py", ["--workload", "gpt"], "--workload"),
    ("examples/ddp_train.py", ["--workload", "transformer", "--text", "."], "python3.11-doc"),
    ("examples/ddp_train.py", ["--eval-items", "-1"], "--eval-items"),
    ("examples/ddp_train.py", ["--fsdp", "hsdp", "--replicas", "3"], "--replicas"),
    ("examples/ddp_train.py", ["--fsdp", "full", "--hook", "powersgd:rank=2"], "DDP's"),
    ("examples/ddp_train.py", ["--fsdp", "full", "--local", "4", "--hook", "dense"], "--local"),
    ("examples/ddp_train.py", ["--fsdp", "full", "--workers", "1"], "--fsdp"),
    ("examples/ddp_train.py", ["--fsdp", "fsdp1", "--workers", "1"], "--fsdp fsdp1"),
    ("examples/ddp_train.py", ["--fsdp", "fsdp1", "--replicas", "2"], "--fsdp hsdp"),
    ("examples/ddp_train.py", ["--replicas", "2"], "--fsdp hsdp"),
    ("examples/ddp_train.py", ["--simulate", "0"], "--simulate"),
    ("examples/ddp_train.py", ["--simulate", "2", "--fsdp", "full"], "--simulate"),
    ("examples/ddp_train.py", ["--simulate", "2", "--hook", "powersgd:rank=2"], "--simulate"),
    ("examples/ddp_train.py", ["--simulate", "2", "--local", "4", "--hook", "torch:average"], "--simulate"),
    ("examples/ddp_train.py", ["--simulate", "2", "--rank", "0", "--master", "127.0.0.1:1234"], "--simulate"),
    ("examples/ddp_train.py", ["--workload", "lm", "--vocab", "100"], "512..65536"),
    ("examples/ddp_train.py", ["--hook", "torchft:diloco"], "--local"),
    ("examples/ddp_train.py", ["--hook", "torchft:streaming:fragments=3", "--local", "16"], "multiple"),
    ("examples/ddp_train.py", ["--hook", "torchft:streaming:fragments=2,delay=8", "--local", "16"], "delay"),
    ("examples/ddp_train.py", ["--hook", "torchft:streaming:fragments=1", "--local", "16"], "fragments"),
    ("examples/ddp_train.py", ["--hook", "torchft:diloco:fragments=2", "--local", "16"], "no options"),
    ("examples/ddp_train.py", ["--hook", "torchft:localsgd", "--local", "16"], "torchft:diloco"),
    ("examples/ddp_train.py", ["--simulate", "2", "--hook", "torchft:diloco", "--local", "4"], "--simulate"),
    ("examples/ddp_train.py", ["--hook", "bf16"], "--fsdp"),
    ("benchmarks/bench_fsdp.py", ["--steps", "0"], "--steps"),
    ("benchmarks/bench_fsdp.py", ["--only", "nothing"], "--only"),
    ("benchmarks/bench_fsdp.py", ["--table"], "--table"),
    ("benchmarks/bench_fsdp.py", ["--ranks", "0"], "--ranks"),
    ("benchmarks/bench_fsdp.py", ["--isolated"], "--isolated"),
    ("benchmarks/bench_fsdp.py", ["--ranks", "4", "--replicas", "3"], "--replicas"),
    ("benchmarks/bench_fsdp.py", ["--replicas", "2"], "--replicas"),
    ("benchmarks/bench_fsdp.py", ["--isolated", "--ranks", "2", "--only", "dense"], "layout codec"),
    ("scripts/compare_fsdp.py", ["--only", "full:nothing"], "--only"),
    ("benchmarks/bench_round.py", ["--k", "0"], "--k"),
    ("benchmarks/bench_round.py", ["--report", "x.json"], "--report"),
    ("benchmarks/bench_round.py", ["--report", "x.json", "--table", "../x"], "--table"),
    ("examples/federated.py", ["--clients", "0"], "--clients"),
    ("examples/federated.py", ["--split", "classes:0"], "--split"),
    ("examples/federated.py", ["--per-round", "2000"], "--per-round"),
    ("scripts/compare_codecs.py", ["--epochs", "0"], "--epochs"),
    ("scripts/compare_codecs.py", ["--only", "dense,bogus"], "--only"),
    ("scripts/compare_ddp.py", ["--workers", "0"], "--workers"),
    ("scripts/compare_ddp.py", ["--only", "bogus"], "--only"),
    ("scripts/compare_ddp.py", ["--restate", "--table", "no-such-table"], "--restate"),
    ("scripts/scale.py", ["--series", "global", "--workers", "4,256"], "--series global"),
    ("scripts/scale.py", ["--series", "diloco", "--only", "fetchsgd"], "--only"),
    ("scripts/scale.py", ["--restore", "--warmup", "3", "--report-only"], "--restore"),
    ("scripts/compare_federated.py", ["--split", "iid,bogus"], "--split"),
    ("scripts/compare_local_ps.py", ["--seeds", "1,x"], "--seeds"),
    ("scripts/compare_shards.py", ["--shards", "2,4"], "--shards"),
    ("scripts/compare_shards.py", ["--shards", "1,0"], "--shards"),
    ("scripts/density.py", ["--steps", "0"], "--steps"),
    ("scripts/doc_tables.py", ["--root", "/nonexistent"], "--root"),
    ("scripts/frontier.py", ["--workload", "gpt"], "--workload"),
    ("scripts/frontier.py", ["--half", "/nonexistent"], "--half"),
    ("scripts/hook_table.py", ["--date", "2024-13", "a=/nonexistent.json"], "--date"),
    ("scripts/hook_table.py", ["a=/nonexistent.json"], "a=/nonexistent.json"),
    ("scripts/local_frontier.py", ["--workload", "gpt"], "--workload"),
    ("benchmarks/bench_codec_phases.py", ["--dim", "-1"], "--dim"),
    ("benchmarks/bench_hook.py", ["--steps", "0"], "--steps"),
    ("benchmarks/bench_hook.py", ["--device", "tpu"], "--device"),
    ("benchmarks/bench_network.py", ["--rates", "1gbit,bogus"], "--rates"),
    ("benchmarks/bench_network.py", ["--ps-shards", "1,0"], "--ps-shards"),
    ("benchmarks/bench_network.py", ["--timeout", "nan"], "--timeout"),
    ("benchmarks/bench_shards_links.py", ["--shards", "1,x"], "--shards"),
    ("benchmarks/churn_table.py", ["/nonexistent.jsonl"], "/nonexistent.jsonl"),
    ("benchmarks/flood_table.py", ["--date", "today"], "--date"),
    ("benchmarks/compare_torch.py", ["--hashing", "blocked,bogus"], "--hashing"),
    ("benchmarks/gpu_report.py", ["--replot", "/nonexistent.json"], "--replot"),
    ("benchmarks/plot_bench.py", ["/nonexistent.json", "/"], "/nonexistent.json"),
    ("benchmarks/shards_table.py", ["--write-docs", "--date", "today"], "--date"),
    (TRAIN, ["--workers", "0"], "--workers"),
    (TRAIN, ["--epochs", "-1"], "--epochs"),
    (TRAIN, ["--lr", "nan"], "--lr"),
    (TRAIN, ["--codec", "nonsense"], "--codec"),
    (TRAIN, ["--data", "/nonexistent"], "--data"),
    (TRAIN, ["--bogus", "1"], "--bogus"),
    (TRAIN, ["--epochs"], "--epochs"),
    (TRAIN, ["--mode", "async"], "one-round codec"),
    (TRAIN, ["--mode", "sometimes"], "--mode"),
    (TRAIN, ["--slow", "4:2"], "--slow"),
    (TRAIN, ["--slow", "1:0.5"], "--slow"),
    (TRAIN, ["--mode", "async", "--staleness", "2", "--codec", "topk:k=10"], "--staleness"),
    (TRAIN, ["--server-opt", "lion"], "--server-opt"),
    (SERVER, ["--world", "0", "--dim", "100"], "--world"),
    (SERVER, ["--dim", "0"], "--dim"),
    (SERVER, ["--dim", "100", "--lr", "nan"], "--lr"),
    (SERVER, ["--dim", "100", "--codec", "nonsense"], "--codec"),
    (SERVER, ["--dim", "100", "--policy", "sometimes"], "--policy"),
    (SERVER, ["--dim", "100", "--outer-momentum", "1.5"], "--outer-momentum"),
    (SERVER, ["--dim", "100", "--mode", "downpour"], "--mode"),
    (SERVER, ["--dim", "10000", "--mode", "async", "--codec", "powersgd:layout=100x100"],
     "one-round codec"),
    (SERVER, ["--dim", "100", "--max-age", "3"], "--max-age"),
    (SERVER, ["--dim", "100", "--bogus"], "--bogus"),
    (SERVER, ["--dim", "100", "--world"], "--world"),
]


def _name(program):
    return os.path.basename(program)


def _argv(program, args):
    if program in (TRAIN, SERVER):
        extra = ["--bind", "tcp://127.0.0.1:*"] if program == SERVER else []  # never the default port
        return [program, *extra, *args]
    return [sys.executable, os.path.join(ROOT, program), *args]


def _run(argv, cwd):
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)
        return done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        return None, e.stdout or "", e.stderr or ""


_OUTCOMES = {}


def _outcome(i):
    """Case i's (exit status, stdout, stderr). The first call runs every case whose program
    exists, side by side (most are a Python start-up and an import of torch)."""
    if not _OUTCOMES:
        todo = [j for j, (program, _, _) in enumerate(CASES) if program not in (TRAIN, SERVER) or
                os.access(program, os.X_OK)]
        with tempfile.TemporaryDirectory(prefix="sketchsgd-cli-") as scratch, \
                ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
            futures = {j: pool.submit(_run, _argv(CASES[j][0], CASES[j][1]), scratch) for j in todo}
            _OUTCOMES.update({j: f.result() for j, f in futures.items()})
    return _OUTCOMES[i]


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{_name(p)} {' '.join(a)}" for p, a, _ in CASES])
def test_a_bad_value_is_refused_with_one_line_and_status_2(i):
    program, args, names = CASES[i]
    if program in (TRAIN, SERVER) and not os.access(program, os.X_OK):
        pytest.skip(f"{program} is not built")
    rc, out, err = _outcome(i)
    shown = f"{_name(program)} {' '.join(args)}: exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    assert rc == 2, shown
    assert "Traceback" not in out + err, shown
    assert out == "", shown  # nothing started: no progress line, no endpoint
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, shown
    if program in (TRAIN, SERVER):
        assert len(lines) == 1, shown
    else:  # argparse: its usage (a first line "usage: …", indented continuations), then the error
        assert [line for line in lines if not line.startswith(("usage:", " "))] == lines[-1:], shown
        assert lines[-1].startswith(f"{_name(program)}: error: "), shown
    assert names in lines[-1], shown


def test_a_table_of_payload_rows_is_restated_in_link_bytes(tmp_path):
    """compare_ddp.py --restate: a row kept from before link bytes were counted gets them from its
    payload by the ring model at W = 4 (an all-reduce's rank 3x its payload, sent + received; a
    gather's 6x), the bf16 all-reduce's over them beside it; a table already restated is left."""
    sys.path[:0] = [os.path.join(ROOT, "scripts"), os.path.join(ROOT, "examples")]
    import compare_ddp
    path = tmp_path / "t.json"
    old = {"command": "c", "date": "2026-11-23", "machine": "m", "note": "n.", "columns": compare_ddp.PAYLOAD_COLUMNS,
           "rows": [["`none`", "87.07 %", "7,454,760 B", "1.0×", "1.0×", "yes", "65 s"],
                    ["`topk:k=20000,momentum=0.9`", "85.94 %", "168,292 B", "44.3×", "40.0×", "yes", "80 s"]]}
    path.write_text(json.dumps(old))
    assert compare_ddp.restate(str(path), compare_ddp.COLUMNS)
    t = json.loads(path.read_text())
    assert t["columns"] == compare_ddp.COLUMNS
    dense, topk = t["rows"]
    assert dense[2:4] == ["22,364,280 B", "0.5×"]  # 3 x 7,454,760; bf16's is half of fp32's
    assert topk[2] == f"{6 * 168292:,} B"
    bf16 = 3 * 44.3 * 168292 / 2
    assert topk[3] == f"{bf16 / (6 * 168292):.1f}×"
    assert topk[4:] == old["rows"][1][2:]
    assert "ring model" in t["note"]
    assert not compare_ddp.restate(str(path), compare_ddp.COLUMNS)


def test_restore_takes_the_docs_points_with_this_runs_flags_as_run(tmp_path):
    """scale.py --restore: the docs' data file's points whose flags are this run's are written into
    the folder and reported as run before (a fresh clone's study goes on from them); those of
    other flags (--steps 60: none recorded) are not, and a point the folder holds is its own."""
    scale = [sys.executable, os.path.join(ROOT, "scripts", "scale.py"), "--restore", "--report-only",
             "--workers", "256", "--only", "dense-bf16,fetchsgd", "--out", str(tmp_path)]
    with open(os.path.join(ROOT, "docs", "data", "scale-mlp.json")) as f:
        recorded = json.load(f)
    own = dict(recorded["fetchsgd-w256"][0], quality=0.5)
    (tmp_path / "fetchsgd-w256-s1.json").write_text(json.dumps(own))
    out = subprocess.run(scale + ["--steps", "40"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--restore: 1 points" in out.stdout, out.stdout
    assert f"dense-bf16, seed 1: test_accuracy {recorded['dense-bf16-w256'][0]['quality']:.4f}" in out.stdout
    assert json.loads((tmp_path / "fetchsgd-w256-s1.json").read_text())["quality"] == 0.5
    assert (tmp_path / "dense-bf16-w256-s1.args").exists()
    other = subprocess.run(scale + ["--steps", "60", "--out", str(tmp_path / "other")], capture_output=True, text=True,
                           timeout=120)
    assert other.returncode == 0 and "--restore: 0 points" in other.stdout, other.stdout + other.stderr
