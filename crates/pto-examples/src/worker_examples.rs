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
    let w = worker(args)
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
        .init()?;
    let mk = |shape: &[usize], d: DType| w.tensor(shape, d).map_err(ExampleError::from);
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
    let report = w.run_with(
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
    )?;
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
        ranks: Vec::new(),
    })
}

/// A Worker builder with what every example's Worker gets: the caller's child-exit hook.
pub(crate) fn worker(args: &RunArgs) -> pto_worker::WorkerBuilder {
    let b = Worker::builder();
    match &args.on_child_exit {
        Some(h) => {
            let h = h.0.clone();
            b.on_child_exit(move |f| h(f))
        }
        None => b,
    }
}

/// Checks each chip's `row_len` slice of `got` against `golden(chip)`; the detail names the
/// first mismatch.
fn check_rows(
    got: &[f64],
    row_len: usize,
    what: &str,
    tol: f64,
    golden: impl Fn(usize) -> Vec<f64>,
) -> (bool, String) {
    let row_len = row_len.max(1);
    for (r, row) in got.chunks(row_len).enumerate() {
        let (ok, det) = crate::compare(&format!("chip {r} {what}"), row, &golden(r), tol);
        if !ok {
            return (false, det);
        }
    }
    (
        true,
        format!(
            "{} chips: every {what} matches the golden",
            got.len() / row_len
        ),
    )
}

/// Starts chip program `program` on every chip at once, with the host tensors `ins` (read) and
/// `outs` (written) as its arguments.
fn group_run(
    w: &Worker,
    chips: usize,
    program: &'static str,
    ins: &pto_core::Tensor,
    outs: &pto_core::Tensor,
    trace: bool,
) -> Result<pto_worker::WorkerReport, ExampleError> {
    let (i2, o2) = (ins.clone(), outs.clone());
    let all: Vec<usize> = (0..chips).collect();
    w.run_with(
        move |h| {
            h.submit_group(
                &all,
                program,
                TaskArgs::new().input(&i2).output_existing(&o2),
            )
            .map(|_| ())
        },
        trace,
    )
    .map_err(ExampleError::from)
}

/// Closes the Worker and makes the outcome.
fn finish(
    w: Worker,
    report: pto_worker::WorkerReport,
    t: Instant,
    (passed, detail): (bool, String),
) -> Outcome {
    let tasks = report.host.stats.tasks;
    w.close();
    Outcome {
        passed,
        detail,
        wall: t.elapsed(),
        tasks,
        events: report.trace_events,
        ranks: Vec::new(),
    }
}

/// Row `rank` of a host tensor `[n, rest...]`, as a tensor of shape `rest`.
fn row(
    t: &pto_core::Tensor,
    rank: usize,
    rest: &[usize],
) -> Result<pto_core::Tensor, pto_core::OrchError> {
    let mut shape = vec![1];
    shape.extend_from_slice(rest);
    let mut offs = vec![rank];
    offs.extend(rest.iter().map(|_| 0));
    Ok(t.view(&shape, &offs)?.reshape(rest)?)
}

/// `ffn_tp_parallel` through the Worker: one process per chip; the host stacks every rank's
/// `x` and `w` in shared memory and starts the chip program on all chips at once (a group, as
/// the allreduce inside needs); each chip takes its row, computes its partial on an AIC core,
/// allreduces it on an AIV core, and writes `y`; the host checks every chip's `y`.
pub(crate) fn ffn_tp_parallel_worker(
    args: &RunArgs,
    chips: usize,
) -> Result<Outcome, ExampleError> {
    use crate::collectives::{f64s, ffn_golden, ffn_w, ffn_x, kernels};
    let d = args.size.unwrap_or(64).max(1);
    let t = Instant::now();
    let w = worker(args)
        .chips(chips)
        .cores(args.cores.0.max(1), args.cores.1.max(1))
        .collectives(64 << 10)
        .program("ffn", kernels()?, crate::programs::ffn)
        .init()?;
    let mk = || {
        w.tensor(&[chips, d, d], DType::F32)
            .map_err(ExampleError::from)
    };
    let (xs, ws, ys) = (mk()?, mk()?, mk()?);
    xs.write(&(0..chips).flat_map(|r| ffn_x(r, d)).collect::<Vec<_>>())?;
    ws.write(&(0..chips).flat_map(|r| ffn_w(r, d)).collect::<Vec<_>>())?;
    let (x2, w2, y2) = (xs.clone(), ws.clone(), ys.clone());
    let all: Vec<usize> = (0..chips).collect();
    let report = w.run_with(
        move |h| {
            h.submit_group(
                &all,
                "ffn",
                TaskArgs::new().input(&x2).input(&w2).output_existing(&y2),
            )
            .map(|_| ())
        },
        args.trace,
    )?;
    let want = ffn_golden(chips, d);
    let got = f64s(&ys.read::<f32>()?);
    let (passed, detail) = check_rows(&got, d * d, "y", 1e-4, |_| want.clone());
    Ok(finish(w, report, t, (passed, detail)))
}

/// `allreduce_distributed` through the Worker: the four-phase kernel on each chip's window
/// (allocated at bring-up), started on all chips as one group. Golden
/// `out[i] = n·i + 100·n(n−1)/2` on every chip.
pub(crate) fn allreduce_distributed_worker(
    args: &RunArgs,
    chips: usize,
) -> Result<Outcome, ExampleError> {
    use crate::collectives::{f64s, input, kernels};
    use pto_comm::{BufferSpec, WindowSpec};
    let len = args.size.unwrap_or(256).max(1);
    let t = Instant::now();
    let w = worker(args)
        .chips(chips)
        .cores(args.cores.0.max(1), args.cores.1.max(1))
        .window(WindowSpec::for_buffers(vec![
            BufferSpec::new("scratch", DType::F32, len),
            BufferSpec::new("signals", DType::U32, 16 * chips),
        ]))
        .program(
            "allreduce",
            kernels()?,
            crate::programs::allreduce_four_phase,
        )
        .init()?;
    let ins = w.tensor(&[chips, len], DType::F32)?;
    let outs = w.tensor(&[chips, len], DType::F32)?;
    ins.write(&(0..chips).flat_map(|r| input(r, len)).collect::<Vec<_>>())?;
    let report = group_run(&w, chips, "allreduce", &ins, &outs, args.trace)?;
    let want: Vec<f64> = (0..len)
        .map(|i| (chips * i + 100 * chips * (chips - 1) / 2) as f64)
        .collect();
    let got = f64s(&outs.read::<f32>()?);
    // Sums past 2^24 round in f32: the tolerance grows with the number of terms summed (the
    // error bound of an f32 sum of n terms, n * epsilon; 1e-6 up to 8 chips).
    let tol = (chips as f64 * f64::from(f32::EPSILON)).max(1e-6);
    let (passed, detail) = check_rows(&got, len, "out", tol, |_| want.clone());
    Ok(finish(w, report, t, (passed, detail)))
}

/// What one collective example needs to run through the Worker.
struct CollectiveRun {
    kernel: &'static str,
    /// The per-rank count `C` the formulas use.
    c: usize,
    /// Elements of each chip's input and output.
    in_len: usize,
    out_len: usize,
    /// Chip r's input.
    input: fn(usize, usize, usize) -> Vec<f32>,
    /// Chip r's golden output.
    golden: fn(usize, usize, usize) -> Vec<f64>,
    /// The kernel takes its data in place (one INOUT tensor) rather than IN then OUT.
    in_place: bool,
}

/// Runs `spec` through the Worker: every chip takes its row of the host's stacked input and
/// output, the kernel calls the chip's collectives, the host checks every row.
fn collective_worker(
    args: &RunArgs,
    chips: usize,
    spec: CollectiveRun,
) -> Result<Outcome, ExampleError> {
    use crate::collectives::{f64s, kernels};
    let c = spec.c;
    let t = Instant::now();
    let (kernel, in_len, out_len, in_place) =
        (spec.kernel, (spec.in_len), spec.out_len, spec.in_place);
    let w = worker(args)
        .chips(chips)
        .cores(args.cores.0.max(1), args.cores.1.max(1))
        .collectives(64 << 10)
        .program("collective", kernels()?, move |o, call| {
            let r = call.rank;
            if in_place {
                let d = row(call.tensor(1)?, r, &[out_len])?;
                o.submit(kernel, TaskArgs::new().inout(&d).scalar(0u64))
                    .map(|_| ())
            } else {
                let (i, out) = (
                    row(call.tensor(0)?, r, &[in_len])?,
                    row(call.tensor(1)?, r, &[out_len])?,
                );
                o.submit(kernel, TaskArgs::new().input(&i).output_existing(&out))
                    .map(|_| ())
            }
        })
        .init()?;
    let ins = w.tensor(&[chips, in_len.max(1)], DType::F32)?;
    let outs = w.tensor(&[chips, out_len.max(1)], DType::F32)?;
    ins.write(
        &(0..chips)
            .flat_map(|r| (spec.input)(r, chips, c))
            .collect::<Vec<_>>(),
    )?;
    if in_place {
        outs.write(
            &(0..chips)
                .flat_map(|r| (spec.input)(r, chips, c))
                .collect::<Vec<_>>(),
        )?;
    }
    let report = group_run(&w, chips, "collective", &ins, &outs, args.trace)?;
    let got = f64s(&outs.read::<f32>()?);
    let (passed, detail) = check_rows(&got, out_len.max(1), "output", 0.0, |r| {
        (spec.golden)(r, chips, c)
    });
    Ok(finish(w, report, t, (passed, detail)))
}

fn inp(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (i + 100 * r) as f32).collect()
}

pub(crate) fn allgather_worker(args: &RunArgs, chips: usize) -> Result<Outcome, ExampleError> {
    let c = args.size.unwrap_or(64).max(1);
    collective_worker(
        args,
        chips,
        CollectiveRun {
            kernel: "allgather",
            c,
            in_len: c,
            out_len: chips * c,
            input: |r, _, c| inp(r, c),
            golden: |_, n, c| {
                (0..n)
                    .flat_map(|s| (0..c).map(move |i| (100 * s + i) as f64))
                    .collect()
            },
            in_place: false,
        },
    )
}

pub(crate) fn reduce_scatter_worker(args: &RunArgs, chips: usize) -> Result<Outcome, ExampleError> {
    let c = args.size.unwrap_or(64).max(1);
    collective_worker(
        args,
        chips,
        CollectiveRun {
            kernel: "reduce_scatter",
            c,
            in_len: chips * c,
            out_len: c,
            input: |r, n, c| inp(r, n * c),
            golden: |r, n, c| {
                (0..c)
                    .map(|j| (n * (r * c + j) + 100 * n * (n - 1) / 2) as f64)
                    .collect()
            },
            in_place: false,
        },
    )
}

pub(crate) fn broadcast_worker(args: &RunArgs, chips: usize) -> Result<Outcome, ExampleError> {
    let c = args.size.unwrap_or(256).max(1);
    collective_worker(
        args,
        chips,
        CollectiveRun {
            kernel: "broadcast",
            c,
            in_len: c,
            out_len: c,
            input: |r, _, c| {
                if r == 0 {
                    (0..c).map(|i| i as f32).collect()
                } else {
                    vec![-1.0; c]
                }
            },
            golden: |_, _, c| (0..c).map(|i| i as f64).collect(),
            in_place: true,
        },
    )
}

pub(crate) fn all_to_all_worker(args: &RunArgs, chips: usize) -> Result<Outcome, ExampleError> {
    let c = args.size.unwrap_or(32).max(1);
    collective_worker(
        args,
        chips,
        CollectiveRun {
            kernel: "all_to_all",
            c,
            in_len: chips * c,
            out_len: chips * c,
            input: |r, n, c| {
                (0..n)
                    .flat_map(|d| (0..c).map(move |j| (1000 * r + 100 * d + j) as f32))
                    .collect()
            },
            golden: |r, n, c| {
                (0..n)
                    .flat_map(|s| (0..c).map(move |j| (1000 * s + 100 * r + j) as f64))
                    .collect()
            },
            in_place: false,
        },
    )
}

/// `deferred_notify` through the Worker: each chip's window holds its mailbox and counter
/// (allocated at bring-up); one group run: put into the next chip's mailbox and notify, a
/// deferred wait on the own counter, then the consumer copies the mailbox into the chip's row of
/// the host result. Golden: `result[r] = partial[(r − 1) mod n] = r` (with `partial[r] = r + 1`).
pub(crate) fn deferred_notify_worker(
    args: &RunArgs,
    chips: usize,
) -> Result<Outcome, ExampleError> {
    notify_worker(args, chips, false)
}

/// `async_notify` through the Worker: producer `out = 2·in` then notify the next chip; a
/// deferred wait; consumer `result = out + 1`. Golden: `2·in + 1`, `in[i] = i + 100·r`.
pub(crate) fn async_notify_worker(args: &RunArgs, chips: usize) -> Result<Outcome, ExampleError> {
    notify_worker(args, chips, true)
}

fn notify_worker(
    args: &RunArgs,
    chips: usize,
    asynchronous: bool,
) -> Result<Outcome, ExampleError> {
    use pto_comm::{BufferSpec, WindowSpec};
    let len = args
        .size
        .unwrap_or(if asynchronous { 64 } else { 16 })
        .max(1);
    let t = Instant::now();
    let w = worker(args)
        .chips(chips)
        .cores(args.cores.0, args.cores.1.max(1))
        .window(WindowSpec::for_buffers(vec![
            BufferSpec::new("mailbox", DType::F32, len),
            BufferSpec::new("counter", DType::U32, 1),
        ]))
        .program("notify", crate::notify::kernels()?, move |o, call| {
            let r = call.rank;
            let (i, res) = (
                row(call.tensor(0)?, r, &[len])?,
                row(call.tensor(1)?, r, &[len])?,
            );
            if !asynchronous {
                return crate::programs::deferred_notify(o, call);
            }
            let out = o
                .submit(
                    "double_notify",
                    TaskArgs::new().input(&i).output(&[len], DType::F32),
                )?
                .out(0)?;
            crate::notify::wait_then_consume(o, &out, &res, 1.0)
        })
        .init()?;
    let ins = w.tensor(&[chips, len], DType::F32)?;
    let outs = w.tensor(&[chips, len], DType::F32)?;
    let input = |r: usize| -> Vec<f32> {
        if asynchronous {
            (0..len).map(|i| (i + 100 * r) as f32).collect()
        } else {
            vec![(r + 1) as f32; len]
        }
    };
    ins.write(&(0..chips).flat_map(input).collect::<Vec<_>>())?;
    let report = group_run(&w, chips, "notify", &ins, &outs, args.trace)?;
    let got = crate::collectives::f64s(&outs.read::<f32>()?);
    let (passed, detail) = check_rows(&got, len, "result", 0.0, |r| {
        if asynchronous {
            input(r).iter().map(|&x| 2.0 * f64::from(x) + 1.0).collect()
        } else {
            vec![((r + chips - 1) % chips + 1) as f64; len]
        }
    });
    Ok(finish(w, report, t, (passed, detail)))
}

/// The domains of `domain_rank_map` (even ranks; the last two, last first) or of
/// `dual_domain_overlap` (left `[0, 1]`, right `[1, 2]`, clipped to the chips), with the affine
/// scale each applies (1 for the rank map).
fn domains(chips: usize, dual: bool) -> Vec<(Vec<usize>, f32)> {
    if dual {
        vec![
            ([0, 1].into_iter().filter(|&r| r < chips).collect(), 2.0),
            ([1, 2].into_iter().filter(|&r| r < chips).collect(), 3.0),
        ]
    } else {
        let even = (0..chips).step_by(2).collect();
        let tail = if chips >= 2 {
            vec![chips - 1, chips - 2]
        } else {
            vec![0]
        };
        vec![(even, 1.0), (tail, 1.0)]
    }
}

/// `domain_rank_map` / `dual_domain_overlap` through the Worker: in one group run, each chip's
/// orchestration makes the domains it belongs to (dense ranks in list order; asking for a
/// domain it is not in is an error), allreduces its row within each domain from host code,
/// applies `·scale + bias` (bias = its rank, dual only) and writes the result into its row of
/// the host output `[chip, domain, len]`. The host checks every (chip, domain).
fn domain_worker(args: &RunArgs, chips: usize, dual: bool) -> Result<Outcome, ExampleError> {
    use pto_comm::{Collectives, ReduceOp};
    let len = args.size.unwrap_or(32).max(1);
    let t = Instant::now();
    let w = worker(args)
        .chips(chips)
        .cores(1, 1)
        .program(
            "domains",
            pto_core::KernelRegistry::new(),
            move |o, call| {
                let comm = call
                    .comm
                    .as_ref()
                    .ok_or_else(|| pto_core::OrchError::msg("no comm"))?
                    .comm()
                    .clone();
                let me = comm.world_rank();
                let err = |e: pto_comm::CommError| pto_core::OrchError::msg(e.to_string());
                let x = row(call.tensor(0)?, me, &[len])?;
                let input = o.read::<f32>(&x)?;
                for (d, (members, scale)) in domains(comm.size(), dual).into_iter().enumerate() {
                    if members.is_empty() {
                        continue;
                    }
                    let Some(dense) = members.iter().position(|&m| m == me) else {
                        match comm.domain(&members) {
                            Err(pto_comm::CommError::BadDomain { .. }) => continue,
                            other => {
                                return Err(pto_core::OrchError::msg(format!(
                                    "non-member of {members:?} got {other:?}"
                                )))
                            }
                        }
                    };
                    let dom = comm.domain(&members).map_err(err)?;
                    if dom.rank() != dense {
                        return Err(pto_core::OrchError::msg(format!(
                            "dense rank {} in {members:?}, want {dense}",
                            dom.rank()
                        )));
                    }
                    let co = Collectives::new(&dom, 4096).map_err(err)?;
                    let mut v = input.clone();
                    co.allreduce(&mut v, ReduceOp::Sum).map_err(err)?;
                    let bias = if dual { me as f32 } else { 0.0 };
                    v.iter_mut().for_each(|x| *x = *x * scale + bias);
                    let out = call
                        .tensor(1)?
                        .view(&[1, 1, len], &[me, d, 0])?
                        .reshape(&[len])?;
                    o.write(&out, &v)?;
                }
                Ok(())
            },
        )
        .init()?;
    let ins = w.tensor(&[chips, len], DType::F32)?;
    let outs = w.tensor(&[chips, 2, len], DType::F32)?;
    ins.write(&(0..chips).flat_map(|r| inp(r, len)).collect::<Vec<_>>())?;
    let report = group_run(&w, chips, "domains", &ins, &outs, args.trace)?;
    let got = crate::collectives::f64s(&outs.read::<f32>()?);
    let mut passed = true;
    let mut detail = format!("{chips} chips: every (chip, domain) matches the golden");
    'check: for r in 0..chips {
        for (d, (members, scale)) in domains(chips, dual).into_iter().enumerate() {
            let want: Vec<f64> = if members.contains(&r) {
                let bias = if dual { r as f64 } else { 0.0 };
                (0..len)
                    .map(|i| {
                        members.iter().map(|&m| (i + 100 * m) as f64).sum::<f64>()
                            * f64::from(scale)
                            + bias
                    })
                    .collect()
            } else {
                vec![0.0; len]
            };
            let start = (r * 2 + d) * len;
            let (ok, det) = crate::compare(
                &format!("chip {r} domain {d}"),
                &got[start..start + len],
                &want,
                0.0,
            );
            if !ok {
                passed = false;
                detail = det;
                break 'check;
            }
        }
    }
    Ok(finish(w, report, t, (passed, detail)))
}

pub(crate) fn domain_rank_map_worker(
    args: &RunArgs,
    chips: usize,
) -> Result<Outcome, ExampleError> {
    domain_worker(args, chips, false)
}

pub(crate) fn dual_domain_overlap_worker(
    args: &RunArgs,
    chips: usize,
) -> Result<Outcome, ExampleError> {
    domain_worker(args, chips, true)
}
