//! Integration tests of the `sim` package, one binary (they link once).

mod bad_inputs;
mod claims;
mod cli;
mod client;
mod fidelity;
mod fleet;
mod models;
mod mooncake;
mod observed;
mod physics;
mod prefix;
mod properties;
mod real_runtime;
mod replay;
mod scenarios;
mod serve;
mod spec;

/// The real SmolLM2-135M-Instruct Q4_1 GGUF (`SIM_SMOLLM2_GGUF`, or the cache `.ci/run`
/// fills), when present. Tests that need it skip without it on a developer's machine, but
/// not in CI (`CI` set), where a missing file is a failure.
fn smollm2() -> Option<std::path::PathBuf> {
    let p = std::env::var_os("SIM_SMOLLM2_GGUF")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| {
                std::path::PathBuf::from(h)
                    .join(".cache/sim-models/SmolLM2-135M-Instruct.Q4_1.gguf")
            })
        })
        .filter(|p| p.exists());
    if p.is_none() && std::env::var_os("CI").is_some() {
        panic!("CI must provide the SmolLM2 GGUF: .ci/run fetches it into ~/.cache/sim-models");
    }
    p
}
