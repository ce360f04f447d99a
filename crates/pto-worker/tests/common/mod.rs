//! What the Worker tests share: the chips' kernels and programs, the sub-worker closures, and a
//! scenario that runs them (forked children in `worker.rs`, threads in `in_process.rs`).

// Each test target uses part of it.
#![allow(dead_code)]

use std::time::Duration;

use pto_comm::{BufferSpec, CommContext, SignalOp, WindowSpec};
use pto_core::{CoreKind, DType, KernelError, KernelRegistry, TaskArgs};
use pto_worker::{Worker, WorkerBuilder};

pub type Failed = Box<dyn std::error::Error>;

pub fn kernels() -> KernelRegistry {
    let mut k = KernelRegistry::new();
    k.register("add", CoreKind::Aiv, |ctx| {
        let (a, b) = (ctx.input::<f32>(0)?.to_vec(), ctx.input::<f32>(1)?.to_vec());
        ctx.output::<f32>(2)?
            .assign(&a.iter().zip(&b).map(|(x, y)| x + y).collect::<Vec<_>>())?;
        Ok(())
    })
    .unwrap();
    k.register("boom", CoreKind::Aiv, |_| {
        Err(KernelError::msg("chip kernel failed on purpose"))
    })
    .unwrap();
    // Ring barrier through the window: notify the next rank, wait for the previous one, then
    // write the rank count seen into t0.
    k.register("ring", CoreKind::Aiv, |ctx| {
        let c = ctx
            .ext::<CommContext>()
            .ok_or_else(|| KernelError::msg("no comm"))?;
        let w = c.window(0).map_err(|e| KernelError::msg(e.to_string()))?;
        let next = (w.rank() + 1) % w.ranks();
        w.notify(next, 0, 1, SignalOp::Add)
            .map_err(|e| KernelError::msg(e.to_string()))?;
        w.wait_until(0, 1)
            .map_err(|e| KernelError::msg(e.to_string()))?;
        let r = w.rank() as i64;
        let mut out = ctx.output::<i64>(0)?;
        let n = out.len();
        out.set(&[r as usize % n], r + 1)?;
        Ok(())
    })
    .unwrap();
    k.register("bump_u32", CoreKind::Aiv, |ctx| {
        ctx.output::<u32>(0)?.for_each_mut(|x| *x += 1);
        Ok(())
    })
    .unwrap();
    k.register("sleep", CoreKind::Aiv, |_| {
        std::thread::sleep(Duration::from_secs(30));
        Ok(())
    })
    .unwrap();
    k
}

pub fn builder(chips: usize) -> WorkerBuilder {
    Worker::builder()
        .chips(chips)
        .cores(1, 2)
        .sub_workers(1)
        .timeout(Duration::from_secs(20))
        .window(WindowSpec::for_buffers(vec![BufferSpec::new(
            "signal",
            DType::U32,
            16,
        )]))
        .program("add", kernels(), |o, call| {
            let (a, b, out) = (call.tensor(0)?, call.tensor(1)?, call.tensor(2)?);
            o.submit(
                "add",
                TaskArgs::new().input(a).input(b).output_existing(out),
            )?;
            Ok(())
        })
        .program("boom", kernels(), |o, _| {
            o.submit("boom", TaskArgs::new()).map(|_| ())
        })
        .program("ring", kernels(), |o, call| {
            o.submit("ring", TaskArgs::new().no_dep(call.tensor(0)?))?;
            Ok(())
        })
        .program("sleep", kernels(), |o, _| {
            o.submit("sleep", TaskArgs::new()).map(|_| ())
        })
        .program("bump_staged", kernels(), |o, call| {
            let w = call
                .comm
                .as_ref()
                .ok_or_else(|| pto_core::OrchError::msg("no comm"))?;
            let t = w
                .window(0)
                .and_then(|w| w.local_tensor("signal"))
                .map_err(|e| pto_core::OrchError::msg(e.to_string()))?;
            o.submit("bump_u32", TaskArgs::new().inout(&t)).map(|_| ())
        })
        .sub("check_sum", |call| {
            // t0 = a, t1 = b, t2 = out, t3 = verdict (1 when out == a + b).
            let t = |i: usize| call.tensors[i].0.read::<f32>().map_err(|e| e.to_string());
            let (a, b, out) = (t(0)?, t(1)?, t(2)?);
            let ok = a.iter().zip(&b).zip(&out).all(|((x, y), z)| x + y == *z);
            call.tensors[3]
                .0
                .write(&[i32::from(ok)])
                .map_err(|e| e.to_string())
        })
        .sub("panic", |_| panic!("sub-worker failed on purpose"))
}

/// Three chips each run a program, a sub-worker checks each result (depending on it through the
/// output), then a group runs a ring barrier through the window (it deadlocks unless the three
/// run at once). Leaves the Worker open.
pub fn programs_a_sub_worker_and_a_group(w: &Worker) -> Result<(), Failed> {
    for i in 0..3 {
        let f = w.chip_facts(i).unwrap();
        assert_eq!((f.rank, f.size), (i as u32, 3));
        assert_eq!(f.window_bytes, 64);
        assert_eq!(f.buffer_offsets, vec![0]);
    }
    let n = 8;
    let mut ts = Vec::new();
    for c in 0..3 {
        let a = w.tensor(&[n], DType::F32)?;
        let b = w.tensor(&[n], DType::F32)?;
        a.write(&(0..n).map(|i| (i + 100 * c) as f32).collect::<Vec<_>>())?;
        b.write(&vec![0.5f32; n])?;
        let out = w.tensor(&[n], DType::F32)?;
        let verdict = w.tensor(&[1], DType::I32)?;
        ts.push((a, b, out, verdict));
    }
    let t2 = ts.clone();
    let report = w.run(move |h| {
        for (c, (a, b, out, v)) in t2.iter().enumerate() {
            h.submit_chip(
                c,
                "add",
                TaskArgs::new().input(a).input(b).output_existing(out),
            )?;
            // Depends on the chip task through `out` (read after write).
            h.submit_sub(
                "check_sum",
                TaskArgs::new()
                    .input(a)
                    .input(b)
                    .input(out)
                    .output_existing(v),
            )?;
        }
        Ok(())
    })?;
    assert_eq!(report.stats.tasks, 6);
    for (c, (a, b, out, v)) in ts.iter().enumerate() {
        let want: Vec<f32> = a
            .read::<f32>()?
            .iter()
            .zip(b.read::<f32>()?)
            .map(|(x, y)| x + y)
            .collect();
        assert_eq!(out.read::<f32>()?, want, "chip {c}");
        assert_eq!(v.read::<i32>()?, vec![1], "sub-worker verdict for chip {c}");
    }
    // A group: every chip runs the ring program at once (it would deadlock otherwise).
    let seen = w.tensor(&[3], DType::I64)?;
    let s2 = seen.clone();
    w.run(move |h| {
        h.submit_group(&[0, 1, 2], "ring", TaskArgs::new().no_dep(&s2))
            .map(|_| ())
    })?;
    assert_eq!(seen.read::<i64>()?, vec![1, 2, 3]);
    drop(ts);
    drop(seen);
    Ok(())
}
