#!/usr/bin/env python3
"""The docs' tables, made from data files: every docs/data/tables/NAME.json becomes the markdown
table between <!-- table:NAME --> and <!-- end:NAME --> wherever a doc has that block, with a
caption naming the command, the date and the machine. People write the conclusions around the
blocks; a table is changed by changing its data file (a producer such as hook_table.py or
compare_codecs.py writes it) and running this script.

    .venv/bin/python scripts/doc_tables.py            # rewrite the blocks in README.md and docs/*.md
    .venv/bin/python scripts/doc_tables.py --check    # exit 1 when a block differs from its data

A table file: {"command": "...", "date": "YYYY-MM-DD", "machine": "...", "data": "raw file(s), optional",
"note": "optional caption text", "columns": [...], "rows": [[cell, ...], ...]}.
"""
import argparse
import glob
import json
import os
import re
import sys

ROOT = TABLES = None
BLOCK = re.compile(r"<!-- table:([\w.-]+) -->\n(.*?)<!-- end:\1 -->\n", re.S)
FIELDS = {"command", "date", "machine", "columns", "rows", "data", "note"}


def load(name):
    path = os.path.join(TABLES, name + ".json")
    if not os.path.exists(path):
        raise SystemExit(f"doc_tables.py: no data file {os.path.relpath(path, ROOT)} for table {name!r}")
    with open(path) as f:
        t = json.load(f)
    missing = {"command", "date", "machine", "columns", "rows"} - set(t)
    unknown = set(t) - FIELDS
    if missing or unknown:
        raise SystemExit(f"doc_tables.py: {name}.json: missing {sorted(missing)}, unknown {sorted(unknown)}")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", t["date"]):
        raise SystemExit(f"doc_tables.py: {name}.json: date {t['date']!r} is not YYYY-MM-DD")
    for i, row in enumerate(t["rows"]):
        if len(row) != len(t["columns"]):
            raise SystemExit(f"doc_tables.py: {name}.json: row {i} has {len(row)} cells for {len(t['columns'])} columns")
    return t


def render(name):
    t = load(name)
    cell = lambda c: "" if c is None else str(c)
    lines = ["| " + " | ".join(t["columns"]) + " |", "|" + "---|" * len(t["columns"])]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t["rows"]]
    caption = f"*{t['date']}, {t['machine']}: `{t['command']}`"
    if t.get("data"):
        caption += f" (data: {t['data']})"
    caption += "." + (f" {t['note']}" if t.get("note") else "") + "*"
    return caption + "\n\n" + "\n".join(lines) + "\n"


def write(path, command, date, machine, columns, rows, data=None, note=None, key=None):
    """Writes a table data file (a producer's half). With key (a column index), rows of an existing
    file whose key no new row has are kept: a producer run on a few configurations (--only)
    updates their rows and leaves the others."""
    rows = [["" if c is None else str(c) for c in r] for r in rows]
    if key is not None and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("columns") == columns:
            new = {r[key]: r for r in rows}
            mine = list(new)
            merged = [new.pop(r[key]) if r[key] in new else r for r in old["rows"]]
            if len(merged) > len(mine) - len(new):  # some old rows kept: say which run is which
                command = old["command"]
                note = (old.get("note", "").split(" Rows ")[0] + f" Rows {', '.join(mine)}: {date}; "
                        f"the others: {old['date'].split(' ')[0]}.").strip()
            rows = merged + list(new.values())
    t = {"command": command, "date": date, "machine": machine}
    if data:
        t["data"] = data
    if note:
        t["note"] = note
    t.update(columns=columns, rows=rows)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(t, f, indent=1, ensure_ascii=False)
        f.write("\n")


def date_flag(ap):
    """Adds --date (the measurements' date, YYYY-MM-DD; default today) to a producer's parser."""
    import datetime

    def day(s):
        try:
            return datetime.date.fromisoformat(s).isoformat()
        except ValueError:
            raise argparse.ArgumentTypeError(f"a date YYYY-MM-DD, not {s!r}")

    ap.add_argument("--date", type=day, default=datetime.date.today().isoformat(),
                    help="the measurements' date (default: today)")


def read_jsonl(ap, path, what="runs"):
    """A producer's JSON lines; a missing, unreadable or empty file is the parser's error."""
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        ap.error(f"cannot read {path}: {e}")
    if not rows:
        ap.error(f"{path} holds no {what}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is out of date")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the source tree (default: this script's)")
    args = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(args.root, "README.md")):
        ap.error(f"--root {args.root}: not a source tree (no README.md)")
    global ROOT, TABLES
    ROOT = args.root
    TABLES = os.path.join(ROOT, "docs", "data", "tables")
    docs = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    stale, used = [], set()
    for path in docs:
        with open(path) as f:
            doc = f.read()
        new = BLOCK.sub(lambda m: (used.add(m.group(1)) or
                                   f"<!-- table:{m.group(1)} -->\n{render(m.group(1))}<!-- end:{m.group(1)} -->\n"), doc)
        if new != doc:
            stale.append(os.path.relpath(path, ROOT))
            if not args.check:
                with open(path, "w") as f:
                    f.write(new)
    orphans = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(TABLES, "*.json"))
                     if os.path.basename(p)[:-5] not in used)
    if orphans:
        print(f"doc_tables.py: data files no doc shows: {', '.join(orphans)}", file=sys.stderr)
    if args.check and (stale or orphans):
        if stale:
            print(f"doc_tables.py: tables out of date with docs/data/tables in {', '.join(stale)}: "
                  "run .venv/bin/python scripts/doc_tables.py", file=sys.stderr)
        sys.exit(1)
    print(f"doc_tables.py: {len(used)} tables, " + (f"rewrote {', '.join(stale)}" if stale and not args.check else "all current"))


if __name__ == "__main__":
    main()
