#!/bin/bash
# The docs' tables match their data files (scripts/doc_tables.py --check), and the check fails
# when a data file changes without the docs: a copy of the tree with one cell changed is refused,
# and rewriting it makes it pass again.
set -euo pipefail
python=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
"$python" "$src/scripts/doc_tables.py" --check
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/docs"
cp "$src/README.md" "$tmp/"
cp -r "$src/docs/"*.md "$src/docs/data" "$tmp/docs/"
tables=("$tmp/docs/data/tables/"*.json)  # (not `ls | head -1`: under pipefail, ls's SIGPIPE fails it)
table=${tables[0]}
"$python" - "$table" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["rows"][0][0] = "changed"
json.dump(t, open(sys.argv[1], "w"))
PY
if "$python" "$src/scripts/doc_tables.py" --check --root "$tmp" 2>/dev/null; then
  echo "a changed data file passed the check" >&2
  exit 1
fi
"$python" "$src/scripts/doc_tables.py" --root "$tmp" >/dev/null
"$python" "$src/scripts/doc_tables.py" --check --root "$tmp" >/dev/null
grep -q "| changed |" "$tmp"/docs/*.md "$tmp/README.md"
echo "docs tables: in sync; a stale table is refused"
