//! The checker against a suite in the spirit of RMARaceBench (conflict, synchronization,
//! atomic, hybrid and misc cases; the mapping is in `docs/design/check.md`), written for pto's
//! operations: every case has a known answer (race or not), and every answer must be right: no
//! missed race, no false report. Cases whose race needs a particular interleaving are not here (a checker of one execution sees the
//! interleaving that ran; `pto check --schedules` explores others).

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use pto_comm::check::Checker;
use pto_comm::{BufferSpec, Collectives, Comm, CommError, ReduceOp, SignalOp, Window, WindowSpec};
use pto_core::DType;

type Body = fn(&Comm, &Window) -> Result<(), CommError>;

fn b(w: &Window, i: usize) -> usize {
    w.buffer("data").unwrap().offset + i
}
fn f(w: &Window, i: usize) -> usize {
    w.buffer("flag").unwrap().offset + 4 * i
}
fn put(w: &Window, to: usize, at: usize, n: usize) -> Result<(), CommError> {
    w.put(to, b(w, at), &vec![7u8; n])
}
fn get(w: &Window, from: usize, at: usize, n: usize) -> Result<(), CommError> {
    let mut v = vec![0u8; n];
    w.get(from, b(w, at), &mut v)
}
fn notify(w: &Window, to: usize, i: usize) -> Result<(), CommError> {
    w.notify(to, f(w, i), 1, SignalOp::Add)
}
fn wait(w: &Window, i: usize, v: u32) -> Result<(), CommError> {
    w.wait_until(f(w, i), v).map(drop)
}

/// Runs one task of `kernel` on this rank's chip (with `w` as the chip's window):
/// `read_data` reads and `write_data` writes this rank's `data` (a window tensor argument, the
/// whole buffer); `put_to_1` puts 8 bytes into rank 1's `data[0..8)`, `put_notify_to_1` does and
/// then notifies rank 1's `flag[0]`, `get_from_1` gets rank 1's `data[0..8)` (RMA from a kernel).
fn on_chip(c: &Comm, w: &Window, kernel: &'static str) -> Result<(), CommError> {
    use pto_comm::CommContext;
    use pto_core::{Chip, CoreKind, KernelCtx, KernelError, KernelRegistry, Program, TaskArgs};
    fn win<'a>(ctx: &KernelCtx<'a>) -> Result<&'a Window, KernelError> {
        let c = ctx
            .ext::<CommContext>()
            .ok_or(KernelError::msg("no CommContext"))?;
        c.window(0).map_err(|e| KernelError::msg(e.to_string()))
    }
    let ke = |e: CommError| KernelError::msg(e.to_string());
    let mut k = KernelRegistry::new();
    k.register("read_data", CoreKind::Aiv, |ctx| {
        ctx.input::<u8>(0).map(drop)
    })
    .unwrap();
    k.register("write_data", CoreKind::Aiv, |ctx| {
        ctx.output::<u8>(0)?.fill(1);
        Ok(())
    })
    .unwrap();
    k.register("put_to_1", CoreKind::Aiv, move |ctx| {
        let w = win(ctx)?;
        w.put(1, b(w, 0), &[7u8; 8]).map_err(ke)
    })
    .unwrap();
    k.register("put_notify_to_1", CoreKind::Aiv, move |ctx| {
        let w = win(ctx)?;
        w.put(1, b(w, 0), &[7u8; 8]).map_err(ke)?;
        notify(w, 1, 0).map_err(ke)
    })
    .unwrap();
    k.register("get_from_1", CoreKind::Aiv, move |ctx| {
        get(win(ctx)?, 1, 0, 8).map_err(ke)
    })
    .unwrap();
    let chip = Chip::builder()
        .aiv_cores(1)
        .extension(std::sync::Arc::new(
            CommContext::new(c.clone()).with_window(w.clone()),
        ))
        .build()
        .unwrap();
    let data = w.local_tensor("data")?;
    let program = Program::new("p", k, move |o| {
        let args = match kernel {
            "read_data" => TaskArgs::new().input(&data),
            "write_data" => TaskArgs::new().inout(&data),
            _ => TaskArgs::new(),
        };
        o.submit(kernel, args)?;
        Ok(())
    });
    chip.run(&program).unwrap();
    Ok(())
}

/// (category, name, ranks, a race expected, the body every rank runs).
const CASES: &[(&str, &str, usize, bool, Body)] = &[
    // Conflicts without synchronization (after the window's allocation).
    ("conflict", "put_put_same_bytes", 3, true, |c, w| {
        match c.rank() {
            1 => Ok(()),
            _ => put(w, 1, 0, 8),
        }
    }),
    (
        "conflict",
        "put_put_disjoint_bytes",
        3,
        false,
        |c, w| match c.rank() {
            0 => put(w, 1, 0, 8),
            2 => put(w, 1, 8, 8),
            _ => Ok(()),
        },
    ),
    (
        "conflict",
        "put_put_partial_overlap",
        3,
        true,
        |c, w| match c.rank() {
            0 => put(w, 1, 0, 8),
            2 => put(w, 1, 4, 8),
            _ => Ok(()),
        },
    ),
    ("conflict", "put_put_adjacent", 3, false, |c, w| {
        match c.rank() {
            0 => put(w, 1, 0, 8),
            2 => put(w, 1, 8, 4),
            _ => Ok(()),
        }
    }),
    (
        "conflict",
        "remote_put_remote_get",
        3,
        true,
        |c, w| match c.rank() {
            0 => put(w, 1, 0, 8),
            2 => get(w, 1, 0, 8),
            _ => Ok(()),
        },
    ),
    (
        "conflict",
        "remote_get_remote_get",
        3,
        false,
        |c, w| match c.rank() {
            1 => Ok(()),
            _ => get(w, 1, 0, 8),
        },
    ),
    (
        "conflict",
        "remote_put_local_get",
        2,
        true,
        |c, w| match c.rank() {
            0 => put(w, 1, 0, 8),
            _ => get(w, 1, 0, 8),
        },
    ),
    (
        "conflict",
        "local_put_remote_get",
        2,
        true,
        |c, w| match c.rank() {
            0 => get(w, 1, 0, 8),
            _ => put(w, 1, 0, 8),
        },
    ),
    (
        "conflict",
        "notify_word_overwritten_by_put",
        2,
        true,
        |c, w| match c.rank() {
            0 => notify(w, 1, 0),
            _ => w.put(1, f(w, 0), &[0u8; 4]),
        },
    ),
    // Atomics.
    (
        "atomic",
        "atomic_atomic_same_word",
        3,
        false,
        |c, w| match c.rank() {
            1 => Ok(()),
            _ => w.fetch_add_u32(1, f(w, 1), 1).map(drop),
        },
    ),
    (
        "atomic",
        "atomic_vs_put_same_word",
        3,
        true,
        |c, w| match c.rank() {
            0 => w.fetch_add_u32(1, f(w, 1), 1).map(drop),
            2 => w.put(1, f(w, 1), &[0u8; 4]),
            _ => Ok(()),
        },
    ),
    (
        "atomic",
        "atomic_vs_get_same_word",
        3,
        true,
        |c, w| match c.rank() {
            0 => w.fetch_add_u32(1, f(w, 1), 1).map(drop),
            2 => w.get(1, f(w, 1), &mut [0u8; 4]),
            _ => Ok(()),
        },
    ),
    (
        "atomic",
        "counter_polled_with_loads_orders_the_data",
        2,
        false,
        |c, w| match c.rank() {
            0 => {
                put(w, 1, 0, 8)?;
                w.fetch_add_u32(1, f(w, 1), 1).map(drop)
            }
            _ => {
                while w.load_u32(1, f(w, 1))? < 1 {
                    std::thread::yield_now();
                }
                get(w, 1, 0, 8)
            }
        },
    ),
    // Synchronization.
    (
        "sync",
        "signal_orders_put_and_get",
        2,
        false,
        |c, w| match c.rank() {
            0 => {
                put(w, 1, 0, 8)?;
                notify(w, 1, 0)
            }
            _ => {
                wait(w, 0, 1)?;
                get(w, 1, 0, 8)
            }
        },
    ),
    ("sync", "get_before_the_wait", 2, true, |c, w| {
        match c.rank() {
            0 => {
                put(w, 1, 0, 8)?;
                notify(w, 1, 0)
            }
            _ => {
                get(w, 1, 0, 8)?;
                wait(w, 0, 1)
            }
        }
    }),
    ("sync", "notify_before_the_put", 2, true, |c, w| {
        match c.rank() {
            0 => {
                notify(w, 1, 0)?;
                put(w, 1, 0, 8)
            }
            _ => {
                wait(w, 0, 1)?;
                get(w, 1, 0, 8)
            }
        }
    }),
    ("sync", "window_barrier", 2, false, |c, w| {
        if c.rank() == 0 {
            put(w, 1, 0, 8)?;
        }
        w.barrier()?;
        if c.rank() == 1 {
            get(w, 1, 0, 8)?;
        }
        Ok(())
    }),
    ("sync", "communicator_barrier", 2, false, |c, w| {
        if c.rank() == 0 {
            put(w, 1, 0, 8)?;
        }
        c.barrier()?;
        if c.rank() == 1 {
            get(w, 1, 0, 8)?;
        }
        Ok(())
    }),
    ("sync", "collective_separates", 2, false, |c, w| {
        let co = Collectives::new(c, 64)?;
        if c.rank() == 0 {
            put(w, 1, 0, 8)?;
        }
        let mut x = [1.0f32; 4];
        co.allreduce(&mut x, ReduceOp::Sum)?;
        if c.rank() == 1 {
            get(w, 1, 0, 8)?;
        }
        Ok(())
    }),
    ("sync", "transitive_signals", 3, false, |c, w| {
        match c.rank() {
            0 => {
                put(w, 2, 0, 8)?;
                notify(w, 1, 0)
            }
            1 => {
                wait(w, 0, 1)?;
                notify(w, 2, 0)
            }
            _ => {
                wait(w, 0, 1)?;
                get(w, 2, 0, 8)
            }
        }
    }),
    ("sync", "transitive_chain_broken", 3, true, |c, w| {
        match c.rank() {
            0 => {
                put(w, 2, 0, 8)?;
                notify(w, 1, 0)
            }
            1 => {
                // Passes the baton on before it has it.
                notify(w, 2, 0)?;
                wait(w, 0, 1)
            }
            _ => {
                wait(w, 0, 1)?;
                get(w, 2, 0, 8)
            }
        }
    }),
    (
        "sync",
        "signal_of_the_wrong_pair",
        3,
        true,
        |c, w| match c.rank() {
            0 => {
                put(w, 2, 0, 8)?;
                notify(w, 2, 0)
            }
            1 => notify(w, 2, 1),
            _ => {
                // Waits for rank 1's flag, not rank 0's.
                wait(w, 1, 1)?;
                get(w, 2, 0, 8)?;
                wait(w, 0, 1)
            }
        },
    ),
    // Hybrid: kernels' window-tensor arguments and kernels' RMA against host code's RMA and
    // other ranks' kernels.
    (
        "hybrid",
        "kernel_read_vs_peer_put",
        2,
        true,
        |c, w| match c.rank() {
            0 => put(w, 1, 0, 8),
            _ => on_chip(c, w, "read_data"),
        },
    ),
    (
        "hybrid",
        "kernel_read_after_a_wait_on_the_peers_put",
        2,
        false,
        |c, w| match c.rank() {
            0 => {
                put(w, 1, 0, 8)?;
                notify(w, 1, 0)
            }
            _ => {
                wait(w, 0, 1)?;
                on_chip(c, w, "read_data")
            }
        },
    ),
    (
        "hybrid",
        "kernel_write_vs_peer_get",
        2,
        true,
        |c, w| match c.rank() {
            0 => get(w, 1, 0, 8),
            _ => on_chip(c, w, "write_data"),
        },
    ),
    (
        "hybrid",
        "kernel_write_then_barrier_then_peer_get",
        2,
        false,
        |c, w| {
            if c.rank() == 1 {
                on_chip(c, w, "write_data")?;
            }
            w.barrier()?;
            if c.rank() == 0 {
                get(w, 1, 0, 8)?;
            }
            Ok(())
        },
    ),
    (
        "hybrid",
        "kernel_put_vs_host_get",
        2,
        true,
        |c, w| match c.rank() {
            0 => on_chip(c, w, "put_to_1"),
            _ => get(w, 1, 0, 8),
        },
    ),
    (
        "hybrid",
        "kernel_put_and_notify_orders_host_get",
        2,
        false,
        |c, w| match c.rank() {
            0 => on_chip(c, w, "put_notify_to_1"),
            _ => {
                wait(w, 0, 1)?;
                get(w, 1, 0, 8)
            }
        },
    ),
    (
        "hybrid",
        "kernel_get_vs_peer_kernel_write",
        2,
        true,
        |c, w| match c.rank() {
            0 => on_chip(c, w, "get_from_1"),
            _ => on_chip(c, w, "write_data"),
        },
    ),
    (
        "hybrid",
        "kernel_reads_vs_peer_get_no_write",
        2,
        false,
        |c, w| match c.rank() {
            0 => get(w, 1, 0, 8),
            _ => on_chip(c, w, "read_data"),
        },
    ),
    // Misc.
    (
        "misc",
        "one_rank_puts_then_reads_its_own",
        1,
        false,
        |_, w| {
            put(w, 0, 0, 8)?;
            get(w, 0, 0, 8)
        },
    ),
    ("misc", "rounds_separated_by_barriers", 2, false, |c, w| {
        for _ in 0..3 {
            if c.rank() == 0 {
                put(w, 1, 0, 8)?;
            }
            w.barrier()?;
            if c.rank() == 1 {
                get(w, 1, 0, 8)?;
            }
            w.barrier()?;
        }
        Ok(())
    }),
    (
        "misc",
        "domain_barrier_orders_its_members",
        3,
        false,
        |c, w| {
            if c.rank() == 1 {
                return Ok(());
            }
            let d = c.domain(&[0, 2])?;
            if c.rank() == 0 {
                put(w, 2, 0, 8)?;
            }
            d.barrier()?;
            if c.rank() == 2 {
                get(w, 2, 0, 8)?;
            }
            Ok(())
        },
    ),
];

#[test]
fn every_case_gets_the_right_answer() {
    let mut wrong = Vec::new();
    for &(cat, name, n, race, body) in CASES {
        let checker = Checker::install(n);
        let comms = pto_comm::local::comms_with_timeout(n, Duration::from_secs(20)).unwrap();
        let results: Vec<Result<(), CommError>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|comm| {
                    s.spawn(move || {
                        let w = comm.alloc_window(&WindowSpec::for_buffers(vec![
                            BufferSpec::new("data", DType::U8, 64),
                            BufferSpec::new("flag", DType::U32, 4),
                        ]))?;
                        body(&comm, &w)?;
                        // Nobody leaves while a peer may still use its window.
                        comm.barrier()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        Checker::uninstall();
        assert!(
            results.iter().all(Result::is_ok),
            "{cat}/{name}: {results:?}"
        );
        let r = checker.report();
        let by_kernel = r.races.iter().any(|x| x.to_string().contains(" in task "));
        if cat == "hybrid" && race && !by_kernel {
            wrong.push(format!("{cat}/{name}: no race names a kernel's access"));
        }
        if r.races.is_empty() == race {
            wrong.push(format!(
                "{cat}/{name}: expected {}, found {:?}",
                if race { "a race" } else { "no race" },
                r.races.iter().map(ToString::to_string).collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases wrong:\n{}",
        wrong.len(),
        CASES.len(),
        wrong.join("\n")
    );
}
