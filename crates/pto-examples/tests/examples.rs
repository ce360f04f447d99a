//! Every example at several rank counts on every backend it supports, checked against its
//! golden. `harness = false` with one thread: on processes the examples run through the
//! Worker, which forks.

use libtest_mimic::{Arguments, Failed, Trial};
use pto_comm::Backend;
use pto_examples::{dist, RunArgs, EXAMPLES};

fn run(name: &'static str, backend: Backend, ranks: usize) -> Result<(), Failed> {
    let ex = pto_examples::find(name).ok_or("no such example")?;
    let args = RunArgs {
        size: None,
        trace: false,
        cores: (1, 2),
        backend,
        on_child_exit: None,
    };
    let out = dist::run(ex, &args, ranks).map_err(|e| e.to_string())?;
    if out.passed {
        Ok(())
    } else {
        Err(out.detail.into())
    }
}

/// Under the happens-before checker, unperturbed and on `schedules` perturbed schedules:
/// every run passes and nothing is reported.
fn checked(
    name: &'static str,
    backend: Backend,
    ranks: usize,
    schedules: u64,
) -> Result<(), Failed> {
    for seed in std::iter::once(None).chain((0..schedules).map(Some)) {
        checked_once(name, backend, ranks, seed).map_err(|e| format!("seed {seed:?}: {e}"))?;
    }
    Ok(())
}

fn checked_once(
    name: &'static str,
    backend: Backend,
    ranks: usize,
    seed: Option<u64>,
) -> Result<(), String> {
    let ex = pto_examples::find(name).ok_or("no such example")?;
    let args = RunArgs {
        size: None,
        trace: false,
        cores: (1, 2),
        backend,
        on_child_exit: None,
    };
    let c =
        pto_examples::check::example_seeded(ex, &args, ranks, seed).map_err(|e| e.to_string())?;
    let out = c.run.map_err(|e| e.to_string())?;
    if !out.passed {
        return Err(out.detail);
    }
    if !c.report.races.is_empty() || !c.report.warnings.is_empty() {
        return Err(pto_comm::check::render(&c.report));
    }
    Ok(())
}

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    let mut trials = Vec::new();
    for ex in EXAMPLES {
        let name = ex.name;
        let plan: Vec<(Backend, Vec<usize>)> = if ex.ranks.is_some() {
            vec![
                (Backend::Local, vec![1, 2, 3, 4, 8]),
                (Backend::Shm, vec![1, 2, 3, 4, 8]),
            ]
        } else if ex.worker.is_some() {
            vec![(Backend::Shm, vec![1, 2, 3, 4])]
        } else {
            vec![(Backend::Local, vec![1])]
        };
        for (backend, ranks) in plan {
            for n in ranks {
                trials.push(Trial::test(
                    format!("{name}_{}_{n}_ranks", backend.name()),
                    move || run(name, backend, n),
                ));
            }
        }
    }
    // Many more ranks than CPUs: the distributed allreduce through the Worker at 128 and 512
    // chips (docs/design/scale.md).
    for n in [128, 512] {
        trials.push(Trial::test(
            format!("allreduce_distributed_shm_{n}_ranks"),
            move || run("allreduce_distributed", Backend::Shm, n),
        ));
    }
    // No false reports: every distributed example under `pto check`, on threads with 20
    // perturbed schedules, on processes (the Worker) with 20 too.
    for ex in EXAMPLES
        .iter()
        .filter(|e| e.ranks.is_some() || e.worker.is_some())
    {
        let name = ex.name;
        for n in [1, 2, 3, 4, 8] {
            if ex.ranks.is_some() {
                trials.push(Trial::test(
                    format!("{name}_checked_local_{n}_ranks"),
                    move || checked(name, Backend::Local, n, 20),
                ));
            }
            if ex.worker.is_some() {
                trials.push(Trial::test(
                    format!("{name}_checked_shm_{n}_ranks"),
                    move || checked(name, Backend::Shm, n, 20),
                ));
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
