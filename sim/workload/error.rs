//! [`WorkloadError`]: what can go wrong configuring, opening or reading a workload, each
//! error naming the key, or the file, line and column, a user must fix; and the small checks
//! the configuration's validation shares.

use std::path::{Path, PathBuf};

/// Errors from configuring, opening or reading a workload.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A configuration value is missing, misplaced or out of range.
    #[error("{key}: {message}")]
    Config {
        /// Dotted key, e.g. `workload.arrival.rate`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A file could not be opened or read.
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The CSV itself is malformed (bad quoting, invalid UTF-8, ...).
    #[error("{path}{}: malformed CSV: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Csv {
        /// The file.
        path: PathBuf,
        /// 1-based line, when known.
        line: Option<u64>,
        /// What the CSV reader reported.
        message: String,
    },
    /// A required column is not in the header.
    #[error("{path}: column `{column}` not found in the header")]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The column name.
        column: String,
    },
    /// A column holds no values.
    #[error("{path}: column `{column}` has no values")]
    EmptyColumn {
        /// The file.
        path: PathBuf,
        /// The column name.
        column: String,
    },
    /// A value in a row is missing or invalid.
    #[error("{path}:{line}: column `{column}`: {message} (got {text:?})")]
    BadValue {
        /// The file.
        path: PathBuf,
        /// 1-based line of the row.
        line: u64,
        /// The column name.
        column: String,
        /// The text found.
        text: String,
        /// What is wrong.
        message: String,
    },
}

impl WorkloadError {
    pub(super) fn config(key: impl Into<String>, message: impl Into<String>) -> Self {
        WorkloadError::Config {
            key: key.into(),
            message: message.into(),
        }
    }

    pub(super) fn csv(path: &Path, err: &csv::Error) -> Self {
        if let csv::ErrorKind::Io(e) = err.kind() {
            return WorkloadError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(e.kind(), e.to_string()),
            };
        }
        WorkloadError::Csv {
            path: path.to_path_buf(),
            line: err.position().map(|p| p.line()),
            message: quoted(&err.to_string()),
        }
    }
}

pub(super) fn check_positive(key: &str, v: f64) -> Result<(), WorkloadError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(WorkloadError::config(
            key,
            format!("must be a positive number, got {v}"),
        ))
    }
}

pub(super) fn check_non_negative(key: &str, v: f64) -> Result<(), WorkloadError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(WorkloadError::config(
            key,
            format!("must be a non-negative number, got {v}"),
        ))
    }
}

pub(super) fn check_bounds(
    key: &str,
    min: Option<u32>,
    max: Option<u32>,
) -> Result<(), WorkloadError> {
    if let Some(max) = max {
        if max == 0 {
            return Err(WorkloadError::config(
                format!("{key}.max"),
                "must be at least 1, got 0",
            ));
        }
        if let Some(min) = min {
            if min > max {
                return Err(WorkloadError::config(
                    format!("{key}.min"),
                    format!("must not exceed {key}.max ({max}), got {min}"),
                ));
            }
        }
    }
    Ok(())
}

pub(super) fn check_path(key: &str, path: &Path) -> Result<(), WorkloadError> {
    if path.as_os_str().is_empty() {
        Err(WorkloadError::config(key, "must not be empty"))
    } else {
        Ok(())
    }
}

/// A value as an error quotes it: at most 80 characters (a broken quote can make a whole
/// file one field).
pub(super) fn quoted(text: &str) -> String {
    if text.chars().count() <= 80 {
        text.to_string()
    } else {
        let head: String = text.chars().take(80).collect();
        format!("{head}... ({} bytes)", text.len())
    }
}
