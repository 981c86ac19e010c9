#!/usr/bin/env bash
# Two revisions of the native kernels side by side on one GPU, in one run: outputs compared bit for bit
# (side.py out), then each timed twice, alternating (side.py time), then compared (compare.py).
#   git worktree add .old <rev>; bash tools/compare_revision/run.sh .old OUT_DIR
# Each side runs in its own process with PYTHONPATH pointing at its lib/ (pycuda must be importable).
set -euo pipefail
OLD=$(realpath "$1")/lib NEW=$PWD/lib OUT=${2:-.} HERE=$(dirname "$0") BASE=${PYTHONPATH:-}
side() { PYTHONPATH="$1:$BASE" python3 "$HERE/side.py" "${@:2}"; }
side "$OLD" out old /tmp/cmp_old.pt && side "$NEW" out new /tmp/cmp_new.pt
for i in 1 2; do side "$OLD" time old /tmp/cmp_t_old$i.json; side "$NEW" time new /tmp/cmp_t_new$i.json; done
PYTHONPATH="$NEW:$BASE" python3 "$HERE/compare.py" /tmp/cmp_old.pt /tmp/cmp_new.pt "$OUT/refactor_compare.json" \
  /tmp/cmp_t_old1.json /tmp/cmp_t_new1.json /tmp/cmp_t_old2.json /tmp/cmp_t_new2.json
