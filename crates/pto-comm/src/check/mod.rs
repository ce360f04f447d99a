//! The happens-before checker behind `pto check`: a vector clock per rank, advanced by every
//! ordering edge the protocols make (a notify releases, the wait, test or deferred condition
//! that sees it acquires; barriers and collectives join every member), and a record of every
//! window access with its byte range (put, get, atomics, notify, and the window tensors kernels
//! take as arguments). Two accesses to overlapping bytes of one rank's window, at least one a
//! write and not both atomic, that neither clock orders, are a race. See
//! `docs/design/check.md`.
//!
//! Events are recorded as they happen, with a monotonic timestamp (one clock for every process
//! of the host), and replayed in timestamp order when the report is made (`replay`): in memory
//! when the ranks are threads ([`Checker::install`]), or in a file per process when they are
//! processes forked after the checker was installed ([`Checker::install_files`]). Accesses of
//! one rank are taken as ordered among themselves (the chip's borrow table already refuses
//! conflicting tensor accesses of unordered tasks).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use pto_core::observe::KernelObserver;
use pto_core::KernelCtx;

use crate::context::CommContext;
use crate::window::BufferRef;

mod log;
mod replay;

use log::{Ev, Sink};

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
    pub op: String,
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

/// What the checker follows live (ranks that are threads of this process): joining points'
/// sequence numbers, and who waits on what, for the wait-for graph.
#[derive(Default)]
struct Live {
    seqs: HashMap<(String, usize), u64>,
    entered: HashMap<(String, u64), Vec<bool>>,
    last_notifier: HashMap<String, usize>,
    waiting: HashMap<usize, (String, Vec<usize>)>,
    joining: HashMap<usize, (String, u64, Vec<usize>)>,
    blocked: Option<Vec<Blocked>>,
}

/// The process's checker (see the module docs).
pub struct Checker {
    n: usize,
    sink: Sink,
    live: Mutex<Live>,
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
    /// The task this thread runs (its id, kernel, world rank and start token), set around
    /// kernels.
    static TASK: RefCell<Option<(u64, String, usize, u64)>> = const { RefCell::new(None) };
    /// Inside a collective: its internal accesses are the runtime's, not recorded.
    static QUIET: RefCell<u32> = const { RefCell::new(0) };
}

static TOKENS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The installed checker, unless inside a collective.
pub(crate) fn active() -> Option<Arc<Checker>> {
    if !ON.load(Ordering::Relaxed) || QUIET.with(|q| *q.borrow() > 0) {
        return None;
    }
    ACTIVE.read().clone()
}

/// The key of the word at `(target, off)` of window `window`.
fn word(window: &str, target: usize, off: usize) -> String {
    format!("{window} {target} {off}")
}

struct Observer(Arc<Checker>);

impl KernelObserver for Observer {
    fn kernel_start(&self, ctx: &KernelCtx<'_>) {
        let Some(c) = ctx.ext::<CommContext>() else {
            return;
        };
        let rank = c.comm().world_rank();
        self.0.pause(rank);
        let token = (u64::from(std::process::id()) << 32)
            | TOKENS.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff;
        TASK.with(|t| {
            *t.borrow_mut() = Some((ctx.task().get(), ctx.kernel_name().to_string(), rank, token));
        });
        self.0.sink.push(|ts| Ev::Start { ts, rank, token });
    }

    fn kernel_end(&self, ctx: &KernelCtx<'_>, _ok: bool) {
        let Some((task, kernel, rank, token)) = TASK.with(|t| t.borrow_mut().take()) else {
            return;
        };
        // A perturbation point before the task completes (and releases its consumers).
        self.0.pause(rank);
        let pid = std::process::id();
        for i in 0..ctx.num_tensors() {
            let (Ok(t), Ok(mode)) = (ctx.tensor(i), ctx.mode(i)) else {
                continue;
            };
            let r = t.region();
            let size = r.dtype().size();
            let off = r.offset() * size;
            let len = r.extent() * size;
            let kind = if mode.writable() {
                AccessKind::Write
            } else {
                AccessKind::Read
            };
            let buffer = t.buffer().id();
            let kernel = kernel.clone();
            // Arguments that are not window memory are dropped by the replay.
            self.0.sink.push(|ts| Ev::Arg {
                ts,
                rank,
                token,
                pid,
                buffer,
                off,
                len,
                kind,
                task,
                kernel,
            });
        }
    }
}

impl Checker {
    /// Installs a checker for a job of `ranks` ranks that are threads of this process
    /// (replacing any other), and its observer of kernels.
    pub fn install(ranks: usize) -> Arc<Checker> {
        Checker::install_perturbed(ranks, None)
    }

    /// [`Checker::install`], and with `seed` a perturbed schedule: before each put, notify,
    /// kernel start and kernel completion, a rank pauses for a pseudo-random 0-200 µs (or not at all), drawn from `seed`,
    /// the rank and how many such points it passed, so that other interleavings show.
    pub fn install_perturbed(ranks: usize, seed: Option<u64>) -> Arc<Checker> {
        Checker::install_with(ranks, seed, Sink::Memory(Mutex::new(Vec::new())))
    }

    /// Installs a checker for a job whose ranks are processes forked from this one after this
    /// call (the Worker's chips): every process appends its events to its own file in `dir`,
    /// and [`Checker::report`] reads them all.
    pub fn install_files(ranks: usize, seed: Option<u64>, dir: PathBuf) -> Arc<Checker> {
        Checker::install_with(
            ranks,
            seed,
            Sink::Files {
                dir,
                file: Mutex::new(None),
            },
        )
    }

    fn install_with(ranks: usize, seed: Option<u64>, sink: Sink) -> Arc<Checker> {
        let c = Arc::new(Checker {
            perturb: seed.map(|s| (s, (0..ranks).map(|_| Default::default()).collect())),
            n: ranks,
            sink,
            live: Mutex::new(Live::default()),
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

    /// A window's buffers, to name accesses.
    pub(crate) fn window(&self, name: &str, buffers: &[BufferRef]) {
        let buffers = buffers
            .iter()
            .map(|b| (b.name.clone(), b.offset, b.bytes))
            .collect();
        let name = name.to_string();
        self.sink.push(|_| Ev::Window { name, buffers });
    }

    /// A buffer id that is `rank`'s part of window `name` (tensors over it are window memory).
    pub(crate) fn buffer(&self, id: u64, name: &str, rank: usize) {
        let window = name.to_string();
        let pid = std::process::id();
        self.sink.push(|_| Ev::Buffer {
            pid,
            id,
            window,
            rank,
        });
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
            Some((id, k, r, _)) if *r == rank => (Some(*id), Some(k.clone())),
            _ => (None, None),
        });
        let window = window.to_string();
        self.sink.push(|ts| Ev::Access {
            ts,
            rank,
            window,
            target,
            off,
            len,
            kind,
            op: op.to_string(),
            task,
            kernel,
        });
    }

    /// A release on the word at `(target, off)` of `window` by `rank` (a notify, an atomic
    /// add).
    pub(crate) fn release(&self, rank: usize, window: &str, target: usize, off: usize) {
        if !self.ok(rank) {
            return;
        }
        let key = word(window, target, off);
        self.live.lock().last_notifier.insert(key.clone(), rank);
        self.sink.push(|ts| Ev::Release { ts, rank, key });
    }

    /// A wait by `rank` on its signal at `off` of `window` (named `what`) was satisfied.
    pub(crate) fn acquire_wait(&self, rank: usize, window: &str, off: usize, what: &str) {
        if !self.ok(rank) {
            return;
        }
        let key = word(window, rank, off);
        let what = what.to_string();
        self.sink.push(|ts| Ev::Wait {
            ts,
            rank,
            key,
            what,
        });
    }

    /// An acquire by `rank` of the word at `(target, off)` of `window` (a load or atomic add
    /// that saw its value).
    pub(crate) fn acquire(&self, rank: usize, window: &str, target: usize, off: usize) {
        if !self.ok(rank) {
            return;
        }
        let key = word(window, target, off);
        self.sink.push(|ts| Ev::Acquire { ts, rank, key });
    }

    /// `rank` enters a joining point (a barrier or a collective) of the `members` (world
    /// ranks) of the communicator `key`, as member `idx`. Returns its sequence number.
    pub(crate) fn enter(&self, rank: usize, key: &str, members: &[usize], idx: usize) -> u64 {
        if !self.ok(rank) {
            return 0;
        }
        let seq = {
            let mut live = self.live.lock();
            let s = live.seqs.entry((key.to_string(), rank)).or_insert(0);
            *s += 1;
            let seq = *s;
            let e = live
                .entered
                .entry((key.to_string(), seq))
                .or_insert_with(|| vec![false; members.len()]);
            if let Some(x) = e.get_mut(idx) {
                *x = true;
            }
            live.joining
                .insert(rank, (key.to_string(), seq, members.to_vec()));
            seq
        };
        let (key, members) = (key.to_string(), members.len());
        self.sink.push(|ts| Ev::Enter {
            ts,
            rank,
            key,
            seq,
            idx,
            members,
        });
        seq
    }

    /// `rank` leaves joining point `seq` of `key`.
    pub(crate) fn leave(&self, rank: usize, key: &str, seq: u64) {
        if !self.ok(rank) {
            return;
        }
        self.live.lock().joining.remove(&rank);
        let key = key.to_string();
        self.sink.push(|ts| Ev::Leave { ts, rank, key, seq });
    }

    /// `rank` starts waiting on the signal at `off` of `window` (`what` names it).
    pub(crate) fn wait_begin(&self, rank: usize, window: &str, off: usize, what: String) {
        if !self.ok(rank) {
            return;
        }
        let mut live = self.live.lock();
        let on: Vec<usize> = live
            .last_notifier
            .get(&word(window, rank, off))
            .copied()
            .into_iter()
            .collect();
        live.waiting.insert(rank, (what, on));
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
        self.live.lock().waiting.remove(&rank);
    }

    /// Takes the wait-for graph (the first time a deadline passes) of the ranks this process
    /// sees: every rank in a signal wait, what it waits on and who last notified it; every rank
    /// in a barrier or collective, and the members that have not arrived.
    pub(crate) fn snapshot(&self) {
        let mut live = self.live.lock();
        if live.blocked.is_some() {
            return;
        }
        let mut b: Vec<Blocked> = live
            .waiting
            .iter()
            .map(|(r, (what, on))| Blocked {
                rank: *r,
                what: what.clone(),
                on: on.clone(),
            })
            .collect();
        for (r, (key, seq, members)) in &live.joining {
            let missing: Vec<usize> = live
                .entered
                .get(&(key.clone(), *seq))
                .map(|e| {
                    e.iter()
                        .zip(members)
                        .filter(|(x, _)| !**x)
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
        live.blocked = Some(b);
    }

    /// What the run found so far (for processes: what their files hold).
    pub fn report(&self) -> CheckReport {
        let found = replay::replay(self.n, self.sink.events());
        let blocked = self.live.lock().blocked.clone().unwrap_or_default();
        let cycle = cycle(&blocked);
        CheckReport {
            races: found.races,
            warnings: found.warnings,
            accesses: found.accesses,
            edges: found.edges,
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
