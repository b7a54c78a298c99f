#!/usr/bin/env bash
# One lent-GPU session of the CUDA runtime (issue 8; figures go to BENCHMARKS.md):
# correctness checks, benchmarks against the measured ceilings, the scenarios that run
# the engine on real kernels, and the real model. Runs a prebuilt `sim` (SIM, default
# .binc/sim, or .binc/sim.gz unpacked: build it with `cargo build --release`, then
# `strip -o .binc/sim target/release/sim` and `gzip -9 .binc/sim` on the dev machine) and
# writes its logs under OUT (default /tmp/gpu-session).
#   kernels/gpu-session.sh [check] [bench] [scenarios] [calibrate] [fidelity SCENARIO REQUESTS]
#                          [oracle MODEL.gguf] [generate MODEL.gguf]
# `calibrate` fits the cost model to the runtime's steps on this GPU (OUT/cuda.toml and
# OUT/cuda.steps.csv; synthetic weights of CAL_MODEL, default llama-3-8b); a later `fidelity` runs SCENARIO (its REQUESTS first requests) on the
# GPU and on the cost model with that fit (OUT/fidelity-<scenario>/).
set -uo pipefail
if [ -z "${SIM:-}" ] && [ ! -x .binc/sim ] && [ -f .binc/sim.gz ]; then
  gunzip -c .binc/sim.gz > /tmp/sim && chmod +x /tmp/sim && SIM=/tmp/sim
fi
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
    calibrate)
      "$SIM" calibrate --backend cuda --model "${CAL_MODEL:-llama-3-8b}" --out "$OUT/cuda.toml" 2>&1 |
        tee "$OUT/calibrate.txt" || status=1
      ;;
    fidelity)
      scn=$2 req=$3
      shift 2
      name=$(basename "$scn" .toml)
      "$SIM" fidelity "$scn" --calibration "$OUT/cuda.toml" --backend cuda --requests "$req" \
        --out "$OUT/fidelity-$name" 2>&1 | tee "$OUT/fidelity-$name.txt" || status=1
      # The per-request and per-step files stay in a tarball (the device tool returns few files).
      tar czf "$OUT/fidelity-$name.tgz" -C "$OUT" "fidelity-$name" && rm -rf "$OUT/fidelity-$name"
      ;;
    oracle)
      shift
      "$SIM" cuda-oracle --model "$1" 2>&1 | tee "$OUT/oracle.txt" || status=1
      ;;
    generate)
      shift
      {
        "$SIM" generate --model "$1" --prompt "The capital of France is" --max-tokens 24 --ids &&
        "$SIM" generate --model "$1" --chat --prompt "What is the capital of France? Answer in one sentence." --max-tokens 64 &&
        "$SIM" generate --model "$1" --chat --prompt "Write a haiku about the sea." --max-tokens 64 --temperature 0.8 --top-p 0.95 --seed 1 &&
        "$SIM" generate --model "$1" --prompt "Once upon a time" --max-tokens 400
      } 2>&1 | tee "$OUT/generate.txt" || status=1
      ;;
    *) echo "unknown step $1"; status=1 ;;
  esac
  shift
done
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
exit $status
