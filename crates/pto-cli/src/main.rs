//! The `pto` command.

#![forbid(unsafe_code)]

/// `println!` that returns the failure to write (a closed pipe, a full disk) from the enclosing
/// function instead of panicking.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($t)*).map_err($crate::exit::stdout_failed)?
    }};
}

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
            let message = e.render().to_string();
            let message = message.lines().next().unwrap_or("");
            json_failure(exit::USAGE, message.trim_start_matches("error: "));
            return exit::code(exit::USAGE);
        }
    };
    if let Err(e) = logging::init(cli.verbose, cli.quiet) {
        pto_shm::eprint_line!("pto: {e:#}");
        let code = exit::code_of(&e);
        json_failure(code, &format!("{e:#}"));
        return exit::code(code);
    }
    match command::dispatch(cli) {
        Ok(code) => code,
        // The reader of a pipe left (`pto list | head -1`): end quietly, as SIGPIPE would.
        Err(e) if e.is::<exit::StdoutClosed>() => exit::code(exit::STDOUT_CLOSED),
        Err(e) => {
            pto_shm::eprint_line!("pto: {e:#}");
            let code = exit::code_of(&e);
            // `pto run` printed its object already; `pto check` stops before it prints one.
            if CommandWords::of(&std::env::args().skip(1).collect::<Vec<_>>()).command
                == Some("check")
            {
                json_failure(code, &format!("{e:#}"));
            }
            exit::code(code)
        }
    }
}

/// `pto run|check ... --json` prints one JSON object whatever happens: when the arguments (or
/// the logging settings) are refused before the command starts, the object is made from the
/// words of the command line.
fn json_failure(code: u8, message: &str) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words = CommandWords::of(&args);
    if !matches!(words.command, Some("run" | "check")) || !args.iter().any(|a| a == "--json") {
        return;
    }
    use std::io::Write as _;
    // Nothing more to say if even this cannot be written.
    let _ = writeln!(
        std::io::stdout().lock(),
        "{}",
        serde_json::json!({
            "example": words.example, "ranks": words.value("--ranks").and_then(|r| r.parse::<u64>().ok()),
            "backend": words.value("--backend").or(match words.command {
                Some("run") => Some("shm"),
                _ => Some("local"),
            }), "passed": false, "wall_ms": null, "tasks": null,
            "exit_code": code,
            "error": { "kind": exit::kind(code), "message": message, "root_cause": null, "ranks": [] },
        })
    );
}

/// A command line read without its parser: the subcommand, the first positional argument after
/// it, and the options with their values.
struct CommandWords<'a> {
    command: Option<&'a str>,
    example: Option<&'a str>,
    options: Vec<(&'a str, Option<&'a str>)>,
}

impl<'a> CommandWords<'a> {
    /// Options of `run` and `check` that take no value (every other `--name` takes one).
    const FLAGS: [&'static str; 3] = ["--json", "--verbose", "--quiet"];

    fn of(args: &'a [String]) -> Self {
        let mut w = CommandWords {
            command: None,
            example: None,
            options: Vec::new(),
        };
        let mut it = args.iter().map(String::as_str).peekable();
        while let Some(a) = it.next() {
            if let Some(name) = a.strip_prefix("--").map(|_| a) {
                if let Some((n, v)) = name.split_once('=') {
                    w.options.push((n, Some(v)));
                } else if Self::FLAGS.contains(&name) {
                    w.options.push((name, None));
                } else {
                    let v = it.next_if(|v| !v.starts_with("--"));
                    w.options.push((name, v));
                }
            } else if a.starts_with('-') && a.len() > 1 {
                // -v, -q, -vv: global flags without values.
            } else if w.command.is_none() {
                w.command = Some(a);
            } else if w.example.is_none() {
                w.example = Some(a);
            }
        }
        w
    }

    fn value(&self, name: &str) -> Option<&'a str> {
        self.options
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::CommandWords;

    fn words(line: &str) -> (Option<String>, Option<String>, Option<String>) {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        let w = CommandWords::of(&args);
        (
            w.command.map(String::from),
            w.example.map(String::from),
            w.value("--ranks").map(String::from),
        )
    }

    #[test]
    fn the_command_and_example_are_found_wherever_the_flags_are() {
        let s = |x: &str| Some(x.to_string());
        assert_eq!(
            words("run allgather --ranks 0 --json"),
            (s("run"), s("allgather"), s("0"))
        );
        assert_eq!(
            words("-v run --json allgather --ranks=3"),
            (s("run"), s("allgather"), s("3"))
        );
        assert_eq!(
            words("-vv check --ranks 4 ring --plugin x.so"),
            (s("check"), s("ring"), s("4"))
        );
        assert_eq!(words("--quiet run --json"), (s("run"), None, None));
    }
}
