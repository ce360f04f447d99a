//! `pto bench scale`: bring-up, a world barrier, a small allreduce and closing through the
//! Worker (as `pto run` uses it), from 2 ranks to `--max-ranks`, with a fit of how each grows;
//! with `--mpi-anchor`, Open MPI's barrier and 1 KiB allreduce (`mpi_bar8.c`) at the same rank
//! counts (up to 512) in the same run.

use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::Context;
use pto_examples::scale::{fit, iterations, probe};
use serde::Serialize;

use crate::cli::BenchArgs;

/// One rank count's figures.
#[derive(Serialize)]
struct Row {
    bench: &'static str,
    ranks: usize,
    bringup_ms: f64,
    bringup_per_rank_us: f64,
    barrier_us: f64,
    allreduce_us: f64,
    run_ms: f64,
    close_ms: f64,
    mpi_barrier_us: Option<f64>,
    mpi_allreduce1k_us: Option<f64>,
}

/// How one figure grows with the rank count.
#[derive(Serialize)]
struct Fit {
    bench: &'static str,
    figure: &'static str,
    /// `a` in `a + b·n`.
    intercept: f64,
    /// `b` in `a + b·n` (per rank).
    per_rank: f64,
    /// `k` in `t ∝ n^k` (1: linear, 2: quadratic).
    exponent: f64,
    unit: &'static str,
    /// The rank counts fitted.
    from: usize,
    to: usize,
}

/// A fitted figure: its name, unit and where a row keeps it.
type Figure = (&'static str, &'static str, fn(&Row) -> f64);

const COLUMNS: [(&str, usize); 9] = [
    ("ranks", 6),
    ("bringup_ms", 11),
    ("per_rank_us", 12),
    ("barrier_us", 11),
    ("allreduce_us", 13),
    ("run_ms", 9),
    ("close_ms", 9),
    ("mpi_bar_us", 11),
    ("mpi_ar1k_us", 12),
];

/// The most ranks the MPI anchor is run at.
const MPI_ANCHOR_MAX_RANKS: usize = 512;

/// The anchor's `barrier_us` and `allreduce1KB_us` at `n` ranks under `mpirun`.
fn mpi_anchor(exe: &Path, n: usize) -> anyhow::Result<(f64, f64)> {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        &n.to_string(),
    ])
    .arg(exe);
    // Open MPI starts 512 oversubscribed ranks in a few minutes here.
    let out = super::anchor::run(
        cmd,
        "mpirun (Open MPI's launcher)",
        std::time::Duration::from_secs(900),
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse::<f64>().ok())
    };
    match (field("barrier_us="), field("allreduce1KB_us=")) {
        (Some(b), Some(a)) => Ok((b, a)),
        _ => anyhow::bail!(
            "the MPI anchor printed no figures at {n} ranks: {} {}",
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<ExitCode> {
    // A missing anchor is reported before the benchmark runs, not as a note after each count.
    if let Some(p) = &a.mpi_anchor {
        if !p.is_file() {
            return Err(crate::exit::Usage(format!(
                "the MPI anchor {} is not a file (build it: mpicc -O2 -o mpi_bar8 mpi_bar8.c, from the shared anchors)",
                p.display()
            ))
            .into());
        }
    }
    let mut counts = Vec::new();
    let mut n = 2;
    while n <= a.max_ranks {
        counts.push(n);
        n *= 2;
    }
    if counts.last() != Some(&a.max_ranks) && a.max_ranks >= 2 {
        counts.push(a.max_ranks);
    }
    if !a.json {
        outln!(
            "# pto bench scale: host {}, backend shm (the Worker's chips), pto {}",
            super::coll_bench::host_name(),
            env!("CARGO_PKG_VERSION")
        );
        outln!("{}", super::stats::table_header(&COLUMNS));
    }
    let mut rows = Vec::new();
    for &n in &counts {
        let f = probe(n, iterations(n)).with_context(|| format!("{n} ranks"))?;
        // Open MPI takes minutes to start and run 1,024 oversubscribed ranks here: the
        // anchor runs up to 512, and a failed anchor run is a note, not the end of the bench.
        let mpi = match &a.mpi_anchor {
            Some(exe) if n <= MPI_ANCHOR_MAX_RANKS => match mpi_anchor(exe, n) {
                Ok(m) => Some(m),
                Err(e) => {
                    eprintln!("note: the MPI anchor at {n} ranks: {e:#}");
                    None
                }
            },
            _ => None,
        };
        let r2 = |x: f64| (x * 100.0).round() / 100.0;
        let row = Row {
            bench: "scale",
            ranks: n,
            bringup_ms: r2(f.bringup.as_secs_f64() * 1e3),
            bringup_per_rank_us: r2(f.bringup.as_secs_f64() * 1e6 / n as f64),
            barrier_us: r2(f.barrier.as_secs_f64() * 1e6),
            allreduce_us: r2(f.allreduce.as_secs_f64() * 1e6),
            run_ms: r2(f.run.as_secs_f64() * 1e3),
            close_ms: r2(f.close.as_secs_f64() * 1e3),
            mpi_barrier_us: mpi.map(|m| m.0),
            mpi_allreduce1k_us: mpi.map(|m| m.1),
        };
        if a.json {
            outln!("{}", serde_json::to_string(&row)?);
        } else {
            let opt = |x: Option<f64>| x.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
            outln!(
                "{}",
                super::stats::table_line(
                    &[
                        row.ranks.to_string(),
                        format!("{:.2}", row.bringup_ms),
                        format!("{:.2}", row.bringup_per_rank_us),
                        format!("{:.2}", row.barrier_us),
                        format!("{:.2}", row.allreduce_us),
                        format!("{:.2}", row.run_ms),
                        format!("{:.2}", row.close_ms),
                        opt(row.mpi_barrier_us),
                        opt(row.mpi_allreduce1k_us),
                    ],
                    &COLUMNS
                )
            );
        }
        rows.push(row);
    }
    // Fits from 64 ranks up (where per-rank costs dominate), or over all counts when fewer.
    let big: Vec<&Row> = if rows.iter().filter(|r| r.ranks >= 64).count() >= 2 {
        rows.iter().filter(|r| r.ranks >= 64).collect()
    } else {
        rows.iter().collect()
    };
    let figures: [Figure; 4] = [
        ("bringup", "ms", |r| r.bringup_ms),
        ("barrier", "us", |r| r.barrier_us),
        ("allreduce", "us", |r| r.allreduce_us),
        ("close", "ms", |r| r.close_ms),
    ];
    for (name, unit, get) in figures {
        let pts: Vec<(f64, f64)> = big.iter().map(|r| (r.ranks as f64, get(r))).collect();
        let (intercept, per_rank, exponent) = fit(&pts);
        let f = Fit {
            bench: "scale_fit",
            figure: name,
            intercept: (intercept * 1000.0).round() / 1000.0,
            per_rank: (per_rank * 1000.0).round() / 1000.0,
            exponent: (exponent * 100.0).round() / 100.0,
            unit,
            from: big.first().map_or(0, |r| r.ranks),
            to: big.last().map_or(0, |r| r.ranks),
        };
        if a.json {
            outln!("{}", serde_json::to_string(&f)?);
        } else {
            outln!(
                "# fit {}..{} ranks: {name} = {:.3} + {:.4}·n {unit} (grows as n^{:.2})",
                f.from,
                f.to,
                f.intercept,
                f.per_rank,
                f.exponent
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
