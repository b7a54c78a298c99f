#!/usr/bin/env python3
"""Shape-dependent GEMM efficiency models against Vidur's layer profiles (VALIDATION.md).

The shipped cost model uses one compute and one memory efficiency under a soft roofline
(`sim calibrate` fits them). This script asks whether efficiencies that depend on the
GEMM's shape explain Vidur's 2,088 Llama-2-7B layer rows (A100 and H100, TP 1-8, 1 to
16k tokens) better, with the same soft maximum (exponent 1.5) and eager launch cost (6 us):

- constant: the shipped 0.75 compute / 0.85 memory;
- saturating: efficiency e * x / (x + x0) in the GEMM's FLOPs (compute) and bytes (memory);
- waves: compute efficiency times the tile utilisation of the last wave over the SMs
  (output tiles of TM x TN, M padded to whole tiles).

Run from the repository root: python3 calibration/shape_models.py (standard library only).
"""
import csv
import math
import statistics

GPUS = {"a100": (312e12, 2.039e12, 108), "h100": (989.4e12, 3.35e12, 132)}
LAUNCH_S = 6e-6
P = 1.5


def points():
    out = []
    for g, (peak, bw, sms) in GPUS.items():
        with open(f"calibration/vidur_{g}_Llama-2-7b-hf_mlp.csv") as f:
            for r in csv.DictReader(f):
                t = float(r["num_tokens"])
                tp = float(r["num_tensor_parallel_workers"])
                ms = sum(float(r[f"time_stats.{k}.median"]) for k in
                         ["attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"])
                h, inter = 4096, 11008
                shapes = [(h, 3 * h / tp), (h / tp, h), (h, 2 * inter / tp), (inter / tp, h)]
                out.append((peak, bw, sms, t, shapes, ms))
    return out


def soft(tc, tm):
    hi = max(tc, tm)
    return hi * ((tc / hi) ** P + (tm / hi) ** P) ** (1 / P)


def predict(p, eff):
    peak, bw, sms, t, shapes, _ = p
    total = 0.0
    for k, n in shapes:
        flops, nbytes = 2 * t * k * n, k * n * 2 + t * (k + n) * 2
        ec, em = eff(flops, nbytes, t, n, sms)
        total += soft(flops / (peak * ec), nbytes / (bw * em)) + LAUNCH_S
    return total * 1e3


def score(pts, eff):
    errs = [abs(predict(p, eff) - p[5]) / p[5] for p in pts]
    return statistics.median(errs), max(errs)


def main():
    pts = points()
    print(f"{len(pts)} rows")
    med, mx = score(pts, lambda f, b, t, n, s: (0.75, 0.85))
    print(f"constant 0.75/0.85: median {100 * med:.2f}%, max {100 * mx:.1f}%")
    best = None
    for ec in [0.75, 0.8, 0.85, 0.9]:
        for em in [0.85, 0.9, 0.95]:
            for f0 in [0, 1e8, 3e8, 1e9, 3e9]:
                for b0 in [0, 1e6, 3e6, 1e7]:
                    def eff(f, b, t, n, s, ec=ec, em=em, f0=f0, b0=b0):
                        return ec * f / (f + f0), em * b / (b + b0)
                    s = score(pts, eff)
                    if best is None or s[0] < best[0][0]:
                        best = (s, ec, em, f0, b0)
    (med, mx), ec, em, f0, b0 = best
    print(f"saturating (e_c {ec}, e_m {em}, F0 {f0:g}, B0 {b0:g}): median {100 * med:.2f}%, max {100 * mx:.1f}%")
    best = None
    for ec in [0.75, 0.8, 0.85, 0.9, 0.95]:
        for em in [0.8, 0.85, 0.9]:
            for tm_ in [16, 32, 64, 128]:
                for tn in [64, 128, 256]:
                    def eff(f, b, t, n, s, ec=ec, em=em, tm_=tm_, tn=tn):
                        tiles = math.ceil(t / tm_) * math.ceil(n / tn)
                        util = tiles / (math.ceil(tiles / s) * s)
                        pad = t / (math.ceil(t / tm_) * tm_)
                        return ec * util * pad, em
                    s = score(pts, eff)
                    if best is None or s[0] < best[0][0]:
                        best = (s, ec, em, tm_, tn)
    (med, mx), ec, em, tm_, tn = best
    print(f"waves (e_c {ec}, e_m {em}, tile {tm_} x {tn}): median {100 * med:.2f}%, max {100 * mx:.1f}%")


if __name__ == "__main__":
    main()
