//! `pto run <example>`.

use std::process::ExitCode;

use anyhow::{bail, Context};
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
    let args = pto_examples::RunArgs {
        size: a.size,
        trace: a.trace.is_some(),
        cores: (a.aic, a.aiv),
    };
    let result = (ex.run)(&args);
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
        if let Some(t) = &o.trace {
            t.write(path)
                .with_context(|| format!("writing the trace to {}", path.display()))?;
        }
    }
    if a.json {
        println!(
            "{}",
            json!({
                "example": ex.name, "ranks": 1, "backend": "local",
                "passed": passed, "wall_ms": wall_ms, "tasks": tasks,
            })
        );
    } else {
        let verdict = if passed { "PASSED" } else { "FAILED" };
        println!(
            "{}: {verdict} ({tasks} tasks, {wall_ms:.2} ms): {detail}",
            ex.name
        );
        if let Some(p) = &a.trace {
            println!("trace written to {}", p.display());
        }
    }
    if !passed && a.json {
        eprintln!("{}: {detail}", ex.name);
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
