//! `pto run <example>`.

use std::process::ExitCode;

use anyhow::{bail, Context};
use pto_comm::Backend;
use serde_json::json;

use crate::cli::RunArgs;

pub fn run(a: &RunArgs) -> anyhow::Result<ExitCode> {
    let Some(ex) = pto_examples::find(&a.example) else {
        let names: Vec<&str> = pto_examples::EXAMPLES.iter().map(|e| e.name).collect();
        bail!(
            "no example named {:?}; the examples are: {}",
            a.example,
            names.join(", ")
        );
    };
    let Some(backend) = Backend::from_name(&a.backend) else {
        bail!("unknown backend {:?}: use shm or local", a.backend);
    };
    if a.ranks == 0 || a.ranks > pto_comm::MAX_RANKS {
        bail!("--ranks must be 1 to {}", pto_comm::MAX_RANKS);
    }
    let args = pto_examples::RunArgs {
        size: a.size,
        trace: a.trace.is_some(),
        cores: (a.aic, a.aiv),
        backend,
    };
    // Progress on a terminal only: quiet when output goes to a file or a pipe.
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal() && !a.json;
    if tty {
        eprint!("running {} on {} rank(s)...", ex.name, a.ranks);
    }
    let result = pto_examples::dist::run(ex, &args, a.ranks);
    if tty {
        eprint!("\r\x1b[2K");
    }
    let (passed, detail, wall_ms, tasks) = match &result {
        Ok(o) => (
            o.passed,
            o.detail.clone(),
            o.wall.as_secs_f64() * 1e3,
            o.tasks,
        ),
        Err(e) => (false, format!("error: {e}"), 0.0, 0),
    };
    if let (Some(path), Ok(o)) = (&a.trace, &result) {
        let doc = json!({ "traceEvents": o.events, "displayTimeUnit": "ns" });
        std::fs::write(path, doc.to_string())
            .with_context(|| format!("writing the trace to {}", path.display()))?;
    }
    let backend_name = if ex.ranks.is_some() || ex.worker.is_some() {
        backend.name()
    } else {
        "local"
    };
    if a.json {
        println!(
            "{}",
            json!({
                "example": ex.name, "ranks": a.ranks, "backend": backend_name,
                "passed": passed, "wall_ms": (wall_ms * 1000.0).round() / 1000.0,
            })
        );
        if !passed {
            eprintln!("{}: {detail}", ex.name);
        }
    } else {
        let verdict = if passed { "PASSED" } else { "FAILED" };
        println!(
            "{} on {} rank(s) ({backend_name}): {verdict} ({tasks} tasks, {wall_ms:.2} ms): {detail}",
            ex.name, a.ranks
        );
        if let Some(p) = &a.trace {
            println!("trace written to {}", p.display());
        }
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
