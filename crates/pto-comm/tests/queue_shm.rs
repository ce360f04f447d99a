//! The completion queue in shared memory, across processes: a queue created here is opened by
//! name and posted to from child processes (the test binary re-run with the ignored
//! `producer_entry` test selected), and popped here. The stress test runs 4 producer processes
//! of 20 000 completions each through a 64-entry queue; every producer's tokens must arrive
//! exactly once and in order. Everything is bounded by deadlines, and the creator's
//! `SharedQueue` unlinks the segment when it drops, also when a test fails.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use pto_comm::shm::ShmWorld;
use pto_comm::{CommError, SharedQueue};
use pto_core::{Completion, QueueHost};

/// The queue's name, for a child.
const NAME: &str = "PTO_QUEUE_TEST_NAME";
/// The child's producer index (the high half of its tokens).
const INDEX: &str = "PTO_QUEUE_TEST_INDEX";
/// How many completions the child posts.
const COUNT: &str = "PTO_QUEUE_TEST_COUNT";

/// Bounds every wait in a child: opening the queue and posting into a queue nobody drains.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

/// The file behind a segment name (`/pto.…` is `/dev/shm/pto.…`).
fn shm_path(name: &str) -> PathBuf {
    PathBuf::from("/dev/shm").join(name.trim_start_matches('/'))
}

/// Child producer processes; any still running when this drops (a failed test) are killed.
struct Producers(Vec<Option<Child>>);

impl Producers {
    fn spawn(queue: &str, n: u64, count: u64) -> Producers {
        let exe = std::env::current_exe().unwrap();
        Producers(
            (0..n)
                .map(|index| {
                    let child = Command::new(&exe)
                        .args([
                            "--exact",
                            "producer_entry",
                            "--ignored",
                            "--nocapture",
                            "--test-threads=1",
                        ])
                        .env(NAME, queue)
                        .env(INDEX, index.to_string())
                        .env(COUNT, count.to_string())
                        .stdout(Stdio::null())
                        .stderr(Stdio::inherit())
                        .spawn()
                        .unwrap();
                    Some(child)
                })
                .collect(),
        )
    }

    /// Panics if a child has already failed (so a parent waiting on its tokens stops early).
    fn check_none_failed(&mut self) {
        for (i, slot) in self.0.iter_mut().enumerate() {
            if let Some(child) = slot {
                if let Some(status) = child.try_wait().unwrap() {
                    assert!(status.success(), "producer {i} failed: {status}");
                }
            }
        }
    }

    /// Reaps every child, waiting until `deadline`; panics if one is still running then.
    fn wait(&mut self, deadline: Instant) -> Vec<ExitStatus> {
        let mut out = Vec::new();
        for (i, slot) in self.0.iter_mut().enumerate() {
            let child = slot.as_mut().unwrap();
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status;
                }
                assert!(
                    Instant::now() < deadline,
                    "producer {i} still running at the deadline"
                );
                std::thread::sleep(Duration::from_millis(10));
            };
            *slot = None;
            out.push(status);
        }
        out
    }
}

impl Drop for Producers {
    fn drop(&mut self) {
        for child in self.0.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Pops `n` producers' `count` completions each, checking that each producer's tokens
/// (`index << 32 | i`) arrive exactly once and in order; panics at `deadline` or when a child
/// fails first.
fn drain(q: &SharedQueue, kids: &mut Producers, n: u64, count: u64, deadline: Instant) {
    let mut next = vec![0u64; n as usize];
    let mut got = 0;
    let mut idle = 0u32;
    while got < n * count {
        if let Some(c) = q.queue().pop() {
            let (p, i) = ((c.token >> 32) as usize, c.token & 0xffff_ffff);
            assert!(p < next.len(), "unknown token {:#x}", c.token);
            assert_eq!(
                i, next[p],
                "producer {p}: token {i} lost, duplicated or out of order"
            );
            assert_eq!(c.status, i % 7, "producer {p} token {i}: wrong status");
            next[p] += 1;
            got += 1;
            idle = 0;
            continue;
        }
        idle += 1;
        if idle.is_multiple_of(1024) {
            assert!(
                Instant::now() < deadline,
                "gave up with {got} of {} completions (per producer {next:?})",
                n * count
            );
            kids.check_none_failed();
        }
        std::thread::yield_now();
    }
}

/// Creates a queue, has `n` child processes post `count` completions each, drains it here
/// concurrently, and checks the children and the queue afterwards.
fn run(capacity: usize, n: u64, count: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    let q = SharedQueue::create(capacity).unwrap();
    assert_eq!(q.queue().capacity(), capacity);
    let path = shm_path(q.name());
    assert!(path.exists(), "{} missing", path.display());
    let mut kids = Producers::spawn(q.name(), n, count);
    drain(&q, &mut kids, n, count, deadline);
    for (i, status) in kids.wait(deadline).into_iter().enumerate() {
        assert!(status.success(), "producer {i}: {status}");
    }
    assert!(
        q.queue().pop().is_none(),
        "a completion beyond those posted"
    );
    assert!(q.queue().is_empty());
    drop(q);
    assert!(!path.exists(), "{} left behind", path.display());
}

#[test]
fn four_producer_processes_lose_duplicate_and_reorder_nothing() {
    let (n, count) = (4, 20_000);
    let t = Instant::now();
    run(64, n, count, Duration::from_secs(60));
    eprintln!(
        "{n} producer processes x {count} completions through 64 entries: {:?}",
        t.elapsed()
    );
}

#[test]
fn a_queue_created_here_is_posted_to_from_another_process() {
    // Few enough to fit: the child posts everything and exits before anything is popped.
    let q = SharedQueue::create(8).unwrap();
    let name = q.name().to_string();
    let mut kids = Producers::spawn(&name, 1, 5);
    for status in kids.wait(Instant::now() + Duration::from_secs(30)) {
        assert!(status.success(), "producer: {status}");
    }
    for i in 0..5 {
        assert_eq!(
            q.queue().pop(),
            Some(Completion {
                token: i,
                status: i % 7
            })
        );
    }
    assert!(q.queue().pop().is_none());
    // A second handle in this process sees the same queue and does not own the name.
    let other = SharedQueue::open(&name, Instant::now() + Duration::from_secs(5)).unwrap();
    other
        .queue()
        .post(Completion {
            token: 42,
            status: 0,
        })
        .unwrap();
    drop(other);
    assert!(shm_path(&name).exists(), "an opener unlinked the queue");
    assert_eq!(q.queue().pop().map(|c| c.token), Some(42));
    drop(q);
    assert!(!shm_path(&name).exists(), "{name} left behind");
}

#[test]
fn opening_a_segment_that_is_not_a_queue_fails() {
    let world = ShmWorld::create(2).unwrap();
    let soon = || Instant::now() + Duration::from_secs(2);
    match SharedQueue::open(world.name(), soon()) {
        Err(CommError::Mismatch { .. }) => {}
        other => panic!("expected a segment-kind mismatch, got {other:?}"),
    }
    drop(world);
    // Nor is a name nobody created (the deadline bounds the wait for it).
    let t = Instant::now();
    let missing = format!("/pto.{}.0000000000000000.cq", std::process::id());
    let r = SharedQueue::open(&missing, Instant::now() + Duration::from_millis(200));
    assert!(r.is_err(), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// Not a test on its own: the body of one producer process.
#[test]
#[ignore = "entered by the tests above in child processes"]
fn producer_entry() {
    let (Ok(name), Ok(index), Ok(count)) = (
        std::env::var(NAME),
        std::env::var(INDEX),
        std::env::var(COUNT),
    ) else {
        return;
    };
    let index: u64 = index.parse().unwrap();
    let count: u64 = count.parse().unwrap();
    let deadline = Instant::now() + CHILD_DEADLINE;
    let q = SharedQueue::open(&name, deadline).unwrap();
    for i in 0..count {
        let c = Completion {
            token: index << 32 | i,
            status: i % 7,
        };
        let mut tries = 0u32;
        while let Err(full) = q.queue().post(c) {
            assert_eq!(full.token, c.token);
            tries += 1;
            if tries.is_multiple_of(1024) && Instant::now() >= deadline {
                eprintln!("producer {index}: queue still full at completion {i}; giving up");
                std::process::exit(1);
            }
            std::thread::yield_now();
        }
    }
}
