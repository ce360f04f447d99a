//! The `pto` command.

#![forbid(unsafe_code)]

mod cli;
mod command;
mod exit;
mod logging;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with 0; every parse error is a usage error (2).
            let _ = e.print();
            if !e.use_stderr() {
                return std::process::ExitCode::SUCCESS;
            }
            // `pto run ... --json` prints one JSON object whatever happens.
            let args: Vec<String> = std::env::args().collect();
            if args.get(1).is_some_and(|a| a == "run") && args.iter().any(|a| a == "--json") {
                let message = e.render().to_string();
                let message = message
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim_start_matches("error: ");
                println!(
                    "{}",
                    serde_json::json!({
                        "example": args.get(2), "passed": false, "exit_code": exit::USAGE,
                        "error": { "kind": "usage", "message": message, "root_cause": null, "ranks": [] },
                    })
                );
            }
            return exit::code(exit::USAGE);
        }
    };
    if let Err(e) = logging::init(cli.verbose, cli.quiet) {
        pto_shm::eprint_line!("pto: {e:#}");
        return exit::code(exit::code_of(&e));
    }
    match command::dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            pto_shm::eprint_line!("pto: {e:#}");
            exit::code(exit::code_of(&e))
        }
    }
}
