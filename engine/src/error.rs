//! Errors of the engine crate.

/// What can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A configuration value that cannot work.
    #[error("{key}: {msg}")]
    Config {
        /// Scenario key, e.g. `engine.max_num_seqs`.
        key: String,
        /// What is wrong, with the numbers.
        msg: String,
    },
    /// A backend broke the step protocol or failed.
    #[error("backend: {0}")]
    Backend(String),
    /// The engine holds work but cannot schedule any of it and nothing else will happen.
    #[error("no progress at t = {time_ns} ns: {waiting} waiting and {running} running requests but an empty step")]
    Stalled {
        /// Simulated time.
        time_ns: u64,
        /// Waiting requests.
        waiting: usize,
        /// Running requests.
        running: usize,
    },
    /// An actor mailbox failed.
    #[error("actor mailbox: {0}")]
    Mailbox(String),
}
