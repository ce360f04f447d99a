//! What a rank count costs, through the Worker as `pto run` uses it: bring-up (forking the
//! chips, joining the world, allocating their window and collectives), a world barrier, a
//! small allreduce, and closing. `pto bench scale` runs it from 2 to 1,024 ranks and fits how
//! each figure grows (docs/design/scale.md).

use std::time::{Duration, Instant};

use pto_comm::ReduceOp;
use pto_core::{DType, KernelRegistry, OrchError, TaskArgs};
use pto_worker::Worker;

use crate::ExampleError;

/// The figures of one rank count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleFigures {
    /// Ranks (chips, one process each).
    pub ranks: usize,
    /// From the first fork until every chip is up with its window and collectives.
    pub bringup: Duration,
    /// One world barrier (rank 0's average over the timed calls).
    pub barrier: Duration,
    /// One allreduce of two f32 (rank 0's average).
    pub allreduce: Duration,
    /// The whole run of the probe program (submission to every chip's answer).
    pub run: Duration,
    /// Closing the Worker (every chip leaves and is reaped, every segment removed).
    pub close: Duration,
}

/// Timed calls per figure for `ranks` ranks: fewer as a call gets dearer.
pub fn iterations(ranks: usize) -> usize {
    (20_000 / ranks.max(1)).clamp(10, 2000)
}

fn orch_err(e: impl std::fmt::Display) -> OrchError {
    OrchError::msg(e.to_string())
}

/// Brings up `ranks` chips, times `iters` world barriers and `iters` two-element allreduces on
/// every chip, and closes them.
///
/// # Errors
///
/// A failed bring-up, run or result read.
pub fn probe(ranks: usize, iters: usize) -> Result<ScaleFigures, ExampleError> {
    let iters = iters.max(1);
    let t0 = Instant::now();
    let w = Worker::builder()
        .chips(ranks)
        .cores(1, 1)
        .collectives(4096)
        .program("scale_probe", KernelRegistry::new(), move |_o, call| {
            let ctx = call
                .comm
                .as_ref()
                .ok_or_else(|| OrchError::msg("scale_probe needs a communicator"))?;
            let comm = ctx.comm();
            let co = ctx.collectives().map_err(orch_err)?;
            for _ in 0..3 {
                comm.barrier().map_err(orch_err)?;
            }
            let t = Instant::now();
            for _ in 0..iters {
                comm.barrier().map_err(orch_err)?;
            }
            let barrier = t.elapsed().as_secs_f64() / iters as f64;
            let mut v = [1.0f32; 2];
            co.allreduce(&mut v, ReduceOp::Sum).map_err(orch_err)?;
            let t = Instant::now();
            for _ in 0..iters {
                co.allreduce(&mut v, ReduceOp::Sum).map_err(orch_err)?;
            }
            let allreduce = t.elapsed().as_secs_f64() / iters as f64;
            let row = crate::programs::row(call.tensor(0)?, call.rank)?;
            row.write(&[barrier, allreduce]).map_err(orch_err)?;
            Ok(())
        })
        .init()?;
    let bringup = t0.elapsed();
    let out = w.tensor(&[ranks, 2], DType::F64)?;
    let o2 = out.clone();
    let all: Vec<usize> = (0..ranks).collect();
    let t = Instant::now();
    w.run(move |h| {
        h.submit_group(&all, "scale_probe", TaskArgs::new().output_existing(&o2))
            .map(|_| ())
    })?;
    let run = t.elapsed();
    let figures: Vec<f64> = out.read::<f64>()?;
    let t = Instant::now();
    w.close();
    let close = t.elapsed();
    let secs = |x: f64| Duration::from_secs_f64(x.max(0.0));
    Ok(ScaleFigures {
        ranks,
        bringup,
        barrier: secs(figures[0]),
        allreduce: secs(figures[1]),
        run,
        close,
    })
}

/// A least-squares fit of `t = a + b·n` and of the exponent `k` in `t ∝ n^k` (the slope of
/// `log t` over `log n`): `(a, b, k)`. `k` near 1 is linear growth, near 2 quadratic.
pub fn fit(points: &[(f64, f64)]) -> (f64, f64, f64) {
    let line = |pts: &[(f64, f64)]| {
        let m = pts.len() as f64;
        if m < 2.0 {
            return (pts.first().map_or(0.0, |p| p.1), 0.0);
        }
        let (sx, sy) = pts.iter().fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
        let (mx, my) = (sx / m, sy / m);
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let b = if sxx > 0.0 { sxy / sxx } else { 0.0 };
        (my - b * mx, b)
    };
    let (a, b) = line(points);
    let logs: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.0 > 0.0 && p.1 > 0.0)
        .map(|p| (p.0.ln(), p.1.ln()))
        .collect();
    let (_, k) = line(&logs);
    (a, b, k)
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn fits_lines_and_powers() {
        let lin: Vec<(f64, f64)> = [2.0, 4.0, 8.0, 16.0]
            .iter()
            .map(|&n| (n, 3.0 + 2.0 * n))
            .collect();
        let (a, b, _) = fit(&lin);
        assert!((a - 3.0).abs() < 1e-9 && (b - 2.0).abs() < 1e-9);
        let quad: Vec<(f64, f64)> = [2.0, 4.0, 8.0, 16.0]
            .iter()
            .map(|&n| (n, 5.0 * n * n))
            .collect();
        let (_, _, k) = fit(&quad);
        assert!((k - 2.0).abs() < 1e-9);
    }
}
