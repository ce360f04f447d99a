//! `pto bench worker`: Worker init to ready with 4 chips, the host-level round trip of an
//! empty chip task (the baseline, measured the same way in the same run, is a host run of one
//! dependency-only task: the host DAG without any child), and many chip tasks in one host run.

use std::process::ExitCode;
use std::time::Instant;

use pto::prelude::*;
use pto_worker::Worker;
use serde_json::json;

use crate::cli::BenchArgs;

use super::stats::median;

/// Timed host runs of many chip tasks (after a first, reported on its own).
const TASK_RUNS: usize = 3;

pub fn bench(a: &BenchArgs) -> anyhow::Result<ExitCode> {
    let reps = a.reps.max(1);
    let mut inits = Vec::new();
    // Init with 4 chips (each joins the shm world and brings a chip up), then close.
    for _ in 0..reps {
        let t = Instant::now();
        let w = Worker::builder()
            .chips(4)
            .cores(1, 2)
            .program("empty", KernelRegistry::new(), |_, _| Ok(()))
            .init()?;
        inits.push(t.elapsed().as_secs_f64() * 1e3);
        let _ = w.init_time();
        w.close();
    }
    let w = Worker::builder()
        .chips(4)
        .cores(1, 2)
        .program("empty", KernelRegistry::new(), |_, _| Ok(()))
        // One kernel on 16 floats: what a Python `Worker.run` of `vector_scale` does.
        .program("scale", pto::kernels::registry()?, |o, call| {
            let (a, b) = (call.tensor(0)?, call.tensor(1)?);
            o.submit(
                "vector_scale",
                TaskArgs::new().input(a).output_existing(b).scalar(2.0f64),
            )
            .map(|_| ())
        })
        .init()?;
    let runs = a.tasks.clamp(100, 20_000);
    let time_runs = |f: &dyn Fn() -> anyhow::Result<()>| -> anyhow::Result<f64> {
        for _ in 0..50 {
            f()?;
        }
        let mut v = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            f()?;
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(median(v))
    };
    let chip_us = time_runs(&|| {
        w.run(|h| h.submit_chip(0, "empty", TaskArgs::new()).map(|_| ()))?;
        Ok(())
    })?;
    let (x, y) = (w.tensor(&[16], DType::F32)?, w.tensor(&[16], DType::F32)?);
    let kernel_us = time_runs(&|| {
        let (x, y) = (x.clone(), y.clone());
        w.run(move |h| {
            h.submit_chip(0, "scale", TaskArgs::new().input(&x).output_existing(&y))
                .map(|_| ())
        })?;
        Ok(())
    })?;
    let host_only_us = time_runs(&|| {
        w.run(|h| h.orch().submit_dummy(TaskArgs::new()).map(|_| ()))?;
        Ok(())
    })?;
    // Many chip tasks in one host run, spread over the 4 chips: per-task cost. The first run
    // grows the host's task nodes to the thousands in flight (memory a Worker keeps for its
    // later runs); it is reported on its own, and the figure is the median of the runs after.
    let token = w.tensor(&[1], DType::I32)?;
    let n = runs;
    let tasks_run = || -> anyhow::Result<f64> {
        let token = token.clone();
        let t = Instant::now();
        w.run(move |h| {
            // Scopes bound the live tasks of each (the host ring's window is finite).
            for chunk in (0..n).collect::<Vec<_>>().chunks(1024) {
                h.scope(|h| {
                    for &i in chunk {
                        h.submit_chip(i % 4, "empty", TaskArgs::new().no_dep(&token))?;
                    }
                    Ok(())
                })?;
            }
            Ok(())
        })?;
        Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
    };
    let first_run_us = tasks_run()?;
    let per_task_us = median(
        (0..TASK_RUNS)
            .map(|_| tasks_run())
            .collect::<anyhow::Result<Vec<f64>>>()?,
    );
    w.close();
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let lines = [
        json!({"bench": "worker_init", "chips": 4, "ms": r3(median(inits))}),
        json!({"bench": "worker_chip_roundtrip", "chips": 4, "median_us": r3(chip_us),
               "host_dummy_run_median_us": r3(host_only_us), "ratio_vs_host_only": r3(chip_us / host_only_us)}),
        json!({"bench": "worker_chip_kernel_roundtrip", "chips": 4, "kernel": "vector_scale", "floats": 16, "median_us": r3(kernel_us)}),
        json!({"bench": "worker_chip_tasks", "tasks": n, "us_per_task": r3(per_task_us),
               "runs": TASK_RUNS, "first_run_us_per_task": r3(first_run_us)}),
    ];
    for l in lines {
        super::print_line(a.json, &l)?;
    }
    Ok(ExitCode::SUCCESS)
}
