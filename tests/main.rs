//! Integration tests of the `sim` package, one binary (they link once).

mod cli;
mod mooncake;
mod physics;
mod prefix;
mod properties;
mod real_runtime;
mod scenarios;
