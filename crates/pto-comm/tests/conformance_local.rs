//! The conformance suite on the `local` backend (ranks are threads).

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use pto_comm::conformance::CASES;
use pto_comm::local;

/// Runs `body` on `n` ranks, each a thread; each rank's result, in rank order.
fn on_threads(
    n: usize,
    body: impl Fn(pto_comm::Comm) -> Result<(), String> + Sync,
) -> Vec<Result<(), String>> {
    let comms = local::comms_with_timeout(n, Duration::from_secs(20)).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let body = &body;
                s.spawn(move || body(c))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("rank panicked".into())))
            .collect()
    })
}

#[test]
fn every_case_on_threads() {
    for case in CASES {
        for &n in case.ranks {
            let results = on_threads(n, |c| (case.run)(&c));
            for (rank, r) in results.into_iter().enumerate() {
                if let Err(msg) = r {
                    panic!("case {} with {n} ranks, rank {rank}: {msg}", case.name);
                }
            }
        }
    }
}

/// A rank that leaves without raising what two others wait for: neither wait fails at once
/// (each could still be raised by the other, which runs). Rank 1's wait reaches its deadline,
/// and the timeout's wait-for graph names the rank that left; once rank 1 has left too, rank 0's
/// wait fails at once (nobody is left to raise it), long before its own deadline.
#[test]
fn a_rank_that_left_before_its_part_is_named_when_the_waits_run_out() {
    use std::time::Instant;

    use pto_comm::CommError;

    let results = on_threads(3, |c| {
        let w = c
            .alloc_window(&pto_comm::WindowSpec::new(64))
            .map_err(|e| e.to_string())?;
        w.barrier().map_err(|e| e.to_string())?;
        let t = Instant::now();
        let short = Duration::from_millis(300);
        match c.rank() {
            2 => Ok(()),
            1 => match w.wait_until_deadline(0, 1, t + short) {
                Err(CommError::Timeout { what, .. })
                    if what.contains("rank 2 has left") && t.elapsed() >= short =>
                {
                    Ok(())
                }
                other => Err(format!("expected a timeout naming rank 2, got {other:?}")),
            },
            _ => match w.wait_until_deadline(0, 1, t + Duration::from_secs(10)) {
                // Rank 1, the last to leave (rank 2's exit alone did not end it).
                Err(CommError::PeerGone {
                    rank: 1,
                    how: "exited",
                }) if t.elapsed() < Duration::from_secs(5) => Ok(()),
                other => Err(format!(
                    "expected an exit once nobody could raise it, got {other:?} after {:?}",
                    t.elapsed()
                )),
            },
        }
    });
    for (rank, r) in results.into_iter().enumerate() {
        if let Err(msg) = r {
            panic!("rank {rank}: {msg}");
        }
    }
}

/// `Comm::leave` says a rank is done while its handle lives on (as a forked rank does before
/// `_exit`): a peer's barrier fails at once naming it as exited; a second call and the drop
/// after it count nothing more.
#[test]
fn a_rank_that_leaves_explicitly_is_named_as_exited() {
    use std::time::Instant;

    use pto_comm::CommError;

    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    let results = on_threads(2, |c| {
        if c.rank() == 1 {
            c.leave();
            c.leave();
            // The handle lives until rank 0 has seen the exit.
            rx.lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(15))
                .map_err(|e| e.to_string())?;
            return Ok(());
        }
        let t = Instant::now();
        let r = c.barrier();
        let _ = tx.send(());
        match r {
            Err(CommError::PeerGone {
                rank: 1,
                how: "exited",
            }) if t.elapsed() < Duration::from_secs(5) => Ok(()),
            other => Err(format!(
                "expected rank 1 exited, got {other:?} after {:?}",
                t.elapsed()
            )),
        }
    });
    for (rank, r) in results.into_iter().enumerate() {
        if let Err(msg) = r {
            panic!("rank {rank}: {msg}");
        }
    }
}
