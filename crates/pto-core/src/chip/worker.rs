//! A core thread's loop: run the block at hand (or the consumer the last completion made
//! ready), else take one from the queues, else search for a while and park
//! (`crate::engine::sleep`). One idle thread at a time also polls deferred tasks.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::engine::execute::Job;
use crate::engine::{decode_current, Engine};

/// How long the polling thread polls waiting deferred tasks closely before it naps.
const DEFERRED_POLL: Duration = Duration::from_millis(1);
/// Longest nap of the polling thread while deferred tasks wait (their conditions wake no one).
pub(crate) const DEFERRED_NAP_MAX: Duration = Duration::from_millis(1);
/// Longest park of the other idle threads while deferred tasks wait: one of them takes over
/// polling if the polling thread is busy running a kernel.
const DEFERRED_PARK: Duration = Duration::from_millis(2);
/// Longest park otherwise; only bounds a lost wake-up, which the protocol rules out.
const IDLE_PARK: Duration = Duration::from_millis(250);
/// Longest park of the reserved thread while the orchestrating thread is busy; after it, the
/// thread runs queued work if nothing moved meanwhile (see `keep_out`).
const RESERVE_PARK: Duration = Duration::from_millis(1);

pub(crate) fn main(e: &Engine, tid: usize) {
    let mut rotate = tid;
    let mut streak = 0u32;
    let mut next: Option<Job> = None;
    // The core this thread kept from its last block (see `Engine::find_work`).
    let mut held = None;
    // The chip's reserved thread (see `crate::engine::reserve`), and whether it was drafted
    // to work while the orchestrating thread is busy (until it next runs out of work).
    let reserved = e.reserved == Some(tid);
    let mut drafted = false;
    loop {
        if reserved && !drafted && next.is_none() && e.reserve.is_held() {
            if let Some(c) = held.take() {
                e.cores.release(c);
            }
            drafted = keep_out(e);
            if e.shutdown.load(Ordering::Acquire) {
                return;
            }
            continue;
        }
        if let Some(job) = next.take().or_else(|| e.find_work(&mut rotate, &mut held)) {
            next = e.run_block(tid, job, &mut streak);
            if next.is_none() {
                held = Some(job.core);
            }
            continue;
        }
        drafted = false;
        if e.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Out of work: the orchestrating thread may want to refill the queues now.
        e.idle_poke();
        next = search(e, tid, &mut rotate, reserved);
    }
}

/// The reserved thread while the orchestrating thread is busy: parks until it is released
/// (false), or until a whole park passed with work queued and nothing moving (true: it is
/// drafted, and works until it runs out). Returns at shutdown.
fn keep_out(e: &Engine) -> bool {
    loop {
        let seen = (e.finished_total(), e.submitted.load(Ordering::Acquire));
        if e.reserve.park(RESERVE_PARK) || e.shutdown.load(Ordering::Acquire) {
            return false;
        }
        // No task finished (the other threads are stuck in kernels, perhaps waiting for a
        // queued task) or none was submitted (the orchestrating thread is blocked outside the
        // engine) while work waits: run it.
        let now = (e.finished_total(), e.submitted.load(Ordering::Acquire));
        if (now.0 == seen.0 || now.1 == seen.1) && e.has_ready_or_staged() {
            return true;
        }
    }
}

/// The orchestrating thread running ready tasks while it waits for the end of a run (see
/// `ChipBuilder::orchestrator_runs_tasks`). It counts as the engine's last thread slot.
#[derive(Debug, Default)]
pub(crate) struct Helper {
    rotate: usize,
    streak: u32,
    held: Option<crate::kernel::CoreId>,
    /// True while it is the engine's polling thread (deferred tasks wait).
    poller: bool,
    /// When its polling last settled a deferred task (or began).
    polled: Option<Instant>,
}

impl Helper {
    /// Runs what is ready now (and the consumers it makes ready); false when nothing was.
    pub(crate) fn run_some(&mut self, e: &Engine) -> bool {
        let tid = e.threads.len() - 1;
        let Some(mut job) = e
            .take_held(&mut self.held)
            .or_else(|| e.find_work(&mut self.rotate, &mut self.held))
        else {
            return false;
        };
        loop {
            match e.run_block(tid, job, &mut self.streak) {
                Some(next) => job = next,
                None => {
                    self.held = Some(job.core);
                    return true;
                }
            }
        }
    }

    /// While deferred tasks wait and no core thread polls them, becomes the polling thread
    /// and polls them once; true when that settled anything.
    pub(crate) fn poll(&mut self, e: &Engine) -> bool {
        if !e.has_waiting.load(Ordering::Acquire) {
            return false;
        }
        if !self.poller {
            self.poller = e
                .polling
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
            self.polled = Some(Instant::now());
        }
        if self.poller && e.poll_async(Some(e.threads.len() - 1)) {
            self.polled = Some(Instant::now());
            return true;
        }
        false
    }

    /// True while it should poll closely rather than park: it is the polling thread and a
    /// deferred task settled within the last [`DEFERRED_POLL`].
    pub(crate) fn polling_closely(&mut self, e: &Engine) -> bool {
        if !e.has_waiting.load(Ordering::Acquire) {
            // Nothing to poll: the role goes back before a park.
            give_up_polling(e, &mut self.poller);
        }
        self.poller
            && e.has_waiting.load(Ordering::Acquire)
            && self.polled.is_some_and(|t| t.elapsed() < DEFERRED_POLL)
    }

    /// Gives back the core it kept, and the polling role.
    pub(crate) fn stop(&mut self, e: &Engine) {
        if let Some(c) = self.held.take() {
            e.cores.release(c);
        }
        give_up_polling(e, &mut self.poller);
    }
}

/// Gives the polling role back if `poller` says this thread holds it.
fn give_up_polling(e: &Engine, poller: &mut bool) {
    if std::mem::take(poller) {
        e.polling.store(false, Ordering::Release);
    }
}

/// Looks for work: spins for the chip's spin time, then parks until notified; returns the job
/// it found (`None` at shutdown). While deferred tasks wait, one searching thread becomes the
/// poller: it polls their conditions closely for a while (the latency from "condition holds"
/// to "consumer runs" is what deferred tasks are for), then naps briefly between polls. The
/// others spin and park as usual, so pollers never crowd out the threads that set conditions.
/// The reserved thread (`reserved`) stops searching, returning `None`, once the orchestrating
/// thread is busy.
fn search(e: &Engine, tid: usize, rotate: &mut usize, reserved: bool) -> Option<Job> {
    e.sleep.begin_search();
    let mut naps = 0u32;
    let mut none = None;
    let mut poller = false;
    let found = 'outer: loop {
        let start = Instant::now();
        let mut i = 0u32;
        loop {
            if let Some(job) = e.find_work(rotate, &mut none) {
                break 'outer Some(job);
            }
            if e.shutdown.load(Ordering::Acquire) {
                break 'outer None;
            }
            let waiting = e.has_waiting.load(Ordering::Acquire);
            if waiting && !poller {
                poller = e
                    .polling
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok();
            }
            // Completions may be posted for tasks that have not deferred yet: drain now and
            // then (the queue may live in shared memory).
            if ((poller && waiting) || (i.is_multiple_of(256) && !e.sender.host.queue().is_empty()))
                && e.poll_async(Some(tid))
            {
                naps = 0;
                continue;
            }
            i = i.wrapping_add(1);
            if i.is_multiple_of(64) {
                if reserved && e.reserve.is_held() {
                    break 'outer None;
                }
                let spin = if poller && waiting {
                    e.spin.max(DEFERRED_POLL)
                } else {
                    e.spin
                };
                if start.elapsed() >= spin {
                    break;
                }
                if i.is_multiple_of(256) {
                    // Tasks the orchestrating thread staged and has not published (it is busy
                    // elsewhere): publish them (see `Spmc::stage`). Not more often: reading
                    // its count takes the line it writes for every task.
                    if e.publish_staged() {
                        continue;
                    }
                    std::thread::yield_now();
                }
            } else {
                std::hint::spin_loop();
            }
        }
        let timeout = if !e.has_waiting.load(Ordering::Acquire) {
            // Nothing to poll: give the role up before a long park, or a task deferred
            // meanwhile would wait for this park to end.
            give_up_polling(e, &mut poller);
            IDLE_PARK
        } else if poller {
            naps = (naps + 1).min(20);
            (Duration::from_micros(50) * naps).min(DEFERRED_NAP_MAX)
        } else {
            DEFERRED_PARK
        };
        e.sleep.sleep(
            || e.has_ready_or_staged() || e.shutdown.load(Ordering::Acquire),
            timeout,
        );
        // A task the orchestrating thread held back for longer than this thread searched (it
        // is busy elsewhere): queue it, so that it runs now.
        e.flush_held();
        if reserved && e.reserve.is_held() {
            break 'outer None;
        }
    };
    give_up_polling(e, &mut poller);
    if e.sleep.end_search() && e.has_ready() {
        // The last searcher took work and more is queued: let another thread look.
        e.sleep.notify();
    }
    found
}

/// Names the blocks running now and the deferred tasks waiting (a stall report); true when a
/// kernel is running (it may never return).
pub(crate) fn running_report(e: &Engine) -> (String, bool) {
    let mut v: Vec<String> = Vec::new();
    for ts in e.threads.iter() {
        let Some((slot, id)) = decode_current(ts.current.load(Ordering::SeqCst)) else {
            continue;
        };
        let block = ts.block.load(Ordering::Relaxed);
        let core = ts.core.load(Ordering::Relaxed);
        let kind = ["MIX", "AIC", "AIV"][(core >> 16).min(2) as usize];
        let name = e.kernel_name(slot).unwrap_or_else(|| "?".into());
        v.push(format!(
            "task #{id} block {block} kernel {name:?} on {kind}{}",
            core & 0xffff
        ));
    }
    let stuck = !v.is_empty();
    v.sort();
    for w in e.deferred.lock().all_waiting() {
        let conds: Vec<String> = w.conds.iter().map(|(c, _)| c.describe()).collect();
        v.push(format!(
            "deferred task #{} waiting for [{}] and {} token post(s)",
            w.id,
            conds.join(", "),
            w.tokens_expected
        ));
    }
    if v.is_empty() {
        let waiting = e
            .submitted
            .load(Ordering::Acquire)
            .saturating_sub(e.finished_total());
        return (format!("none ({waiting} task(s) waiting)"), false);
    }
    (v.join(", "), stuck)
}
