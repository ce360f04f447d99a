//! The happens-before checker on deliberately wrong programs, each found with the right report,
//! and on their corrected versions, with no report. Ranks are threads (`local`); the checker is
//! process-wide, so the cases run one after the other.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;
use std::time::Duration;

use pto_comm::check::{BlockedIn, CheckReport, Checker};
use pto_comm::{BufferSpec, Collectives, Comm, CommError, ReduceOp, SignalOp, Window, WindowSpec};
use pto_core::DType;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn window(c: &Comm) -> Window {
    c.alloc_window(&WindowSpec::for_buffers(vec![
        BufferSpec::new("inbox", DType::F32, 16),
        BufferSpec::new("flag", DType::U32, 4),
    ]))
    .unwrap()
}

/// Runs `body` on `n` ranks under a fresh checker; returns its report and the ranks' results.
fn checked(
    n: usize,
    timeout: Duration,
    body: impl Fn(&Comm, &Window) -> Result<(), CommError> + Sync,
) -> (CheckReport, Vec<Result<(), CommError>>) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let c = Checker::install(n);
    let comms = pto_comm::local::comms_with_timeout(n, timeout).unwrap();
    let results = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let body = &body;
                s.spawn(move || {
                    let w = window(&comm);
                    body(&comm, &w)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    Checker::uninstall();
    (c.report(), results)
}

const T: Duration = Duration::from_secs(20);

fn off(w: &Window, name: &str, i: usize) -> usize {
    w.buffer(name).unwrap().offset + i
}

#[test]
fn a_read_of_a_peers_put_without_a_wait_is_a_race_and_with_one_is_not() {
    let (r, res) = checked(2, T, |c, w| {
        if c.rank() == 0 {
            w.put_slice(1, off(w, "inbox", 0), &[1.0f32; 4])?;
            w.notify(1, off(w, "flag", 0), 1, SignalOp::Add)?;
        } else {
            // Reads before waiting: the put may not have happened.
            w.get_vec::<f32>(1, off(w, "inbox", 0), 4)?;
            w.wait_until(off(w, "flag", 0), 1)?;
        }
        Ok(())
    });
    assert!(res.iter().all(Result::is_ok));
    assert_eq!(r.races.len(), 1, "{:?}", r.races);
    let text = r.races[0].to_string();
    assert!(
        text.contains("rank 0 writes `inbox[0..16)` of rank 1 (put from host code)"),
        "{text}"
    );
    assert!(
        text.contains("rank 1 reads `inbox[0..16)` (get from host code)"),
        "{text}"
    );
    assert!(
        text.contains("rank 1 does not wait on a signal that rank 0 notified after its put"),
        "{text}"
    );

    let (r, _) = checked(2, T, |c, w| {
        if c.rank() == 0 {
            w.put_slice(1, off(w, "inbox", 0), &[1.0f32; 4])?;
            w.notify(1, off(w, "flag", 0), 1, SignalOp::Add)?;
        } else {
            w.wait_until(off(w, "flag", 0), 1)?;
            w.get_vec::<f32>(1, off(w, "inbox", 0), 4)?;
        }
        Ok(())
    });
    assert!(r.races.is_empty(), "{:?}", r.races);
    assert!(r.edges > 0);
}

#[test]
fn a_wait_on_the_wrong_signal_is_a_race() {
    let (r, _) = checked(2, T, |c, w| {
        if c.rank() == 0 {
            // Notifies flag[1] before the put, flag[0] after it; rank 1 waits on flag[1].
            w.notify(1, off(w, "flag", 4), 1, SignalOp::Add)?;
            w.put_slice(1, off(w, "inbox", 0), &[2.0f32; 4])?;
            w.notify(1, off(w, "flag", 0), 1, SignalOp::Add)?;
        } else {
            w.wait_until(off(w, "flag", 4), 1)?;
            w.get_vec::<f32>(1, off(w, "inbox", 0), 4)?;
            w.wait_until(off(w, "flag", 0), 1)?;
        }
        Ok(())
    });
    assert_eq!(r.races.len(), 1, "{:?}", r.races);
}

#[test]
fn reusing_a_staging_buffer_without_a_barrier_is_a_race() {
    // A rendezvous outside pto (the checker does not see it) makes rank 0's second put come
    // after rank 1's first read in time, without ordering them: the interleaving where the
    // bug shows.
    let body = |with_barrier: bool| {
        let outside = std::sync::Barrier::new(2);
        move |c: &Comm, w: &Window| -> Result<(), CommError> {
            for round in 1..=2u32 {
                if c.rank() == 0 {
                    w.put_slice(1, off(w, "inbox", 0), &[round as f32; 4])?;
                    w.notify(1, off(w, "flag", 0), 1, SignalOp::Add)?;
                } else {
                    w.wait_until(off(w, "flag", 0), round)?;
                    w.get_vec::<f32>(1, off(w, "inbox", 0), 4)?;
                }
                outside.wait();
                if with_barrier {
                    w.barrier()?;
                }
            }
            Ok(())
        }
    };
    let (r, _) = checked(2, T, body(false));
    // Rank 1's read of round 1 and rank 0's put of round 2.
    assert_eq!(r.races.len(), 1, "{:?}", r.races);
    let (r, _) = checked(2, T, body(true));
    assert!(r.races.is_empty(), "{:?}", r.races);
}

#[test]
fn two_puts_into_one_mailbox_slot_are_a_write_write_race() {
    let (r, _) = checked(3, T, |c, w| {
        if c.rank() != 1 {
            w.put_slice(1, off(w, "inbox", 0), &[c.rank() as f32; 2])?;
        }
        w.barrier()
    });
    assert_eq!(r.races.len(), 1, "{:?}", r.races);
    assert!(r.races[0].to_string().contains("writes"));
    // Atomics into one word are not a race.
    let (r, _) = checked(3, T, |c, w| {
        w.fetch_add_u32(1, off(w, "flag", 0), c.rank() as u32)?;
        w.barrier()
    });
    assert!(r.races.is_empty(), "{:?}", r.races);
}

#[test]
fn two_ranks_waiting_on_each_other_are_a_deadlock_in_the_wait_for_graph() {
    let (r, res) = checked(2, Duration::from_millis(400), |c, w| {
        let peer = 1 - c.rank();
        // Round 1 works: each notifies the other, then waits.
        w.notify(peer, off(w, "flag", 0), 1, SignalOp::Add)?;
        w.wait_until(off(w, "flag", 0), 1)?;
        // Round 2: each waits before it notifies.
        w.wait_until(off(w, "flag", 0), 2)?;
        w.notify(peer, off(w, "flag", 0), 1, SignalOp::Add)
    });
    assert!(
        res.iter()
            .any(|x| matches!(x, Err(CommError::Timeout { .. }))),
        "{res:?}"
    );
    assert_eq!(r.blocked.len(), 2, "{:?}", r.blocked);
    assert!(
        r.blocked[0].what.contains("`flag[0]`") && r.blocked[0].what.contains(">= 2"),
        "{:?}",
        r.blocked
    );
    assert_eq!(r.blocked[0].on, vec![1]);
    assert_eq!(r.blocked[1].on, vec![0]);
    assert_eq!(r.cycle.len(), 2, "{:?}", r.cycle);
    let text = pto_comm::check::render(&r);
    assert!(
        text.contains("deadlock: rank 0 -> rank 1 wait on each other"),
        "{text}"
    );
}

#[test]
fn a_barrier_one_rank_skips_names_the_rank_that_did_not_arrive() {
    let (r, res) = checked(3, Duration::from_millis(400), |c, w| {
        if c.rank() != 2 {
            w.barrier()?;
        }
        Ok(())
    });
    assert!(res[0].is_err() && res[2].is_ok(), "{res:?}");
    assert!(
        r.blocked
            .iter()
            .all(|b| b.kind == BlockedIn::Join && b.on == vec![2]),
        "{:?}",
        r.blocked
    );
    let text = pto_comm::check::render(&r);
    assert!(
        text.contains("rank 0 waits on the barrier of")
            && text.contains("(waiting for rank 2 to arrive)"),
        "{text}"
    );
    assert!(!text.contains("last notified"), "{text}");
}

#[test]
fn a_collective_one_rank_skips_names_the_blocked_ranks_and_the_one_missing() {
    let (r, res) = checked(3, Duration::from_millis(400), |c, _| {
        let co = Collectives::new(c, 64)?;
        if c.rank() != 2 {
            let mut x = [1.0f32; 4];
            co.allreduce(&mut x, ReduceOp::Sum)?;
        }
        Ok(())
    });
    assert!(
        res[0].is_err() && res[1].is_err() && res[2].is_ok(),
        "{res:?}"
    );
    // Both ranks that entered are blocked in the allreduce, waiting for rank 2.
    let ranks: Vec<usize> = r.blocked.iter().map(|b| b.rank).collect();
    assert_eq!(ranks, vec![0, 1], "{:?}", r.blocked);
    for b in &r.blocked {
        assert_eq!(b.kind, BlockedIn::Join, "{b:?}");
        assert!(b.what.contains("allreduce"), "{b:?}");
        assert_eq!(b.on, vec![2], "{b:?}");
    }
    let text = pto_comm::check::render(&r);
    for rank in [0, 1] {
        assert!(
            text.contains(&format!("rank {rank} waits on the allreduce of")),
            "{text}"
        );
    }
    assert!(text.contains("(waiting for rank 2 to arrive)"), "{text}");

    // Rank 2 goes on to the communicator's barrier instead: each side waits for the other
    // until the deadline.
    let (r, res) = checked(3, Duration::from_millis(400), |c, _| {
        let co = Collectives::new(c, 64)?;
        if c.rank() == 2 {
            return c.barrier();
        }
        co.allreduce(&mut [1.0f32; 4], ReduceOp::Sum)
    });
    assert!(
        res.iter()
            .any(|x| matches!(x, Err(CommError::Timeout { .. }))),
        "{res:?}"
    );
    let text = pto_comm::check::render(&r);
    assert!(
        text.contains("rank 0 waits on the allreduce of")
            && text.contains("rank 2 waits on the barrier of")
            && text.contains("(waiting for rank 0, 1 to arrive)"),
        "{text}"
    );
    assert!(
        text.contains("deadlock: rank 0 -> rank 2 wait on each other"),
        "{text}"
    );
}

#[test]
fn a_signal_reused_across_two_collectives_without_an_epoch_is_a_stale_signal_warning() {
    let body = |raised: bool| {
        move |c: &Comm, w: &Window| -> Result<(), CommError> {
            let co = Collectives::new(c, 64)?;
            for round in 1..=2u32 {
                if c.rank() == 0 && (round == 1 || raised) {
                    w.notify(1, off(w, "flag", 0), 1, SignalOp::Add)?;
                } else if c.rank() == 1 {
                    // Without raising the value it waits for, round 2's wait passes on round 1's
                    // notify.
                    let want = if raised { round } else { 1 };
                    w.wait_until(off(w, "flag", 0), want)?;
                }
                let mut x = [round as f32; 4];
                co.allreduce(&mut x, ReduceOp::Sum)?;
            }
            Ok(())
        }
    };
    let (r, res) = checked(2, T, body(false));
    assert!(res.iter().all(Result::is_ok), "{res:?}");
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    let w = &r.warnings[0];
    assert!(
        w.contains("rank 1's wait on")
            && w.contains("`flag[0]`")
            && w.contains("last notified by rank 0")
            && w.contains("reused without being reset or raised"),
        "{w}"
    );
    assert!(
        pto_comm::check::render(&r).contains("warning: rank 1's wait"),
        "{}",
        pto_comm::check::render(&r)
    );
    let (r, res) = checked(2, T, body(true));
    assert!(res.iter().all(Result::is_ok), "{res:?}");
    assert!(
        r.warnings.is_empty() && r.races.is_empty(),
        "{:?} {:?}",
        r.warnings,
        r.races
    );
}

/// Rank 1's chip runs `consume` on its inbox (a window tensor argument); with `gate`, after a
/// deferred task that completes when rank 0's notify arrives.
fn kernel_case(gate: bool) -> CheckReport {
    use pto_core::{Chip, CoreKind, KernelRegistry, Program, TaskArgs};
    let (r, res) = checked(2, T, move |c, w| {
        if c.rank() == 0 {
            w.put_slice(1, off(w, "inbox", 0), &[3.0f32; 16])?;
            w.notify(1, off(w, "flag", 0), 1, SignalOp::Add)?;
            return Ok(());
        }
        let mut k = KernelRegistry::new();
        k.register("consume", CoreKind::Aiv, |ctx| {
            ctx.input::<f32>(if ctx.num_tensors() == 2 { 1 } else { 0 })?;
            Ok(())
        })
        .unwrap();
        k.register("gate", CoreKind::Aiv, |ctx| {
            let w = ctx
                .ext::<pto_comm::CommContext>()
                .unwrap()
                .window(0)
                .unwrap();
            ctx.output::<i32>(0)?.fill(1);
            ctx.defer(
                w.signal_condition(w.buffer("flag").unwrap().offset, 1)
                    .unwrap(),
            )
        })
        .unwrap();
        let chip = Chip::builder()
            .aiv_cores(2)
            .extension(std::sync::Arc::new(
                pto_comm::CommContext::new(c.clone()).with_window(w.clone()),
            ))
            .build()
            .unwrap();
        let inbox = w.local_tensor("inbox")?;
        let program = Program::new("p", k, move |o| {
            if gate {
                let tok = o
                    .submit("gate", TaskArgs::new().output(&[1], DType::I32).deferred())?
                    .out(0)?;
                o.submit("consume", TaskArgs::new().input(&tok).input(&inbox))?;
            } else {
                o.submit("consume", TaskArgs::new().input(&inbox))?;
            }
            Ok(())
        });
        chip.run(&program).unwrap();
        if !gate {
            w.wait_until(off(w, "flag", 0), 1)?;
        }
        Ok(())
    });
    assert!(res.iter().all(Result::is_ok), "{res:?}");
    r
}

#[test]
fn a_kernel_reading_its_window_before_the_peers_put_is_ordered_is_a_race() {
    let r = kernel_case(false);
    assert_eq!(r.races.len(), 1, "{:?}", r.races);
    let text = r.races[0].to_string();
    assert!(
        text.contains("rank 1 reads `inbox[0..64)` (kernel argument in task 0 `consume`)"),
        "{text}"
    );
    assert!(text.contains("`consume`"), "{text}");
    let r = kernel_case(true);
    assert!(r.races.is_empty(), "{:?}", r.races);
}

#[test]
fn a_signal_reused_across_a_barrier_without_being_raised_is_a_stale_signal_warning() {
    let body = |raised: bool| {
        move |c: &Comm, w: &Window| -> Result<(), CommError> {
            for round in 1..=2u32 {
                if c.rank() == 0 {
                    w.put_slice(1, off(w, "inbox", 0), &[round as f32; 4])?;
                    // The fixed protocol notifies every round and waits for the raised value.
                    if round == 1 || raised {
                        w.notify(1, off(w, "flag", 0), 1, SignalOp::Add)?;
                    }
                } else {
                    let want = if raised { round } else { 1 };
                    w.wait_until(off(w, "flag", 0), want)?;
                    w.get_vec::<f32>(1, off(w, "inbox", 0), 4)?;
                }
                w.barrier()?;
            }
            Ok(())
        }
    };
    let (r, _) = checked(2, T, body(false));
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    let w = &r.warnings[0];
    assert!(
        w.contains("`flag[0]`") && w.contains("epoch 2") && w.contains("from epoch 1"),
        "{w}"
    );
    let (r, _) = checked(2, T, body(true));
    assert!(
        r.warnings.is_empty() && r.races.is_empty(),
        "{:?} {:?}",
        r.warnings,
        r.races
    );
}

#[test]
fn without_the_checker_a_deadline_names_what_every_rank_waits_on() {
    // No checker: the wait board in the world segment alone.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let comms = pto_comm::local::comms_with_timeout(3, T).unwrap();
    let results: Vec<Result<(), CommError>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let w = window(&comm);
                    let flag = off(&w, "flag", 0);
                    match comm.rank() {
                        // Rank 0 gives up first, while rank 1 still waits and rank 2 runs.
                        0 => w
                            .wait_until_deadline(
                                flag,
                                1,
                                std::time::Instant::now() + Duration::from_millis(300),
                            )
                            .map(drop),
                        1 => w
                            .wait_until_deadline(
                                flag,
                                1,
                                std::time::Instant::now() + Duration::from_secs(5),
                            )
                            .map(drop),
                        _ => {
                            std::thread::sleep(Duration::from_millis(600));
                            Ok(())
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let Err(CommError::Timeout { what, .. }) = &results[0] else {
        panic!("{results:?}");
    };
    // The rank that gave up names the signal by its buffer, and what it holds.
    assert!(
        what.contains("wait on signal `flag[0]`") && what.contains("it holds 0"),
        "{what}"
    );
    // Ranks in the same wait are named together.
    assert!(
        what.contains("wait-for graph: ranks 0-1: waits on its signal at offset"),
        "{what}"
    );
    assert!(what.contains("rank 2 is running (not in a wait)"), "{what}");
}
