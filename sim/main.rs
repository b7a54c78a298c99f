//! The `sim` command line: parses the arguments and hands them to the subcommand's module
//! in `sim/commands/` (one per subcommand); prints what it wrote, or its error in one line
//! with exit code 2.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[macro_use]
mod commands;

use commands::*;

/// Actor-based discrete-event simulator of LLM inference serving.
#[derive(Parser)]
#[command(name = "sim", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands; each one's help is its `Args` documentation.
#[derive(Subcommand)]
enum Command {
    Run(run::Args),
    Speculate(speculate::Args),
    Compare(compare::Args),
    Report(report::Args),
    Merge(merge::Args),
    Generate(generate::Args),
    Serve(serve::Args),
    Doctor(doctor::Args),
    CudaCheck(cuda_check::Args),
    CudaOracle(cuda_oracle::Args),
    CpuBench(cpu_bench::Args),
    CudaBench(cuda_bench::Args),
    Validate(validate::Args),
    ValidateModel(validate_model::Args),
    Plan(plan::Args),
    Claims(claims::Args),
    Calibrate(calibrate::Args),
    Replay(replay::Args),
    Fidelity(fidelity::Args),
    Bench(bench::Args),
    Models(models::Args),
    Gpus(gpus::Args),
}

fn dispatch(command: Command, out: &mut String) -> anyhow::Result<()> {
    match command {
        Command::Run(a) => run::run(a, out),
        Command::Speculate(a) => speculate::run(a, out),
        Command::Compare(a) => compare::run(a, out),
        Command::Report(a) => report::run(a, out),
        Command::Merge(a) => merge::run(a, out),
        Command::Generate(a) => generate::run(a, out),
        Command::Serve(a) => serve::run(a, out),
        Command::Doctor(a) => doctor::run(a, out),
        Command::CudaCheck(a) => cuda_check::run(a, out),
        Command::CudaOracle(a) => cuda_oracle::run(a, out),
        Command::CpuBench(a) => cpu_bench::run(a, out),
        Command::CudaBench(a) => cuda_bench::run(a, out),
        Command::Validate(a) => validate::run(a, out),
        Command::ValidateModel(a) => validate_model::run(a, out),
        Command::Plan(a) => plan::run(a, out),
        Command::Claims(a) => claims::run(a, out),
        Command::Calibrate(a) => calibrate::run(a, out),
        Command::Replay(a) => replay::run(a, out),
        Command::Fidelity(a) => fidelity::run(a, out),
        Command::Bench(a) => bench::run(a, out),
        Command::Models(a) => models::run(a, out),
        Command::Gpus(a) => gpus::run(a, out),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // One line, as every other error: clap's first (the usage hint follows it).
            let text = e.to_string();
            eprintln!("{}", text.lines().next().unwrap_or("error: bad arguments"));
            return ExitCode::from(2);
        }
    };
    let mut out = String::new();
    let result = dispatch(cli.command, &mut out);
    // A reader that went away (a closed pipe) is not an error of ours.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes());
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the cause chain, skipping causes the outer message already quotes.
            let mut line = String::new();
            for cause in e.chain() {
                let text = cause.to_string().replace('\n', " ");
                if !line.contains(&text) {
                    if !line.is_empty() {
                        line.push_str(": ");
                    }
                    line.push_str(&text);
                }
            }
            eprintln!("error: {line}");
            ExitCode::from(2)
        }
    }
}
