//! The `pto` command.

#![forbid(unsafe_code)]

mod cli;
mod command;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    match command::dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pto: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
