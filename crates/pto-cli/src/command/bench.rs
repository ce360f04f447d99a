//! `pto bench`.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::bail;
use pto::prelude::*;
use serde_json::json;

use crate::cli::{BenchArgs, BenchKind, DagPattern};

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
    // out = a + b + 1 (the diamond's task: two inputs from the layer before).
    k.register("join", CoreKind::Aiv, |ctx| {
        let a = ctx.input::<i64>(0)?.iter().next().unwrap_or(0);
        let b = ctx.input::<i64>(1)?.iter().next().unwrap_or(0);
        ctx.output::<i64>(2)?
            .fill(a.wrapping_add(b).wrapping_add(1));
        Ok(())
    })?;
    // Busy-waits for scalar 0 nanoseconds, then writes 1 (the granularity probe's task).
    k.register("busy", CoreKind::Aiv, |ctx| {
        let ns = ctx.scalar::<u64>(0)?;
        let t = Instant::now();
        while (t.elapsed().as_nanos() as u64) < ns {
            std::hint::spin_loop();
        }
        ctx.output::<i64>(0)?.fill(1);
        Ok(())
    })?;
    Ok(k)
}

/// Context switches of this process so far (every thread's, voluntary and not), from
/// `/proc/self/task/*/status`.
fn context_switches() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|s| {
            s.lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// Width of the diamond's layers.
const WIDTH: usize = 8;

/// Runs one pattern; returns nanoseconds per task, context switches per task and the most
/// tasks live at once (how far the orchestrating thread ran ahead of the cores).
fn pattern(chip: &Chip, name: &str, n: usize, busy_ns: u64) -> anyhow::Result<(f64, f64, usize)> {
    let cell = Tensor::zeros(&[1], DType::I64)?;
    let cells = Tensor::zeros(&[n.max(1)], DType::I64)?;
    // The diamond's two layers, reused in turn.
    let layers = Tensor::zeros(&[2, WIDTH], DType::I64)?;
    let (c1, cs, ls) = (cell.clone(), cells.clone(), layers.clone());
    // The pattern as a number, so the submit loop compares no strings.
    let kind = match name {
        "chain" => 0,
        "diamond" => 1,
        "busy" => 2,
        _ => 3,
    };
    let program = Program::new(name, bench_kernels()?, move |o| {
        if kind != 0 {
            o.submit("set1", TaskArgs::new().output_existing(&c1))?;
        }
        let mut i = 0;
        while i < n {
            let end = (i + SCOPE).min(n);
            o.scope(|o| {
                for j in i..end {
                    match kind {
                        0 => {
                            o.submit("inc", TaskArgs::new().inout(&c1))?;
                        }
                        1 => {
                            // Task j is column j % WIDTH of layer j / WIDTH: it reads columns
                            // c and c + 1 of the layer before.
                            let (layer, c) = (j / WIDTH, j % WIDTH);
                            let (src, dst) = ((layer + 1) % 2, layer % 2);
                            let a = ls.view(&[1, 1], &[src, c])?;
                            let b = ls.view(&[1, 1], &[src, (c + 1) % WIDTH])?;
                            let out = ls.view(&[1, 1], &[dst, c])?;
                            // The views are this task's alone: given up, not cloned.
                            o.submit(
                                "join",
                                TaskArgs::new().input(a).input(b).output_existing(out),
                            )?;
                        }
                        2 => {
                            let e = cs.view(&[1], &[j])?;
                            o.submit("busy", TaskArgs::new().output_existing(e).scalar(busy_ns))?;
                        }
                        _ => {
                            let e = cs.view(&[1], &[j])?;
                            o.submit("fan", TaskArgs::new().input(&c1).output_existing(e))?;
                        }
                    }
                }
                Ok(())
            })?;
            i = end;
        }
        Ok(())
    });
    let cs0 = context_switches();
    let t = Instant::now();
    let report = chip.run(&program)?;
    let ns = t.elapsed().as_secs_f64() * 1e9 / n.max(1) as f64;
    let switches = (context_switches().saturating_sub(cs0)) as f64 / n.max(1) as f64;
    // Check the work was done, so the benchmark cannot pass on a no-op.
    match name {
        "chain" => {
            let v = cell.read::<i64>()?[0];
            if v != n as i64 {
                bail!("chain computed {v}, expected {n}");
            }
        }
        "diamond" => {
            let want = diamond_reference(n);
            let got = layers.read::<i64>()?;
            if got != want {
                bail!("diamond computed {got:?}, expected {want:?}");
            }
        }
        "busy" => {
            if cells.read::<i64>()?.iter().any(|&v| v != 1) {
                bail!("a busy task did not run");
            }
        }
        _ => {
            if cells.read::<i64>()?.iter().any(|&v| v != 2) {
                bail!("fan computed a wrong cell");
            }
        }
    }
    Ok((ns, switches, report.stats.peak_ring_tasks))
}

/// The diamond's two layers after `n` tasks, computed sequentially.
fn diamond_reference(n: usize) -> Vec<i64> {
    let mut l = vec![0i64; 2 * WIDTH];
    for j in 0..n {
        let (layer, c) = (j / WIDTH, j % WIDTH);
        let (src, dst) = ((layer + 1) % 2, layer % 2);
        let v = l[src * WIDTH + c]
            .wrapping_add(l[src * WIDTH + (c + 1) % WIDTH])
            .wrapping_add(1);
        l[dst * WIDTH + c] = v;
    }
    l
}

/// The smallest busy-wait task (doubling from 250 ns) at which the chip's threads, running a
/// 1 -> N fan of such tasks, reach half their ideal throughput (Task Bench's METG(50%)).
/// Returns the task length and the efficiency measured at each length.
/// A granularity measurement: the smallest task length that reached 50%, and the efficiency at
/// every length tried.
type Granularity = (Option<u64>, Vec<(u64, f64)>);

fn granularity(chip: &Chip, threads: usize) -> anyhow::Result<Granularity> {
    let mut seen = Vec::new();
    let mut d = 250u64;
    while d <= 1 << 20 {
        // About 60 ms of ideal work per measurement.
        let n = ((60_000_000 * threads as u64) / d).clamp(2_000, 200_000) as usize;
        pattern(chip, "busy", n.min(2_000), d)?; // warm-up
        let (ns, _, _) = pattern(chip, "busy", n, d)?;
        let ideal = d as f64 / threads as f64;
        let eff = ideal / ns;
        seen.push((d, eff));
        if eff >= 0.5 {
            return Ok((Some(d), seen));
        }
        d *= 2;
    }
    Ok((None, seen))
}

use super::stats::median;

/// The OpenMP anchor's nanoseconds per task: chain, fan, and the diamond when the anchor
/// measures it (`scripts/anchors/omp_deps.c` does).
type OmpRun = (f64, f64, Option<f64>);

/// Runs the OpenMP anchor and parses `chain_ns_per_task=`, `fan_ns_per_task=` and, if there,
/// `diamond_ns_per_task=`.
fn omp(path: &Path, n: usize, threads: usize) -> anyhow::Result<OmpRun> {
    let mut cmd = std::process::Command::new(path);
    cmd.arg(n.to_string())
        .env("OMP_NUM_THREADS", threads.to_string());
    // libgomp runs 200 000 tasks in well under a second here.
    let out = super::anchor::run(
        cmd,
        &format!("the OpenMP anchor {}", path.display()),
        std::time::Duration::from_secs(300),
    )?;
    if !out.status.success() {
        bail!(
            "the OpenMP anchor {} failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let find = |key: &str| -> Option<f64> {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
    };
    let field = |key: &str| -> anyhow::Result<f64> {
        find(key).ok_or_else(|| {
            crate::exit::Usage(format!(
                "{} is not the OpenMP anchor: no {key} in its output {text:?} (build it: gcc -O2 -fopenmp -o omp_deps scripts/anchors/omp_deps.c)",
                path.display()
            ))
            .into()
        })
    };
    Ok((
        field("chain_ns_per_task=")?,
        field("fan_ns_per_task=")?,
        find("diamond_ns_per_task="),
    ))
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<ExitCode> {
    match a.what {
        BenchKind::Dag => {}
        BenchKind::Comm
        | BenchKind::Allreduce
        | BenchKind::Allgather
        | BenchKind::ReduceScatter
        | BenchKind::Broadcast
        | BenchKind::AllToAll => return super::comm_bench::bench(a),
        BenchKind::Deferred => return super::deferred_bench::bench(a),
        BenchKind::Worker => return super::worker_bench::bench(a),
        BenchKind::Scale => return super::scale_bench::bench(a),
        BenchKind::Plugin => return super::plugin_bench::bench(a),
    }
    // A missing anchor is reported before the benchmark runs, not after it.
    if let Some(p) = &a.omp_anchor {
        if !p.is_file() {
            return Err(crate::exit::Usage(format!(
                "the OpenMP anchor {} is not a file (build it: gcc -O2 -fopenmp -o omp_deps scripts/anchors/omp_deps.c)",
                p.display()
            ))
            .into());
        }
    }
    let cpus = std::thread::available_parallelism().map_or(2, usize::from);
    let threads = a.threads.unwrap_or(cpus);
    let chip = Chip::builder()
        .aic_cores(2)
        .aiv_cores(4)
        .threads(threads)
        .build()?;
    let reps = a.reps.max(1);
    let wanted = |p: DagPattern| a.pattern.is_empty() || a.pattern.contains(&p);
    let patterns: Vec<&str> = [
        ("chain", DagPattern::Chain),
        ("fan", DagPattern::Fan),
        ("diamond", DagPattern::Diamond),
    ]
    .into_iter()
    .filter(|&(_, p)| wanted(p))
    .map(|(name, _)| name)
    .collect();
    for name in &patterns {
        pattern(&chip, name, a.tasks.min(10_000), 0)?; // warm-up
    }
    // pto and the OpenMP anchor take turns, one repetition each: on a shared virtual machine
    // the CPUs' speed drifts within seconds, and a baseline measured after all of pto's
    // repetitions would see another machine. Each repetition's ratio pairs two runs seconds
    // apart; the median of those is reported.
    let mut runs: Vec<Vec<(f64, f64, usize)>> = vec![Vec::new(); patterns.len()];
    let mut omp_runs: Vec<OmpRun> = Vec::new();
    for _ in 0..reps {
        for (i, name) in patterns.iter().enumerate() {
            runs[i].push(pattern(&chip, name, a.tasks, 0)?);
        }
        if let Some(p) = &a.omp_anchor {
            omp_runs.push(omp(p, a.tasks, threads)?);
        }
    }
    for (name, runs) in patterns.iter().zip(&runs) {
        let ns = median(runs.iter().map(|r| r.0).collect());
        let switches = median(runs.iter().map(|r| r.1).collect());
        let peak = runs.iter().map(|r| r.2).max().unwrap_or(0);
        // This pattern's OpenMP figure in each repetition, if the anchor measured it.
        let base: Vec<Option<f64>> = omp_runs
            .iter()
            .map(|o| match *name {
                "chain" => Some(o.0),
                "fan" => Some(o.1),
                _ => o.2,
            })
            .collect();
        let paired: Vec<f64> = runs
            .iter()
            .zip(&base)
            .filter_map(|(r, b)| b.map(|b| r.0 / b))
            .collect();
        let base: Vec<f64> = base.into_iter().flatten().collect();
        let base = (!base.is_empty()).then(|| (median(base), median(paired)));
        if a.json {
            let mut v = json!({
                "bench": "dag", "pattern": name, "tasks": a.tasks, "threads": threads,
                "orchestrator_cpu": chip.config().orchestrator_cpu,
                "ns_per_task": (ns * 10.0).round() / 10.0,
                "context_switches_per_task": (switches * 10_000.0).round() / 10_000.0,
                "peak_live_tasks": peak,
            });
            if let Some((b, ratio)) = base {
                v["openmp_ns_per_task"] = json!(b);
                v["ratio_vs_openmp"] = json!((ratio * 1000.0).round() / 1000.0);
            }
            outln!("{v}");
        } else {
            let openmp = base
                .map(|(b, ratio)| format!("   OpenMP {b:.1} ns/task, ratio {ratio:.3}"))
                .unwrap_or_default();
            outln!(
                "{name:<8} {ns:>9.1} ns/task, {switches:.4} context switches/task, at most {peak} live ({} tasks, {threads} threads){openmp}",
                a.tasks
            );
        }
    }
    if !wanted(DagPattern::Granularity) {
        return Ok(ExitCode::SUCCESS);
    }
    let (min, seen) = granularity(&chip, threads)?;
    if a.json {
        outln!(
            "{}",
            json!({
                "bench": "dag_granularity", "threads": threads,
                "min_task_ns": min,
                "efficiency": seen.iter().map(|(d, e)| json!({"task_ns": d, "efficiency": (e * 1000.0).round() / 1000.0})).collect::<Vec<_>>(),
            })
        );
    } else {
        let steps: Vec<String> = seen
            .iter()
            .map(|(d, e)| format!("{d} ns: {:.0}%", e * 100.0))
            .collect();
        match min {
            Some(d) => outln!(
                "granularity: 50% efficiency from {d} ns tasks on {threads} threads ({})",
                steps.join(", ")
            ),
            None => outln!(
                "granularity: 50% not reached up to 1 ms tasks ({})",
                steps.join(", ")
            ),
        }
    }
    Ok(ExitCode::SUCCESS)
}
