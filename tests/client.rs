//! The benchmark client between workload and engine (`sim::driver::Client`): a closed loop
//! keeps exactly `concurrency` requests in flight and sends the next one when one ends
//! (plus the think time); `max_in_flight` holds an open loop's arrivals until a slot frees.
//! Checked exactly against the run's own `requests.csv`.

use std::path::Path;

use sim::driver::DriverKind;
use sim::run::{run_scenario, RunOptions};
use sim::scenario::Scenario;

const BASE: &str = r#"
name = "client"
seed = 3

[model]
name = "llama-3-8b"

[hardware]
gpu = "h100-sxm"

[engine]
scheduler = "chunked"

[workload]
num_requests = 300
WORKLOAD

[[workload.class]]
name = "chat"
prompt = { dist = "lognormal", mean = 600, std = 400, min = 16, max = 4000 }
output = { dist = "lognormal", mean = 120, std = 80, min = 4, max = 600 }
"#;

/// `(request id, arrival ns, finish ns)` of every request of `variant`, by id.
fn requests(dir: &Path, variant: &str) -> Vec<(u64, u64, u64)> {
    let mut rdr = csv::Reader::from_path(dir.join(variant).join("requests.csv")).expect("csv");
    let ns = |s: &str| (s.parse::<f64>().expect("seconds") * 1e9).round() as u64;
    let mut rows: Vec<(u64, u64, u64)> = rdr
        .records()
        .map(|r| {
            let r = r.expect("row");
            assert_eq!(&r[16], "length", "every request runs to its length");
            (r[0].parse().expect("id"), ns(&r[2]), ns(&r[5]))
        })
        .collect();
    rows.sort_unstable();
    rows
}

fn run(workload: &str, variants: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("client.toml");
    let text = BASE.replace("WORKLOAD", workload) + variants;
    std::fs::write(&path, text).expect("write");
    let scn = Scenario::load(&path, None).expect("loads");
    let opts = RunOptions {
        out_dir: Some(dir.path().join("out")),
        driver: DriverKind::Inline,
        ..RunOptions::default()
    };
    run_scenario(&scn, &opts).expect("runs");
    dir
}

/// Finish times in order: the times slots free.
fn finishes(rows: &[(u64, u64, u64)]) -> Vec<u64> {
    let mut f: Vec<u64> = rows.iter().map(|r| r.2).collect();
    f.sort_unstable();
    f
}

/// Requests in flight at most, over the run.
fn peak_in_flight(rows: &[(u64, u64, u64)]) -> usize {
    let mut events: Vec<(u64, i32)> = rows.iter().flat_map(|r| [(r.1, 1), (r.2, -1)]).collect();
    // Ends before sends at the same instant (the slot is reused).
    events.sort_unstable();
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        peak = peak.max(now);
    }
    peak as usize
}

#[test]
fn a_closed_loop_sends_the_next_request_when_one_ends() {
    for (concurrency, think_ns) in [(8usize, 0u64), (3, 250_000_000)] {
        let think = think_ns as f64 / 1e9;
        let dir = run(
            &format!(
                r#"arrival = {{ process = "closed-loop", concurrency = {concurrency}, think_time_s = {think} }}"#
            ),
            "",
        );
        let rows = requests(&dir.path().join("out"), "base");
        assert_eq!(rows.len(), 300);
        // The first `concurrency` requests go at once; request k waits for the
        // (k - concurrency)-th end and the think time.
        let ends = finishes(&rows);
        for (k, r) in rows.iter().enumerate() {
            let want = if k < concurrency {
                0
            } else {
                ends[k - concurrency] + think_ns
            };
            assert!(
                r.1.abs_diff(want) <= 1,
                "c={concurrency}: request {k} sent at {} ns, want {want}",
                r.1
            );
        }
        assert_eq!(peak_in_flight(&rows), concurrency);
    }
}

#[test]
fn max_in_flight_holds_arrivals_until_a_slot_frees() {
    let dir = run(
        r#"arrival = { process = "poisson", rate = 40.0 }"#,
        "[[variant]]\nname = \"open\"\n\n[[variant]]\nname = \"capped\"\nworkload.max_in_flight = 6\n",
    );
    let out = dir.path().join("out");
    let (open, capped) = (requests(&out, "open"), requests(&out, "capped"));
    assert!(
        peak_in_flight(&open) > 6,
        "the open loop must exceed the cap"
    );
    assert_eq!(peak_in_flight(&capped), 6);
    // Sent at its arrival, or when the slot of the (k - 6)-th end frees, in order.
    let ends = finishes(&capped);
    let mut last = 0;
    for (k, (o, c)) in open.iter().zip(&capped).enumerate() {
        let slot = if k < 6 { 0 } else { ends[k - 6] };
        let want = o.1.max(slot).max(last);
        assert!(
            c.1.abs_diff(want) <= 1,
            "request {k}: sent {} want {want}",
            c.1
        );
        last = c.1;
    }
}

#[test]
fn a_ramp_starts_the_clients_one_by_one() {
    let dir = run(
        r#"arrival = { process = "closed-loop", concurrency = 4, ramp_up_s = 0.2 }"#,
        "",
    );
    let rows = requests(&dir.path().join("out"), "base");
    // Each send takes the earliest slot: client k's start (k x 0.2 s / 4) or the end of an
    // earlier request, whichever comes first; the four starts are all used.
    let ends = finishes(&rows);
    let mut starts_used = 0;
    for r in &rows {
        let start = starts_used * 50_000_000;
        if starts_used < 4 && r.1.abs_diff(start) <= 1 {
            starts_used += 1;
        } else {
            assert!(
                ends.iter().any(|e| e.abs_diff(r.1) <= 1),
                "request {} sent at {}",
                r.0,
                r.1
            );
        }
    }
    assert_eq!(starts_used, 4);
    assert_eq!(rows[0].1, 0);
    assert_eq!(peak_in_flight(&rows), 4);
}

/// `think_jitter_s`: each pause is the think time plus a uniform draw below the jitter, from
/// the scenario's seed: every later send falls in `[end + think, end + think + jitter)` of
/// some request's end, hardly any exactly at `end + think`, and the same seed gives the same
/// sends.
#[test]
fn a_closed_loop_jitters_each_pause_from_the_seed() {
    let workload = r#"arrival = { process = "closed-loop", concurrency = 4, think_time_s = 0.1, think_jitter_s = 0.05 }"#;
    let dir = run(workload, "");
    let rows = requests(&dir.path().join("out"), "base");
    assert_eq!(rows.len(), 300);
    assert!(peak_in_flight(&rows) <= 4);
    let ends = finishes(&rows);
    let (think, jitter) = (100_000_000u64, 50_000_000u64);
    let mut exact = 0;
    for r in &rows[4..] {
        assert!(
            ends.iter()
                .any(|&e| r.1 + 1 >= e + think && r.1 < e + think + jitter + 1),
            "request {} sent at {} outside every end's pause",
            r.0,
            r.1
        );
        exact += usize::from(ends.iter().any(|&e| r.1.abs_diff(e + think) <= 1));
    }
    assert!(exact < 10, "{exact} sends at exactly the think time");
    let again = run(workload, "");
    assert_eq!(requests(&again.path().join("out"), "base"), rows);
}

/// `(id, arrival ns, first scheduled ns)` of every request of `variant`, by id.
fn scheduled(dir: &Path, variant: &str) -> Vec<(u64, u64, u64)> {
    timelines(dir, variant)
        .into_iter()
        .map(|(id, arrival, scheduled, ..)| (id, arrival, scheduled))
        .collect()
}

/// `cost.request_overhead_ms`: the engine's front end delays every request on its way to
/// the scheduler; its arrival stays the send, so TTFT includes the delay, and a closed
/// loop's clients still send at once.
#[test]
fn the_front_end_delays_requests_on_their_way_to_the_scheduler() {
    let dir = run(
        r#"arrival = { process = "closed-loop", concurrency = 4 }"#,
        "[[variant]]\nname = \"fe\"\ncost.request_overhead_ms = 25.0\n",
    );
    let rows = scheduled(dir.path(), "fe");
    assert_eq!(rows.len(), 300);
    for (id, arrival, scheduled) in &rows {
        assert!(scheduled - arrival >= 25_000_000, "request {id}");
    }
    assert!(
        rows[..4].iter().all(|r| r.1 == 0),
        "the four clients send at once"
    );
}

/// `(id, arrival, first scheduled, first token, finish)` in ns, by id, of `variant`'s
/// `requests.csv` under `dir/out`.
fn timelines(dir: &Path, variant: &str) -> Vec<(u64, u64, u64, u64, u64)> {
    let path = dir.join("out").join(variant).join("requests.csv");
    let mut rdr = csv::Reader::from_path(path).expect("csv");
    let ns = |s: &str| (s.parse::<f64>().expect("seconds") * 1e9).round() as u64;
    let mut rows: Vec<_> = rdr
        .records()
        .map(|r| {
            let r = r.expect("row");
            (
                r[0].parse().expect("id"),
                ns(&r[2]),
                ns(&r[3]),
                ns(&r[4]),
                ns(&r[5]),
            )
        })
        .collect();
    rows.sort_unstable();
    rows
}

/// `cost.frontend_update_us`: one front-end process sends every sequence's output of every
/// step, first come first served. The client sees no token before its step's end, a closed
/// loop's delivered updates cannot come faster than one per `frontend_update_us`, and, once
/// the front end is the bottleneck, first tokens wait behind its backlog: TTFT grows far
/// beyond the engine's while the engine itself runs a smaller batch.
#[test]
fn a_serial_front_end_caps_the_updates_it_delivers() {
    let workload = r#"arrival = { process = "closed-loop", concurrency = 64 }"#;
    let dir = run(
        workload,
        "[[variant]]\nname = \"off\"\n\n[[variant]]\nname = \"slow\"\ncost.frontend_update_us = 1000.0\n",
    );
    let off = timelines(dir.path(), "off");
    let slow = timelines(dir.path(), "slow");
    assert_eq!(off.len(), 300);
    assert_eq!(slow.len(), 300);
    // Every request's tokens were sent by the front end (one update each: no parallel
    // sampling or speculation here): a closed loop's delivered tokens over its span are
    // at most one per 1,000 us.
    let tokens: u64 = {
        let path = dir.path().join("out").join("slow").join("requests.csv");
        let mut rdr = csv::Reader::from_path(path).expect("csv");
        rdr.records()
            .map(|r| r.expect("row")[7].parse::<u64>().expect("output_len"))
            .sum()
    };
    let span = slow.iter().map(|r| r.4).max().expect("rows")
        - slow.iter().map(|r| r.1).min().expect("rows");
    let rate = tokens as f64 / (span as f64 * 1e-9);
    assert!(
        rate <= 1e6 / 1000.0 * 1.001,
        "{rate} tokens/s through a 1,000 us front end"
    );
    // Unloaded, the same engine delivers far faster (its steps carry 64 sequences).
    let span_off =
        off.iter().map(|r| r.4).max().expect("rows") - off.iter().map(|r| r.1).min().expect("rows");
    assert!(
        span_off * 2 < span,
        "{span_off} ns unloaded against {span} ns"
    );
    let ttft = |rows: &[(u64, u64, u64, u64, u64)]| {
        let mut v: Vec<u64> = rows.iter().map(|r| r.3 - r.1).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    assert!(
        ttft(&slow) > 3 * ttft(&off),
        "median TTFT {} ns behind the front end, {} ns without",
        ttft(&slow),
        ttft(&off)
    );
    for r in &slow {
        assert!(r.1 <= r.3 && r.3 <= r.4, "request {} in order", r.0);
    }
    // Off, the front end changes nothing: the same run without the key is identical.
    let again = run(
        workload,
        "[[variant]]\nname = \"off\"\ncost.frontend_update_us = 0.0\n",
    );
    assert_eq!(timelines(again.path(), "off"), off);
}

/// `cost.frontend_request_ms`: the front end takes requests one at a time, so a closed
/// loop's clients that send at once are served one after another: the k-th of them reaches
/// the scheduler no sooner than k x the serial time after the send, and no run sends more
/// requests a second than the front end serves.
#[test]
fn a_serial_front_end_takes_requests_one_at_a_time() {
    let dir = run(
        r#"arrival = { process = "closed-loop", concurrency = 8 }"#,
        "[[variant]]\nname = \"fe\"\ncost.frontend_request_ms = 20.0\ncost.request_overhead_ms = 5.0\n",
    );
    let rows = scheduled(dir.path(), "fe");
    assert_eq!(rows.len(), 300);
    assert!(
        rows[..8].iter().all(|r| r.1 == 0),
        "the clients send at once"
    );
    let mut first: Vec<u64> = rows[..8].iter().map(|r| r.2).collect();
    first.sort_unstable();
    for (k, t) in first.iter().enumerate() {
        assert!(
            *t >= (k as u64 + 1) * 20_000_000 + 5_000_000,
            "{k}-th scheduled at {t} ns"
        );
    }
    let last = rows.iter().map(|r| r.2).max().expect("rows");
    assert!(
        last >= 300 * 20_000_000,
        "300 requests through a 20 ms front end by {last} ns"
    );
}
