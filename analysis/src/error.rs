//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while collecting or writing run results.
///
/// File errors carry the path (or, for caller-supplied writers, the logical file name such
/// as `requests.csv`); the underlying error is available through
/// [`std::error::Error::source`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnalysisError {
    /// Reading, writing, creating or flushing a file failed.
    #[error("I/O error on {}", path.display())]
    Io {
        /// The file (or logical output name) concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A results folder or file does not hold what it should.
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The folder or file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Writing a CSV row failed.
    #[error("CSV error in {}", path.display())]
    Csv {
        /// The file (or logical output name) concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: csv::Error,
    },
    /// Serialising or parsing JSON failed.
    #[error("JSON error on {}", path.display())]
    Json {
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// A request record is inconsistent (for example a first token before the arrival).
    #[error("invalid record for request {request_id}: {reason}")]
    InvalidRequest {
        /// The request's id.
        request_id: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A step record is inconsistent (for example a non-finite KV usage).
    #[error("invalid record for step {step}: {reason}")]
    InvalidStep {
        /// The step number.
        step: u64,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl AnalysisError {
    /// An [`AnalysisError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        AnalysisError::Io {
            path: path.into(),
            source,
        }
    }

    /// An [`AnalysisError::Csv`] for `path`.
    pub fn csv(path: impl Into<PathBuf>, source: csv::Error) -> Self {
        AnalysisError::Csv {
            path: path.into(),
            source,
        }
    }
}
