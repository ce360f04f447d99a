//! `deferred_notify` and `async_notify`: deferred completion across ranks.
//!
//! Each rank runs a chip whose kernels reach the rank's window through the chip's extension
//! (a [`CommContext`]). A deferred `notify_wait` task registers "my counter >= 1" and returns at
//! once; its consumer runs only when a peer's notify has arrived.
//!
//! The kernels and the task builders that submit them (`deferred_notify_tasks`,
//! `wait_then_consume`) live here; the chip programs (`programs`) and the Worker examples
//! (`worker_examples`) use them, and this module uses neither.

use std::sync::Arc;

use pto_comm::{BufferSpec, Comm, CommContext, SignalOp, Window, WindowSpec};
use pto_core::{
    Chip, CoreKind, DType, KernelCtx, KernelError, KernelRegistry, Orch, OrchError, Program,
    RunOptions, TaskArgs, Tensor,
};

use crate::dist::RankOutcome;
use crate::{compare, ExampleError, RunArgs};

fn comm_err(e: pto_comm::CommError) -> KernelError {
    KernelError::msg(e.to_string())
}

fn window<'a>(ctx: &'a KernelCtx<'_>) -> Result<&'a Window, KernelError> {
    ctx.ext::<CommContext>()
        .ok_or_else(|| KernelError::msg("the chip has no communication context"))?
        .window(0)
        .map_err(comm_err)
}

/// The kernels both examples use. Buffers: `mailbox` (f32) and `counter` (u32).
pub(crate) fn kernels() -> Result<KernelRegistry, ExampleError> {
    let mut k = KernelRegistry::new();
    // t0: data (IN). Puts it into the next rank's mailbox, then notifies its counter.
    k.register("put_notify", CoreKind::Aiv, |ctx| {
        let w = window(ctx)?;
        let data = ctx.input::<f32>(0)?.to_vec();
        let peer = (w.rank() + 1) % w.ranks();
        let mb = w.buffer("mailbox").map_err(comm_err)?.offset;
        let ctr = w.buffer("counter").map_err(comm_err)?.offset;
        w.put_slice(peer, mb, &data).map_err(comm_err)?;
        w.fence();
        w.notify(peer, ctr, 1, SignalOp::Add).map_err(comm_err)
    })?;
    // t0: data (IN), t1: out (OUT). out = 2 * data, then notify the next rank's counter.
    k.register("double_notify", CoreKind::Aiv, |ctx| {
        let w = window(ctx)?;
        let data = ctx.input::<f32>(0)?.to_vec();
        ctx.output::<f32>(1)?
            .assign(&data.iter().map(|x| 2.0 * x).collect::<Vec<_>>())?;
        let peer = (w.rank() + 1) % w.ranks();
        let ctr = w.buffer("counter").map_err(comm_err)?.offset;
        w.notify(peer, ctr, 1, SignalOp::Add).map_err(comm_err)
    })?;
    // Deferred. t0: token (OUT). Completes when this rank's counter reaches 1.
    k.register("notify_wait", CoreKind::Aiv, |ctx| {
        let w = window(ctx)?;
        let ctr = w.buffer("counter").map_err(comm_err)?.offset;
        ctx.output::<i32>(0)?.fill(1);
        ctx.defer(w.signal_condition(ctr, 1).map_err(comm_err)?)
    })?;
    // t0: token (IN), t1: src (IN), t2: dst (written): dst = src + s0.
    k.register("consume", CoreKind::Aiv, |ctx| {
        ctx.input::<i32>(0)?;
        let add = ctx.scalar::<f32>(0)?;
        let src = ctx.input::<f32>(1)?.to_vec();
        ctx.output::<f32>(2)?
            .assign(&src.iter().map(|x| x + add).collect::<Vec<_>>())?;
        Ok(())
    })?;
    Ok(k)
}

/// `deferred_notify`'s tasks on one chip: put `input` into the next rank's mailbox and notify
/// its counter, a deferred wait for this rank's counter, then `result = mailbox`.
pub(crate) fn deferred_notify_tasks(
    o: &mut Orch<'_>,
    input: &Tensor,
    mailbox: &Tensor,
    result: &Tensor,
) -> Result<(), OrchError> {
    o.submit("put_notify", TaskArgs::new().input(input))?;
    wait_then_consume(o, mailbox, result, 0.0)
}

/// A deferred wait for this rank's counter (`notify_wait`), then `result = data + add`
/// (`consume`), which the wait's token orders after it.
pub(crate) fn wait_then_consume(
    o: &mut Orch<'_>,
    data: &Tensor,
    result: &Tensor,
    add: f32,
) -> Result<(), OrchError> {
    let tok = o
        .submit(
            "notify_wait",
            TaskArgs::new().output(&[1], DType::I32).deferred(),
        )?
        .out(0)?;
    o.submit(
        "consume",
        TaskArgs::new()
            .input(&tok)
            .input(data)
            .output_existing(result)
            .scalar(add),
    )?;
    Ok(())
}

fn setup(comm: &Comm, args: &RunArgs, len: usize) -> Result<(Window, Chip), ExampleError> {
    let spec = WindowSpec::for_buffers(vec![
        BufferSpec::new("mailbox", DType::F32, len),
        BufferSpec::new("counter", DType::U32, 1),
    ]);
    let w = comm.alloc_window(&spec)?;
    let chip = Chip::builder()
        .chip_id(comm.rank() as u32)
        .aic_cores(args.cores.0)
        .aiv_cores(args.cores.1.max(1))
        .extension(Arc::new(
            CommContext::new(comm.clone()).with_window(w.clone()),
        ))
        .build()?;
    Ok((w, chip))
}

/// Rank r puts `partial[r] = r + 1` into rank r+1's mailbox and notifies it; a deferred wait
/// task gates the consumer that copies the mailbox out. Golden: `result == partial[r - 1]`.
pub(crate) fn deferred_notify(comm: &Comm, args: &RunArgs) -> Result<RankOutcome, ExampleError> {
    let (r, n) = (comm.rank(), comm.size());
    let len = args.size.unwrap_or(16).max(1);
    let (w, chip) = setup(comm, args, len)?;
    let partial = Tensor::from_slice(&[len], &vec![(r + 1) as f32; len])?;
    let mailbox = w.local_tensor("mailbox")?;
    let result = Tensor::zeros(&[len], DType::F32)?;
    let res = result.clone();
    let program = Program::new("deferred_notify", kernels()?, move |o| {
        deferred_notify_tasks(o, &partial, &mailbox, &res)
    });
    let report = chip.run_with(&program, RunOptions { trace: args.trace })?;
    let prev = (r + n - 1) % n;
    let want = vec![(prev + 1) as f64; len];
    verdict(w, report, &result, &want)
}

/// Checks `result` against `want`, releases the window, and makes the rank's outcome.
fn verdict(
    w: pto_comm::Window,
    report: pto_core::RunReport,
    result: &Tensor,
    want: &[f64],
) -> Result<RankOutcome, ExampleError> {
    let got: Vec<f64> = result.read::<f32>()?.into_iter().map(f64::from).collect();
    let (passed, detail) = compare("result", &got, want, 0.0);
    // Nobody may still be writing into a window when it goes away.
    w.release()?;
    Ok(RankOutcome {
        passed,
        detail,
        tasks: report.stats.tasks,
        events: report.trace.map(|t| t.chrome_events()).unwrap_or_default(),
    })
}

/// Producer `out = 2·in` then notify the next rank; a deferred wait on this rank's counter;
/// consumer `result = out + 1`. Inputs `in[i] = i + 100·r`. Golden: `2·in + 1`.
pub(crate) fn async_notify(comm: &Comm, args: &RunArgs) -> Result<RankOutcome, ExampleError> {
    let r = comm.rank();
    let len = args.size.unwrap_or(64).max(1);
    let (w, chip) = setup(comm, args, 1)?;
    let input: Vec<f32> = (0..len).map(|i| (i + 100 * r) as f32).collect();
    let tin = Tensor::from_slice(&[len], &input)?;
    let result = Tensor::zeros(&[len], DType::F32)?;
    let res = result.clone();
    let program = Program::new("async_notify", kernels()?, move |o| {
        let out = o
            .submit(
                "double_notify",
                TaskArgs::new().input(&tin).output(&[len], DType::F32),
            )?
            .out(0)?;
        wait_then_consume(o, &out, &res, 1.0)
    });
    let report = chip.run_with(&program, RunOptions { trace: args.trace })?;
    let want: Vec<f64> = input.iter().map(|&x| 2.0 * f64::from(x) + 1.0).collect();
    verdict(w, report, &result, &want)
}
