#!/usr/bin/env bash
# pip installs the package from the source tree with no network and no build isolation (Debian's
# setuptools), into a scratch folder, then imports it from there and runs one round.
set -euo pipefail
python=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$(cd "$(dirname "$0")/../.." && pwd)
# A copy without build trees, so the in-tree build leaves nothing in the checkout.
mkdir "$work/src"
tar -C "$src" --exclude=./build --exclude=./.venv --exclude=./python/build --exclude='*.egg-info' --exclude=.git -cf - . |
  tar -C "$work/src" -xf -
SKETCHSGD_CUDA=OFF "$python" -m pip install --quiet --no-build-isolation --no-deps --no-index \
  --target "$work/site" "$work/src/python"
cd "$work"
PYTHONPATH="$work/site" "$python" - <<'PY'
import sketchsgd, torch
assert sketchsgd.__file__.startswith(__import__("os").getcwd()), sketchsgd.__file__
c = sketchsgd.Compressor("sketch:rows=3,cols=300,k=20", 2000)
agg = c.make_aggregator(1)
g = torch.zeros(2000); g[7] = 5.0
agg.add(c.encode(g))
step = c.apply(agg.finish())
assert step[7] == 5.0, step[7]
import sketchsgd.fsdp  # the subpackages are installed too
assert sketchsgd.fsdp.__file__.startswith(__import__("os").getcwd()), sketchsgd.fsdp.__file__
print("pip-installed sketchsgd works:", sketchsgd.__file__)
PY
