//! Property test of the dependency engine: random programs of reads, in-place updates and
//! overwrites over overlapping (strided, transposed, sliced) views of one buffer, run on a chip
//! with several threads, must produce exactly what running the same program sequentially does.
//! A second property runs programs over the aligned tiles of the buffer (the TensorMap's tiled
//! mode), with host reads that span several tiles and a few unaligned views that turn the
//! buffer general part-way.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use proptest::prelude::*;

use pto_core::{Chip, CoreKind, DType, KernelRegistry, Program, TaskArgs, Tensor};

const N: usize = 16;

#[derive(Clone, Debug)]
enum View {
    Flat {
        start: usize,
        end: usize,
        step: usize,
    },
    /// Elements `[k * w, (k + 1) * w)`: an aligned tile.
    Tile { w: usize, k: usize },
    Box2 {
        r0: usize,
        r1: usize,
        c0: usize,
        c1: usize,
        transpose: bool,
    },
}

#[derive(Clone, Debug)]
enum Op {
    /// x = x * 3 + k over the view (INOUT).
    Update(View, i64),
    /// x = k over the view (OUTPUT_EXISTING).
    Set(View, i64),
    /// Sum of the view into a runtime-allocated output (IN).
    Sum(View),
    /// A dependency-only task over the view (IN).
    Dummy(View),
    /// The orchestrator reads the view (it waits for the view's producers) and records its sum.
    Read(View),
    /// Open a scope around the next `n` ops.
    Scope(usize),
}

fn arb_view() -> impl Strategy<Value = View> {
    prop_oneof![
        (0..N, 0..=N, 1usize..4).prop_map(|(a, b, step)| {
            let (start, end) = if a <= b { (a, b) } else { (b, a) };
            View::Flat { start, end, step }
        }),
        (0usize..4, 0usize..=4, 0usize..4, 0usize..=4, any::<bool>()).prop_map(
            |(a, b, c, d, transpose)| View::Box2 {
                r0: a.min(b),
                r1: a.max(b),
                c0: c.min(d),
                c1: c.max(d),
                transpose,
            }
        ),
    ]
}

/// Aligned tiles of width `w` mostly; now and then any view (which may overlap tiles partly).
fn arb_tiled_view(w: usize) -> impl Strategy<Value = View> {
    prop_oneof![
        8 => (0..N / w).prop_map(move |k| View::Tile { w, k }),
        1 => arb_view(),
    ]
}

fn arb_tiled_op(w: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (arb_tiled_view(w), -5i64..5).prop_map(|(v, k)| Op::Update(v, k)),
        2 => (arb_tiled_view(w), -5i64..5).prop_map(|(v, k)| Op::Set(v, k)),
        3 => arb_tiled_view(w).prop_map(Op::Sum),
        1 => arb_tiled_view(w).prop_map(Op::Dummy),
        1 => arb_view().prop_map(Op::Read),
        1 => (1usize..6).prop_map(Op::Scope),
    ]
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (arb_view(), -5i64..5).prop_map(|(v, k)| Op::Update(v, k)),
        2 => (arb_view(), -5i64..5).prop_map(|(v, k)| Op::Set(v, k)),
        3 => arb_view().prop_map(Op::Sum),
        1 => arb_view().prop_map(Op::Dummy),
        1 => (1usize..6).prop_map(Op::Scope),
    ]
}

fn make_view(base: &Tensor, v: &View) -> Tensor {
    match *v {
        View::Flat { start, end, step } => base.slice(0, start, end, step).unwrap(),
        View::Tile { w, k } => base.slice(0, k * w, (k + 1) * w, 1).unwrap(),
        View::Box2 {
            r0,
            r1,
            c0,
            c1,
            transpose,
        } => {
            let m = base.reshape(&[4, 4]).unwrap();
            let b = m.view(&[r1 - r0, c1 - c0], &[r0, c0]).unwrap();
            if transpose {
                b.transpose(0, 1).unwrap()
            } else {
                b
            }
        }
    }
}

/// Element offsets of a view, in logical order.
fn offsets(t: &Tensor) -> Vec<usize> {
    let (shape, strides) = (t.shape(), t.strides());
    let mut out = Vec::new();
    let total: usize = shape.iter().product();
    for flat in 0..total {
        let mut rem = flat;
        let mut off = t.region().offset();
        for d in (0..shape.len()).rev() {
            off += (rem % shape[d]) * strides[d];
            rem /= shape[d];
        }
        out.push(off);
    }
    out
}

fn jitter(seed: i64) {
    // A few microseconds of work so that tasks overlap in time.
    let mut x = seed as u64 | 1;
    for _ in 0..(200 + (seed.unsigned_abs() % 7) * 300) {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
    }
    std::hint::black_box(x);
}

fn kernels() -> KernelRegistry {
    let mut k = KernelRegistry::new();
    k.register("update", CoreKind::Aiv, |ctx| {
        let c = ctx.scalar::<i64>(0)?;
        ctx.output::<i64>(0)?.for_each_mut(|x| {
            jitter(*x);
            *x = x.wrapping_mul(3).wrapping_add(c);
        });
        Ok(())
    })
    .unwrap();
    k.register("set", CoreKind::Aiv, |ctx| {
        let c = ctx.scalar::<i64>(0)?;
        ctx.output::<i64>(0)?.for_each_mut(|x| {
            jitter(c);
            *x = c;
        });
        Ok(())
    })
    .unwrap();
    k.register("sum", CoreKind::Aic, |ctx| {
        let s = ctx.input::<i64>(0)?.iter().fold(0i64, |a, b| {
            jitter(b);
            a.wrapping_add(b)
        });
        ctx.output::<i64>(1)?.fill(s);
        Ok(())
    })
    .unwrap();
    k
}

fn reference(ops: &[Op]) -> (Vec<i64>, Vec<i64>) {
    let base = Tensor::zeros(&[N], DType::I64).unwrap();
    let mut mem: Vec<i64> = (1..=N as i64).collect();
    let mut sums = Vec::new();
    for op in ops {
        match op {
            Op::Update(v, k) => {
                for o in offsets(&make_view(&base, v)) {
                    mem[o] = mem[o].wrapping_mul(3).wrapping_add(*k);
                }
            }
            Op::Set(v, k) => {
                for o in offsets(&make_view(&base, v)) {
                    mem[o] = *k;
                }
            }
            Op::Sum(v) | Op::Read(v) => {
                sums.push(
                    offsets(&make_view(&base, v))
                        .iter()
                        .fold(0i64, |a, &o| a.wrapping_add(mem[o])),
                );
            }
            Op::Dummy(_) | Op::Scope(_) => {}
        }
    }
    (mem, sums)
}

/// Submits `ops`; each Sum's output goes to `outs` with its index in program order.
fn submit_ops(
    o: &mut pto_core::Orch<'_>,
    base: &Tensor,
    ops: &[Op],
    next: &mut usize,
    outs: &mut Vec<(usize, Tensor)>,
    sums: &mut [i64],
) -> Result<(), pto_core::OrchError> {
    let mut i = 0;
    while i < ops.len() {
        match &ops[i] {
            Op::Update(v, k) => {
                o.submit(
                    "update",
                    TaskArgs::new().inout(make_view(base, v)).scalar(*k),
                )?;
            }
            Op::Set(v, k) => {
                o.submit(
                    "set",
                    TaskArgs::new()
                        .output_existing(make_view(base, v))
                        .scalar(*k),
                )?;
            }
            Op::Sum(v) => {
                let s = o.submit(
                    "sum",
                    TaskArgs::new()
                        .input(make_view(base, v))
                        .output(&[1], DType::I64),
                )?;
                outs.push((*next, s.out(0)?));
                *next += 1;
            }
            Op::Dummy(v) => {
                o.submit_dummy(TaskArgs::new().input(make_view(base, v)))?;
            }
            Op::Read(v) => {
                sums[*next] = o
                    .read::<i64>(&make_view(base, v))?
                    .iter()
                    .fold(0i64, |a, &b| a.wrapping_add(b));
                *next += 1;
            }
            Op::Scope(n) => {
                let end = (i + 1 + n).min(ops.len());
                let inner = &ops[i + 1..end];
                // Outputs of an inner scope are read inside it.
                o.scope(|o| {
                    let mut inner_outs = Vec::new();
                    submit_ops(o, base, inner, next, &mut inner_outs, sums)?;
                    for (k, t) in inner_outs {
                        sums[k] = o.read::<i64>(&t)?[0];
                    }
                    Ok(())
                })?;
                i = end;
                continue;
            }
        }
        i += 1;
    }
    Ok(())
}

/// Runs `ops` on a chip and checks the buffer and every sum against the sequential reference.
fn check(ops: &[Op], orch_runs: bool) -> Result<(), TestCaseError> {
    let chip = Chip::builder()
        .orchestrator_runs_tasks(orch_runs)
        .aic_cores(2)
        .aiv_cores(4)
        .threads(3)
        .ring_task_window(64)
        .wait_timeout(Duration::from_secs(10))
        .stall_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let base = Tensor::from_slice(&[N], &(1..=N as i64).collect::<Vec<_>>()).unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let (b, g, ops2) = (base.clone(), got.clone(), ops.to_vec());
    let n_sums = ops
        .iter()
        .filter(|op| matches!(op, Op::Sum(_) | Op::Read(_)))
        .count();
    chip.run(&Program::new("prop", kernels(), move |o| {
        let mut outs = Vec::new();
        let mut sums = vec![0i64; n_sums];
        let mut next = 0;
        submit_ops(o, &b, &ops2, &mut next, &mut outs, &mut sums)?;
        for (k, t) in outs {
            sums[k] = o.read::<i64>(&t)?[0];
        }
        *g.lock() = sums;
        Ok(())
    }))
    .unwrap();
    let (mem, sums) = reference(ops);
    prop_assert_eq!(base.read::<i64>().unwrap(), mem);
    prop_assert_eq!(&*got.lock(), &sums);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn parallel_run_matches_sequential_reference(
        ops in prop::collection::vec(arb_op(), 1..40),
        orch_runs in any::<bool>(),
    ) {
        check(&ops, orch_runs)?;
    }

    #[test]
    fn tiled_run_matches_sequential_reference(
        ops in prop::sample::select(vec![1usize, 2, 4, 8])
            .prop_flat_map(|w| prop::collection::vec(arb_tiled_op(w), 1..48)),
        orch_runs in any::<bool>(),
    ) {
        check(&ops, orch_runs)?;
    }
}
