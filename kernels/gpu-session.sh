#!/usr/bin/env bash
# One lent-GPU session of the CUDA runtime (issue 8; figures go to BENCHMARKS.md):
# correctness checks, benchmarks against the measured ceilings, and the scenarios that run
# the engine on real kernels. Runs a prebuilt `sim` (SIM, default .binc/sim: build it with
# `cargo build --release` and `strip -o .binc/sim target/release/sim` on the dev machine)
# and writes its logs under OUT (default /tmp/gpu-session).
#   kernels/gpu-session.sh [check] [bench] [scenarios] [oracle MODEL.gguf]
set -uo pipefail
SIM=${SIM:-.binc/sim}
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
# The CUDA 13 libraries (NVRTC, cuBLAS) and headers where the lent machines have them.
for d in /usr/local/cuda/targets/x86_64-linux /usr/local/cuda-13.0/targets/x86_64-linux; do
  if [ -d "$d/lib" ]; then
    export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export SIM_CUDA_INCLUDE="${SIM_CUDA_INCLUDE:-$d/include}"
    break
  fi
done
[ $# -eq 0 ] && set -- check bench scenarios
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
"$SIM" doctor 2>&1 | tee "$OUT/doctor.txt"
status=0
while [ $# -gt 0 ]; do
  case "$1" in
    check) "$SIM" cuda-check 2>&1 | tee "$OUT/check.txt" || status=1 ;;
    bench) "$SIM" cuda-bench --model llama-3-8b 2>&1 | tee "$OUT/bench.txt" || status=1 ;;
    scenarios)
      for s in cuda_features cuda_window; do
        "$SIM" run "scenarios/$s.toml" --backend cuda --quiet --out "$OUT/runs/$s" 2>&1 | tee "$OUT/$s.txt" || status=1
      done
      "$SIM" run scenarios/mixed.toml --backend cuda --requests 200 --quiet --out "$OUT/runs/mixed" 2>&1 | tee "$OUT/mixed.txt" || status=1
      tar czf "$OUT/runs.tgz" -C "$OUT" runs && rm -rf "$OUT/runs"
      ;;
    oracle)
      shift
      "$SIM" cuda-oracle --model "$1" 2>&1 | tee "$OUT/oracle.txt" || status=1
      ;;
    *) echo "unknown step $1"; status=1 ;;
  esac
  shift
done
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
exit $status
