//! `pto bench plugin --plugin LIB`: what a task of a C plugin's kernel costs beside a built-in
//! Rust kernel's, on one chip, in one run. Two patterns, each timed with the built-in kernel
//! and with the plugin's, interleaved over `--reps` rounds (medians):
//!
//! * `independent`: N tasks without arguments (`noop` against the plugin's `empty`);
//! * `chain`: N tasks on one `i64` INOUT, each after the one before (`inc` here against the
//!   plugin's `plugin_inc`, which adds 1 through `pto_tensor_ptr`); the result is checked.
//!
//! `examples/plugin/empty.c` has both kernels.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::bail;
use pto::prelude::*;
use serde_json::json;

use crate::cli::BenchArgs;

const SCOPE: usize = 1024;

use super::stats::median;

/// Nanoseconds per task of `n` tasks of `kernel` (with `cell` INOUT when `chain`).
fn time(
    chip: &Chip,
    reg: &KernelRegistry,
    kernel: &str,
    n: usize,
    chain: bool,
) -> anyhow::Result<f64> {
    let cell = Tensor::zeros(&[1], DType::I64)?;
    let (c1, k) = (cell.clone(), kernel.to_string());
    let program = Program::new("bench", reg.clone(), move |o| {
        let mut i = 0;
        while i < n {
            let end = (i + SCOPE).min(n);
            o.scope(|o| {
                for _ in i..end {
                    let args = if chain {
                        TaskArgs::new().inout(&c1)
                    } else {
                        TaskArgs::new()
                    };
                    o.submit(k.as_str(), args)?;
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
    if chain {
        let v = cell.read::<i64>()?[0];
        if v != n as i64 {
            bail!("the chain of {kernel} computed {v}, expected {n}");
        }
    }
    Ok(ns)
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<ExitCode> {
    let path = a.plugin.as_ref().ok_or_else(|| {
        crate::exit::Usage(
            "pto bench plugin needs --plugin LIB (build examples/plugin/empty.c)".into(),
        )
    })?;
    let plugin = pto_plugin::Plugin::load(path)?;
    let mut reg = KernelRegistry::new();
    pto::kernels::register_all(&mut reg)?;
    reg.register("inc", CoreKind::Aiv, |ctx| {
        ctx.output::<i64>(0)?.for_each_mut(|x| *x += 1);
        Ok(())
    })?;
    plugin.add_kernels(&mut reg)?;
    for k in ["empty", "plugin_inc"] {
        if reg.lookup(k).is_err() {
            return Err(crate::exit::Usage(format!(
                "plugin {} has no kernel {k:?} (build examples/plugin/empty.c)",
                plugin.path()
            ))
            .into());
        }
    }
    let cpus = std::thread::available_parallelism().map_or(2, usize::from);
    let threads = a.threads.unwrap_or(cpus);
    let chip = Chip::builder()
        .aic_cores(1)
        .aiv_cores(4)
        .threads(threads)
        .build()?;
    let n = a.tasks;
    for (pattern, rust, c, chain) in [
        ("independent", "noop", "empty", false),
        ("chain", "inc", "plugin_inc", true),
    ] {
        time(&chip, &reg, rust, n.min(10_000), chain)?; // warm-up
        time(&chip, &reg, c, n.min(10_000), chain)?;
        let (mut rs, mut cs) = (Vec::new(), Vec::new());
        for _ in 0..a.reps.max(1) {
            rs.push(time(&chip, &reg, rust, n, chain)?);
            cs.push(time(&chip, &reg, c, n, chain)?);
        }
        let (r, c_ns) = (median(rs), median(cs));
        let ratio = c_ns / r;
        let line = json!({
            "bench": "plugin_kernel", "pattern": pattern, "tasks": n, "threads": threads,
            "rust_kernel": rust, "rust_ns_per_task": (r * 10.0).round() / 10.0,
            "c_kernel": c, "c_ns_per_task": (c_ns * 10.0).round() / 10.0,
            "ratio_c_vs_rust": (ratio * 1000.0).round() / 1000.0,
        });
        super::print_line(a.json, &line)?;
    }
    Ok(ExitCode::SUCCESS)
}
