#!/usr/bin/env bash
# Byte-for-byte comparison of two `sim` binaries' outputs, for refactors that must not change
# behaviour (issue 15): every scenario in scenarios/ on both drivers, the sweeps whole and
# sharded then merged, `--seeds` replicas, validate/plan/calibrate/validate-model and the
# catalogs, each command's stdout and stderr too. Only `timing.json` (wall-clock times) may
# differ.
#
#   scripts/compare-outputs.sh [REF]      # REF (default HEAD) against the working tree
#   SIM_BASE_BIN=path scripts/compare-outputs.sh   # a baseline binary built earlier
#   SIM_REUSE_BASE=1 scripts/compare-outputs.sh    # keep target/compare/base from a last run
#
# REF is built in a git worktree under target/compare/; the working tree with
# `cargo build --release`. Outputs go to target/compare/{base,new}; the script exits 1 and
# lists the files that differ when any do. A full pass takes about 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
WORK="$REPO/target/compare"
mkdir -p "$WORK"

if [ -n "${SIM_REUSE_BASE:-}" ] && [ -d "$WORK/base/log" ]; then
  BASE_BIN=""
elif [ -n "${SIM_BASE_BIN:-}" ]; then
  mkdir -p "$WORK/bin-base" && cp "$SIM_BASE_BIN" "$WORK/bin-base/sim"
  BASE_BIN="$WORK/bin-base/sim"
else
  REF="${1:-HEAD}"
  SHA="$(git rev-parse "$REF")"
  TREE="$WORK/ref-$SHA"
  if [ ! -d "$TREE" ]; then
    git worktree add --detach "$TREE" "$SHA" >/dev/null
  fi
  (cd "$TREE" && CARGO_TARGET_DIR="$WORK/target" cargo build --release --bin sim --quiet)
  # Both binaries are called `sim`, as clap prints the name in `--help`.
  BASE_BIN="$WORK/bin-base/sim"
  mkdir -p "$WORK/bin-base" && cp "$WORK/target/release/sim" "$BASE_BIN"
fi
cargo build --release --bin sim --quiet
# A copy, so that a build during the run cannot swap the binary under it.
NEW_BIN="$WORK/bin-new/sim"
mkdir -p "$WORK/bin-new" && cp "$REPO/target/release/sim" "$NEW_BIN"

# Runs the suite with binary $1 in folder $2 (relative output paths, so that printed paths
# agree between the two runs).
suite() {
  local sim="$1" dir="$2"
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  # Each command's stdout, stderr and exit code, in `log/<name>.{out,err}`.
  c() {
    local name="$1"
    shift
    mkdir -p log
    local rc=0
    "$sim" "$@" >"log/$name.out" 2>"log/$name.err" || rc=$?
    echo "$rc" >"log/$name.rc"
  }
  c models models
  c gpus gpus
  c help --help
  for cmd in run validate plan calibrate fidelity bench generate speculate compare merge; do
    c "help-$cmd" "$cmd" --help
  done
  for s in "$REPO"/scenarios/*.toml; do
    local n
    n="$(basename "$s" .toml)"
    c "validate-$n" validate "$s"
    c "run-$n-actors" run "$s" --quiet --out "runs/$n-actors"
    c "run-$n-inline" run "$s" --quiet --driver inline --out "runs/$n-inline"
    if grep -q '^\[sweep\]' "$s"; then
      c "run-$n-shard0" run "$s" --quiet --driver inline --shard 0/2 --out "runs/$n-shard0"
      c "run-$n-shard1" run "$s" --quiet --driver inline --shard 1/2 --out "runs/$n-shard1"
      c "merge-$n" merge "runs/$n-shard0" "runs/$n-shard1" --out "runs/$n-merged"
    else
      c "run-$n-seeds" run "$s" --quiet --driver inline --seeds 2 --seed 7 --requests 1500 \
        --out "runs/$n-seeds"
      c "run-$n-variant" run "$s" --quiet --requests 300 --out "runs/$n-variant" \
        --variant "$(grep -m1 -A1 '^\[\[variant\]\]' "$s" | sed -n 's/^name *= *"\(.*\)"/\1/p')"
    fi
  done
  c compare compare runs/mixed-actors runs/mixed-inline --out compare.csv
  c compare-seeds compare runs/preemption-seeds runs/mixed-seeds
  c report report runs/mixed-actors
  c plan plan "$REPO/scenarios/mixed.toml" --rate 30 --requests 200 --gpu h100 --gpu a100 \
    --tp 1 --tp 2 --dtype bf16 --dtype fp8 --price h100-sxm=2.5
  c calibrate calibrate --from "$REPO/calibration" --out fitted.toml
  c calibrate-gemm calibrate --from "$REPO/calibration/llmcompass_a100_gemm.csv" --out gemm.toml
  c calibrate-steps calibrate --steps "$REPO/calibration/h100-sxm-cuda.steps.csv" --gpu h100-sxm \
    --out steps.toml
  c validate-model validate-model --data "$REPO/calibration" --out VALIDATION.md
  c calibrated-run run "$REPO/scenarios/mixed.toml" --quiet --driver inline --requests 500 \
    --calibration "$REPO/calibration/h100-sxm-cuda.toml" --out runs/mixed-calibrated
  # Errors: one line each.
  c err-missing run "$REPO/scenarios/missing.toml"
  c err-gpu plan "$REPO/scenarios/mixed.toml" --rate 1 --gpu rtx-9090
  c err-model cuda-bench --model no-such-model
  c err-requests run "$REPO/scenarios/mixed.toml" --requests 0
  c err-shard run "$REPO/scenarios/mixed.toml" --shard 0/2
  cd "$REPO"
}

if [ -n "$BASE_BIN" ]; then
  echo "baseline: $BASE_BIN"
  suite "$BASE_BIN" "$WORK/base"
else
  echo "baseline: the outputs in $WORK/base"
fi
echo "candidate: $NEW_BIN"
suite "$NEW_BIN" "$WORK/new"

if diff -rq -x timing.json "$WORK/base" "$WORK/new"; then
  echo "identical: $(find "$WORK/new" -type f ! -name timing.json | wc -l) files (timing.json aside)"
else
  echo "outputs differ (above); inspect with: diff -r -x timing.json $WORK/base $WORK/new"
  exit 1
fi
