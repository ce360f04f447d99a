//! Your own kernels and a distributed program, run on 4 ranks (one process each, over shared
//! memory) through pto's host Worker, and checked against a golden computed here.
//!
//! Every rank `r` has `x[i] = i + 100 r`. Its chip runs `saxpy` (y = 2 x + 1, a kernel of this
//! crate) and `shift` (this crate's too: put y into the next rank's `inbox` window buffer,
//! notify that rank's `ready` signal, wait for its own, copy its inbox out). So rank `r` ends
//! with `out = 2 x[r-1] + 1`.

use pto::comm::{BufferSpec, CommContext, SignalOp, WindowSpec};
use pto::prelude::*;
use pto::worker::Worker;

const RANKS: usize = 4;
const N: usize = 1024;

fn kernels() -> Result<KernelRegistry, pto::core::RegistryError> {
    let mut k = KernelRegistry::new();
    // t0: x (IN), t1: y (OUT), s0: a, s1: b. y = a x + b.
    k.register("saxpy", CoreKind::Aiv, |ctx| {
        let (a, b) = (ctx.scalar::<f32>(0)?, ctx.scalar::<f32>(1)?);
        let x = ctx.input::<f32>(0)?.to_vec();
        let y: Vec<f32> = x.iter().map(|v| a * v + b).collect();
        ctx.output::<f32>(1)?.assign(&y)?;
        Ok(())
    })?;
    // t0: y (IN), t1: out (OUT). Sends y to the next rank, waits for the previous rank's.
    k.register("shift", CoreKind::Aiv, |ctx| {
        let err = |e: pto::comm::CommError| KernelError::msg(e.to_string());
        let w = ctx
            .ext::<CommContext>()
            .ok_or_else(|| KernelError::msg("no communication context"))?
            .window(0)
            .map_err(err)?;
        let next = (w.rank() + 1) % w.ranks();
        let inbox = w.buffer("inbox").map_err(err)?.offset;
        let ready = w.buffer("ready").map_err(err)?.offset;
        w.put_slice(next, inbox, &ctx.input::<f32>(0)?.to_vec())
            .map_err(err)?;
        w.fence();
        w.notify(next, ready, 1, SignalOp::Add).map_err(err)?;
        w.wait_until(ready, 1).map_err(err)?;
        let got: Vec<f32> = w.get_vec(w.rank(), inbox, N).map_err(err)?;
        ctx.output::<f32>(1)?.assign(&got)?;
        Ok(())
    })?;
    Ok(k)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let w = Worker::builder()
        .chips(RANKS)
        .cores(1, 2)
        .window(WindowSpec::for_buffers(vec![
            BufferSpec::new("inbox", DType::F32, N),
            BufferSpec::new("ready", DType::U32, 1),
        ]))
        .program("shifted_saxpy", kernels()?, |o, call| {
            let (x, out) = (call.tensor(0)?, call.tensor(1)?);
            let y = o
                .submit(
                    "saxpy",
                    TaskArgs::new()
                        .input(x)
                        .output(&[N], DType::F32)
                        .scalar(2.0f32)
                        .scalar(1.0f32),
                )?
                .out(0)?;
            o.submit("shift", TaskArgs::new().input(&y).output_existing(out))?;
            Ok(())
        })
        .init()?;
    // One x and one out per rank, in shared memory.
    let xs: Vec<Tensor> = (0..RANKS)
        .map(|_| w.tensor(&[N], DType::F32))
        .collect::<Result<_, _>>()?;
    let outs: Vec<Tensor> = (0..RANKS)
        .map(|_| w.tensor(&[N], DType::F32))
        .collect::<Result<_, _>>()?;
    for (r, x) in xs.iter().enumerate() {
        x.write(&(0..N).map(|i| (i + 100 * r) as f32).collect::<Vec<_>>())?;
    }
    let (x2, o2) = (xs.clone(), outs.clone());
    // Every rank's program at once: each waits for its neighbour's signal.
    w.run(move |h| {
        for r in 0..RANKS {
            h.submit_chip(
                r,
                "shifted_saxpy",
                TaskArgs::new().input(&x2[r]).output_existing(&o2[r]),
            )?;
        }
        Ok(())
    })?;
    for (r, out) in outs.iter().enumerate() {
        let prev = (r + RANKS - 1) % RANKS;
        let want: Vec<f32> = (0..N)
            .map(|i| 2.0 * (i + 100 * prev) as f32 + 1.0)
            .collect();
        if out.read::<f32>()? != want {
            return Err(format!("rank {r}: out differs from 2 x[{prev}] + 1").into());
        }
    }
    w.close();
    println!("own-crate: {RANKS} ranks, every out = 2 x[r-1] + 1");
    Ok(())
}
