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
    libtest_mimic::run(&args, trials).exit();
}
