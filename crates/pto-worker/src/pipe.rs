//! A child's frames in flight. Each child has a few mailbox *lanes*; the host sends frame `g`
//! (generations count from 1) into lane `(g - 1) % lanes` and the child serves the lanes in
//! the same order, so it finds its next frame waiting while it runs one: a chip drains a queue
//! of chip tasks back to back, and no host thread waits per chip task (the host's `chip` task
//! completes later, through a deferred-completion condition that polls its [`Ticket`]).
//!
//! Results are taken in generation order by whichever host thread looks first (a condition's
//! poll, a blocking wait, a post) and kept until their ticket asks. A lane is written again
//! only after its result was taken. A frame posted while every lane is busy waits in the
//! child's host-side queue (the posting thread does not wait): whoever takes a result sends the
//! next queued frame into the lane it freed. Deadlines run from the moment a frame becomes the
//! oldest in flight: a child is silent when its oldest frame gets no answer for the Worker's
//! timeout (plus a grace), whatever waits behind it. See `docs/design/worker.md`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::failure::FailKind;
use crate::frame::Outcome;
use crate::host::{kind_of, HostState, GRACE};
use crate::mailbox::{Ident, Mailbox};

/// How often a wait for results looks whether the child is still alive (a `waitpid`) and
/// whether its oldest frame is past its deadline.
const LOOK_EVERY: Duration = Duration::from_millis(1);
/// One in this many lock-free polls of a deferred chip task goes on to look after the child.
const LOOK_POLLS: u32 = 64;
/// Most buffers of sent queued frames a child's pipe keeps for the next ones.
const SPARE_FRAMES: usize = 64;
/// Larger buffers are freed rather than kept.
const SPARE_CAPACITY: usize = 16 << 10;
/// Longest park of a blocking wait before it looks again.
const PARK: Duration = Duration::from_millis(2);

/// Lanes per child: eight (a chip runs up to eight tasks back to back), fewer when there are
/// many children (each lane is a mailbox slot of [`crate::mailbox::SLOT`] bytes of shared
/// memory; from 256 children on, one lane each, as before lanes existed).
pub(crate) fn lanes_for(children: usize) -> usize {
    (256 / children.max(1)).clamp(1, 8)
}

/// The in-flight state of one child (under its lock).
#[derive(Debug)]
pub(crate) struct Pipe {
    /// Frames sent (the generation of the last one).
    pub(crate) sent: u64,
    /// Frames sent whose results were not taken yet, oldest first.
    inflight: VecDeque<Ident>,
    /// Frames posted while every lane was busy, oldest first (empty whenever a lane is free):
    /// each goes into the lane that the result taken before it frees.
    queued: VecDeque<(Ident, Vec<u8>)>,
    /// Buffers of queued frames that were sent, for the next ones (a frame queued per chip
    /// task then allocates nothing; at most [`SPARE_FRAMES`] are kept).
    spare: Vec<Vec<u8>>,
    /// Since when the oldest frame in flight has been the oldest.
    head_since: Instant,
    last_look: Instant,
    /// Results taken and not yet asked for, by generation.
    done: Vec<(u64, Result<Outcome, String>)>,
    /// Set once the child died or was killed: every frame in flight, and every later send,
    /// fails with this.
    lost: Option<String>,
    /// Most frames ever in flight at once (for tests).
    pub(crate) peak: usize,
}

impl Pipe {
    pub(crate) fn new() -> Pipe {
        let now = Instant::now();
        Pipe {
            sent: 0,
            inflight: VecDeque::new(),
            queued: VecDeque::new(),
            spare: Vec::new(),
            head_since: now,
            last_look: now,
            done: Vec::new(),
            lost: None,
            peak: 0,
        }
    }

    /// True when no frame is in flight or queued for the child.
    pub(crate) fn idle(&self) -> bool {
        self.inflight.is_empty() && self.queued.is_empty()
    }

    /// Counts a published frame in flight (`now`: the time if the caller has read it).
    fn in_flight(&mut self, ident: Ident, now: Option<Instant>) {
        if self.inflight.is_empty() {
            let now = now.unwrap_or_else(Instant::now);
            self.head_since = now;
            self.last_look = now;
        }
        self.inflight.push_back(ident);
        self.peak = self.peak.max(self.inflight.len());
    }

    fn claim(&mut self, generation: u64) -> Option<Result<Outcome, String>> {
        let i = self.done.iter().position(|(g, _)| *g == generation)?;
        Some(self.done.swap_remove(i).1)
    }
}

/// A frame sent to a child, to ask for its result.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    pub(crate) child: usize,
    pub(crate) ident: Ident,
    /// The lane that carries it (`lane_of`, computed once: polls are frequent).
    lane: usize,
}

/// The lane that carries generation `g` among `lanes`.
pub(crate) fn lane_of(lanes: &[Mailbox], g: u64) -> &Mailbox {
    &lanes[lane_index(lanes.len(), g)]
}

fn lane_index(lanes: usize, g: u64) -> usize {
    (g.wrapping_sub(1) % lanes as u64) as usize
}

impl HostState {
    /// Sends `frame` for host task `task` to `child`: into a free lane, or into the child's
    /// host-side queue when every lane is busy (it never waits).
    ///
    /// # Errors
    ///
    /// The child is lost (died, stopped, silent), or the frame is too large.
    pub(crate) fn post(&self, child: usize, task: u64, frame: &[u8]) -> Result<Ticket, String> {
        let c = &self.children[child];
        let mut p = c.pipe.lock();
        self.post_queued(child, &mut p, task, frame)
    }

    /// [`HostState::post`] with the child's lock held.
    pub(crate) fn post_queued(
        &self,
        child: usize,
        p: &mut Pipe,
        task: u64,
        frame: &[u8],
    ) -> Result<Ticket, String> {
        let c = &self.children[child];
        Mailbox::fits(frame).map_err(|e| e.to_string())?;
        self.advance(child, p);
        if let Some(l) = &p.lost {
            return Err(l.clone());
        }
        let ident = Ident {
            run: self.run.load(std::sync::atomic::Ordering::Relaxed),
            task,
            generation: p.sent + 1,
        };
        // The lane's pages, before its first frame (a queued frame goes into it later).
        lane_of(&c.lanes, ident.generation)
            .reserve()
            .map_err(|e| e.to_string())?;
        if p.queued.is_empty() && p.inflight.len() < c.lanes.len() {
            lane_of(&c.lanes, ident.generation)
                .send(ident, frame)
                .map_err(|e| e.to_string())?;
            p.in_flight(ident, None);
        } else {
            let mut b = p.spare.pop().unwrap_or_default();
            b.clear();
            b.extend_from_slice(frame);
            p.queued.push_back((ident, b));
        }
        p.sent = ident.generation;
        Ok(Ticket {
            child,
            ident,
            lane: lane_index(c.lanes.len(), ident.generation),
        })
    }

    /// A post with the child's lock held and a custom `send` (which must publish exactly one
    /// frame on success, and nothing on error) that waits, within the deadline of the oldest
    /// frame, for a free lane and an empty queue (a test hook's raw frames).
    pub(crate) fn post_locked(
        &self,
        child: usize,
        p: &mut Pipe,
        task: u64,
        send: impl FnOnce(&Mailbox, Ident) -> Result<(), String>,
    ) -> Result<Ticket, String> {
        let c = &self.children[child];
        loop {
            self.advance(child, p);
            if let Some(l) = &p.lost {
                return Err(l.clone());
            }
            let Some(&head) = p.inflight.front() else {
                break;
            };
            if p.inflight.len() < c.lanes.len() && p.queued.is_empty() {
                break;
            }
            lane_of(&c.lanes, head.generation).wait_settled(Instant::now() + PARK);
        }
        let ident = Ident {
            run: self.run.load(std::sync::atomic::Ordering::Relaxed),
            task,
            generation: p.sent + 1,
        };
        let lane = lane_of(&c.lanes, ident.generation);
        lane.reserve().map_err(|e| e.to_string())?;
        // Counted only once published: the child serves the lanes in order, a skipped lane
        // would leave it waiting forever.
        send(lane, ident)?;
        p.sent = ident.generation;
        p.in_flight(ident, None);
        Ok(Ticket {
            child,
            ident,
            lane: lane_index(c.lanes.len(), ident.generation),
        })
    }

    /// The result of `t` if it is in (`None` while it runs, or when `t`'s child is busy with
    /// another thread and `blocking` is false). Never waits for the child.
    pub(crate) fn poll(&self, t: &Ticket, blocking: bool) -> Option<Result<Outcome, String>> {
        let c = &self.children[t.child];
        if !blocking {
            // The deferred task's poll runs on every pass of the engine's polling thread: while
            // nothing is there to take (results come in order: the oldest frame not taken has
            // not answered), answer without the lock or the clock. Only the oldest frame's polls
            // are counted, and one in `LOOK_POLLS` goes on to look after the child (the later
            // ones wait behind it and touch no shared counter).
            let taken = c.taken.load(Ordering::Acquire);
            if taken < t.ident.generation {
                let oldest = taken + 1;
                if !lane_of(&c.lanes, oldest).result_ready() {
                    if oldest != t.ident.generation {
                        return None;
                    }
                    // A plain load and store: a lost count only moves the next look by a poll.
                    let n = c.polls.load(Ordering::Relaxed).wrapping_add(1);
                    c.polls.store(n, Ordering::Relaxed);
                    if !n.is_multiple_of(LOOK_POLLS) {
                        return None;
                    }
                }
            }
        }
        let mut p = if blocking {
            c.pipe.lock()
        } else {
            c.pipe.try_lock()?
        };
        if let Some(r) = p.claim(t.ident.generation) {
            return Some(r);
        }
        self.advance(t.child, &mut p);
        p.claim(t.ident.generation)
    }

    /// Waits for the results of `tickets`, in their order.
    pub(crate) fn wait(&self, tickets: &[Ticket]) -> Vec<Result<Outcome, String>> {
        let mut out: Vec<Option<Result<Outcome, String>>> = vec![None; tickets.len()];
        loop {
            for (o, t) in out.iter_mut().zip(tickets) {
                if o.is_none() {
                    *o = self.poll(t, true);
                }
            }
            let Some(k) = out.iter().position(Option::is_none) else {
                break;
            };
            let t = &tickets[k];
            // Until the lane's frame settles: its result is in, or another thread took it (the
            // next poll finds it among the taken ones).
            self.children[t.child].lanes[t.lane].wait_settled(Instant::now() + PARK);
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err("no result".into())))
            .collect()
    }

    /// Sends one frame and waits for its result.
    pub(crate) fn send(&self, child: usize, task: u64, frame: &[u8]) -> Result<Outcome, String> {
        let t = self.post(child, task, frame)?;
        self.wait(&[t])
            .pop()
            .unwrap_or_else(|| Err("no result".into()))
    }

    /// Takes the results that are in, oldest first; now and then looks whether the child died
    /// or its oldest frame is past its deadline (then every frame in flight fails).
    fn advance(&self, child: usize, p: &mut Pipe) {
        let c = &self.children[child];
        let taken_at = self.take_ready(child, p);
        let Some(&head) = p.inflight.front() else {
            return;
        };
        let now = taken_at.unwrap_or_else(Instant::now);
        if p.lost.is_none() && now.duration_since(p.last_look) >= LOOK_EVERY {
            p.last_look = now;
            if let Some(e) = c.exit() {
                // It may have published just before it died.
                self.take_ready(child, p);
                if let Some(&head) = p.inflight.front() {
                    let f = c.failure(
                        child,
                        FailKind::Died(e),
                        format!("while running host task {}", head.task),
                    );
                    p.lost = Some(f.to_string());
                    self.note_failure(f);
                }
            } else if c.in_process() && c.killed.load(Ordering::Acquire) {
                // A thread cannot be killed: once the Worker gave up on it (an abort, or a
                // deadline below), its frames fail now and it is left to return on its own.
                p.lost = Some(format!(
                    "{}: abandoned while running host task {} (a child thread cannot be killed)",
                    c.who, head.task
                ));
            } else if now >= p.head_since + self.timeout + GRACE {
                let waited = now.duration_since(p.head_since);
                let f = c.silence(child, waited, &format!("host task {}", head.task));
                p.lost = Some(f.to_string());
                // Recorded before the kill, so that the death it causes is no news.
                self.note_failure(f);
                // It cannot be trusted with another frame: stop it (a stopped process takes
                // SIGKILL too).
                c.kill();
            }
        }
        if let Some(l) = &p.lost {
            // In generation order: every frame in flight, then every queued one.
            let queued = p.queued.drain(..).map(|(id, _)| id).collect::<Vec<_>>();
            for id in p.inflight.drain(..).chain(queued) {
                p.done.push((id.generation, Err(l.clone())));
                c.taken.store(id.generation, Ordering::Release);
            }
        }
    }

    /// Takes the results that are in, oldest first; returns the time it read if it took any
    /// (one clock read for all of them: they came in together).
    fn take_ready(&self, child: usize, p: &mut Pipe) -> Option<Instant> {
        let c = &self.children[child];
        let mut now = None;
        while let Some(&head) = p.inflight.front() {
            let lane = lane_of(&c.lanes, head.generation);
            if !lane.result_ready() {
                break;
            }
            let r = lane
                .take_result(head, &c.who)
                .map_err(|e| e.to_string())
                .and_then(|b| Outcome::decode(&b).map_err(|e| format!("{}: {e}", c.who)));
            match &r {
                Ok(o) if o.status != 0 => {
                    self.note_failure(c.failure(child, kind_of(o.status), o.message.clone()))
                }
                Ok(o) if !o.trace.is_empty() => self.traces.lock().push(o.trace.clone()),
                Ok(_) => {}
                Err(e) => self.note_failure(c.failure(child, FailKind::Task, e.clone())),
            }
            p.inflight.pop_front();
            let t = *now.get_or_insert_with(Instant::now);
            p.head_since = t;
            p.done.push((head.generation, r));
            c.taken.store(head.generation, Ordering::Release);
            // The lane it freed carries the next queued frame (queued frames follow every frame
            // in flight, one lane round behind).
            if let Some((id, bytes)) = p.queued.pop_front() {
                // The size was checked when it was queued: the send cannot fail.
                let _ = lane_of(&c.lanes, id.generation).send(id, &bytes);
                p.in_flight(id, now);
                if p.spare.len() < SPARE_FRAMES && bytes.capacity() <= SPARE_CAPACITY {
                    p.spare.push(bytes);
                }
            }
        }
        now
    }
}
