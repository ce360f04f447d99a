//! The happens-before checker behind `pto check`: a vector clock per rank, advanced by every
//! ordering edge the protocols make (a notify releases, the wait, test or deferred condition
//! that sees it acquires; barriers and collectives join every member), and a record of every
//! window access with its byte range (put, get, atomics, notify, and the window tensors kernels
//! take as arguments). Two accesses to overlapping bytes of one rank's window, at least one a
//! write and not both atomic, that neither clock orders, are a race. See
//! `docs/design/check.md`.
//!
//! One checker per process ([`Checker::install`]); ranks must be threads of this process (the
//! `local` backend). Accesses of one rank are taken as ordered among themselves (the chip's
//! borrow table already refuses conflicting tensor accesses of unordered tasks).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use pto_core::observe::KernelObserver;
use pto_core::KernelCtx;

use crate::context::CommContext;
use crate::window::BufferRef;

type Clock = Vec<u32>;
/// A joining point's published clocks (by member index) and how many members left it.
type Slots = (Vec<Option<Clock>>, usize);

/// How an access touches memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    /// A plain read.
    Read,
    /// A plain write.
    Write,
    /// An atomic read-modify-write or store (atomics, notifies).
    Atomic,
}

impl AccessKind {
    fn word(self) -> &'static str {
        match self {
            AccessKind::Read => "reads",
            AccessKind::Write => "writes",
            AccessKind::Atomic => "atomically updates",
        }
    }
}

/// One recorded window access, as a report shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The rank that made it.
    pub rank: usize,
    /// The operation (`put`, `get`, `notify`, `atomic add`, `kernel argument`...).
    pub op: &'static str,
    /// How it touches memory.
    pub kind: AccessKind,
    /// The task that made it, when a kernel did.
    pub task: Option<u64>,
    /// That task's kernel.
    pub kernel: Option<String>,
    /// The rank whose window it touched.
    pub target: usize,
    /// The window's buffer it touched (`None` outside named buffers).
    pub buffer: Option<String>,
    /// Bytes touched, relative to the buffer (or the window).
    pub range: (usize, usize),
}

impl Access {
    fn describe(&self) -> String {
        let mut s = format!("rank {} {} ", self.rank, self.kind.word());
        match &self.buffer {
            Some(b) => write!(s, "`{b}[{}..{})`", self.range.0, self.range.1),
            None => write!(s, "window bytes [{}..{})", self.range.0, self.range.1),
        }
        .ok();
        if self.target != self.rank {
            write!(s, " of rank {}", self.target).ok();
        }
        write!(s, " ({}", self.op).ok();
        if let (Some(t), Some(k)) = (self.task, &self.kernel) {
            write!(s, " in task {t} `{k}`").ok();
        } else {
            s.push_str(" from host code");
        }
        s.push(')');
        s
    }
}

/// Two accesses that no synchronization orders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Race {
    /// The window.
    pub window: String,
    /// The first access (in record order).
    pub first: Access,
    /// The second.
    pub second: Access,
    /// What synchronization would order them.
    pub advice: String,
}

impl std::fmt::Display for Race {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} and {}: neither is ordered before the other: {}",
            self.first.describe(),
            self.second.describe(),
            self.advice
        )
    }
}

/// A rank blocked in a wait when a deadline passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// The rank.
    pub rank: usize,
    /// What it waits on, in words.
    pub what: String,
    /// The ranks it waits for (empty when unknown).
    pub on: Vec<usize>,
}

/// What a checked run found.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    /// Unordered conflicting accesses.
    pub races: Vec<Race>,
    /// Window accesses recorded.
    pub accesses: usize,
    /// Ordering edges recorded (acquires and joins).
    pub edges: usize,
    /// Waits satisfied by a signal value already there before the rank's current epoch began
    /// (a single-use signal reused without being reset or raised).
    pub warnings: Vec<String>,
    /// The wait-for graph when a wait passed its deadline (empty otherwise).
    pub blocked: Vec<Blocked>,
    /// A cycle of ranks waiting on each other, when the graph has one.
    pub cycle: Vec<usize>,
}

struct Rec {
    a: Access,
    window: String,
    abs: (usize, usize),
    lo: Clock,
    hi: Clock,
}

#[derive(Default)]
struct State {
    clocks: Vec<Clock>,
    /// Per signal: the join of its notifiers' clocks, its last notifier, and that notifier's
    /// epoch then (joining points it had passed).
    signals: HashMap<(String, usize, usize), (Clock, Option<usize>)>,
    signal_epochs: HashMap<(String, usize, usize), (usize, u64)>,
    /// Per rank: joining points passed, and its clock when it left the last one.
    epochs: HashMap<usize, (u64, Clock)>,
    warnings: Vec<String>,
    joins: HashMap<(String, u64), Slots>,
    seqs: HashMap<(String, usize), u64>,
    windows: HashMap<String, Vec<BufferRef>>,
    buffers: HashMap<u64, (String, usize)>,
    recs: Vec<Rec>,
    edges: usize,
    waiting: HashMap<usize, (String, Vec<usize>)>,
    /// Ranks in a joining point: its key, sequence number and members' world ranks.
    joining: HashMap<usize, (String, u64, Vec<usize>)>,
    blocked: Option<Vec<Blocked>>,
}

/// The process's checker (see the module docs).
pub struct Checker {
    n: usize,
    state: Mutex<State>,
    /// Seeded perturbations (`pto check --schedules`): a pseudo-random pause before puts,
    /// notifies and kernels, from this seed and a per-rank counter.
    perturb: Option<(u64, Vec<std::sync::atomic::AtomicU64>)>,
}

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker").field("ranks", &self.n).finish()
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static ACTIVE: RwLock<Option<Arc<Checker>>> = RwLock::new(None);

thread_local! {
    /// The task this thread runs (its id, kernel and world rank), set around kernels.
    static TASK: RefCell<Option<(u64, String, usize)>> = const { RefCell::new(None) };
    /// Inside a collective: its internal accesses are the runtime's, not recorded.
    static QUIET: RefCell<u32> = const { RefCell::new(0) };
}

/// The installed checker, unless inside a collective.
pub(crate) fn active() -> Option<Arc<Checker>> {
    if !ON.load(Ordering::Relaxed) || QUIET.with(|q| *q.borrow() > 0) {
        return None;
    }
    ACTIVE.read().clone()
}

struct Observer(Arc<Checker>);

impl KernelObserver for Observer {
    fn kernel_start(&self, ctx: &KernelCtx<'_>) {
        let Some(c) = ctx.ext::<CommContext>() else {
            return;
        };
        let rank = c.comm().world_rank();
        TASK.with(|t| {
            *t.borrow_mut() = Some((ctx.task().get(), ctx.kernel_name().to_string(), rank));
        });
        self.0.pause(rank);
        let lo = self.0.clock(rank);
        START.with(|s| *s.borrow_mut() = Some(lo));
    }

    fn kernel_end(&self, ctx: &KernelCtx<'_>, _ok: bool) {
        let task = TASK.with(|t| t.borrow_mut().take());
        let lo = START.with(|s| s.borrow_mut().take());
        let (Some((id, kernel, rank)), Some(lo)) = (task, lo) else {
            return;
        };
        // Window tensors among the arguments: accessed somewhere between the kernel's start
        // and its end.
        let mut args = Vec::new();
        for i in 0..ctx.num_tensors() {
            let (Ok(t), Ok(mode)) = (ctx.tensor(i), ctx.mode(i)) else {
                continue;
            };
            let r = t.region();
            let size = r.dtype().size();
            let start = r.offset() * size;
            let end = (r.offset() + r.extent()) * size;
            let kind = if mode.writable() {
                AccessKind::Write
            } else {
                AccessKind::Read
            };
            args.push((t.buffer().id(), start, end, kind));
        }
        if args.is_empty() {
            return;
        }
        let mut st = self.0.state.lock();
        let hi = st.clocks[rank].clone();
        for (buf, start, end, kind) in args {
            let Some((window, target)) = st.buffers.get(&buf).cloned() else {
                continue;
            };
            let a = Access {
                rank,
                op: "kernel argument",
                kind,
                task: Some(id),
                kernel: Some(kernel.clone()),
                target,
                buffer: None,
                range: (start, end),
            };
            push(&mut st, a, &window, lo.clone(), hi.clone());
        }
    }
}

thread_local! {
    static START: RefCell<Option<Clock>> = const { RefCell::new(None) };
}

fn push(st: &mut State, mut a: Access, window: &str, lo: Clock, hi: Clock) {
    let abs = a.range;
    if let Some(b) = st.windows.get(window).and_then(|bs| {
        bs.iter()
            .find(|b| abs.0 >= b.offset && abs.0 < b.offset + b.bytes.max(1))
    }) {
        a.buffer = Some(b.name.clone());
        a.range = (abs.0 - b.offset, abs.1 - b.offset);
    }
    st.recs.push(Rec {
        a,
        window: window.to_string(),
        abs,
        lo,
        hi,
    });
}

fn join_into(dst: &mut Clock, src: &Clock) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = (*d).max(*s);
    }
}

impl Checker {
    /// Installs a checker for a job of `ranks` ranks in this process (replacing any other),
    /// and its observer of kernels.
    pub fn install(ranks: usize) -> Arc<Checker> {
        Checker::install_perturbed(ranks, None)
    }

    /// [`Checker::install`], and with `seed` a perturbed schedule: before each put, notify and
    /// kernel, a rank pauses for a pseudo-random 0-200 µs (or not at all), drawn from `seed`,
    /// the rank and how many such points it passed, so that other interleavings show.
    pub fn install_perturbed(ranks: usize, seed: Option<u64>) -> Arc<Checker> {
        let c = Arc::new(Checker {
            perturb: seed.map(|s| (s, (0..ranks).map(|_| Default::default()).collect())),
            n: ranks,
            state: Mutex::new(State {
                clocks: (0..ranks)
                    .map(|r| {
                        let mut v = vec![0; ranks];
                        v[r] = 1;
                        v
                    })
                    .collect(),
                ..State::default()
            }),
        });
        *ACTIVE.write() = Some(c.clone());
        pto_core::observe::set_observer(Some(Arc::new(Observer(c.clone()))));
        ON.store(true, Ordering::Release);
        c
    }

    /// Removes the installed checker (its report stays readable).
    pub fn uninstall() {
        ON.store(false, Ordering::Release);
        pto_core::observe::set_observer(None);
        *ACTIVE.write() = None;
    }

    fn ok(&self, rank: usize) -> bool {
        rank < self.n
    }

    /// A perturbation point of `rank` (see [`Checker::install_perturbed`]).
    pub(crate) fn pause(&self, rank: usize) {
        let Some((seed, counters)) = &self.perturb else {
            return;
        };
        let Some(c) = counters.get(rank) else {
            return;
        };
        let i = c.fetch_add(1, Ordering::Relaxed);
        // splitmix64 of (seed, rank, i).
        let mut z = seed
            .wrapping_add((rank as u64) << 40)
            .wrapping_add(i)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        match z % 4 {
            0 => {}
            1 => std::thread::yield_now(),
            _ => std::thread::sleep(std::time::Duration::from_micros((z >> 8) % 200)),
        }
    }

    fn clock(&self, rank: usize) -> Clock {
        let st = self.state.lock();
        st.clocks.get(rank).cloned().unwrap_or_default()
    }

    /// A window's buffers, to name accesses.
    pub(crate) fn window(&self, name: &str, buffers: &[BufferRef]) {
        self.state
            .lock()
            .windows
            .insert(name.to_string(), buffers.to_vec());
    }

    /// A buffer id that is `rank`'s part of window `name` (tensors over it are window memory).
    pub(crate) fn buffer(&self, id: u64, name: &str, rank: usize) {
        self.state
            .lock()
            .buffers
            .insert(id, (name.to_string(), rank));
    }

    /// An access by `rank` to `target`'s part of window `window`, bytes `[off, off + len)`
    /// (`span` is `(off, len)`).
    pub(crate) fn access(
        &self,
        rank: usize,
        window: &str,
        target: usize,
        span: (usize, usize),
        kind: AccessKind,
        op: &'static str,
    ) {
        let (off, len) = span;
        if !self.ok(rank) || len == 0 {
            return;
        }
        if kind != AccessKind::Read {
            self.pause(rank);
        }
        let (task, kernel) = TASK.with(|t| match &*t.borrow() {
            Some((id, k, r)) if *r == rank => (Some(*id), Some(k.clone())),
            _ => (None, None),
        });
        let mut st = self.state.lock();
        let now = st.clocks[rank].clone();
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
        push(&mut st, a, window, now.clone(), now);
    }

    /// A release on the signal at `(target, off)` of `window` by `rank` (a notify): its clock
    /// joins the signal's, then its own epoch advances.
    pub(crate) fn release(&self, rank: usize, window: &str, target: usize, off: usize) {
        if !self.ok(rank) {
            return;
        }
        let mut st = self.state.lock();
        let mine = st.clocks[rank].clone();
        let e = st
            .signals
            .entry((window.to_string(), target, off))
            .or_insert_with(|| (vec![0; self.n], None));
        join_into(&mut e.0, &mine);
        e.1 = Some(rank);
        let epoch = st.epochs.get(&rank).map_or(0, |e| e.0);
        st.signal_epochs
            .insert((window.to_string(), target, off), (rank, epoch));
        st.clocks[rank][rank] += 1;
    }

    /// A wait by `rank` on its signal at `off` of `window` (named `what`) was satisfied: it
    /// acquires; a value whose every notify came before the rank's current epoch began is
    /// reported as a stale signal.
    pub(crate) fn acquire_wait(&self, rank: usize, window: &str, off: usize, what: &str) {
        if !self.ok(rank) {
            return;
        }
        let key = (window.to_string(), rank, off);
        {
            let mut st = self.state.lock();
            if let (Some((c, _)), Some((epoch, at))) = (st.signals.get(&key), st.epochs.get(&rank))
            {
                if *epoch > 0 && c.iter().zip(at).all(|(x, y)| x <= y) {
                    let (by, then) = st.signal_epochs.get(&key).copied().unwrap_or((rank, 0));
                    let w = format!(
                        "rank {rank}'s wait on {what} in its epoch {epoch} was satisfied by a value from epoch {then} (last notified by rank {by}, before the barrier or collective that began epoch {epoch}): a signal reused without being reset or raised"
                    );
                    if !st.warnings.contains(&w) {
                        st.warnings.push(w);
                    }
                }
            }
        }
        self.acquire(rank, window, rank, off);
    }

    /// An acquire by `rank` of the signal at `(target, off)` of `window` (a wait, test, load
    /// or condition that saw its value).
    pub(crate) fn acquire(&self, rank: usize, window: &str, target: usize, off: usize) {
        if !self.ok(rank) {
            return;
        }
        let mut st = self.state.lock();
        if let Some((c, _)) = st.signals.get(&(window.to_string(), target, off)).cloned() {
            join_into(&mut st.clocks[rank], &c);
            st.edges += 1;
        }
    }

    /// `rank` enters a joining point (a barrier or a collective) of the `members` of the
    /// communicator `key`: everything before it happens before every member's leaving.
    /// Returns the point's sequence number for [`Checker::leave`].
    pub(crate) fn enter(&self, rank: usize, key: &str, members: &[usize], idx: usize) -> u64 {
        if !self.ok(rank) {
            return 0;
        }
        let mut st = self.state.lock();
        let seq = {
            let s = st.seqs.entry((key.to_string(), rank)).or_insert(0);
            *s += 1;
            *s
        };
        let mine = st.clocks[rank].clone();
        let e = st
            .joins
            .entry((key.to_string(), seq))
            .or_insert_with(|| (vec![None; members.len()], 0));
        if let Some(slot) = e.0.get_mut(idx) {
            *slot = Some(mine);
        }
        st.clocks[rank][rank] += 1;
        st.joining
            .insert(rank, (key.to_string(), seq, members.to_vec()));
        seq
    }

    /// `rank` leaves joining point `seq` of `key`: it knows what every member that entered did.
    pub(crate) fn leave(&self, rank: usize, key: &str, seq: u64) {
        if !self.ok(rank) {
            return;
        }
        let mut st = self.state.lock();
        st.joining.remove(&rank);
        let k = (key.to_string(), seq);
        let Some((slots, left)) = st.joins.get(&k).cloned() else {
            return;
        };
        let mut mine = st.clocks[rank].clone();
        for c in slots.iter().flatten() {
            join_into(&mut mine, c);
        }
        st.clocks[rank] = mine.clone();
        st.edges += 1;
        let n = st.epochs.get(&rank).map_or(0, |e| e.0) + 1;
        st.epochs.insert(rank, (n, mine));
        // What this rank does from now on is after the epoch began.
        st.clocks[rank][rank] += 1;
        if left + 1 >= slots.len() {
            st.joins.remove(&k);
        } else if let Some(e) = st.joins.get_mut(&k) {
            e.1 += 1;
        }
    }

    /// `rank` starts waiting on the signal at `off` of `window` for `wanted`.
    pub(crate) fn wait_begin(&self, rank: usize, window: &str, off: usize, what: String) {
        if !self.ok(rank) {
            return;
        }
        let mut st = self.state.lock();
        let last = st
            .signals
            .get(&(window.to_string(), rank, off))
            .and_then(|s| s.1);
        let on: Vec<usize> = last.into_iter().collect();
        st.waiting.insert(rank, (what, on));
    }

    /// `rank` stopped waiting; `stalled` when its deadline passed or a peer left or died (the
    /// wait-for graph is taken then, once).
    pub(crate) fn wait_end(&self, rank: usize, stalled: bool) {
        if !self.ok(rank) {
            return;
        }
        if stalled {
            self.snapshot();
        }
        self.state.lock().waiting.remove(&rank);
    }

    /// Takes the wait-for graph (the first time a deadline passes): every rank in a signal
    /// wait, what it waits on and who last notified it; every rank in a barrier or
    /// collective, and the members that have not arrived.
    pub(crate) fn snapshot(&self) {
        let mut st = self.state.lock();
        if st.blocked.is_some() {
            return;
        }
        let mut b: Vec<Blocked> = st
            .waiting
            .iter()
            .map(|(r, (what, on))| Blocked {
                rank: *r,
                what: what.clone(),
                on: on.clone(),
            })
            .collect();
        for (r, (key, seq, members)) in &st.joining {
            let missing: Vec<usize> = st
                .joins
                .get(&(key.clone(), *seq))
                .map(|(slots, _)| {
                    slots
                        .iter()
                        .zip(members)
                        .filter(|(s, _)| s.is_none())
                        .map(|(_, m)| *m)
                        .collect()
                })
                .unwrap_or_default();
            let names: Vec<String> = missing.iter().map(|m| format!("rank {m}")).collect();
            b.push(Blocked {
                rank: *r,
                what: format!("the {key} (not arrived: {})", names.join(", ")),
                on: missing,
            });
        }
        b.sort_by_key(|x| x.rank);
        st.blocked = Some(b);
    }

    /// What the run found so far.
    pub fn report(&self) -> CheckReport {
        let st = self.state.lock();
        let mut races = Vec::new();
        let mut by: HashMap<(&str, usize), Vec<&Rec>> = HashMap::new();
        for r in &st.recs {
            by.entry((r.window.as_str(), r.a.target))
                .or_default()
                .push(r);
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
        let blocked = st.blocked.clone().unwrap_or_default();
        let cycle = cycle(&blocked);
        CheckReport {
            races,
            warnings: st.warnings.clone(),
            accesses: st.recs.len(),
            edges: st.edges,
            blocked,
            cycle,
        }
    }
}

/// A failure that means the job stalled: a deadline, or a member that left or died.
pub(crate) fn stalled(e: &crate::error::CommError) -> bool {
    use crate::error::CommError as E;
    matches!(
        e,
        E::Timeout { .. } | E::PeerGone { .. } | E::PeerDied { .. }
    )
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
    let before = |a: &Rec, b: &Rec| a.lo[a.a.rank] <= b.hi[a.a.rank];
    !before(x, y) && !before(y, x)
}

fn advice(x: &Access, y: &Access) -> String {
    let (w, other) = if x.kind != AccessKind::Read {
        (x, y)
    } else {
        (y, x)
    };
    if w.rank != w.target && other.rank == w.target {
        format!(
            "rank {} does not wait on a signal that rank {} notified after its {} (notify -> wait), and no barrier or collective separates them",
            other.rank, w.rank, w.op
        )
    } else {
        format!(
            "order them with a notify -> wait on a signal between ranks {} and {}, a barrier or a collective",
            x.rank, y.rank
        )
    }
}

fn cycle(blocked: &[Blocked]) -> Vec<usize> {
    let on: HashMap<usize, &Vec<usize>> = blocked.iter().map(|b| (b.rank, &b.on)).collect();
    for b in blocked {
        let mut path = vec![b.rank];
        let mut cur = b.rank;
        while let Some(next) = on.get(&cur).and_then(|v| v.first()).copied() {
            if next == b.rank {
                return path;
            }
            if path.contains(&next) {
                break;
            }
            path.push(next);
            cur = next;
        }
    }
    Vec::new()
}

/// A joining point of a communicator's members (a barrier or a collective), for the checker:
/// entered when made, left when dropped. Inside a collective (`quiet`) the runtime's own
/// accesses are not recorded.
pub(crate) struct Join(Option<(Arc<Checker>, usize, String, u64, bool)>);

impl Join {
    /// A barrier (of a window or a communicator) named by `name`.
    pub(crate) fn enter(comm: &crate::comm::Comm, name: &str, what: &str) -> Join {
        Join::make(comm, name, what, false)
    }

    /// A collective of `comm`: one joining point, its internals not recorded.
    pub(crate) fn collective(comm: &crate::comm::Comm, what: &str) -> Join {
        Join::make(comm, &comm.inner.key, what, true)
    }

    fn make(comm: &crate::comm::Comm, name: &str, what: &str, quiet: bool) -> Join {
        let Some(c) = active() else {
            return Join(None);
        };
        let rank = comm.world_rank();
        let key = format!("{what} of {name}");
        let members: Vec<usize> = (0..comm.size())
            .map(|i| comm.world_rank_of(i).unwrap_or(i))
            .collect();
        let seq = c.enter(rank, &key, &members, comm.rank());
        if quiet {
            QUIET.with(|q| *q.borrow_mut() += 1);
        }
        Join(Some((c, rank, key, seq, quiet)))
    }
}

impl Join {
    /// The joining point failed with `e`: a deadline, or a member that left or died, takes
    /// the wait-for graph.
    pub(crate) fn failed(&self, e: &crate::error::CommError) {
        if let Some((c, ..)) = &self.0 {
            if stalled(e) {
                c.snapshot();
            }
        }
    }
}

impl Drop for Join {
    fn drop(&mut self) {
        if let Some((c, rank, key, seq, quiet)) = self.0.take() {
            if quiet {
                QUIET.with(|q| *q.borrow_mut() -= 1);
            }
            c.leave(rank, &key, seq);
        }
    }
}

/// A report's text: every race, then the wait-for graph.
pub fn render(r: &CheckReport) -> String {
    let mut s = String::new();
    for (i, race) in r.races.iter().enumerate() {
        writeln!(s, "race {}: {race}", i + 1).ok();
    }
    for w in &r.warnings {
        writeln!(s, "warning: {w}").ok();
    }
    if !r.blocked.is_empty() {
        s.push_str("wait-for graph when a deadline passed:\n");
        for b in &r.blocked {
            write!(s, "  rank {} waits on {}", b.rank, b.what).ok();
            if !b.on.is_empty() {
                write!(s, " (last notified by rank {})", b.on[0]).ok();
            }
            s.push('\n');
        }
        if !r.cycle.is_empty() {
            let names: Vec<String> = r.cycle.iter().map(|x| format!("rank {x}")).collect();
            writeln!(s, "  deadlock: {} wait on each other", names.join(" -> ")).ok();
        }
    }
    s
}
