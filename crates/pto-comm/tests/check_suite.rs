//! The checker against a suite in the spirit of RMARaceBench (conflict, synchronization,
//! atomic, hybrid and misc cases), written for pto's operations: every case has a known answer
//! (race or not), and every answer must be right: no missed race, no false report. Cases whose
//! race needs a particular interleaving are not here (a checker of one execution sees the
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
