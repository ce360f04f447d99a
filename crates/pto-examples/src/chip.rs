//! Single-chip examples.

use pto_core::{Chip, DType, OrchError, Program, RunOptions, TaskArgs, Tensor};

use crate::{compare, ExampleError, Outcome, RunArgs};

fn chip(args: &RunArgs) -> Result<Chip, ExampleError> {
    Ok(Chip::builder()
        .aic_cores(args.cores.0)
        .aiv_cores(args.cores.1)
        .build()?)
}

/// `c = a + b` on 4 SPMD blocks, `d = 0.5 c`, `s = sum(d)`, with `a[i] = i`, `b[i] = 2i`.
pub(crate) fn vector_pipeline(args: &RunArgs) -> Result<Outcome, ExampleError> {
    let n = args.size.unwrap_or(4096);
    if n == 0 {
        return Err(ExampleError::Args("size must be at least 1".into()));
    }
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    let (ta, tb) = (Tensor::from_slice(&[n], &a)?, Tensor::from_slice(&[n], &b)?);
    let d_out = Tensor::zeros(&[n], DType::F32)?;
    let s_out = Tensor::zeros(&[1], DType::F32)?;
    let (d2, s2) = (d_out.clone(), s_out.clone());
    let program = Program::new("vector_pipeline", pto_kernels::registry()?, move |o| {
        let c = o
            .submit(
                "vector_add",
                TaskArgs::new()
                    .input(&ta)
                    .input(&tb)
                    .output(&[n], DType::F32)
                    .blocks(4),
            )?
            .out(0)?;
        o.submit(
            "vector_scale",
            TaskArgs::new()
                .input(&c)
                .output_existing(&d2)
                .scalar(0.5f64)
                .blocks(4),
        )?;
        o.submit(
            "reduce_sum",
            TaskArgs::new().input(&d2).output_existing(&s2),
        )?;
        Ok(())
    });
    let report = chip(args)?.run_with(&program, RunOptions { trace: args.trace })?;
    let want_d: Vec<f64> = (0..n).map(|i| 1.5 * i as f64).collect();
    let want_s = vec![want_d.iter().sum::<f64>()];
    let d: Vec<f64> = d_out.read::<f32>()?.into_iter().map(f64::from).collect();
    let s: Vec<f64> = s_out.read::<f32>()?.into_iter().map(f64::from).collect();
    let (ok_d, det_d) = compare("d", &d, &want_d, 1e-6);
    let (ok_s, det_s) = compare("sum", &s, &want_s, 1e-5);
    Ok(Outcome {
        passed: ok_d && ok_s,
        detail: format!("{det_d}; {det_s}"),
        wall: report.wall,
        tasks: report.stats.tasks,
        events: report.trace.map(|t| t.chrome_events()).unwrap_or_default(),
        ranks: Vec::new(),
    })
}

fn det(i: usize, j: usize, salt: usize) -> f32 {
    // Small deterministic values in [-1, 1).
    (((i * 31 + j * 17 + salt * 7) % 97) as f32 / 48.5) - 1.0
}

fn matmul_ref(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}

/// `y = relu(x · w1) · w2` with `x: [m, k]`, `w1: [k, h]`, `w2: [h, k]`.
pub(crate) fn ffn_chip(args: &RunArgs) -> Result<Outcome, ExampleError> {
    let m = args.size.unwrap_or(64);
    if m == 0 {
        return Err(ExampleError::Args("size must be at least 1".into()));
    }
    let (k, h) = (64, 128);
    let x: Vec<f32> = (0..m * k).map(|e| det(e / k, e % k, 1)).collect();
    let w1: Vec<f32> = (0..k * h).map(|e| det(e / h, e % h, 2)).collect();
    let w2: Vec<f32> = (0..h * k).map(|e| det(e / k, e % k, 3)).collect();
    let (tx, tw1, tw2) = (
        Tensor::from_slice(&[m, k], &x)?,
        Tensor::from_slice(&[k, h], &w1)?,
        Tensor::from_slice(&[h, k], &w2)?,
    );
    let y = Tensor::zeros(&[m, k], DType::F32)?;
    let y2 = y.clone();
    let blocks = args.cores.0.max(1);
    let program = Program::new("ffn_chip", pto_kernels::registry()?, move |o| {
        let hid = o
            .submit(
                "matmul",
                TaskArgs::new()
                    .input(&tx)
                    .input(&tw1)
                    .output(&[m, h], DType::F32)
                    .blocks(blocks),
            )?
            .out(0)?;
        let act = o
            .submit(
                "relu",
                TaskArgs::new()
                    .input(&hid)
                    .output(&[m, h], DType::F32)
                    .blocks(2),
            )?
            .out(0)?;
        o.submit(
            "matmul",
            TaskArgs::new()
                .input(&act)
                .input(&tw2)
                .output_existing(&y2)
                .blocks(blocks),
        )
        .map_err(|e| OrchError::msg(format!("second matmul: {e}")))?;
        Ok(())
    });
    let report = chip(args)?.run_with(&program, RunOptions { trace: args.trace })?;
    let f = |v: &[f32]| v.iter().map(|&e| f64::from(e)).collect::<Vec<f64>>();
    let hid = matmul_ref(&f(&x), &f(&w1), m, k, h);
    let act: Vec<f64> = hid.iter().map(|v| v.max(0.0)).collect();
    let want = matmul_ref(&act, &f(&w2), m, h, k);
    let (passed, detail) = compare("y", &f(&y.read::<f32>()?), &want, 1e-4);
    Ok(Outcome {
        passed,
        detail,
        wall: report.wall,
        tasks: report.stats.tasks,
        events: report.trace.map(|t| t.chrome_events()).unwrap_or_default(),
        ranks: Vec::new(),
    })
}
