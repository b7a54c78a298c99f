//! The subcommands of `sim`, one module each (as cargo's `commands/`): its clap arguments
//! (`Args`) and its `run(args, out)`, which prints into `out` and returns an `anyhow` error
//! for `main` to report in one line. Output is buffered and written once at the end, so a
//! reader that goes away (`sim run ... | head`) never makes printing panic.
//!
//! Shared printing helpers live here: [`outln!`] and [`gb`].

/// Appends a formatted line to the output buffer.
macro_rules! outln {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

pub mod bench;
pub mod calibrate;
pub mod claims;
pub mod compare;
pub mod cpu_bench;
pub mod cuda_bench;
pub mod cuda_check;
pub mod cuda_oracle;
pub mod doctor;
pub mod fidelity;
pub mod generate;
pub mod gpus;
pub mod merge;
pub mod models;
pub mod plan;
pub mod replay;
pub mod report;
pub mod run;
pub mod serve;
pub mod speculate;
pub mod validate;
pub mod validate_model;

/// Bytes as gigabytes with two decimals (`80.00 GB`).
pub fn gb(bytes: f64) -> String {
    format!("{:.2} GB", bytes / 1e9)
}
