//! The conformance suite: behaviour every backend must show, as functions that every rank of a
//! communicator runs. The test drivers (`tests/conformance_local.rs`,
//! `tests/conformance_shm.rs` and, with the `mpi` feature, `tests/conformance_mpi.rs` under
//! `mpirun`) run each case on several rank counts.

use std::time::{Duration, Instant};

use pto_core::DType;

use crate::comm::Comm;
use crate::error::CommError;
use crate::signal::SignalOp;
use crate::window::{BufferSpec, WindowSpec};

/// One case: its name, the rank counts to run it on, and the body every rank runs.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Name.
    pub name: &'static str,
    /// Rank counts.
    pub ranks: &'static [usize],
    /// The body.
    pub run: fn(&Comm) -> Result<(), String>,
}

fn e(err: CommError) -> String {
    err.to_string()
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

/// Every case.
pub const CASES: &[Case] = &[
    Case {
        name: "ranks_are_distinct",
        ranks: &[1, 2, 3, 4],
        run: ranks_are_distinct,
    },
    Case {
        name: "barrier_phases",
        ranks: &[2, 3, 4],
        run: barrier_phases,
    },
    Case {
        name: "put_get_ring",
        ranks: &[1, 2, 3, 4],
        run: put_get_ring,
    },
    Case {
        name: "atomics",
        ranks: &[2, 4],
        run: atomics,
    },
    Case {
        name: "signals_and_epochs",
        ranks: &[2, 3],
        run: signals_and_epochs,
    },
    Case {
        name: "a_rank_that_left_after_its_part_fails_no_wait",
        ranks: &[3, 4],
        run: left_after_its_part,
    },
    Case {
        name: "named_buffers_and_tensors",
        ranks: &[2],
        run: named_buffers_and_tensors,
    },
    Case {
        name: "windows_are_zeroed_and_reusable",
        ranks: &[2, 3],
        run: windows_are_zeroed,
    },
    Case {
        name: "domains",
        ranks: &[3, 4],
        run: domains,
    },
    Case {
        name: "bad_input",
        ranks: &[2],
        run: bad_input,
    },
    Case {
        name: "collectives",
        ranks: &[1, 2, 3, 4],
        run: collectives,
    },
    Case {
        name: "size_mismatch_is_named",
        ranks: &[2, 3],
        run: size_mismatch,
    },
];

/// The case named `name`.
pub fn find(name: &str) -> Option<&'static Case> {
    CASES.iter().find(|c| c.name == name)
}

fn ranks_are_distinct(c: &Comm) -> Result<(), String> {
    let (me, n) = (c.rank(), c.size());
    ensure(me < n, || format!("rank {me} >= size {n}"))?;
    let w = c.alloc_window(&WindowSpec::new(8 * n)).map_err(e)?;
    w.put_slice(0, 8 * me, &[me as u64 + 1]).map_err(e)?;
    w.barrier().map_err(e)?;
    if me == 0 {
        let v = w.get_vec::<u64>(0, 0, n).map_err(e)?;
        let want: Vec<u64> = (1..=n as u64).collect();
        ensure(v == want, || format!("rank slots {v:?}, want {want:?}"))?;
    }
    w.release().map_err(e)
}

fn barrier_phases(c: &Comm) -> Result<(), String> {
    let n = c.size() as u64;
    let w = c.alloc_window(&WindowSpec::new(64)).map_err(e)?;
    for round in 0..300u64 {
        w.fetch_add_u64(0, 0, 1).map_err(e)?;
        c.barrier().map_err(e)?;
        let v = w.load_u64(0, 0).map_err(e)?;
        // Every rank arrived for this round; nobody can have started the next (second barrier).
        ensure(v == (round + 1) * n, || {
            format!("round {round}: counter {v}, want {}", (round + 1) * n)
        })?;
        c.barrier().map_err(e)?;
    }
    Ok(())
}

fn put_get_ring(c: &Comm) -> Result<(), String> {
    let (me, n) = (c.rank(), c.size());
    let len = 4096 + 13;
    let w = c.alloc_window(&WindowSpec::new(len)).map_err(e)?;
    let right = (me + 1) % n;
    let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + me * 31) as u8).collect();
    w.put(right, 0, &pattern).map_err(e)?;
    w.barrier().map_err(e)?;
    let left = (me + n - 1) % n;
    let mine = w.get_vec::<u8>(me, 0, len).map_err(e)?;
    let want: Vec<u8> = (0..len).map(|i| (i * 7 + left * 31) as u8).collect();
    ensure(mine == want, || {
        format!("rank {me}: data from rank {left} is wrong")
    })?;
    // One-sided get from the right neighbour's window: it holds our pattern.
    let theirs = w.get_vec::<u8>(right, 0, len).map_err(e)?;
    ensure(theirs == pattern, || {
        format!("rank {me}: get from rank {right} is wrong")
    })?;
    w.release().map_err(e)
}

fn atomics(c: &Comm) -> Result<(), String> {
    let n = c.size() as u64;
    let w = c.alloc_window(&WindowSpec::new(64)).map_err(e)?;
    let mut prev = Vec::new();
    for _ in 0..1000 {
        prev.push(w.fetch_add_u64(0, 8, 1).map_err(e)?);
        w.fetch_add_u32(0, 0, 2).map_err(e)?;
    }
    w.barrier().map_err(e)?;
    let total = w.load_u64(0, 8).map_err(e)?;
    ensure(total == 1000 * n, || {
        format!("u64 counter {total}, want {}", 1000 * n)
    })?;
    let t32 = w.load_u32(0, 0).map_err(e)?;
    ensure(u64::from(t32) == 2000 * n, || format!("u32 counter {t32}"))?;
    ensure(prev.windows(2).all(|p| p[0] < p[1]), || {
        "fetch_add values not increasing".into()
    })?;
    w.release().map_err(e)
}

fn signals_and_epochs(c: &Comm) -> Result<(), String> {
    let (me, n) = (c.rank(), c.size());
    let w = c.alloc_window(&WindowSpec::new(64)).map_err(e)?;
    let right = (me + 1) % n;
    // Epochs: the same signal serves every round; waits are ">= round".
    for round in 1..=200u32 {
        w.put_slice(right, 8, &[u64::from(round) * 10 + me as u64])
            .map_err(e)?;
        w.notify(right, 0, 1, SignalOp::Add).map_err(e)?;
        let seen = w.wait_until(0, round).map_err(e)?;
        ensure(seen >= round, || format!("signal {seen} < {round}"))?;
        let left = (me + n - 1) % n;
        let v = w.get_vec::<u64>(me, 8, 1).map_err(e)?[0];
        ensure(v == u64::from(round) * 10 + left as u64, || {
            format!("round {round}: payload {v} not visible after the signal")
        })?;
        // Keep the next round's put from overwriting the payload before it is read.
        w.barrier().map_err(e)?;
    }
    // Set: a flag raised by rank 0 on every rank.
    if me == 0 {
        for r in 0..n {
            w.notify(r, 4, 7, SignalOp::Set).map_err(e)?;
        }
    }
    w.wait_until(4, 7).map_err(e)?;
    ensure(w.test(4, 7).map_err(e)?, || {
        "test() disagrees with wait_until".into()
    })?;
    // A wait that can never succeed times out at its deadline.
    let t = Instant::now();
    let r = w.wait_until_deadline(4, 1000, Instant::now() + Duration::from_millis(50));
    ensure(matches!(r, Err(CommError::Timeout { .. })), || {
        format!("expected a timeout, got {r:?}")
    })?;
    ensure(t.elapsed() < Duration::from_secs(2), || {
        "timeout took too long".into()
    })?;
    w.release().map_err(e)
}

/// Rank 0 raises rank 1's flag, then, well after the next liveness check, the others'. Rank 1
/// leaves as soon as it has its flag: its exit must not fail the waits that rank 0 (still
/// running) will satisfy. Only a rank that left before raising what a wait needs is an error.
fn left_after_its_part(c: &Comm) -> Result<(), String> {
    let (me, n) = (c.rank(), c.size());
    let w = c.alloc_window(&WindowSpec::new(64)).map_err(e)?;
    w.barrier().map_err(e)?;
    match me {
        0 => {
            w.notify(1, 0, 1, SignalOp::Set).map_err(e)?;
            // Several liveness checks (every 20 ms) pass while rank 1 has left.
            std::thread::sleep(Duration::from_millis(150));
            for r in 2..n {
                w.notify(r, 0, 1, SignalOp::Set).map_err(e)?;
            }
            Ok(())
        }
        // Leaves without the window's (collective) release: the others do not release it either.
        1 => w.wait_until(0, 1).map(drop).map_err(e),
        _ => w
            .wait_until(0, 1)
            .map(drop)
            .map_err(|err| format!("rank {me} waited for rank 0, got: {err}")),
    }
}

fn named_buffers_and_tensors(c: &Comm) -> Result<(), String> {
    let me = c.rank();
    let spec = WindowSpec::for_buffers(vec![
        BufferSpec::new("x", DType::F32, 10),
        BufferSpec::new("flags", DType::U32, 3),
    ]);
    let w = c.alloc_window(&spec).map_err(e)?;
    let x = w.buffer("x").map_err(e)?.clone();
    let f = w.buffer("flags").map_err(e)?.clone();
    ensure(x.offset == 0 && f.offset == 64, || {
        format!("offsets {} {}", x.offset, f.offset)
    })?;
    ensure(w.buffer("nope").is_err(), || "unknown buffer found".into())?;
    // Write our buffer through a pto-core tensor, read it from the peer with get.
    let t = w.local_tensor("x").map_err(e)?;
    t.write(&(0..10).map(|i| (i + 100 * me) as f32).collect::<Vec<_>>())
        .map_err(|err| err.to_string())?;
    w.barrier().map_err(e)?;
    let peer = 1 - me;
    let got = w.get_vec::<f32>(peer, x.offset, 10).map_err(e)?;
    let want: Vec<f32> = (0..10).map(|i| (i + 100 * peer) as f32).collect();
    ensure(got == want, || format!("peer buffer {got:?}"))?;
    w.release().map_err(e)
}

fn windows_are_zeroed(c: &Comm) -> Result<(), String> {
    for round in 0..3 {
        let w = c.alloc_window(&WindowSpec::new(256)).map_err(e)?;
        let mine = w.get_vec::<u8>(c.rank(), 0, 256).map_err(e)?;
        ensure(mine.iter().all(|&b| b == 0), || {
            format!("round {round}: window not zeroed")
        })?;
        let other = c.alloc_window(&WindowSpec::new(128)).map_err(e)?;
        w.put(c.rank(), 0, &[0xAB; 256]).map_err(e)?;
        other.release().map_err(e)?;
        w.release().map_err(e)?;
    }
    Ok(())
}

fn domains(c: &Comm) -> Result<(), String> {
    let (me, n) = (c.rank(), c.size());
    // Two domains: even ranks and odd ranks, listed in reverse (dense rank 0 is the highest).
    let mut mine: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).collect();
    mine.reverse();
    let d = c.domain(&mine).map_err(e)?;
    ensure(d.size() == mine.len(), || {
        format!("domain size {}", d.size())
    })?;
    ensure(d.members() == mine, || "members differ".into())?;
    ensure(d.world_rank_of(d.rank()).ok() == Some(me), || {
        "dense rank maps back wrongly".into()
    })?;
    let w = d.alloc_window(&WindowSpec::new(64)).map_err(e)?;
    w.fetch_add_u64(0, 0, me as u64 + 1).map_err(e)?;
    d.barrier().map_err(e)?;
    let sum = w.load_u64(0, 0).map_err(e)?;
    let want: u64 = mine.iter().map(|&r| r as u64 + 1).sum();
    ensure(sum == want, || format!("domain sum {sum}, want {want}"))?;
    // A domain that does not list the caller is an error (and changes nothing).
    let others: Vec<usize> = (0..n).filter(|&r| r != me).collect();
    ensure(
        matches!(c.domain(&others), Err(CommError::BadDomain { .. })),
        || "non-member accepted".into(),
    )?;
    ensure(
        matches!(c.domain(&[me, me]), Err(CommError::BadDomain { .. })),
        || "duplicate accepted".into(),
    )?;
    ensure(
        matches!(c.domain(&[me, n]), Err(CommError::BadDomain { .. })),
        || "outsider accepted".into(),
    )?;
    // A second domain over the same members is a new one.
    let d2 = c.domain(&mine).map_err(e)?;
    d2.barrier().map_err(e)?;
    w.release().map_err(e)?;
    c.barrier().map_err(e)
}

fn bad_input(c: &Comm) -> Result<(), String> {
    let w = c.alloc_window(&WindowSpec::new(100)).map_err(e)?;
    let me = c.rank();
    ensure(
        matches!(
            w.put(2, 0, &[1]),
            Err(CommError::BadRank { rank: 2, size: 2 })
        ),
        || "bad rank".into(),
    )?;
    ensure(
        matches!(w.put(me, 96, &[0; 8]), Err(CommError::OutOfBounds { .. })),
        || "put oob".into(),
    )?;
    ensure(
        matches!(
            w.get(me, usize::MAX, &mut [0; 2]),
            Err(CommError::OutOfBounds { .. })
        ),
        || "get overflow".into(),
    )?;
    ensure(
        matches!(
            w.fetch_add_u64(me, 4, 1),
            Err(CommError::Misaligned { align: 8, .. })
        ),
        || "misaligned".into(),
    )?;
    ensure(
        matches!(
            w.notify(me, 2, 1, SignalOp::Add),
            Err(CommError::Misaligned { .. })
        ),
        || "signal misaligned".into(),
    )?;
    ensure(
        matches!(
            w.notify(me, 100, 1, SignalOp::Add),
            Err(CommError::OutOfBounds { .. })
        ),
        || "signal oob".into(),
    )?;
    ensure(
        matches!(w.wait_until(101, 1), Err(CommError::OutOfBounds { .. })),
        || "wait oob".into(),
    )?;
    ensure(
        matches!(
            c.alloc_window(&WindowSpec::new(0)),
            Err(CommError::BadWindow { .. })
        ),
        || "zero window".into(),
    )?;
    ensure(
        matches!(
            c.alloc_window(&WindowSpec::new(usize::MAX / 2)),
            Err(CommError::BadWindow { .. })
        ),
        || "huge window".into(),
    )?;
    let over = WindowSpec::new(32).buffer(BufferSpec::new("big", DType::F64, 8));
    let r = c.alloc_window(&over);
    ensure(
        matches!(&r, Err(CommError::BadBuffer { name, .. }) if name == "big"),
        || format!("overflowing buffer: {r:?}"),
    )?;
    let short = WindowSpec::new(64).buffer(BufferSpec::new("s", DType::F64, 4).with_bytes(8));
    ensure(
        matches!(c.alloc_window(&short), Err(CommError::BadBuffer { .. })),
        || "short buffer".into(),
    )?;
    // Nothing above touched the window or desynchronised the ranks.
    w.barrier().map_err(e)?;
    let mine = w.get_vec::<u8>(me, 0, 100).map_err(e)?;
    ensure(mine.iter().all(|&b| b == 0), || {
        "bad input corrupted the window".into()
    })?;
    w.release().map_err(e)
}

fn collectives(c: &Comm) -> Result<(), String> {
    use crate::collective::{Algorithm, Collectives};
    use crate::reduce::ReduceOp;
    let (me, n) = (c.rank(), c.size());
    // A small staging area forces the larger calls through in pieces.
    let co = Collectives::new(c, 256).map_err(e)?;
    for count in [0usize, 1, 7, 100, 1000] {
        for algo in [
            Algorithm::Mesh,
            Algorithm::TwoPhase,
            Algorithm::Ring,
            Algorithm::SingleCopy,
            Algorithm::Tree,
        ] {
            let mut v: Vec<f32> = (0..count).map(|i| (i + 100 * me) as f32).collect();
            co.allreduce_with(&mut v, ReduceOp::Sum, algo).map_err(e)?;
            let want: Vec<f32> = (0..count)
                .map(|i| (n * i + 100 * n * (n - 1) / 2) as f32)
                .collect();
            ensure(v == want, || {
                format!("allreduce {algo:?} of {count}: {v:?}")
            })?;
        }
        let mut m: Vec<i64> = (0..count).map(|i| (i * (me + 1)) as i64).collect();
        co.allreduce(&mut m, ReduceOp::Max).map_err(e)?;
        ensure(
            m == (0..count).map(|i| (i * n) as i64).collect::<Vec<_>>(),
            || "max".into(),
        )?;
        let mut all = vec![0i32; n * count];
        co.allgather(
            &(0..count)
                .map(|i| (i + 100 * me) as i32)
                .collect::<Vec<_>>(),
            &mut all,
        )
        .map_err(e)?;
        let want: Vec<i32> = (0..n)
            .flat_map(|r| (0..count).map(move |i| (i + 100 * r) as i32))
            .collect();
        ensure(all == want, || "allgather".into())?;
    }
    co.barrier().map_err(e)
}

fn size_mismatch(c: &Comm) -> Result<(), String> {
    // Rank 1 asks for another size: rank 1 gets a mismatch naming both sizes, and every other
    // rank fails instead of hanging (rank 1 aborts; on MPI, every rank gets the mismatch).
    // This leaves a shm or local world aborted.
    let bytes = if c.rank() == 1 { 256 } else { 128 };
    match c.alloc_window(&WindowSpec::new(bytes)) {
        Err(CommError::Mismatch {
            theirs: 128,
            ours: 256,
            ..
        }) if c.rank() == 1 => Ok(()),
        // Where the members agree on the size before allocating (MPI), everyone gets the
        // mismatch.
        Err(CommError::Mismatch {
            theirs: 256,
            ours: 128,
            ..
        }) if c.rank() != 1 => Ok(()),
        Err(CommError::Aborted { rank: 1, message }) if c.rank() != 1 => {
            ensure(message.contains("128") && message.contains("256"), || {
                format!("abort message {message:?}")
            })
        }
        other => Err(format!("rank {}: unexpected {other:?}", c.rank())),
    }
}

/// The barrier stress test: up to `rounds` back-to-back barriers with a per-phase check, for at
/// most about `budget` of rank 0's time. Before round `i` every rank adds 1 to counter `i % 2` in
/// rank 0's window; after the barrier that counter must be exactly `(i / 2 + 1) × n` (a fast
/// rank cannot touch it again before every rank has passed the next barrier), so any lost or
/// doubled arrival fails. Returns the rounds run.
///
/// Each round costs a wake-up of every parked rank, so on a loaded machine a round takes the
/// scheduler's latency (about 1 ms with a CPU hog on each of 2 CPUs, against 12 µs idle): the
/// budget keeps the test's length bounded there. When rank 0 sees it spent, it publishes a last
/// round two rounds ahead before entering the next barrier; every rank reads that word after
/// each barrier, so all of them learn it by the same round and stop together.
///
/// # Errors
///
/// The first wrong count or communication error, as text.
pub fn stress_barrier(c: &Comm, rounds: u64, budget: std::time::Duration) -> Result<u64, String> {
    const STOP: usize = 16;
    let n = c.size() as u64;
    let w = c.alloc_window(&WindowSpec::new(64)).map_err(e)?;
    let started = std::time::Instant::now();
    let mut last = rounds;
    let mut i = 0;
    while i < last {
        if c.rank() == 0 && last == rounds && started.elapsed() > budget {
            last = (i + 2).min(rounds);
            w.fetch_add_u64(0, STOP, last + 1).map_err(e)?;
        }
        let off = 8 * (i % 2) as usize;
        w.fetch_add_u64(0, off, 1).map_err(e)?;
        c.barrier().map_err(e)?;
        let v = w.load_u64(0, off).map_err(e)?;
        let want = (i / 2 + 1) * n;
        ensure(v == want, || format!("round {i}: counter {v}, want {want}"))?;
        if c.rank() != 0 && last == rounds {
            // 0: not published; otherwise the last round plus one.
            let stop = w.load_u64(0, STOP).map_err(e)?;
            if stop > 0 {
                last = stop - 1;
            }
        }
        i += 1;
    }
    c.barrier().map_err(e)?;
    w.release().map_err(e)?;
    Ok(i)
}
