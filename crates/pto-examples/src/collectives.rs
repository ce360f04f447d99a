//! The collective examples: every rank runs a chip whose kernels communicate through the rank's
//! window (`allreduce_distributed`) or through `pto_comm::Collectives` (the others), and checks
//! its part of the golden. Inputs follow upstream: `in[r][i] = i + 100·r` unless noted.
//!
//! Their kernels, inputs and goldens are shared with the chip programs (`programs`) and the
//! Worker examples (`worker_examples`).

use std::sync::Arc;

use pto_comm::{BufferSpec, Collectives, Comm, CommContext, ReduceOp, SignalOp, WindowSpec};
use pto_core::{
    Chip, CoreKind, DType, KernelCtx, KernelError, KernelRegistry, Program, RunOptions, TaskArgs,
    Tensor,
};

use crate::dist::RankOutcome;
use crate::{compare, ExampleError, RunArgs};

fn ce(e: pto_comm::CommError) -> KernelError {
    KernelError::msg(e.to_string())
}

fn cctx<'a>(ctx: &'a KernelCtx<'_>) -> Result<&'a CommContext, KernelError> {
    ctx.ext::<CommContext>()
        .ok_or_else(|| KernelError::msg("the chip has no communication context"))
}

/// Kernels that call the collectives on their tensor arguments.
pub(crate) fn kernels() -> Result<KernelRegistry, ExampleError> {
    let mut k = KernelRegistry::new();
    // t0 IN, t1 OUT (same shape, f32): copy.
    k.register("copy_f32", CoreKind::Aiv, |ctx| {
        let v = ctx.input::<f32>(0)?.to_vec();
        ctx.output::<f32>(1)?.assign(&v)?;
        Ok(())
    })?;
    // t0 (INOUT f32): allreduce sum in place.
    k.register("allreduce_sum", CoreKind::Aiv, |ctx| {
        let co = cctx(ctx)?.collectives().map_err(ce)?;
        let mut t = ctx.output::<f32>(0)?;
        let v = t
            .as_mut_slice()
            .ok_or_else(|| KernelError::msg("not contiguous"))?;
        co.allreduce(v, ReduceOp::Sum).map_err(ce)
    })?;
    // t0 IN, t1 OUT: allgather.
    k.register("allgather", CoreKind::Aiv, |ctx| {
        let co = cctx(ctx)?.collectives().map_err(ce)?;
        let mine = ctx.input::<f32>(0)?.to_vec();
        let mut out = ctx.output::<f32>(1)?;
        let o = out
            .as_mut_slice()
            .ok_or_else(|| KernelError::msg("not contiguous"))?;
        co.allgather(&mine, o).map_err(ce)
    })?;
    // t0 IN, t1 OUT (this rank's share).
    k.register("reduce_scatter", CoreKind::Aiv, |ctx| {
        let co = cctx(ctx)?.collectives().map_err(ce)?;
        let data = ctx.input::<f32>(0)?.to_vec();
        let share = co.reduce_scatter(&data, ReduceOp::Sum).map_err(ce)?;
        ctx.output::<f32>(1)?.assign(&share)?;
        Ok(())
    })?;
    // t0 INOUT, scalar 0 = root.
    k.register("broadcast", CoreKind::Aiv, |ctx| {
        let co = cctx(ctx)?.collectives().map_err(ce)?;
        let root = ctx.scalar::<u64>(0)? as usize;
        let mut t = ctx.output::<f32>(0)?;
        let v = t
            .as_mut_slice()
            .ok_or_else(|| KernelError::msg("not contiguous"))?;
        co.broadcast(v, root).map_err(ce)
    })?;
    // t0 IN, t1 OUT.
    k.register("all_to_all", CoreKind::Aiv, |ctx| {
        let co = cctx(ctx)?.collectives().map_err(ce)?;
        let send = ctx.input::<f32>(0)?.to_vec();
        let mut out = ctx.output::<f32>(1)?;
        let o = out
            .as_mut_slice()
            .ok_or_else(|| KernelError::msg("not contiguous"))?;
        co.all_to_all(&send, o).map_err(ce)
    })?;
    // The four-phase allreduce on the window itself. t0 IN (input), t1 OUT (result).
    // Window buffers: "scratch" (f32, count) and "signals" (u32, one line per rank).
    k.register("allreduce_4phase", CoreKind::Aiv, |ctx| {
        let w = cctx(ctx)?.window(0).map_err(ce)?;
        let (me, n) = (w.rank(), w.ranks());
        let scratch = w.buffer("scratch").map_err(ce)?.offset;
        let signals = w.buffer("signals").map_err(ce)?.offset;
        let input = ctx.input::<f32>(0)?.to_vec();
        // 1. Stage in: this rank's input into its own scratch.
        w.put_slice(me, scratch, &input).map_err(ce)?;
        // 2. Signal barrier: tell every peer our scratch is ready; wait for theirs.
        for p in 0..n {
            w.notify(p, signals + 64 * me, 1, SignalOp::Add)
                .map_err(ce)?;
        }
        for p in 0..n {
            w.wait_until(signals + 64 * p, 1).map_err(ce)?;
        }
        // 3. Reduce from every peer (rank order on every rank: identical results).
        let mut acc = vec![0.0f32; input.len()];
        for p in 0..n {
            let v = w.get_vec::<f32>(p, scratch, input.len()).map_err(ce)?;
            for (a, x) in acc.iter_mut().zip(v) {
                *a += x;
            }
        }
        // 4. Stage out.
        ctx.output::<f32>(1)?.assign(&acc)?;
        Ok(())
    })?;
    // Partial matmul on an AIC core: t0 [M,K] IN, t1 [K,N] IN, t2 [M,N] OUT.
    k.register("matmul", CoreKind::Aic, |ctx| {
        let (x, w) = (ctx.input::<f32>(0)?, ctx.input::<f32>(1)?);
        let (m, kk, n) = (x.shape()[0], x.shape()[1], w.shape()[1]);
        let (x, w) = (x.to_vec(), w.to_vec());
        let mut out = vec![0.0f32; m * n];
        matmul_acc(&mut out, &x, &w, kk, n);
        ctx.output::<f32>(2)?.assign(&out)?;
        Ok(())
    })?;
    // t0 INOUT: t0 = t0 * s0 + s1.
    k.register("affine", CoreKind::Aiv, |ctx| {
        let (s, b) = (ctx.scalar::<f32>(0)?, ctx.scalar::<f32>(1)?);
        ctx.output::<f32>(0)?.for_each_mut(|x| *x = *x * s + b);
        Ok(())
    })?;
    Ok(k)
}

fn chip(comm: &Comm, args: &RunArgs, ctx: CommContext) -> Result<Chip, ExampleError> {
    Ok(Chip::builder()
        .chip_id(comm.world_rank() as u32)
        .aic_cores(args.cores.0.max(1))
        .aiv_cores(args.cores.1.max(1))
        .extension(Arc::new(ctx))
        .build()?)
}

pub(crate) fn input(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (i + 100 * r) as f32).collect()
}

fn outcome(passed: bool, detail: String, report: &pto_core::RunReport) -> RankOutcome {
    RankOutcome {
        passed,
        detail,
        tasks: report.stats.tasks,
        events: report
            .trace
            .as_ref()
            .map(|t| t.chrome_events())
            .unwrap_or_default(),
    }
}

pub(crate) fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// The four-phase allreduce kernel. Golden `out[i] = n·i + 100·n(n−1)/2`.
pub(crate) fn allreduce_distributed(
    comm: &Comm,
    args: &RunArgs,
) -> Result<RankOutcome, ExampleError> {
    let (r, n) = (comm.rank(), comm.size());
    let len = args.size.unwrap_or(256).max(1);
    let w = comm.alloc_window(&WindowSpec::for_buffers(vec![
        BufferSpec::new("scratch", DType::F32, len),
        BufferSpec::new("signals", DType::U32, 16 * n),
    ]))?;
    let chip = chip(
        comm,
        args,
        CommContext::new(comm.clone()).with_window(w.clone()),
    )?;
    let tin = Tensor::from_slice(&[len], &input(r, len))?;
    let out = Tensor::zeros(&[len], DType::F32)?;
    let o = out.clone();
    let report = chip.run_with(
        &Program::new("allreduce_distributed", kernels()?, move |orch| {
            orch.submit(
                "allreduce_4phase",
                TaskArgs::new().input(&tin).output_existing(&o),
            )?;
            Ok(())
        }),
        RunOptions { trace: args.trace },
    )?;
    let want: Vec<f64> = (0..len)
        .map(|i| (n * i + 100 * n * (n - 1) / 2) as f64)
        .collect();
    let (passed, detail) = compare("out", &f64s(&out.read::<f32>()?), &want, 1e-6);
    w.release()?;
    Ok(outcome(passed, detail, &report))
}

/// Runs one collective kernel on a chip with a `Collectives` context.
fn with_collectives<F>(
    comm: &Comm,
    args: &RunArgs,
    orch: F,
) -> Result<pto_core::RunReport, ExampleError>
where
    F: Fn(&mut pto_core::Orch<'_>) -> Result<(), pto_core::OrchError> + Send + Sync + 'static,
{
    let co = Collectives::new(comm, 64 << 10)?;
    let chip = chip(
        comm,
        args,
        CommContext::new(comm.clone()).with_collectives(co),
    )?;
    Ok(chip.run_with(
        &Program::new("collective", kernels()?, orch),
        RunOptions { trace: args.trace },
    )?)
}

/// Golden `out[r·C + i] = 100·r + i`.
pub(crate) fn allgather(comm: &Comm, args: &RunArgs) -> Result<RankOutcome, ExampleError> {
    let (r, n) = (comm.rank(), comm.size());
    let c = args.size.unwrap_or(64).max(1);
    let tin = Tensor::from_slice(&[c], &input(r, c))?;
    let out = Tensor::zeros(&[n * c], DType::F32)?;
    let o = out.clone();
    let report = with_collectives(comm, args, move |orch| {
        orch.submit("allgather", TaskArgs::new().input(&tin).output_existing(&o))
            .map(|_| ())
    })?;
    let want: Vec<f64> = (0..n)
        .flat_map(|s| (0..c).map(move |i| (100 * s + i) as f64))
        .collect();
    let (passed, detail) = compare("out", &f64s(&out.read::<f32>()?), &want, 0.0);
    Ok(outcome(passed, detail, &report))
}

/// Input `n·C` elements `i + 100·r`; rank r gets `out[j] = n·(rC + j) + 100·n(n−1)/2`.
pub(crate) fn reduce_scatter(comm: &Comm, args: &RunArgs) -> Result<RankOutcome, ExampleError> {
    let (r, n) = (comm.rank(), comm.size());
    let c = args.size.unwrap_or(64).max(1);
    let tin = Tensor::from_slice(&[n * c], &input(r, n * c))?;
    let out = Tensor::zeros(&[c], DType::F32)?;
    let o = out.clone();
    let report = with_collectives(comm, args, move |orch| {
        orch.submit(
            "reduce_scatter",
            TaskArgs::new().input(&tin).output_existing(&o),
        )
        .map(|_| ())
    })?;
    let want: Vec<f64> = (0..c)
        .map(|j| (n * (r * c + j) + 100 * n * (n - 1) / 2) as f64)
        .collect();
    let (passed, detail) = compare("out", &f64s(&out.read::<f32>()?), &want, 0.0);
    Ok(outcome(passed, detail, &report))
}

/// Root 0 holds `i`; golden `out[i] = i` on every rank.
pub(crate) fn broadcast(comm: &Comm, args: &RunArgs) -> Result<RankOutcome, ExampleError> {
    let r = comm.rank();
    let c = args.size.unwrap_or(256).max(1);
    let data: Vec<f32> = if r == 0 {
        (0..c).map(|i| i as f32).collect()
    } else {
        vec![-1.0; c]
    };
    let t = Tensor::from_slice(&[c], &data)?;
    let t2 = t.clone();
    let report = with_collectives(comm, args, move |orch| {
        orch.submit("broadcast", TaskArgs::new().inout(&t2).scalar(0u64))
            .map(|_| ())
    })?;
    let want: Vec<f64> = (0..c).map(|i| i as f64).collect();
    let (passed, detail) = compare("out", &f64s(&t.read::<f32>()?), &want, 0.0);
    Ok(outcome(passed, detail, &report))
}

/// Rank r sends `1000·r + 100·d + j` to rank d; golden `out[s·C + j] = 1000·s + 100·r + j`.
pub(crate) fn all_to_all(comm: &Comm, args: &RunArgs) -> Result<RankOutcome, ExampleError> {
    let (r, n) = (comm.rank(), comm.size());
    let c = args.size.unwrap_or(32).max(1);
    let send: Vec<f32> = (0..n)
        .flat_map(|d| (0..c).map(move |j| (1000 * r + 100 * d + j) as f32))
        .collect();
    let tin = Tensor::from_slice(&[n * c], &send)?;
    let out = Tensor::zeros(&[n * c], DType::F32)?;
    let o = out.clone();
    let report = with_collectives(comm, args, move |orch| {
        orch.submit(
            "all_to_all",
            TaskArgs::new().input(&tin).output_existing(&o),
        )
        .map(|_| ())
    })?;
    let want: Vec<f64> = (0..n)
        .flat_map(|s| (0..c).map(move |j| (1000 * s + 100 * r + j) as f64))
        .collect();
    let (passed, detail) = compare("out", &f64s(&out.read::<f32>()?), &want, 0.0);
    Ok(outcome(passed, detail, &report))
}

/// Tensor-parallel FFN: rank r computes `x_r · w_r` on an AIC core (`x = (arange + 0.25r)/32`,
/// `w = (arange + 0.5(r+1))/48`, 64×64 each), then an allreduce sum on an AIV core; golden
/// `y = Σ_r x_r · w_r` computed here for every rank in f64.
pub(crate) fn ffn_tp_parallel(comm: &Comm, args: &RunArgs) -> Result<RankOutcome, ExampleError> {
    let (r, n) = (comm.rank(), comm.size());
    let d = args.size.unwrap_or(64).max(1);
    let x_of = |r: usize| -> Vec<f32> {
        (0..d * d)
            .map(|i| (i as f32 + 0.25 * r as f32) / 32.0)
            .collect()
    };
    let w_of = |r: usize| -> Vec<f32> {
        (0..d * d)
            .map(|i| (i as f32 + 0.5 * (r + 1) as f32) / 48.0)
            .collect()
    };
    let tx = Tensor::from_slice(&[d, d], &x_of(r))?;
    let tw = Tensor::from_slice(&[d, d], &w_of(r))?;
    let y = Tensor::zeros(&[d, d], DType::F32)?;
    let y2 = y.clone();
    let report = with_collectives(comm, args, move |orch| {
        // The partial is runtime-allocated; the allreduce depends on it through the TensorMap.
        let partial = orch
            .submit(
                "matmul",
                TaskArgs::new()
                    .input(&tx)
                    .input(&tw)
                    .output(&[d, d], DType::F32),
            )?
            .out(0)?;
        orch.submit("allreduce_sum", TaskArgs::new().inout(&partial))?;
        let v = orch.read::<f32>(&partial)?;
        orch.write(&y2, &v)?;
        Ok(())
    })?;
    let (passed, detail) = compare(
        "y",
        &f64s(&y.read::<f32>()?),
        &shared_ffn_golden(n, d),
        1e-4,
    );
    Ok(outcome(passed, detail, &report))
}

/// Rank r's `x` (d×d): `(arange + 0.25 r) / 32`.
pub(crate) fn ffn_x(r: usize, d: usize) -> Vec<f32> {
    (0..d * d)
        .map(|i| (i as f32 + 0.25 * r as f32) / 32.0)
        .collect()
}

/// Rank r's `w` (d×d): `(arange + 0.5 (r + 1)) / 48`.
pub(crate) fn ffn_w(r: usize, d: usize) -> Vec<f32> {
    (0..d * d)
        .map(|i| (i as f32 + 0.5 * (r + 1) as f32) / 48.0)
        .collect()
}

/// `Σ_r x_r · w_r` in f64, sequentially.
pub(crate) fn ffn_golden(n: usize, d: usize) -> Vec<f64> {
    let mut want = vec![0.0f64; d * d];
    for q in 0..n {
        let (x, w) = (f64s(&ffn_x(q, d)), f64s(&ffn_w(q, d)));
        matmul_acc(&mut want, &x, &w, d, d);
    }
    want
}

/// [`ffn_golden`], computed once per process: ranks that are threads of one process (the
/// local backend) share it instead of each computing every rank's product.
fn shared_ffn_golden(n: usize, d: usize) -> Arc<Vec<f64>> {
    /// The golden of `(ranks, size)`.
    type Golden = Option<((usize, usize), Arc<Vec<f64>>)>;
    static GOLDEN: std::sync::Mutex<Golden> = std::sync::Mutex::new(None);
    // A rank that panicked while computing it left nothing half-written: the value is replaced
    // whole.
    let mut g = GOLDEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match &*g {
        Some((key, v)) if *key == (n, d) => v.clone(),
        _ => {
            let v = Arc::new(ffn_golden(n, d));
            *g = Some(((n, d), v.clone()));
            v
        }
    }
}

/// `out [M,N] += x [M,K] @ w [K,N]`, row-major, in i-k-j order: every element adds its
/// products in increasing k, exactly as the plain triple loop does (the same result to the
/// bit), but ROWS rows of the output at a time, so that each row of `w` is read once per block
/// rather than once per row, and with an inner loop over two slices that the compiler
/// vectorises. (A 2048-wide FFN spent most of its run in its golden while that was a plain
/// triple loop.)
fn matmul_acc<T>(out: &mut [T], x: &[T], w: &[T], k: usize, n: usize)
where
    T: Copy + std::ops::Mul<Output = T> + std::ops::AddAssign,
{
    const ROWS: usize = 8;
    if k == 0 || n == 0 {
        return;
    }
    for (out_rows, x_rows) in out.chunks_mut(ROWS * n).zip(x.chunks(ROWS * k)) {
        for (p, w_row) in w.chunks_exact(n).enumerate() {
            for (out_row, x_row) in out_rows.chunks_exact_mut(n).zip(x_rows.chunks_exact(k)) {
                let a = x_row[p];
                for (o, &wv) in out_row.iter_mut().zip(w_row) {
                    *o += a * wv;
                }
            }
        }
    }
}

fn domain_allreduce(
    dom: &Comm,
    args: &RunArgs,
    x: Vec<f32>,
) -> Result<(Vec<f32>, pto_core::RunReport), ExampleError> {
    let len = x.len();
    let t = Tensor::from_slice(&[len], &x)?;
    let t2 = t.clone();
    let report = with_collectives(dom, args, move |orch| {
        orch.submit("allreduce_sum", TaskArgs::new().inout(&t2))
            .map(|_| ())
    })?;
    Ok((t.read::<f32>()?, report))
}

/// Domains over subsets with dense ranks in list order: "even" = even world ranks, "tail" = the
/// last two ranks listed last-first. Each domain allreduces `x = i + 100·world_rank`; golden:
/// the sum over that domain's members only; a chip outside a domain gets a clear error.
pub(crate) fn domain_rank_map(comm: &Comm, args: &RunArgs) -> Result<RankOutcome, ExampleError> {
    let (me, n) = (comm.world_rank(), comm.size());
    let len = args.size.unwrap_or(32).max(1);
    let even: Vec<usize> = (0..n).step_by(2).collect();
    let tail: Vec<usize> = if n >= 2 { vec![n - 1, n - 2] } else { vec![0] };
    let mut detail = Vec::new();
    let mut passed = true;
    let mut tasks = 0;
    for (name, members) in [("even", even), ("tail", tail)] {
        match members.iter().position(|&m| m == me) {
            Some(dense) => {
                let dom = comm.domain(&members)?;
                if dom.rank() != dense || dom.members() != members {
                    passed = false;
                    detail.push(format!("{name}: dense rank {} (want {dense})", dom.rank()));
                }
                let (got, report) = domain_allreduce(&dom, args, input(me, len))?;
                tasks += report.stats.tasks;
                let want: Vec<f64> = (0..len)
                    .map(|i| members.iter().map(|&m| (i + 100 * m) as f64).sum())
                    .collect();
                let (ok, d) = compare(name, &f64s(&got), &want, 0.0);
                passed &= ok;
                detail.push(d);
            }
            None => {
                // A chip outside the domain asking for it gets a clear error.
                match comm.domain(&members) {
                    Err(pto_comm::CommError::BadDomain { .. }) => {}
                    other => {
                        passed = false;
                        detail.push(format!("{name}: a non-member got {other:?}"));
                    }
                }
            }
        }
    }
    comm.barrier()?;
    Ok(RankOutcome {
        passed,
        detail: detail.join("; "),
        tasks,
        events: Vec::new(),
    })
}

/// One chip in two domains: left = [0, 1], right = [1, 2] (ranks beyond the world are dropped).
/// Each domain allreduces, then an affine `reduce·scale[w] + bias[w]` per (domain, chip).
pub(crate) fn dual_domain_overlap(
    comm: &Comm,
    args: &RunArgs,
) -> Result<RankOutcome, ExampleError> {
    let (me, n) = (comm.world_rank(), comm.size());
    let len = args.size.unwrap_or(32).max(1);
    let left: Vec<usize> = [0, 1].into_iter().filter(|&r| r < n).collect();
    let right: Vec<usize> = [1, 2].into_iter().filter(|&r| r < n).collect();
    let mut detail = Vec::new();
    let mut passed = true;
    let mut tasks = 0;
    for (name, members, scale) in [("left", left, 2.0f32), ("right", right, 3.0f32)] {
        if members.is_empty() || !members.contains(&me) {
            continue;
        }
        let dom = comm.domain(&members)?;
        let (mut got, report) = domain_allreduce(&dom, args, input(me, len))?;
        tasks += report.stats.tasks;
        let bias = me as f32;
        got.iter_mut().for_each(|v| *v = *v * scale + bias);
        let want: Vec<f64> = (0..len)
            .map(|i| {
                members.iter().map(|&m| (i + 100 * m) as f64).sum::<f64>() * f64::from(scale)
                    + f64::from(bias)
            })
            .collect();
        let (ok, d) = compare(name, &f64s(&got), &want, 0.0);
        passed &= ok;
        detail.push(d);
    }
    comm.barrier()?;
    Ok(RankOutcome {
        passed,
        detail: if detail.is_empty() {
            "no domain includes this rank".into()
        } else {
            detail.join("; ")
        },
        tasks,
        events: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::matmul_acc;

    /// The plain triple loop the blocked one must equal to the bit.
    fn naive<T>(out: &mut [T], x: &[T], w: &[T], m: usize, k: usize, n: usize)
    where
        T: Copy + std::ops::Mul<Output = T> + std::ops::AddAssign,
    {
        for i in 0..m {
            for p in 0..k {
                for j in 0..n {
                    out[i * n + j] += x[i * k + p] * w[p * n + j];
                }
            }
        }
    }

    #[test]
    fn blocked_matmul_equals_the_triple_loop_to_the_bit() {
        // Rows not a multiple of the block, a single row, an empty inner dimension.
        for &(m, k, n) in &[(13, 7, 5), (1, 3, 9), (8, 16, 8), (17, 1, 3), (4, 0, 4)] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let w: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 97) as f32 - 40.0) / 3.0)
                .collect();
            let start: Vec<f32> = (0..m * n).map(|i| i as f32 / 11.0).collect();
            let (mut got, mut want) = (start.clone(), start);
            matmul_acc(&mut got, &x, &w, k, n);
            naive(&mut want, &x, &w, m, k, n);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "f32 {m}x{k}x{n}");
            let (x, w): (Vec<f64>, Vec<f64>) = (
                x.iter().map(|&v| f64::from(v)).collect(),
                w.iter().map(|&v| f64::from(v)).collect(),
            );
            let (mut got, mut want) = (vec![0.5f64; m * n], vec![0.5f64; m * n]);
            matmul_acc(&mut got, &x, &w, k, n);
            naive(&mut want, &x, &w, m, k, n);
            assert_eq!(got, want, "f64 {m}x{k}x{n}");
        }
    }
}
