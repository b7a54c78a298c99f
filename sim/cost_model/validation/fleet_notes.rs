//! The figures VALIDATION.md's paragraph on the disaggregated rows quotes, computed from
//! the replays' checks rather than written by hand, so that they follow the model when it
//! moves: the groups whose measured TTFT no replay comes near (TensorRT-LLM's DeepSeek
//! rows in fp8 on GB200 and H100 at up to 64 clients), the H100 rows' TPOT at TP16, the
//! prefill throughput SGLang's B200 rows with long prompts imply, and the dense rows.
//!
//! In: the checks of [`super::disagg::disagg_checks`]; out: the paragraph (a sentence is
//! left out when no row matches it).

use super::disagg::prefill_gpus;
use super::silicon::{mean_length_fraction, SiliconCheck};

/// `lo-hi` of `values` in seconds from milliseconds, two significant figures (`1.6-39`);
/// `None` when empty.
fn span_s(values: impl Iterator<Item = f64>) -> Option<String> {
    span(values.map(|ms| ms / 1e3))
}

/// The least and greatest of `values`; `None` when empty.
fn bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    (lo <= hi).then_some((lo, hi))
}

/// `lo-hi` (or `x` when equal) of `values`, two significant figures.
fn span(values: impl Iterator<Item = f64>) -> Option<String> {
    let (lo, hi) = bounds(values)?;
    let (lo, hi) = (sig2(lo), sig2(hi));
    Some(if lo == hi { lo } else { format!("{lo}-{hi}") })
}

/// `lo-hi` of whole numbers (clients), thousands grouped; `None` when empty.
fn span_whole(values: impl Iterator<Item = u32>) -> Option<String> {
    let (lo, hi) = values.fold((u32::MAX, 0), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return None;
    }
    let (lo, hi) = (thousands(&lo.to_string()), thousands(&hi.to_string()));
    Some(if lo == hi { lo } else { format!("{lo}-{hi}") })
}

/// An integer's digits grouped in threes (`4100` -> `4,100`; a leading `-` kept).
fn thousands(text: &str) -> String {
    let (sign, digits) = text.split_at(usize::from(text.starts_with('-')));
    let mut out = String::from(sign);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A span of signed errors (%) in words: `38-46% short`, `5-9% long`, or `-3% to +8% off`.
fn signed_span(values: &[f64]) -> Option<String> {
    let (lo, hi) = bounds(values.iter().copied())?;
    Some(if hi < 0.0 {
        format!("{}% short", span([-hi, -lo].into_iter())?)
    } else if lo > 0.0 {
        format!("{}% long", span([lo, hi].into_iter())?)
    } else {
        format!("{}% to +{}% off", sig2(lo), sig2(hi))
    })
}

/// `x` to two significant figures, thousands separated (`0.19`, `1.6`, `39`, `4,100`).
fn sig2(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let digits = x.abs().log10().floor() as i32;
    let decimals = (1 - digits).max(0) as usize;
    let scale = 10f64.powi(digits - 1);
    let rounded = if digits >= 1 {
        (x / scale).round() * scale
    } else {
        x
    };
    let text = format!("{rounded:.decimals$}");
    if decimals > 0 {
        text
    } else {
        thousands(&text)
    }
}

/// The rows of TensorRT-LLM's DeepSeek model in fp8 on `gpu` at up to 64 clients whose
/// measured TTFT is a second or more.
fn slow_trtllm<'a>(checks: &'a [SiliconCheck], gpu: &str) -> Vec<&'a SiliconCheck> {
    checks
        .iter()
        .filter(|c| {
            c.row.backend == "trtllm"
                && c.gpu == gpu
                && c.model.starts_with("deepseek")
                && c.row.gemm_quant == "fp8"
                && c.row.concurrency.unwrap_or(0) <= 64
                && c.row.ttft_ms >= 1e3
        })
        .collect()
}

/// The rows' models as their files name them, without the organisation
/// (`DeepSeek-R1 and DeepSeek-V3`).
fn names(rows: &[&SiliconCheck]) -> String {
    let mut names: Vec<&str> = rows
        .iter()
        .map(|c| c.row.model.rsplit('/').next().unwrap_or(&c.row.model))
        .collect();
    names.sort_unstable();
    names.dedup();
    match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// Measured TTFT, clients and replayed TTFT ranges of `rows`: `(measured s, clients,
/// replay s)`.
fn ranges(rows: &[&SiliconCheck]) -> Option<(String, String, String)> {
    Some((
        span_s(rows.iter().map(|c| c.row.ttft_ms))?,
        span_whole(rows.iter().map(|c| c.row.concurrency.unwrap_or(0)))?,
        span_s(rows.iter().map(|c| c.ttft_ms))?,
    ))
}

/// The closed loop's throughput (requests per ms, from TTFT and TPOT in ms): clients over
/// one request's time, the first token and the mean output's other tokens.
fn throughput(c: &SiliconCheck, ttft: f64, tpot: f64) -> f64 {
    let out = mean_length_fraction(c.row.client) * f64::from(c.row.osl);
    f64::from(c.row.concurrency.unwrap_or(1)) / (ttft + (out - 1.0).max(0.0) * tpot)
}

/// The paragraph after the disaggregated rows' tables.
pub(super) fn disagg_paragraph(checks: &[SiliconCheck]) -> String {
    let errors: Vec<f64> = checks
        .iter()
        .map(|c| {
            let sim = throughput(c, c.ttft_ms, c.tpot_ms);
            100.0 * (sim / throughput(c, c.row.ttft_ms, c.row.tpot_ms) - 1.0).abs()
        })
        .collect();
    let throughput_err = analysis::median(&errors);
    let mut s = format!(
        "\nTPOT, the decode pool's steady state, is as close as the aggregated rows' (the decode engines run the same mixture-of-experts terms). TTFT is not. Beyond a few clients per prefill rank, a closed loop's TTFT is mostly the wait at the prefill pool, and that wait magnifies any error in throughput: the loop's throughput (clients / (TTFT + (mean output - 1) x TPOT)) comes out within {throughput_err:.1}% median |error|, while TTFT, about a tenth of a request's time in these rows, is off by several times that. At 16 clients or fewer, where TTFT is one prefill and a transfer, the signed median is small but the spread is wide, because some measured TTFTs are seconds for a handful of prompts"
    );
    let (gb200, h100) = (
        slow_trtllm(checks, "gb200"),
        slow_trtllm(checks, "h100-sxm"),
    );
    let both: Vec<&SiliconCheck> = gb200.iter().chain(&h100).copied().collect();
    match (ranges(&gb200), ranges(&h100)) {
        (Some((m, c, r)), h) => {
            s.push_str(&format!(
                ": TensorRT-LLM with {} in fp8 on GB200 measures {m} s at {c} clients where the replay's TTFT is {r} s",
                names(&both)
            ));
            if let Some((m, c, r)) = h {
                s.push_str(&format!(", and on H100 {m} s at {c} clients (the replay: {r} s)"));
            }
            s.push('.');
        }
        (None, Some((m, c, r))) => s.push_str(&format!(
            ": TensorRT-LLM with {} in fp8 on H100 measures {m} s at {c} clients (the replay: {r} s).",
            names(&both)
        )),
        (None, None) => s.push('.'),
    }
    // TensorRT-LLM's H100 rows that decode at TP16, over two 8-GPU nodes.
    let tp16: Vec<f64> = checks
        .iter()
        .filter(|c| {
            c.row.backend == "trtllm"
                && c.gpu == "h100-sxm"
                && c.row.disagg.and_then(|d| d.decode.parallel.tp) == Some(16)
        })
        .map(|c| 100.0 * c.tpot_error())
        .collect();
    if !tp16.is_empty() {
        let m = analysis::median(&tp16);
        let side = if m < 0.0 { "short" } else { "long" };
        s.push_str(&format!(
            " TensorRT-LLM's {} H100 rows that decode at TP16 span two 8-GPU nodes, whose all-reduces run NCCL's over the scale-out network (an engine's custom all-reduce needs peer access inside one NVLink domain): their TPOT comes out {}% {side} (signed median; 56% short when the custom all-reduce was priced there too).",
            tp16.len(),
            sig2(m.abs()),
        ));
    }
    s.push_str(" Start-up costs inside short runs (ten requests per client), or settings the rows do not record, would explain such figures; the roofline does not.");
    // SGLang's fp8 rows on B200 with 8,192-token prompts at 64 clients or more: the prefill
    // throughput each implies per prefill GPU, measured and replayed.
    let sglang: Vec<&SiliconCheck> = checks
        .iter()
        .filter(|c| {
            c.row.backend == "sglang"
                && c.gpu == "b200"
                && c.row.gemm_quant == "fp8"
                && c.row.isl == 8192
                && c.row.concurrency.unwrap_or(0) >= 64
        })
        .collect();
    let per_gpu = |c: &SiliconCheck, ttft: f64, tpot: f64| -> Option<f64> {
        let gpus = prefill_gpus(&c.row)? as f64;
        let prompt = f64::from(c.row.isl) * mean_length_fraction(c.row.client);
        Some(1e3 * throughput(c, ttft, tpot) * prompt / gpus)
    };
    let middle = |v: Vec<f64>| -> Option<String> {
        if v.is_empty() {
            return None;
        }
        let (lo, hi) = (
            analysis::percentile(&v, 10.0),
            analysis::percentile(&v, 90.0),
        );
        span([lo, hi].into_iter())
    };
    let measured: Vec<f64> = sglang
        .iter()
        .filter_map(|c| per_gpu(c, c.row.ttft_ms, c.row.tpot_ms))
        .collect();
    let replayed: Vec<f64> = sglang
        .iter()
        .filter_map(|c| per_gpu(c, c.ttft_ms, c.tpot_ms))
        .collect();
    let ttfts: Vec<f64> = sglang.iter().map(|c| c.row.ttft_ms / 1e3).collect();
    if let (Some(t), Some(c), Some(m), Some(r)) = (
        middle(ttfts),
        span_whole(sglang.iter().map(|c| c.row.concurrency.unwrap_or(0))),
        middle(measured),
        middle(replayed),
    ) {
        s.push_str(&format!(
            " SGLang's {} fp8 rows on B200 with 8,192-token prompts at 64 clients or more measure {t} s (10th to 90th percentile) at {c} clients, a prefill pool moving {m} prompt tokens/s per GPU (the loop's throughput, the same percentiles), where the replay's pools move {r} and queue less.",
            sglang.len()
        ));
    }
    // The dense rows.
    let dense: Vec<&SiliconCheck> = checks.iter().filter(|c| !c.row.is_moe()).collect();
    let tpot: Vec<f64> = dense.iter().map(|c| 100.0 * c.tpot_error()).collect();
    if let (Some(sim), Some(meas), Some(tpot)) = (
        span_s(dense.iter().map(|c| c.ttft_ms)),
        span_s(dense.iter().map(|c| c.row.ttft_ms)),
        signed_span(&tpot),
    ) {
        s.push_str(&format!(
            " The {n} dense rows ({models}) replay at a TTFT of {sim} s against {meas} s measured, and a TPOT {tpot}.",
            n = dense.len(),
            models = names(&dense),
        ));
    }
    s.push_str(" What the replay leaves out: the engines' KV-transfer queues and bootstrap handshakes, the idle ranks' dummy batches (a rank without work waits for its worker's step at no cost), and multi-token prediction, which the rows do not record.\n");
    s
}

#[cfg(test)]
mod tests {
    use super::{sig2, signed_span, span, span_whole};

    /// Ranges read as VALIDATION.md writes them: two significant figures, thousands
    /// grouped, a single value once.
    #[test]
    fn ranges_have_two_significant_figures() {
        assert_eq!(sig2(0.194), "0.19");
        assert_eq!(sig2(1.56), "1.6");
        assert_eq!(sig2(38.6), "39");
        assert_eq!(sig2(4123.0), "4,100");
        assert_eq!(sig2(12_345.0), "12,000");
        assert_eq!(sig2(-41.6), "-42");
        assert_eq!(
            span([1.2, 0.194, 0.5].into_iter()).as_deref(),
            Some("0.19-1.2")
        );
        assert_eq!(span([4.1, 4.1].into_iter()).as_deref(), Some("4.1"));
        assert_eq!(span(std::iter::empty()), None);
        assert_eq!(
            span_whole([64, 1024, 128].into_iter()).as_deref(),
            Some("64-1,024")
        );
        assert_eq!(span_whole([3].into_iter()).as_deref(), Some("3"));
        assert_eq!(
            signed_span(&[-46.2, -38.4]).as_deref(),
            Some("38-46% short")
        );
        assert_eq!(signed_span(&[5.0, 9.1]).as_deref(), Some("5.0-9.1% long"));
        assert_eq!(
            signed_span(&[-3.0, 8.0]).as_deref(),
            Some("-3.0% to +8.0% off")
        );
    }
}
