//! What a checked run reports: the accesses, races, warnings and the wait-for graph, and
//! their text.

use std::collections::HashMap;
use std::fmt::Write as _;

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

/// What a blocked rank waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockedIn {
    /// A wait on a signal: [`Blocked::on`] is its last notifier (empty when nobody notified
    /// it yet).
    Signal,
    /// A barrier or a collective: [`Blocked::on`] is the members that have not arrived.
    Join,
}

/// A rank blocked in a wait when a deadline passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// The rank.
    pub rank: usize,
    /// What it waits on, in words.
    pub what: String,
    /// A signal wait or a joining point; says what [`Blocked::on`] holds.
    pub kind: BlockedIn,
    /// The ranks it waits for: for a signal wait, the rank that last notified the signal (at
    /// most one; empty when nobody did); for a barrier or collective, the members that have
    /// not arrived.
    pub on: Vec<usize>,
}

impl Blocked {
    /// The edge's words: `last notified by rank 1`, `waiting for rank 2, 3 to arrive`.
    fn edge(&self) -> Option<String> {
        let names = || {
            let v: Vec<String> = self.on.iter().map(usize::to_string).collect();
            v.join(", ")
        };
        match (self.kind, self.on.is_empty()) {
            (BlockedIn::Signal, true) => Some("nobody notified it yet".into()),
            (BlockedIn::Signal, false) => Some(format!("last notified by rank {}", names())),
            (BlockedIn::Join, true) => None,
            (BlockedIn::Join, false) => Some(format!("waiting for rank {} to arrive", names())),
        }
    }
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

pub(super) fn cycle(blocked: &[Blocked]) -> Vec<usize> {
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
        s.push_str("wait-for graph when a wait stalled (a deadline passed or a peer left):\n");
        for b in &r.blocked {
            write!(s, "  rank {} waits on {}", b.rank, b.what).ok();
            if let Some(edge) = b.edge() {
                write!(s, " ({edge})").ok();
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
