//! `pto bench`.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context};
use pto::prelude::*;
use serde_json::json;

use crate::cli::{BenchArgs, BenchKind};

/// Tasks per scope: bounds the live tasks of a scope well below the ring window.
const SCOPE: usize = 1024;

fn bench_kernels() -> anyhow::Result<KernelRegistry> {
    let mut k = KernelRegistry::new();
    k.register("inc", CoreKind::Aiv, |ctx| {
        ctx.output::<i64>(0)?.for_each_mut(|x| *x += 1);
        Ok(())
    })?;
    k.register("set1", CoreKind::Aiv, |ctx| {
        ctx.output::<i64>(0)?.fill(1);
        Ok(())
    })?;
    k.register("fan", CoreKind::Aiv, |ctx| {
        let v = ctx.input::<i64>(0)?.get(&[0]).unwrap_or(0);
        ctx.output::<i64>(1)?.fill(v + 1);
        Ok(())
    })?;
    Ok(k)
}

/// Runs one pattern and returns nanoseconds per task.
fn pattern(chip: &Chip, name: &str, n: usize) -> anyhow::Result<f64> {
    let cell = Tensor::zeros(&[1], DType::I64)?;
    let cells = Tensor::zeros(&[n.max(1)], DType::I64)?;
    let (c1, cs) = (cell.clone(), cells.clone());
    let chain = name == "chain";
    let program = Program::new(name, bench_kernels()?, move |o| {
        if !chain {
            o.submit("set1", TaskArgs::new().output_existing(&c1))?;
        }
        let mut i = 0;
        while i < n {
            let end = (i + SCOPE).min(n);
            o.scope(|o| {
                for j in i..end {
                    if chain {
                        o.submit("inc", TaskArgs::new().inout(&c1))?;
                    } else {
                        let e = cs.view(&[1], &[j])?;
                        o.submit("fan", TaskArgs::new().input(&c1).output_existing(&e))?;
                    }
                }
                Ok(())
            })?;
            i = end;
        }
        Ok(())
    });
    let t = Instant::now();
    chip.run(&program)?;
    let ns = t.elapsed().as_secs_f64() * 1e9 / n.max(1) as f64;
    // Check the work was done, so the benchmark cannot pass on a no-op.
    if chain {
        let v = cell.read::<i64>()?[0];
        if v != n as i64 {
            bail!("chain computed {v}, expected {n}");
        }
    } else if cells.read::<i64>()?.iter().any(|&v| v != 2) {
        bail!("fan computed a wrong cell");
    }
    Ok(ns)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the OpenMP anchor and parses `chain_ns_per_task=` and `fan_ns_per_task=`.
fn omp(path: &Path, n: usize, threads: usize) -> anyhow::Result<(f64, f64)> {
    let out = std::process::Command::new(path)
        .arg(n.to_string())
        .env("OMP_NUM_THREADS", threads.to_string())
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| -> anyhow::Result<f64> {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {key} in the anchor's output {text:?}"))
    };
    Ok((field("chain_ns_per_task=")?, field("fan_ns_per_task=")?))
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<ExitCode> {
    match a.what {
        BenchKind::Dag => {}
        BenchKind::Comm | BenchKind::Allreduce => return super::comm_bench::bench(a),
        BenchKind::Deferred => return super::deferred_bench::bench(a),
        BenchKind::Worker => return super::worker_bench::bench(a),
    }
    let cpus = std::thread::available_parallelism().map_or(2, usize::from);
    let threads = a.threads.unwrap_or(cpus);
    let chip = Chip::builder()
        .aic_cores(2)
        .aiv_cores(4)
        .threads(threads)
        .build()?;
    let reps = a.reps.max(1);
    let mut results = Vec::new();
    for name in ["chain", "fan"] {
        pattern(&chip, name, a.tasks.min(10_000))?; // warm-up
        let ns: Vec<f64> = (0..reps)
            .map(|_| pattern(&chip, name, a.tasks))
            .collect::<anyhow::Result<_>>()?;
        results.push((name, median(ns)));
    }
    let baseline = match &a.omp_anchor {
        Some(p) => {
            let runs: Vec<(f64, f64)> = (0..reps)
                .map(|_| omp(p, a.tasks, threads))
                .collect::<anyhow::Result<_>>()?;
            Some((
                median(runs.iter().map(|r| r.0).collect()),
                median(runs.iter().map(|r| r.1).collect()),
            ))
        }
        None => None,
    };
    for (i, (name, ns)) in results.iter().enumerate() {
        let base = baseline.map(|b| if i == 0 { b.0 } else { b.1 });
        if a.json {
            let mut v = json!({
                "bench": "dag", "pattern": name, "tasks": a.tasks, "threads": threads,
                "ns_per_task": (ns * 10.0).round() / 10.0,
            });
            if let Some(b) = base {
                v["openmp_ns_per_task"] = json!(b);
                v["ratio_vs_openmp"] = json!((ns / b * 1000.0).round() / 1000.0);
            }
            println!("{v}");
        } else {
            print!(
                "{name:<6} {ns:>9.1} ns/task ({} tasks, {threads} threads)",
                a.tasks
            );
            if let Some(b) = base {
                print!("   OpenMP {b:.1} ns/task, ratio {:.3}", ns / b);
            }
            println!();
        }
    }
    Ok(ExitCode::SUCCESS)
}
