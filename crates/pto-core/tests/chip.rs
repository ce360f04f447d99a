//! End-to-end behaviour of the chip runtime: dependencies, scopes and rings, SPMD, failures,
//! traces. Results are checked against values computed independently in the test.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pto_core::{
    ArgMode, Chip, CoreKind, DType, KernelError, KernelRegistry, OrchError, Program, RunError,
    RunOptions, TaskArgs, Tensor, TensorError,
};

/// Set by `fill_flagged` when it starts.
static FILL_STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn kernels() -> KernelRegistry {
    let mut k = KernelRegistry::new();
    // As `fill`, but raises FILL_STARTED first.
    k.register("fill_flagged", CoreKind::Aiv, |ctx| {
        FILL_STARTED.store(true, Ordering::Release);
        let v = ctx.scalar::<i64>(0)?;
        std::thread::sleep(Duration::from_millis(ctx.scalar::<u64>(1).unwrap_or(0)));
        ctx.output::<i64>(0)?.fill(v);
        Ok(())
    })
    .unwrap();
    // t0 (INOUT i64) += s0
    k.register("add_scalar", CoreKind::Aiv, |ctx| {
        let v = ctx.scalar::<i64>(0)?;
        ctx.output::<i64>(0)?.for_each_mut(|x| *x += v);
        Ok(())
    })
    .unwrap();
    // t1 = t0 * 2 + s0 (after sleeping s1 ms)
    k.register("affine", CoreKind::Aiv, |ctx| {
        let b = ctx.scalar::<i64>(0)?;
        let ms = ctx.scalar::<u64>(1).unwrap_or(0);
        std::thread::sleep(Duration::from_millis(ms));
        let x = ctx.input::<i64>(0)?.to_vec();
        ctx.output::<i64>(1)?
            .assign(&x.iter().map(|v| v * 2 + b).collect::<Vec<_>>())?;
        Ok(())
    })
    .unwrap();
    // t0 = s0 everywhere (after sleeping s1 ms)
    k.register("fill", CoreKind::Aiv, |ctx| {
        let v = ctx.scalar::<i64>(0)?;
        std::thread::sleep(Duration::from_millis(ctx.scalar::<u64>(1).unwrap_or(0)));
        ctx.output::<i64>(0)?.fill(v);
        Ok(())
    })
    .unwrap();
    k.register("matmul_like", CoreKind::Aic, |ctx| {
        let x = ctx.input::<f32>(0)?.to_vec();
        ctx.output::<f32>(1)?
            .assign(&x.iter().map(|v| v * 10.0).collect::<Vec<_>>())?;
        Ok(())
    })
    .unwrap();
    k.register("mix", CoreKind::Mix, |ctx| {
        ctx.output::<i64>(0)?
            .fill(i64::from(ctx.core().index) + 100);
        Ok(())
    })
    .unwrap();
    // SPMD: each block writes its index into its chunk.
    k.register("spmd_idx", CoreKind::Aiv, |ctx| {
        let b = i64::from(ctx.block_idx());
        ctx.output_chunk::<i64>(0)?.fill(b);
        Ok(())
    })
    .unwrap();
    k.register("boom", CoreKind::Aiv, |_ctx| panic!("kernel exploded"))
        .unwrap();
    k.register("refuse", CoreKind::Aiv, |_ctx| {
        Err(KernelError::msg("refused on purpose"))
    })
    .unwrap();
    k.register("read_as_f64", CoreKind::Aiv, |ctx| {
        ctx.input::<f64>(0)?;
        Ok(())
    })
    .unwrap();
    k.register("nop", CoreKind::Aiv, |_ctx| Ok(())).unwrap();
    // Waits (inside the kernel, as a kernel waiting on a peer's signal does) until `set_peer`
    // has run, then fills t0 with 7.
    k.register("wait_peer", CoreKind::Aiv, |ctx| {
        if !wait_flag(&PEER_FLAG, Duration::from_secs(5)) {
            return Err(KernelError::msg("set_peer never ran"));
        }
        ctx.output::<i64>(0)?.fill(7);
        Ok(())
    })
    .unwrap();
    k.register("set_peer", CoreKind::Aiv, |_ctx| {
        PEER_FLAG.store(true, Ordering::Release);
        Ok(())
    })
    .unwrap();
    k
}

/// Raised by `set_peer`, awaited by `wait_peer`.
static PEER_FLAG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Waits until `flag` is raised (polling every 50 µs, as a kernel waiting for a peer's signal
/// does), for at most `limit`; false if it never was.
fn wait_flag(flag: &std::sync::atomic::AtomicBool, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while !flag.load(Ordering::Acquire) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    true
}

fn chip() -> Chip {
    Chip::builder()
        .aic_cores(1)
        .aiv_cores(2)
        .threads(2)
        .wait_timeout(Duration::from_secs(10))
        .stall_timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn program(
    f: impl Fn(&mut pto_core::Orch<'_>) -> Result<(), OrchError> + Send + Sync + 'static,
) -> Program {
    Program::new("test", kernels(), f)
}

#[test]
fn read_after_write_chain_is_serial() {
    let cell = Tensor::zeros(&[1], DType::I64).unwrap();
    let c = cell.clone();
    let report = chip()
        .run(&program(move |o| {
            for i in 0..2000 {
                o.submit("add_scalar", TaskArgs::new().inout(&c).scalar(i as i64))?;
            }
            Ok(())
        }))
        .unwrap();
    assert_eq!(cell.read::<i64>().unwrap(), vec![(0..2000).sum::<i64>()]);
    assert_eq!(report.stats.tasks, 2000);
    assert_eq!(report.stats.edges, 1999);
}

#[test]
fn write_after_read_waits_for_the_slow_reader() {
    // The reader sleeps; the writer must not overwrite x before the reader copied it.
    let x = Tensor::from_slice(&[4], &[1i64, 2, 3, 4]).unwrap();
    let snap = Tensor::zeros(&[4], DType::I64).unwrap();
    let (xx, ss) = (x.clone(), snap.clone());
    chip()
        .run(&program(move |o| {
            o.submit(
                "affine",
                TaskArgs::new()
                    .input(&xx)
                    .output_existing(&ss)
                    .scalar(0i64)
                    .scalar(50u64),
            )?;
            o.submit(
                "fill",
                TaskArgs::new()
                    .output_existing(&xx)
                    .scalar(-1i64)
                    .scalar(0u64),
            )?;
            Ok(())
        }))
        .unwrap();
    assert_eq!(snap.read::<i64>().unwrap(), vec![2, 4, 6, 8]);
    assert_eq!(x.read::<i64>().unwrap(), vec![-1; 4]);
}

#[test]
fn write_after_write_keeps_submission_order() {
    let x = Tensor::zeros(&[64], DType::I64).unwrap();
    let xx = x.clone();
    chip()
        .run(&program(move |o| {
            for i in 0..50u64 {
                // Early writers sleep longer: without WAW ordering the last value would be wrong.
                let ms = if i < 3 { 20 } else { 0 };
                o.submit(
                    "fill",
                    TaskArgs::new()
                        .output_existing(&xx)
                        .scalar(i as i64)
                        .scalar(ms),
                )?;
            }
            Ok(())
        }))
        .unwrap();
    assert_eq!(x.read::<i64>().unwrap(), vec![49; 64]);
}

#[test]
fn disjoint_views_run_in_parallel_and_land_in_place() {
    let m = Tensor::zeros(&[4, 8], DType::I64).unwrap();
    let mm = m.clone();
    chip()
        .run(&program(move |o| {
            for c in 0..4 {
                let col = mm.view(&[4, 2], &[0, 2 * c])?;
                o.submit(
                    "fill",
                    TaskArgs::new()
                        .output_existing(&col)
                        .scalar(c as i64)
                        .scalar(5u64),
                )?;
            }
            Ok(())
        }))
        .unwrap();
    let v = m.read::<i64>().unwrap();
    for r in 0..4 {
        for c in 0..8 {
            assert_eq!(v[r * 8 + c], (c / 2) as i64);
        }
    }
}

#[test]
fn runtime_outputs_flow_between_tasks_and_read_waits() {
    let x = Tensor::from_slice(&[3], &[1i64, 2, 3]).unwrap();
    let got = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let g = got.clone();
    chip()
        .run(&program(move |o| {
            let y = o
                .submit(
                    "affine",
                    TaskArgs::new()
                        .input(&x)
                        .output(&[3], DType::I64)
                        .scalar(1i64)
                        .scalar(20u64),
                )?
                .out(0)?;
            let z = o
                .submit(
                    "affine",
                    TaskArgs::new()
                        .input(&y)
                        .output(&[3], DType::I64)
                        .scalar(0i64),
                )?
                .out(0)?;
            *g.lock() = o.read::<i64>(&z)?;
            Ok(())
        }))
        .unwrap();
    assert_eq!(*got.lock(), vec![6, 10, 14]);
}

#[test]
fn scopes_recycle_ring_memory_under_back_pressure() {
    // 64 KiB per ring; each task allocates 8 KiB; 1000 tasks only fit because scopes end.
    let chip = Chip::builder()
        .aic_cores(1)
        .aiv_cores(2)
        .threads(2)
        .ring_heap_bytes(64 << 10)
        .ring_task_window(16)
        .build()
        .unwrap();
    let acc = Tensor::zeros(&[1024], DType::I64).unwrap();
    let a = acc.clone();
    let report = chip
        .run(&program(move |o| {
            for i in 0..200 {
                o.scope(|o| {
                    let t = o
                        .submit(
                            "affine",
                            TaskArgs::new()
                                .input(&a)
                                .output(&[1024], DType::I64)
                                .scalar(i as i64),
                        )?
                        .out(0)?;
                    for _ in 0..4 {
                        o.submit(
                            "affine",
                            TaskArgs::new()
                                .input(&t)
                                .output(&[1024], DType::I64)
                                .scalar(0i64),
                        )?;
                    }
                    Ok(())
                })?;
            }
            Ok(())
        }))
        .unwrap();
    assert_eq!(report.stats.tasks, 1000);
    assert!(report.stats.peak_ring_bytes <= 64 << 10);
    assert!(report.stats.peak_ring_tasks < 16);
}

#[test]
fn a_full_ring_refills_as_soon_as_a_slot_frees_while_a_kernel_waits_on_a_later_task() {
    // The ring (scope depth 1, window 5) holds 4 live tasks: `fill`, then `wait_peer` and its two
    // readers. `set_peer` fits only once `fill` retires, and `wait_peer` (hence its readers)
    // finishes only after `set_peer` ran. The orchestrating thread, blocked on the full ring,
    // must come back for that one slot.
    PEER_FLAG.store(false, Ordering::Release);
    let chip = Chip::builder()
        .aiv_cores(2)
        .aic_cores(0)
        .threads(2)
        .ring_task_window(5)
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let report = chip
        .run(&program(|o| {
            o.scope(|o| {
                // Sleeps 20 ms, so the ring is full before it retires.
                o.submit(
                    "fill",
                    TaskArgs::new()
                        .output(&[4], DType::I64)
                        .scalar(1i64)
                        .scalar(20u64),
                )?;
                Ok(())
            })?;
            o.scope(|o| {
                let b = o
                    .submit("wait_peer", TaskArgs::new().output(&[4], DType::I64))?
                    .out(0)?;
                for _ in 0..2 {
                    o.submit(
                        "affine",
                        TaskArgs::new()
                            .input(&b)
                            .output(&[4], DType::I64)
                            .scalar(1i64),
                    )?;
                }
                Ok(())
            })?;
            o.scope(|o| {
                o.submit("set_peer", TaskArgs::new())?;
                Ok(())
            })
        }))
        .unwrap();
    assert_eq!(report.stats.tasks, 5);
    assert_eq!(report.stats.peak_ring_tasks, 4, "the ring was never full");
    assert!(PEER_FLAG.load(Ordering::Acquire));
}

#[test]
fn a_scope_larger_than_its_ring_is_a_named_deadlock() {
    let chip = Chip::builder()
        .aiv_cores(2)
        .aic_cores(0)
        .ring_task_window(8)
        .build()
        .unwrap();
    let err = chip
        .run(&program(|o| {
            o.scope(|o| {
                for _ in 0..100 {
                    o.submit("nop", TaskArgs::new().output(&[4], DType::F32))?;
                }
                Ok(())
            })
        }))
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            &err,
            RunError::Orchestration(OrchError::ScopeDeadlock {
                depth: 1,
                ring: 1,
                ..
            })
        ),
        "{msg}"
    );
    assert!(msg.contains("depth 1"), "{msg}");
    // The chip is still usable.
    chip.run(&program(|o| o.submit("nop", TaskArgs::new()).map(|_| ())))
        .unwrap();
}

#[test]
fn an_output_larger_than_the_ring_is_an_error() {
    let chip = Chip::builder().ring_heap_bytes(1024).build().unwrap();
    let err = chip
        .run(&program(|o| {
            o.submit("nop", TaskArgs::new().output(&[1024], DType::F32))
                .map(|_| ())
        }))
        .unwrap_err();
    assert!(
        matches!(
            err,
            RunError::Orchestration(OrchError::OutputTooLarge {
                bytes: 4096,
                capacity: 1024,
                ..
            })
        ),
        "{err}"
    );
}

#[test]
fn dummy_tasks_join_dependencies() {
    let x = Tensor::zeros(&[2], DType::I64).unwrap();
    let y = Tensor::zeros(&[2], DType::I64).unwrap();
    let (xx, yy) = (x.clone(), y.clone());
    chip()
        .run(&program(move |o| {
            let a = o.submit(
                "fill",
                TaskArgs::new()
                    .output_existing(&xx)
                    .scalar(7i64)
                    .scalar(30u64),
            )?;
            let d = o.submit_dummy(TaskArgs::new().after(a.task))?;
            // Manual scope: only the explicit dependency on the dummy orders this after `a`.
            o.manual_scope(|o| {
                o.submit(
                    "affine",
                    TaskArgs::new()
                        .no_dep(&xx)
                        .output_existing(&yy)
                        .scalar(0i64)
                        .after(d.task),
                )
            })?;
            Ok(())
        }))
        .unwrap();
    assert_eq!(y.read::<i64>().unwrap(), vec![14, 14]);
}

#[test]
fn spmd_blocks_write_their_own_chunks() {
    let out = Tensor::zeros(&[10, 3], DType::I64).unwrap();
    let oo = out.clone();
    let report = chip()
        .run(&program(move |o| {
            o.submit("spmd_idx", TaskArgs::new().output_existing(&oo).blocks(4))?;
            Ok(())
        }))
        .unwrap();
    assert_eq!(report.stats.blocks, 4);
    let v = out.read::<i64>().unwrap();
    let expect: Vec<i64> = (0..10)
        .flat_map(|r| {
            let b = (0..4)
                .find(|&b| pto_core::block_range(10, b, 4).contains(&r))
                .unwrap();
            [i64::from(b); 3]
        })
        .collect();
    assert_eq!(v, expect);
}

#[test]
fn spmd_blocks_cannot_share_a_writable_tensor() {
    let mut k = kernels();
    k.register("bad_spmd", CoreKind::Aiv, |ctx| {
        ctx.output::<i64>(0)?;
        Ok(())
    })
    .unwrap();
    let out = Tensor::zeros(&[4], DType::I64).unwrap();
    let err = chip()
        .run(&Program::new("t", k, move |o| {
            o.submit("bad_spmd", TaskArgs::new().output_existing(&out).blocks(2))
                .map(|_| ())
        }))
        .unwrap_err();
    assert!(err.to_string().contains("output_chunk"), "{err}");
}

#[test]
fn mix_and_aic_kernels_run_on_their_cores() {
    let x = Tensor::from_slice(&[2], &[1.0f32, 2.0]).unwrap();
    let m = Tensor::zeros(&[1], DType::I64).unwrap();
    let mm = m.clone();
    let res = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let r = res.clone();
    let report = chip()
        .run_with(
            &program(move |o| {
                let y = o
                    .submit(
                        "matmul_like",
                        TaskArgs::new().input(&x).output(&[2], DType::F32),
                    )?
                    .out(0)?;
                o.submit("mix", TaskArgs::new().output_existing(&mm))?;
                *r.lock() = o.read::<f32>(&y)?;
                Ok(())
            }),
            RunOptions { trace: true },
        )
        .unwrap();
    assert_eq!(*res.lock(), vec![10.0, 20.0]);
    assert_eq!(m.read::<i64>().unwrap(), vec![100]);
    let trace = report.trace.unwrap();
    let mut kinds: Vec<String> = trace.events.iter().map(|e| e.core.to_string()).collect();
    kinds.sort();
    assert_eq!(kinds, vec!["AIC0", "MIX0"]);
}

#[test]
fn a_panicking_kernel_fails_its_task_and_poisons_downstream() {
    let chip = chip();
    let x = Tensor::zeros(&[4], DType::I64).unwrap();
    let independent = Tensor::zeros(&[1], DType::I64).unwrap();
    let (xx, ii) = (x.clone(), independent.clone());
    let ran_after = Arc::new(AtomicUsize::new(0));
    let err = chip
        .run(&program(move |o| {
            let bad = o.submit("boom", TaskArgs::new().output_existing(&xx))?;
            // Three tasks downstream (by data and explicitly), one independent.
            let y = o
                .submit(
                    "affine",
                    TaskArgs::new()
                        .input(&xx)
                        .output(&[4], DType::I64)
                        .scalar(0i64),
                )?
                .out(0)?;
            o.submit(
                "affine",
                TaskArgs::new()
                    .input(&y)
                    .output(&[4], DType::I64)
                    .scalar(0i64),
            )?;
            o.submit("nop", TaskArgs::new().after(bad.task))?;
            o.submit("fill", TaskArgs::new().output_existing(&ii).scalar(5i64))?;
            // Reading poisoned data names the failure.
            match o.read::<i64>(&y) {
                Err(OrchError::Poisoned { cause, .. }) => {
                    assert!(cause.contains("kernel exploded"))
                }
                other => panic!("expected a poisoned read, got {other:?}"),
            }
            Ok(())
        }))
        .unwrap_err();
    ran_after.fetch_add(1, Ordering::Relaxed);
    match &err {
        RunError::TaskFailed {
            failure,
            failed,
            poisoned,
        } => {
            assert_eq!(failure.kernel, "boom");
            assert_eq!(failure.task.get(), 0);
            assert!(failure.message.contains("kernel exploded"));
            assert!(failure.core.is_some_and(|c| c.kind == CoreKind::Aiv));
            assert_eq!((*failed, *poisoned), (1, 3));
        }
        other => panic!("unexpected {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("boom") && msg.contains("#0") && msg.contains("AIV"),
        "{msg}"
    );
    assert_eq!(independent.read::<i64>().unwrap(), vec![5]);
    // The chip stays usable.
    let c = Tensor::zeros(&[1], DType::I64).unwrap();
    let cc = c.clone();
    chip.run(&program(move |o| {
        o.submit("add_scalar", TaskArgs::new().inout(&cc).scalar(3i64))
            .map(|_| ())
    }))
    .unwrap();
    assert_eq!(c.read::<i64>().unwrap(), vec![3]);
}

#[test]
fn poison_reaches_later_readers_of_a_retired_failed_writer() {
    let x = Tensor::zeros(&[4], DType::I64).unwrap();
    let out = Tensor::zeros(&[4], DType::I64).unwrap();
    let (xx, oo) = (x.clone(), out.clone());
    let err = chip()
        .run(&program(move |o| {
            o.scope(|o| {
                o.submit("refuse", TaskArgs::new().output_existing(&xx))?;
                // Wait for it inside the scope (the read fails: it was poisoned), so that the
                // scope's end retires it.
                assert!(o.read::<i64>(&xx).is_err());
                Ok(())
            })?;
            // The failed task has retired; read what it should have written.
            o.submit(
                "affine",
                TaskArgs::new().input(&xx).output_existing(&oo).scalar(1i64),
            )?;
            Ok(())
        }))
        .unwrap_err();
    assert!(
        matches!(
            err,
            RunError::TaskFailed {
                poisoned: 1,
                failed: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("refused on purpose"));
    assert_eq!(out.read::<i64>().unwrap(), vec![0; 4]);
}

#[test]
fn bad_kernel_accesses_are_errors() {
    let x = Tensor::zeros(&[4], DType::F32).unwrap();
    let xx = x.clone();
    let err = chip()
        .run(&program(move |o| {
            o.submit("read_as_f64", TaskArgs::new().input(&xx))
                .map(|_| ())
        }))
        .unwrap_err();
    assert!(
        err.to_string().contains("dtype f32, accessed as f64"),
        "{err}"
    );

    let err = chip()
        .run(&program(|o| {
            o.submit("read_as_f64", TaskArgs::new()).map(|_| ())
        }))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("tensor argument 0 out of range: the task has 0"),
        "{err}"
    );

    // `add_scalar` reads scalar 0 as i64; give it an f32.
    let y = Tensor::zeros(&[1], DType::I64).unwrap();
    let err = chip()
        .run(&program(move |o| {
            o.submit("add_scalar", TaskArgs::new().inout(&y).scalar(1.0f32))
                .map(|_| ())
        }))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("scalar argument 0 is f32, read as i64"),
        "{err}"
    );

    // Writing an IN argument.
    let z = Tensor::zeros(&[1], DType::I64).unwrap();
    let err = chip()
        .run(&program(move |o| {
            o.submit("fill", TaskArgs::new().tensor(&z, ArgMode::In).scalar(1i64))
                .map(|_| ())
        }))
        .unwrap_err();
    assert!(
        err.to_string().contains("is IN and cannot be written"),
        "{err}"
    );
}

#[test]
fn bad_submissions_are_errors_and_lose_nothing() {
    let x = Tensor::zeros(&[8], DType::I64).unwrap();
    let xx = x.clone();
    let err = chip()
        .run(&program(move |o| {
            let a = xx.view(&[4], &[0])?;
            let b = xx.view(&[4], &[2])?;
            o.submit(
                "affine",
                TaskArgs::new().input(&a).output_existing(&b).scalar(0i64),
            )
            .map(|_| ())
        }))
        .unwrap_err();
    assert!(
        err.to_string().contains("overlap and one is written"),
        "{err}"
    );
    let err = chip()
        .run(&program(|o| {
            o.submit("no_such_kernel", TaskArgs::new()).map(|_| ())
        }))
        .unwrap_err();
    assert!(err.to_string().contains("no_such_kernel"), "{err}");
    let err = chip()
        .run(&program(|o| {
            o.submit("nop", TaskArgs::new().blocks(0)).map(|_| ())
        }))
        .unwrap_err();
    assert!(err.to_string().contains("block count"), "{err}");
    let err = chip()
        .run(&program(|o| {
            o.submit("nop", TaskArgs::new().output(&[2; 6], DType::F32))
                .map(|_| ())
        }))
        .unwrap_err();
    assert!(err.to_string().contains("1 to 5 dimensions"), "{err}");
    // A dimension a region cannot hold is named before any ring memory is sought.
    let err = chip()
        .run(&program(|o| {
            o.submit("nop", TaskArgs::new().output(&[2, 1 << 32], DType::U8))
                .map(|_| ())
        }))
        .unwrap_err();
    assert!(
        err.to_string().contains("dimension 1's size is 4294967296"),
        "{err}"
    );
    let no_aic = Chip::builder().aic_cores(0).aiv_cores(1).build().unwrap();
    let err = no_aic
        .run(&program(|o| {
            o.submit("matmul_like", TaskArgs::new()).map(|_| ())
        }))
        .unwrap_err();
    assert!(err.to_string().contains("needs a AIC core"), "{err}");
    assert!(Chip::builder().aic_cores(0).aiv_cores(0).build().is_err());
    assert!(Chip::builder().ring_task_window(2).build().is_err());
}

#[test]
fn untracked_writers_that_collide_fail_instead_of_racing() {
    let x = Tensor::zeros(&[4], DType::I64).unwrap();
    let xx = x.clone();
    let err = chip()
        .run(&program(move |o| {
            o.manual_scope(|o| {
                o.submit(
                    "fill_flagged",
                    TaskArgs::new()
                        .output_existing(&xx)
                        .scalar(1i64)
                        .scalar(300u64),
                )?;
                // Submit the second writer only once the first one runs.
                let t = std::time::Instant::now();
                while !FILL_STARTED.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(10)
                {
                    std::thread::yield_now();
                }
                o.submit(
                    "fill",
                    TaskArgs::new()
                        .output_existing(&xx)
                        .scalar(2i64)
                        .scalar(0u64),
                )
            })?;
            Ok(())
        }))
        .unwrap_err();
    assert!(err.to_string().contains("data race"), "{err}");
    assert_eq!(x.read::<i64>().unwrap(), vec![1; 4]);
}

/// A `NO_DEP` reader of a buffer that an engine-ordered task is writing fails with a data
/// race. The run owns the buffer, so the writer registered nothing (the fast path); the
/// reader's borrow must find it among the running tasks.
#[test]
fn a_no_dep_reader_finds_the_engine_ordered_writer_it_would_race() {
    static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let mut k = KernelRegistry::new();
    k.register("slow_fill", CoreKind::Aiv, |ctx| {
        STARTED.store(true, Ordering::Release);
        std::thread::sleep(Duration::from_millis(300));
        ctx.output::<i64>(0)?.fill(1);
        Ok(())
    })
    .unwrap();
    k.register("peek", CoreKind::Aiv, |_| Ok(())).unwrap();
    let x = Tensor::zeros(&[4], DType::I64).unwrap();
    let xx = x.clone();
    let err = chip()
        .run(&Program::new("race", k, move |o| {
            o.submit("slow_fill", TaskArgs::new().output_existing(&xx))?;
            let t = std::time::Instant::now();
            while !STARTED.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(10) {
                std::thread::yield_now();
            }
            o.submit("peek", TaskArgs::new().no_dep(&xx)).map(|_| ())
        }))
        .unwrap_err();
    assert!(err.to_string().contains("data race"), "{err}");
    assert!(err.to_string().contains("peek"), "{err}");
    assert_eq!(x.read::<i64>().unwrap(), vec![1; 4]);
}

/// The run failed because an argument was an output the runtime no longer reserves.
fn assert_stale(err: &RunError) {
    assert!(
        matches!(
            err,
            RunError::Orchestration(OrchError::Tensor(TensorError::Stale { .. }))
        ),
        "{err}"
    );
}

#[test]
fn a_stale_output_handle_is_an_error() {
    let x = Tensor::from_slice(&[2], &[1i64, 2]).unwrap();
    let err = chip()
        .run(&program(move |o| {
            let y = o.scope(|o| {
                o.submit(
                    "affine",
                    TaskArgs::new()
                        .input(&x)
                        .output(&[2], DType::I64)
                        .scalar(0i64),
                )?
                .out(0)
                .and_then(|y| {
                    // Finished inside the scope, so the scope's end retires it at once.
                    o.read::<i64>(&y)?;
                    Ok(y)
                })
            })?;
            // The scope's task retired: its output is stale.
            o.submit(
                "affine",
                TaskArgs::new()
                    .input(&y)
                    .output(&[2], DType::I64)
                    .scalar(0i64),
            )
            .map(|_| ())
        }))
        .unwrap_err();
    assert_stale(&err);
}

/// Runs on one chip reuse the rings (and their heaps) of the runs before: each run's outputs
/// are right, and an output kept from an earlier run is stale (in a later submit and on a
/// read), never a view of what a later run wrote in the same bytes.
#[test]
fn later_runs_reuse_the_ring_heaps_and_earlier_outputs_are_stale() {
    let c = chip();
    let x = Tensor::from_slice(&[2], &[1i64, 2]).unwrap();
    let kept: Arc<Mutex<Vec<Tensor>>> = Arc::default();
    for (run, b) in [0i64, 100, 1000].into_iter().enumerate() {
        let (x, k) = (x.clone(), kept.clone());
        c.run(&program(move |o| {
            let y = o
                .submit(
                    "affine",
                    TaskArgs::new().input(&x).output(&[2], DType::I64).scalar(b),
                )?
                .out(0)?;
            let got = o.read::<i64>(&y)?;
            if got != [2 + b, 4 + b] {
                return Err(OrchError::msg(format!("run {run}: {got:?}")));
            }
            k.lock().unwrap().push(y);
            Ok(())
        }))
        .unwrap();
    }
    let kept = kept.lock().unwrap().clone();
    // One heap served the three runs.
    assert!(kept
        .iter()
        .all(|y| y.buffer().id() == kept[0].buffer().id()));
    for y in &kept {
        assert!(matches!(y.read::<i64>(), Err(TensorError::Stale { .. })));
    }
    let y0 = kept[0].clone();
    let err = c
        .run(&program(move |o| {
            o.submit(
                "affine",
                TaskArgs::new()
                    .input(&y0)
                    .output(&[2], DType::I64)
                    .scalar(0i64),
            )
            .map(|_| ())
        }))
        .unwrap_err();
    assert_stale(&err);
}

#[test]
fn a_trace_records_every_block_as_chrome_json() {
    let x = Tensor::zeros(&[8, 2], DType::I64).unwrap();
    let xx = x.clone();
    let report = chip()
        .run_with(
            &program(move |o| {
                o.submit("spmd_idx", TaskArgs::new().output_existing(&xx).blocks(3))?;
                o.submit("add_scalar", TaskArgs::new().inout(&xx).scalar(1i64))?;
                Ok(())
            }),
            RunOptions { trace: true },
        )
        .unwrap();
    let trace = report.trace.unwrap();
    assert_eq!(trace.events.len(), 4);
    let last = trace
        .events
        .iter()
        .find(|e| &*e.kernel == "add_scalar")
        .unwrap();
    assert_eq!(last.deps.len(), 1);
    for e in &trace.events {
        assert!(e.end_us >= e.start_us);
    }
    let json = trace.to_chrome_json();
    let evs = json["traceEvents"].as_array().unwrap();
    assert_eq!(evs.iter().filter(|e| e["ph"] == "X").count(), 4);
    assert!(evs
        .iter()
        .any(|e| e["ph"] == "M" && e["name"] == "thread_name"));
    // An arrow from each producer to each consumer; lanes named, no pid or tid 0.
    let deps: usize = trace
        .events
        .iter()
        .filter(|e| e.block == 0 && !e.deferred)
        .map(|e| e.deps.len())
        .sum();
    assert!(deps > 0);
    assert_eq!(evs.iter().filter(|e| e["ph"] == "s").count(), deps);
    assert_eq!(evs.iter().filter(|e| e["ph"] == "f").count(), deps);
    assert!(evs
        .iter()
        .all(|e| e["pid"] != 0 && e.get("tid").is_none_or(|t| *t != 0)));
    assert!(evs
        .iter()
        .any(|e| e["name"] == "process_name" && e["args"]["name"] == "rank 0 / chip"));
    // Off by default.
    assert!(chip().run(&program(|_| Ok(()))).unwrap().trace.is_none());
}

#[test]
fn a_kernel_that_never_returns_is_reported_and_drop_does_not_hang() {
    let mut k = KernelRegistry::new();
    k.register("hang", CoreKind::Aiv, |_| {
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    })
    .unwrap();
    let chip = Chip::builder()
        .aiv_cores(1)
        .aic_cores(0)
        .threads(1)
        .stall_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let err = chip
        .run(&Program::new("hang", k, |o| {
            o.submit("hang", TaskArgs::new()).map(|_| ())
        }))
        .unwrap_err();
    assert!(
        matches!(&err, RunError::Stalled { running, .. } if running.contains("hang")),
        "{err}"
    );
    assert!(chip.broken().is_some());
    assert!(matches!(
        chip.run(&program(|_| Ok(()))),
        Err(RunError::Broken(_))
    ));
    let t = std::time::Instant::now();
    drop(chip);
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn an_orchestration_error_or_panic_is_reported() {
    let chip = chip();
    let err = chip
        .run(&program(|_| Err(OrchError::msg("bad plan"))))
        .unwrap_err();
    assert_eq!(err.to_string(), "orchestration failed: bad plan");
    let err = chip
        .run(&program(|_| panic!("orchestrator fell over")))
        .unwrap_err();
    assert!(err.to_string().contains("orchestrator fell over"), "{err}");
    chip.run(&program(|_| Ok(()))).unwrap();
}

#[test]
fn many_programs_in_a_row_and_one_thread_for_many_cores() {
    let chip = Chip::builder()
        .aic_cores(4)
        .aiv_cores(8)
        .threads(1)
        .build()
        .unwrap();
    for round in 0..20i64 {
        let x = Tensor::zeros(&[16], DType::I64).unwrap();
        let xx = x.clone();
        chip.run(&program(move |o| {
            for i in 0..16 {
                let e = xx.view(&[1], &[i])?;
                o.submit(
                    "fill",
                    TaskArgs::new()
                        .output_existing(&e)
                        .scalar(round * 100 + i as i64),
                )?;
            }
            Ok(())
        }))
        .unwrap();
        assert_eq!(
            x.read::<i64>().unwrap(),
            (0..16).map(|i| round * 100 + i).collect::<Vec<_>>()
        );
    }
}

#[test]
#[ignore = "timing probe, run by hand in release mode"]
fn probe_run_fixed_cost() {
    let chip = chip();
    let p = program(|o| o.submit_dummy(TaskArgs::new()).map(|_| ()));
    let e = program(|_| Ok(()));
    let k = program(|o| o.submit("nop", TaskArgs::new()).map(|_| ()));
    for (name, prog) in [("empty", &e), ("dummy", &p), ("one kernel", &k)] {
        let mut v: Vec<f64> = (0..2000)
            .map(|_| {
                let t = std::time::Instant::now();
                chip.run(prog).unwrap();
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        v.sort_by(f64::total_cmp);
        eprintln!("{name}: median {:.2} us", v[v.len() / 2]);
    }
}

/// Timing probe of the engine on threads: the fan of `pto bench dag`, run by hand in release
/// mode (`cargo test --release -p pto-core --test chip probe_fan -- --ignored --nocapture`).
#[test]
#[ignore = "timing probe"]
fn probe_fan() {
    let mut k = KernelRegistry::new();
    k.register("fan", CoreKind::Aiv, |ctx| {
        let v = ctx.input::<i64>(0)?.get(&[0]).unwrap_or(0);
        ctx.output::<i64>(1)?.fill(v + 1);
        Ok(())
    })
    .unwrap();
    let k = std::sync::Arc::new(k);
    let chip = Chip::builder()
        .aic_cores(2)
        .aiv_cores(4)
        .threads(2)
        .build()
        .unwrap();
    let n = 200_000;
    let mut all = Vec::new();
    for _ in 0..10 {
        let c1 = Tensor::zeros(&[1], DType::I64).unwrap();
        let cs = Tensor::zeros(&[n], DType::I64).unwrap();
        let t = std::time::Instant::now();
        chip.run(&Program::new("fan", k.clone(), move |o| {
            let mut i = 0;
            while i < n {
                let end = (i + 1024).min(n);
                o.scope(|o| {
                    for j in i..end {
                        let e = cs.view(&[1], &[j])?;
                        o.submit("fan", TaskArgs::new().input(&c1).output_existing(&e))?;
                    }
                    Ok(())
                })?;
                i = end;
            }
            Ok(())
        }))
        .unwrap();
        all.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
    }
    all.sort_by(f64::total_cmp);
    eprintln!(
        "fan: min {:.0} median {:.0} ns/task",
        all[0],
        all[all.len() / 2]
    );
}

fn helping_chip() -> Chip {
    Chip::builder()
        .aic_cores(1)
        .aiv_cores(2)
        .threads(2)
        .orchestrator_runs_tasks(true)
        .wait_timeout(Duration::from_secs(10))
        .stall_timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// With `orchestrator_runs_tasks`, the one task of a run runs on the thread that called
/// `run` (no hand-off to a core thread), and its result is right.
#[test]
fn an_orchestrator_that_runs_tasks_runs_a_lone_task_itself() {
    let mut k = KernelRegistry::new();
    k.register("where", CoreKind::Aiv, |ctx| {
        let on_core = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("pto-chip"));
        ctx.output::<i64>(0)?.fill(if on_core { 1 } else { 2 });
        Ok(())
    })
    .unwrap();
    let k = Arc::new(k);
    let (helping, plain) = (helping_chip(), chip());
    for (c, want) in [(&helping, 2), (&plain, 1)] {
        let t = Tensor::zeros(&[1], DType::I64).unwrap();
        let t2 = t.clone();
        c.run(&Program::new("lone", k.clone(), move |o| {
            o.submit("where", TaskArgs::new().output_existing(&t2))
                .map(|_| ())
        }))
        .unwrap();
        assert_eq!(t.read::<i64>().unwrap(), vec![want]);
    }
}

/// Chains, fans and failures give the same results when the orchestrating thread runs tasks.
#[test]
fn an_orchestrator_that_runs_tasks_keeps_order_results_and_poison() {
    let chip = helping_chip();
    for round in 0..20i64 {
        let cell = Tensor::zeros(&[1], DType::I64).unwrap();
        let fan = Tensor::zeros(&[16], DType::I64).unwrap();
        let (c, f) = (cell.clone(), fan.clone());
        chip.run(&program(move |o| {
            for _ in 0..50 {
                o.submit("add_scalar", TaskArgs::new().inout(&c).scalar(2i64))?;
            }
            for i in 0..16 {
                let v = f.view(&[1], &[i])?;
                o.submit(
                    "fill",
                    TaskArgs::new().output_existing(&v).scalar(round + i as i64),
                )?;
            }
            Ok(())
        }))
        .unwrap();
        assert_eq!(cell.read::<i64>().unwrap(), vec![100]);
        assert_eq!(
            fan.read::<i64>().unwrap(),
            (0..16).map(|i| round + i).collect::<Vec<_>>()
        );
    }
    // A failing task held back by the orchestrating thread still poisons its consumer.
    let t = Tensor::zeros(&[1], DType::I64).unwrap();
    let t2 = t.clone();
    let err = chip
        .run(&program(move |o| {
            o.submit("refuse", TaskArgs::new().output_existing(&t2))?;
            o.submit("add_scalar", TaskArgs::new().inout(&t2).scalar(1i64))?;
            Ok(())
        }))
        .unwrap_err();
    match err {
        RunError::TaskFailed {
            failed, poisoned, ..
        } => assert_eq!((failed, poisoned), (1, 1)),
        other => panic!("expected a task failure, got {other}"),
    }
    // The chip runs the next program.
    chip.run(&program(|o| o.submit("nop", TaskArgs::new()).map(|_| ())))
        .unwrap();
}

/// A task the orchestrating thread held back still runs when the orchestration then blocks
/// on something outside the engine that the task itself provides (a core thread about to
/// park queues it): no hang.
#[test]
fn a_held_task_runs_while_the_orchestration_waits_outside_the_engine() {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let mut k = KernelRegistry::new();
    k.register("raise", CoreKind::Aiv, |_| {
        DONE.store(true, Ordering::Release);
        Ok(())
    })
    .unwrap();
    let chip = helping_chip();
    let start = std::time::Instant::now();
    chip.run(&Program::new("outside", Arc::new(k), |o| {
        o.submit("raise", TaskArgs::new())?;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !DONE.load(Ordering::Acquire) {
            if std::time::Instant::now() > deadline {
                return Err(OrchError::msg("the held task never ran"));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    }))
    .unwrap();
    // Bounded by the longest park of an idle core thread (250 ms), not by a deadline.
    assert!(start.elapsed() < Duration::from_secs(3));
}

/// The engine's nodes keep the kernel their last task ran (to spare a reference count per
/// task), but not past the run: once a program is dropped, nothing of it stays alive in the
/// chip, and a second program with a kernel of the same name runs its own.
#[test]
fn a_chip_keeps_no_kernel_past_the_run_that_used_it() {
    let chip = chip();
    let t = Tensor::zeros(&[1], DType::I64).unwrap();
    for (round, add) in [(0, 1i64), (1, 10)] {
        let token = Arc::new(());
        let held = token.clone();
        let mut k = KernelRegistry::new();
        k.register("bump", CoreKind::Aiv, move |ctx| {
            let _ = &held;
            ctx.output::<i64>(0)?.for_each_mut(|x| *x += add);
            Ok(())
        })
        .unwrap();
        let tc = t.clone();
        let p = Program::new("keep", k, move |o| {
            for _ in 0..100 {
                o.submit("bump", TaskArgs::new().inout(&tc))?;
            }
            Ok(())
        });
        chip.run(&p).unwrap();
        drop(p);
        assert_eq!(
            Arc::strong_count(&token),
            1,
            "round {round}: the kernel outlived its program"
        );
    }
    // 100 runs of +1, then 100 of +10: each program ran its own kernel.
    assert_eq!(t.read::<i64>().unwrap(), vec![1100]);
}

/// More tasks ready at submit than the orchestrating thread's own queue holds (4096) while the
/// only core thread is busy: the rest go to the shared queue, and every task runs exactly once.
#[test]
fn tasks_ready_at_submit_beyond_the_orchestrators_queue_all_run_once() {
    static GATE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let chip = Chip::builder()
        .aic_cores(1)
        .aiv_cores(1)
        .threads(1)
        .ring_task_window(8192)
        .wait_timeout(Duration::from_secs(10))
        .stall_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut k = KernelRegistry::new();
    // Holds the only core thread until the orchestrating thread has queued everything.
    k.register("gate", CoreKind::Aiv, |_| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !GATE.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        Ok(())
    })
    .unwrap();
    k.register("bump", CoreKind::Aiv, |ctx| {
        ctx.output::<i64>(0)?.for_each_mut(|x| *x += 1);
        Ok(())
    })
    .unwrap();
    let n = 6000;
    let cells = Tensor::zeros(&[n], DType::I64).unwrap();
    let cs = cells.clone();
    let p = Program::new("overflow", k, move |o| {
        o.submit("gate", TaskArgs::new())?;
        for j in 0..n {
            o.submit(
                "bump",
                TaskArgs::new().output_existing(&cs.view(&[1], &[j])?),
            )?;
        }
        GATE.store(true, Ordering::Release);
        Ok(())
    });
    chip.run(&p).unwrap();
    assert!(cells.read::<i64>().unwrap().iter().all(|&v| v == 1));
}

/// The reserved core thread (`ChipBuilder::orchestrator_cpu`) parks while the orchestrating
/// thread is busy. When that thread blocks outside the engine and the other core thread is stuck
/// in a kernel that waits for a queued task, the reserved thread must still run that task.
#[test]
fn a_reserved_thread_runs_queued_work_when_the_orchestrator_blocks_elsewhere() {
    static GO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let mut k = KernelRegistry::new();
    k.register("wait_go", CoreKind::Aiv, |ctx| {
        if !wait_flag(&GO, Duration::from_secs(10)) {
            return Err(KernelError::msg("`go` never ran"));
        }
        ctx.output::<i64>(0)?.fill(1);
        Ok(())
    })
    .unwrap();
    k.register("go", CoreKind::Aiv, |_| {
        GO.store(true, Ordering::Release);
        Ok(())
    })
    .unwrap();
    let chip = Chip::builder()
        .aic_cores(0)
        .aiv_cores(2)
        .threads(2)
        .orchestrator_cpu(true)
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    assert!(chip.config().orchestrator_cpu);
    let out = Tensor::zeros(&[2], DType::I64).unwrap();
    let o2 = out.clone();
    let p = Program::new("reserve", k, move |o| {
        o.submit("wait_go", TaskArgs::new().output_existing(&o2))?;
        o.submit("go", TaskArgs::new())?;
        // A host-side wait the engine cannot see: the orchestrating thread stays busy.
        if !wait_flag(&GO, Duration::from_secs(10)) {
            return Err(OrchError::Other(
                "`go` never ran while the orchestrating thread was busy".into(),
            ));
        }
        Ok(())
    });
    let report = chip.run(&p).unwrap();
    assert_eq!(report.stats.tasks, 2);
    assert_eq!(out.read::<i64>().unwrap(), vec![1, 1]);
}

/// When a chip keeps a CPU for its orchestrating thread, and that the choice can be forced.
#[test]
fn the_orchestrator_cpu_is_kept_only_where_it_can_be() {
    let kept = |b: pto_core::ChipBuilder| b.build().unwrap().config().orchestrator_cpu;
    assert!(kept(Chip::builder().threads(2).orchestrator_cpu(true)));
    // One core thread: parking it would leave no thread to run tasks while the program runs.
    assert!(!kept(Chip::builder().threads(1).orchestrator_cpu(true)));
    // An orchestrating thread that runs tasks itself needs no reserve.
    assert!(!kept(
        Chip::builder()
            .threads(2)
            .orchestrator_cpu(true)
            .orchestrator_runs_tasks(true)
    ));
    assert!(!kept(Chip::builder().threads(8).orchestrator_cpu(false)));
    // With it forced on and off, a program computes the same.
    for on in [false, true] {
        let chip = Chip::builder()
            .aic_cores(1)
            .aiv_cores(2)
            .threads(2)
            .orchestrator_cpu(on)
            .build()
            .unwrap();
        let cells = Tensor::zeros(&[300], DType::I64).unwrap();
        let cs = cells.clone();
        let p = program(move |o| {
            for j in 0..300 {
                let c = cs.view(&[1], &[j])?;
                for _ in 0..=(j % 3) {
                    o.submit("add_scalar", TaskArgs::new().inout(&c).scalar(j as i64))?;
                }
            }
            Ok(())
        });
        chip.run(&p).unwrap();
        let want: Vec<i64> = (0..300).map(|j| j * (j % 3 + 1)).collect();
        assert_eq!(cells.read::<i64>().unwrap(), want, "orchestrator_cpu({on})");
    }
}
