//! `pto check`: an example or a plugin's program under the happens-before checker. Exit 0 when
//! no race was found and the run passed, 5 when races were found, else the run's own code.

use std::process::ExitCode;

use pto_comm::check::{render, Access, Blocked, BlockedIn, CheckReport};
use pto_examples::check::Checked;
use serde_json::{json, Value};

use crate::cli::CheckArgs;
use crate::exit::{self, Usage};

fn access_json(a: &Access) -> Value {
    json!({
        "rank": a.rank, "op": a.op, "kind": format!("{:?}", a.kind).to_lowercase(),
        "task": a.task, "kernel": a.kernel, "target_rank": a.target,
        "buffer": a.buffer, "range": [a.range.0, a.range.1],
    })
}

/// A blocked rank: `on_ranks` is the last notifier of a signal wait (`"in": "signal"`), or the
/// members that have not arrived at a barrier or collective (`"in": "join"`).
fn blocked_json(b: &Blocked) -> Value {
    let kind = match b.kind {
        BlockedIn::Signal => "signal",
        BlockedIn::Join => "join",
    };
    json!({"rank": b.rank, "waits_on": b.what, "in": kind, "on_ranks": b.on})
}

fn report_json(r: &CheckReport) -> Value {
    json!({
        "races": r.races.iter().map(|x| json!({
            "window": x.window, "first": access_json(&x.first), "second": access_json(&x.second),
            "advice": x.advice, "message": x.to_string(),
        })).collect::<Vec<_>>(),
        "warnings": r.warnings,
        "accesses": r.accesses, "edges": r.edges,
        "blocked": r.blocked.iter().map(blocked_json).collect::<Vec<_>>(),
        "cycle": r.cycle,
    })
}

fn one(a: &CheckArgs, args: &pto_examples::RunArgs, seed: Option<u64>) -> anyhow::Result<Checked> {
    match &a.plugin {
        Some(path) => {
            let p = pto_plugin::Plugin::load(path)?;
            if !p.has_program(&a.example) {
                return Err(Usage(format!(
                    "plugin {} has no program {:?}; its programs are: {}",
                    p.path(),
                    a.example,
                    p.programs().collect::<Vec<_>>().join(", ")
                ))
                .into());
            }
            pto_examples::check::plugin(&p, &a.example, args, a.ranks, seed)
        }
        None => {
            let Some(ex) = pto_examples::find(&a.example) else {
                return Err(
                    Usage(format!("no example named {:?} (see pto list)", a.example)).into(),
                );
            };
            pto_examples::check::example_seeded(ex, args, a.ranks, seed)
        }
    }
    .map_err(|e| match e {
        pto_examples::ExampleError::Args(m) => anyhow::Error::from(Usage(m)),
        e => e.into(),
    })
}

pub fn check(a: &CheckArgs) -> anyhow::Result<ExitCode> {
    pto::config::check_all()?;
    let args = pto_examples::RunArgs {
        size: a.chip.size,
        trace: false,
        cores: (a.chip.aic, a.chip.aiv),
        backend: a.backend.backend(),
        on_child_exit: None,
    };
    if a.json {
        exit::json_on_signal(&a.example, Some(a.ranks), a.backend.backend().name());
    }
    let perturbed = a.schedules > 1 || a.seed.is_some();
    let base = a.seed.unwrap_or(0);
    let mut worst = 0u8;
    let mut schedules = Vec::new();
    for k in 0..a.schedules {
        let seed = perturbed.then(|| base.wrapping_add(k as u64));
        let checked = one(a, &args, seed)?;
        let r = &checked.report;
        let (run_passed, run_detail, run_code) = match &checked.run {
            Ok(o) if o.passed => (true, o.detail.clone(), 0),
            // A rank that failed or timed out is a runtime failure (3), as in `pto run`.
            Ok(o) => (false, o.detail.clone(), super::run::verdict_code(o)),
            Err(e) => (false, e.to_string(), exit::of_fault(e.fault())),
        };
        let code = if !r.races.is_empty() {
            exit::RACE
        } else {
            run_code
        };
        // A race anywhere is what the check reports; otherwise the worst run.
        if worst != exit::RACE && (code == exit::RACE || code > worst) {
            worst = code;
        }
        let mut v = report_json(r);
        v["seed"] = json!(seed);
        v["run"] = json!({"passed": run_passed, "detail": run_detail});
        v["exit_code"] = json!(code);
        if !a.json {
            let races = match r.races.len() {
                0 => "no race".to_string(),
                1 => "1 race".to_string(),
                n => format!("{n} races"),
            };
            let sched = match seed {
                Some(s) => format!(", schedule {} of {} (seed {s})", k + 1, a.schedules),
                None => String::new(),
            };
            if code != 0 || a.schedules == 1 {
                let text = render(r);
                if !text.is_empty() {
                    outln!("{}", text.trim_end_matches('\n'));
                }
                outln!(
                    "{} on {} rank(s) (checked{sched}): {races} ({} window accesses, {} ordering edges); the run {}: {run_detail}",
                    a.example,
                    a.ranks,
                    r.accesses,
                    r.edges,
                    if run_passed { "passed" } else { "failed" },
                );
            }
        }
        schedules.push(v);
    }
    if a.json {
        let failing: Vec<&Value> = schedules.iter().filter(|s| s["exit_code"] != 0).collect();
        let first = failing.first().copied().unwrap_or(&schedules[0]).clone();
        let mut v = first;
        v["example"] = json!(a.example);
        v["ranks"] = json!(a.ranks);
        v["backend"] = json!(a.backend.backend().name());
        v["schedules"] = json!(a.schedules);
        v["failing_seeds"] = json!(failing
            .iter()
            .map(|s| s["seed"].clone())
            .collect::<Vec<_>>());
        v["exit_code"] = json!(worst);
        // A signal ending the process already prints its own object.
        if let Some(_report) = pto_shm::cleanup::FinalReport::begin() {
            outln!("{v}");
        }
    } else if a.schedules > 1 {
        let bad = schedules.iter().filter(|s| s["exit_code"] != 0).count();
        outln!(
            "{} on {} rank(s): {bad} of {} schedules failed{}",
            a.example,
            a.ranks,
            a.schedules,
            if bad == 0 {
                String::new()
            } else {
                " (each line above names the seed that reproduces it with --seed S --schedules 1)"
                    .into()
            }
        );
    }
    Ok(exit::code(worst))
}
