//! The happens-before checker behind `pto check`: a vector clock per rank, advanced by every
//! ordering edge the protocols make (a notify releases, the wait, test or deferred condition
//! that sees it acquires; barriers and collectives join every member), and a record of every
//! window access with its byte range (put, get, atomics, notify, the window tensors kernels
//! take as arguments, and the raw pointers kernels take into their rank's buffers, each a write
//! of the whole buffer by the task). Two accesses to overlapping bytes of one rank's window, at
//! least one a write and not both atomic, that neither clock orders, are a race. See
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
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use pto_core::observe::KernelObserver;
use pto_core::KernelCtx;

use crate::context::CommContext;
use crate::window::spec::BufferRef;

pub(crate) mod join;
mod log;
mod replay;
mod report;

use log::{Ev, Sink};
use report::cycle;
pub use report::{render, Access, AccessKind, Blocked, BlockedIn, CheckReport, Race};

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
    /// The raw pointers into window memory the running kernel took (see [`Checker::raw`]).
    static RAW: RefCell<Vec<Raw>> = const { RefCell::new(Vec::new()) };
}

/// A raw pointer (or view) a kernel took into its rank's part of a window: window, target
/// rank, byte span, the token stamped when it was taken, and the operation's name.
struct Raw {
    window: String,
    target: usize,
    span: (usize, usize),
    token: u64,
    op: &'static str,
}

fn token() -> u64 {
    (u64::from(std::process::id()) << 32) | TOKENS.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff
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
        let token = token();
        RAW.with(|r| r.borrow_mut().clear());
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
        for raw in RAW.with(|r| std::mem::take(&mut *r.borrow_mut())) {
            let kernel = kernel.clone();
            self.0.sink.push(|ts| Ev::Span {
                ts,
                rank,
                token: raw.token,
                window: raw.window,
                target: raw.target,
                off: raw.span.0,
                len: raw.span.1,
                kind: AccessKind::Write,
                op: raw.op.to_string(),
                task,
                kernel,
            });
        }
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

    /// `rank` took a raw pointer (or view) to bytes `span` (`(off, len)`) of its own part of
    /// window `window`: whatever it does through it is unknown, so it is taken as a write of
    /// the whole span. In a kernel, the write is placed anywhere between now and the kernel's
    /// end (recorded then, like a tensor argument); outside one, now.
    pub(crate) fn raw(&self, rank: usize, window: &str, span: (usize, usize), op: &'static str) {
        if !self.ok(rank) || span.1 == 0 {
            return;
        }
        let in_task = TASK.with(|t| matches!(&*t.borrow(), Some((_, _, r, _)) if *r == rank));
        if !in_task {
            self.access(rank, window, rank, span, AccessKind::Write, op);
            return;
        }
        RAW.with(|r| {
            let mut r = r.borrow_mut();
            // The first time a kernel takes a span is its earliest possible access.
            if r.iter().any(|x| x.window == window && x.span == span) {
                return;
            }
            let token = token();
            self.sink.push(|ts| Ev::Start { ts, rank, token });
            r.push(Raw {
                window: window.to_string(),
                target: rank,
                span,
                token,
                op,
            });
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
                kind: BlockedIn::Signal,
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
            b.push(Blocked {
                rank: *r,
                what: format!("the {key}"),
                kind: BlockedIn::Join,
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
