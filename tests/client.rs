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

/// `cost.request_overhead_ms`: the engine's front end delays every request on its way to
/// the scheduler; its arrival stays the send, so TTFT includes the delay, and a closed
/// loop's clients still send at once.
#[test]
fn the_front_end_delays_requests_on_their_way_to_the_scheduler() {
    let dir = run(
        r#"arrival = { process = "closed-loop", concurrency = 4 }"#,
        "[[variant]]\nname = \"fe\"\ncost.request_overhead_ms = 25.0\n",
    );
    let path = dir.path().join("out").join("fe").join("requests.csv");
    let mut rdr = csv::Reader::from_path(path).expect("csv");
    let ns = |s: &str| (s.parse::<f64>().expect("seconds") * 1e9).round() as u64;
    let mut rows: Vec<(u64, u64, u64)> = rdr
        .records()
        .map(|r| {
            let r = r.expect("row");
            (r[0].parse().expect("id"), ns(&r[2]), ns(&r[3]))
        })
        .collect();
    rows.sort_unstable();
    assert_eq!(rows.len(), 300);
    for (id, arrival, scheduled) in &rows {
        assert!(scheduled - arrival >= 25_000_000, "request {id}");
    }
    assert!(
        rows[..4].iter().all(|r| r.1 == 0),
        "the four clients send at once"
    );
}
