//! Examples that run through the host [`Worker`]: one process per chip, a host orchestration.

use std::time::Instant;

use pto_core::{DType, TaskArgs};
use pto_worker::Worker;

use crate::{ExampleError, Outcome, RunArgs};

/// Two or more chips each run `vector_add` on their own inputs (`a[i] = i + 100·c`,
/// `b[i] = 2·i`), and a sub-worker checks every result (`out = a + b`) and writes its verdict.
pub(crate) fn multi_chip_dispatch(args: &RunArgs, chips: usize) -> Result<Outcome, ExampleError> {
    let n = args.size.unwrap_or(1024).max(1);
    let t = Instant::now();
    let w = Worker::builder()
        .chips(chips)
        .cores(args.cores.0, args.cores.1.max(1))
        .sub_workers(1)
        .no_comm()
        .program("vector_add", pto_kernels::registry()?, |o, call| {
            let (a, b, out) = (call.tensor(0)?, call.tensor(1)?, call.tensor(2)?);
            o.submit(
                "vector_add",
                TaskArgs::new()
                    .input(a)
                    .input(b)
                    .output_existing(out)
                    .blocks(2),
            )?;
            Ok(())
        })
        .sub("check", |call| {
            let r = |i: usize| call.tensors[i].0.read::<f32>().map_err(|e| e.to_string());
            let (a, b, out) = (r(0)?, r(1)?, r(2)?);
            let bad = a
                .iter()
                .zip(&b)
                .zip(&out)
                .position(|((x, y), z)| x + y != *z);
            let verdict: i32 = if bad.is_none() { 1 } else { 0 };
            call.tensors[3]
                .0
                .write(&[verdict])
                .map_err(|e| e.to_string())
        })
        .init()
        .map_err(|e| ExampleError::Args(e.to_string()))?;
    let mk = |shape: &[usize], d: DType| {
        w.tensor(shape, d)
            .map_err(|e| ExampleError::Args(e.to_string()))
    };
    let mut sets = Vec::with_capacity(chips);
    for c in 0..chips {
        let (a, b, out, v) = (
            mk(&[n], DType::F32)?,
            mk(&[n], DType::F32)?,
            mk(&[n], DType::F32)?,
            mk(&[1], DType::I32)?,
        );
        a.write(&(0..n).map(|i| (i + 100 * c) as f32).collect::<Vec<_>>())?;
        b.write(&(0..n).map(|i| (2 * i) as f32).collect::<Vec<_>>())?;
        sets.push((a, b, out, v));
    }
    let s2 = sets.clone();
    let report = w
        .run_with(
            move |h| {
                for (c, (a, b, out, v)) in s2.iter().enumerate() {
                    h.submit_chip(
                        c,
                        "vector_add",
                        TaskArgs::new().input(a).input(b).output_existing(out),
                    )?;
                    h.submit_sub(
                        "check",
                        TaskArgs::new()
                            .input(a)
                            .input(b)
                            .input(out)
                            .output_existing(v),
                    )?;
                }
                Ok(())
            },
            args.trace,
        )
        .map_err(|e| ExampleError::Args(e.to_string()))?;
    // The golden, computed here independently of the sub-worker's verdict.
    let mut detail = format!("{chips} chips: every out = a + b, confirmed by the sub-worker");
    let mut passed = true;
    for (c, (_, _, out, v)) in sets.iter().enumerate() {
        let want: Vec<f64> = (0..n).map(|i| (i + 100 * c + 2 * i) as f64).collect();
        let got: Vec<f64> = out.read::<f32>()?.into_iter().map(f64::from).collect();
        let (ok, d) = crate::compare(&format!("chip {c} out"), &got, &want, 0.0);
        let verdict = v.read::<i32>()?[0];
        if !ok || verdict != 1 {
            passed = false;
            detail = if ok {
                format!("chip {c}: the sub-worker's verdict is {verdict}")
            } else {
                d
            };
            break;
        }
    }
    let tasks = report.host.stats.tasks;
    drop(sets);
    w.close();
    Ok(Outcome {
        passed,
        detail,
        wall: t.elapsed(),
        tasks,
        events: report.trace_events,
    })
}
