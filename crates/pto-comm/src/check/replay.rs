//! The replay: every recorded event in timestamp order, the vector clocks they imply, and
//! the races and stale signals among the accesses.

use std::collections::HashMap;

use super::log::Ev;
use super::report::{Access, AccessKind, Race};

type Clock = Vec<u32>;

pub(crate) struct Rec {
    pub(crate) a: Access,
    pub(crate) window: String,
    pub(crate) abs: (usize, usize),
    pub(crate) lo: Clock,
    pub(crate) hi: Clock,
}

/// What the replay found.
pub(crate) struct Found {
    pub(crate) races: Vec<Race>,
    pub(crate) warnings: Vec<String>,
    pub(crate) accesses: usize,
    pub(crate) edges: usize,
}

fn join_into(dst: &mut Clock, src: &Clock) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = (*d).max(*s);
    }
}

#[derive(Default)]
struct Replay {
    clocks: Vec<Clock>,
    signals: HashMap<String, Clock>,
    /// Per word: its last releaser and that rank's epoch then.
    last: HashMap<String, (usize, u64)>,
    /// Per rank: joining points left, and its clock when it left the last one.
    epochs: HashMap<usize, (u64, Clock)>,
    joins: HashMap<(String, u64), Vec<Option<Clock>>>,
    starts: HashMap<u64, Clock>,
    windows: HashMap<String, Vec<(String, usize, usize)>>,
    buffers: HashMap<(u32, u64), (String, usize)>,
    recs: Vec<Rec>,
    warnings: Vec<String>,
    edges: usize,
}

impl Replay {
    fn clock(&mut self, r: usize) -> &mut Clock {
        let n = self.clocks.len();
        if r >= n {
            // Ranks are known up front; a rank beyond them gets a clock of its own size.
            for i in n..=r {
                let mut c = vec![0; self.clocks.first().map_or(r + 1, Vec::len).max(r + 1)];
                c[i] = 1;
                self.clocks.push(c);
            }
        }
        &mut self.clocks[r]
    }

    /// Records a kernel's access as made anywhere between its task's start (`token`) and now.
    fn push_task_access(&mut self, a: Access, window: &str, token: u64) {
        let hi = self.clock(a.rank).clone();
        let lo = self
            .starts
            .get(&token)
            .cloned()
            .unwrap_or_else(|| hi.clone());
        self.push(a, window, lo, hi);
    }

    fn push(&mut self, mut a: Access, window: &str, lo: Clock, hi: Clock) {
        let abs = a.range;
        if let Some((name, off, _)) = self.windows.get(window).and_then(|bs| {
            bs.iter()
                .find(|(_, o, n)| abs.0 >= *o && abs.0 < o + (*n).max(1))
        }) {
            a.buffer = Some(name.clone());
            a.range = (abs.0 - off, abs.1 - off);
        }
        self.recs.push(Rec {
            a,
            window: window.to_string(),
            abs,
            lo,
            hi,
        });
    }

    fn step(&mut self, e: Ev) {
        match e {
            Ev::Window { name, buffers } => {
                self.windows.insert(name, buffers);
            }
            Ev::Buffer {
                pid,
                id,
                window,
                rank,
            } => {
                self.buffers.insert((pid, id), (window, rank));
            }
            Ev::Access {
                rank,
                window,
                target,
                off,
                len,
                kind,
                op,
                task,
                kernel,
                ..
            } => {
                let now = self.clock(rank).clone();
                let a = Access {
                    rank,
                    op,
                    kind,
                    task,
                    kernel,
                    target,
                    buffer: None,
                    range: (off, off + len),
                };
                self.push(a, &window, now.clone(), now);
            }
            Ev::Start { rank, token, .. } => {
                let c = self.clock(rank).clone();
                self.starts.insert(token, c);
            }
            Ev::Arg {
                rank,
                token,
                pid,
                buffer,
                off,
                len,
                kind,
                task,
                kernel,
                ..
            } => {
                let Some((window, target)) = self.buffers.get(&(pid, buffer)).cloned() else {
                    return;
                };
                let a = Access {
                    rank,
                    op: "kernel argument".into(),
                    kind,
                    task: Some(task),
                    kernel: Some(kernel),
                    target,
                    buffer: None,
                    range: (off, off + len),
                };
                self.push_task_access(a, &window, token);
            }
            Ev::Span {
                rank,
                token,
                window,
                target,
                off,
                len,
                kind,
                op,
                task,
                kernel,
                ..
            } => {
                let a = Access {
                    rank,
                    op,
                    kind,
                    task: Some(task),
                    kernel: Some(kernel),
                    target,
                    buffer: None,
                    range: (off, off + len),
                };
                self.push_task_access(a, &window, token);
            }
            Ev::Release { rank, key, .. } => {
                let mine = self.clock(rank).clone();
                let n = mine.len();
                join_into(
                    self.signals
                        .entry(key.clone())
                        .or_insert_with(|| vec![0; n]),
                    &mine,
                );
                let epoch = self.epochs.get(&rank).map_or(0, |e| e.0);
                self.last.insert(key, (rank, epoch));
                self.clock(rank)[rank] += 1;
            }
            Ev::Acquire { rank, key, .. } => self.acquire(rank, &key),
            Ev::Wait {
                rank, key, what, ..
            } => {
                if let (Some(c), Some((epoch, at))) =
                    (self.signals.get(&key), self.epochs.get(&rank))
                {
                    if *epoch > 0 && c.iter().zip(at).all(|(x, y)| x <= y) {
                        let (by, then) = self.last.get(&key).copied().unwrap_or((rank, 0));
                        let w = format!(
                            "rank {rank}'s wait on {what} in its epoch {epoch} was satisfied by a value from epoch {then} (last notified by rank {by}, before the barrier or collective that began epoch {epoch}): a signal reused without being reset or raised"
                        );
                        if !self.warnings.contains(&w) {
                            self.warnings.push(w);
                        }
                    }
                }
                self.acquire(rank, &key);
            }
            Ev::Enter {
                rank,
                key,
                seq,
                idx,
                members,
                ..
            } => {
                let mine = self.clock(rank).clone();
                let slots = self
                    .joins
                    .entry((key, seq))
                    .or_insert_with(|| vec![None; members]);
                if let Some(s) = slots.get_mut(idx) {
                    *s = Some(mine);
                }
                self.clock(rank)[rank] += 1;
            }
            Ev::Leave { rank, key, seq, .. } => {
                let slots = self.joins.get(&(key, seq)).cloned().unwrap_or_default();
                let mut mine = self.clock(rank).clone();
                for c in slots.iter().flatten() {
                    join_into(&mut mine, c);
                }
                self.edges += 1;
                let n = self.epochs.get(&rank).map_or(0, |e| e.0) + 1;
                self.epochs.insert(rank, (n, mine.clone()));
                // What this rank does from now on is after the epoch began.
                mine[rank] += 1;
                *self.clock(rank) = mine;
            }
        }
    }

    fn acquire(&mut self, rank: usize, key: &str) {
        if let Some(c) = self.signals.get(key).cloned() {
            join_into(self.clock(rank), &c);
            self.edges += 1;
        }
    }
}

/// Replays `events` of a job of `ranks` ranks.
pub(crate) fn replay(ranks: usize, mut events: Vec<Ev>) -> Found {
    let mut r = Replay {
        clocks: (0..ranks)
            .map(|i| {
                let mut v = vec![0; ranks];
                v[i] = 1;
                v
            })
            .collect(),
        ..Replay::default()
    };
    // Windows and buffers first (they carry no time), then everything in time order.
    events.sort_by_key(Ev::ts);
    for e in events {
        r.step(e);
    }
    let mut races = Vec::new();
    let mut by: HashMap<(&str, usize), Vec<&Rec>> = HashMap::new();
    for rec in &r.recs {
        by.entry((rec.window.as_str(), rec.a.target))
            .or_default()
            .push(rec);
    }
    let mut keys: Vec<_> = by.keys().copied().collect();
    keys.sort();
    for k in keys {
        let recs = &by[&k];
        for (i, x) in recs.iter().enumerate() {
            for y in &recs[i + 1..] {
                if conflict(x, y) && unordered(x, y) {
                    races.push(Race {
                        window: x.window.clone(),
                        first: x.a.clone(),
                        second: y.a.clone(),
                        advice: advice(&x.a, &y.a),
                    });
                }
            }
        }
    }
    Found {
        races,
        warnings: r.warnings,
        accesses: r.recs.len(),
        edges: r.edges,
    }
}

fn conflict(x: &Rec, y: &Rec) -> bool {
    let overlap = x.abs.0 < y.abs.1 && y.abs.0 < x.abs.1;
    let atomic = |r: &Rec| r.a.kind == AccessKind::Atomic;
    let writes = |r: &Rec| r.a.kind != AccessKind::Read;
    overlap && x.a.rank != y.a.rank && !(atomic(x) && atomic(y)) && (writes(x) || writes(y))
}

/// Neither access can be ordered before the other: `x` (somewhere in `[lo, hi]`) is before
/// `y` when its earliest point is known to `y`'s latest.
fn unordered(x: &Rec, y: &Rec) -> bool {
    let before = |a: &Rec, b: &Rec| {
        a.lo.get(a.a.rank).copied().unwrap_or(0) <= b.hi.get(a.a.rank).copied().unwrap_or(0)
    };
    !before(x, y) && !before(y, x)
}

fn advice(x: &Access, y: &Access) -> String {
    let (w, other) = if x.kind != AccessKind::Read {
        (x, y)
    } else {
        (y, x)
    };
    // One side is the owner of the memory (a peer's put and the owner's read, or the owner's
    // write through a window pointer and a peer's get): the other should have waited on it.
    if w.rank != other.rank && (other.rank == w.target || w.rank == w.target) {
        format!(
            "rank {} does not wait on a signal that rank {} notified after its {} (notify -> wait), nor rank {} on one that rank {} notified after its {} (the reuse of memory a peer may still use), and no barrier or collective separates them",
            other.rank, w.rank, w.op, w.rank, other.rank, other.op
        )
    } else {
        format!(
            "order them with a notify -> wait on a signal between ranks {} and {}, a barrier or a collective",
            x.rank, y.rank
        )
    }
}
