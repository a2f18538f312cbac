"""The experiment matrix (scripts/experiments.json) as the drivers and reports read it: the runs
of a workload, and the plot family a run belongs to. One file says what runs and how it is
drawn, so no report recognises runs by the shape of their names."""
import json
import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "experiments.json")


def _data():
    with open(PATH) as f:
        return json.load(f)


def _expand(data, runs):
    """A list's runs with "@name" entries replaced by the shared list of that name."""
    out = []
    for r in runs:
        out += data["lists"][r[1:]] if isinstance(r, str) else [r]
    return out


def workload(kind: str, name: str) -> dict:
    """kind "ddp" or "local": the workload's entry (its runs expanded): "runs" of {"name",
    "hook", optional "flags", "family", and for local runs "every"}, and "epochs", "max_steps"
    for the per-step runs."""
    data = _data()
    w = dict(data[kind][name])
    w["runs"] = _expand(data, w["runs"])
    return w


def workloads(kind: str) -> list:
    return list(_data()[kind])


def families(kind: str) -> list:
    """The plot's lines: {"family", "label", "colour", "marker"[, "baseline"]} in drawing order."""
    return _data()["families"][kind]


def family_of(kind: str) -> dict:
    """Run name -> its family key, over every workload of the kind."""
    data = _data()
    return {r["name"]: r["family"] for w in data[kind].values() for r in _expand(data, w["runs"]) if "family" in r}


def own_tables(kind: str) -> dict:
    """Run name -> the table of its own (another job than its workload's, such as lm --untied),
    for the runs that the workload's frontier leaves out."""
    data = _data()
    return {r["name"]: r["table"] for w in data[kind].values() for r in _expand(data, w["runs"]) if "table" in r}
