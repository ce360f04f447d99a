//! The checker's record: every event in the order it happened (a monotonic timestamp, the one
//! clock all processes of a host share), kept in memory when the ranks are threads, or appended
//! line by line to a file per process (`<dir>/<pid>.log`) when they are processes, and read
//! back for the replay.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::report::AccessKind;

/// One recorded event.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Ev {
    /// A window's named buffers (name, offset, bytes), to name accesses.
    Window {
        name: String,
        buffers: Vec<(String, usize, usize)>,
    },
    /// Buffer `id` of process `pid` is rank `rank`'s part of window `window`.
    Buffer {
        pid: u32,
        id: u64,
        window: String,
        rank: usize,
    },
    /// An operation's access.
    Access {
        ts: u64,
        rank: usize,
        window: String,
        target: usize,
        off: usize,
        len: usize,
        kind: AccessKind,
        op: String,
        task: Option<u64>,
        kernel: Option<String>,
    },
    /// A kernel started (its clock is its arguments' earliest point).
    Start { ts: u64, rank: usize, token: u64 },
    /// A window tensor argument of the kernel started at `token`, recorded as it ended.
    Arg {
        ts: u64,
        rank: usize,
        token: u64,
        pid: u32,
        buffer: u64,
        off: usize,
        len: usize,
        kind: AccessKind,
        task: u64,
        kernel: String,
    },
    /// A raw pointer or view of bytes `[off, off + len)` of `target`'s part of `window` that a
    /// kernel took when `token` was stamped (an [`Ev::Start`]), recorded as the kernel ended:
    /// touched somewhere between the two.
    Span {
        ts: u64,
        rank: usize,
        token: u64,
        window: String,
        target: usize,
        off: usize,
        len: usize,
        kind: AccessKind,
        op: String,
        task: u64,
        kernel: String,
    },
    /// A release on a word (notify, atomic add).
    Release { ts: u64, rank: usize, key: String },
    /// An acquire of a word (load, atomic add).
    Acquire { ts: u64, rank: usize, key: String },
    /// A wait or condition satisfied by a word (`what` names it, for stale-signal reports).
    Wait {
        ts: u64,
        rank: usize,
        key: String,
        what: String,
    },
    /// Entering joining point `seq` of `key` as member `idx` of `members`.
    Enter {
        ts: u64,
        rank: usize,
        key: String,
        seq: u64,
        idx: usize,
        members: usize,
    },
    /// Leaving it.
    Leave {
        ts: u64,
        rank: usize,
        key: String,
        seq: u64,
    },
}

impl Ev {
    pub(crate) fn ts(&self) -> u64 {
        match self {
            Ev::Window { .. } | Ev::Buffer { .. } => 0,
            Ev::Access { ts, .. }
            | Ev::Start { ts, .. }
            | Ev::Arg { ts, .. }
            | Ev::Span { ts, .. }
            | Ev::Release { ts, .. }
            | Ev::Acquire { ts, .. }
            | Ev::Wait { ts, .. }
            | Ev::Enter { ts, .. }
            | Ev::Leave { ts, .. } => *ts,
        }
    }
}

/// Text fields never hold a tab or a line break.
fn clean(s: &str) -> String {
    s.replace(['\t', '\n', '\r'], " ")
}

fn kind_code(k: AccessKind) -> &'static str {
    match k {
        AccessKind::Read => "r",
        AccessKind::Write => "w",
        AccessKind::Atomic => "a",
    }
}

fn kind_of(s: &str) -> Option<AccessKind> {
    Some(match s {
        "r" => AccessKind::Read,
        "w" => AccessKind::Write,
        "a" => AccessKind::Atomic,
        _ => return None,
    })
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map_or_else(|| "-".into(), |x| clean(&x.to_string()))
}

/// One event as a line of tab-separated fields.
pub(crate) fn encode(e: &Ev) -> String {
    match e {
        Ev::Window { name, buffers } => {
            let mut s = format!("W\t{}", clean(name));
            for (b, o, n) in buffers {
                s.push_str(&format!("\t{}\t{o}\t{n}", clean(b)));
            }
            s
        }
        Ev::Buffer {
            pid,
            id,
            window,
            rank,
        } => format!("B\t{pid}\t{id}\t{}\t{rank}", clean(window)),
        Ev::Access {
            ts,
            rank,
            window,
            target,
            off,
            len,
            kind,
            op,
            task,
            kernel,
        } => format!(
            "X\t{ts}\t{rank}\t{}\t{target}\t{off}\t{len}\t{}\t{}\t{}\t{}",
            clean(window),
            kind_code(*kind),
            clean(op),
            opt(task),
            opt(kernel)
        ),
        Ev::Start { ts, rank, token } => format!("S\t{ts}\t{rank}\t{token}"),
        Ev::Arg {
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
        } => format!(
            "A\t{ts}\t{rank}\t{token}\t{pid}\t{buffer}\t{off}\t{len}\t{}\t{task}\t{}",
            kind_code(*kind),
            clean(kernel)
        ),
        Ev::Span {
            ts,
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
        } => format!(
            "P\t{ts}\t{rank}\t{token}\t{}\t{target}\t{off}\t{len}\t{}\t{}\t{task}\t{}",
            clean(window),
            kind_code(*kind),
            clean(op),
            clean(kernel)
        ),
        Ev::Release { ts, rank, key } => format!("R\t{ts}\t{rank}\t{}", clean(key)),
        Ev::Acquire { ts, rank, key } => format!("Q\t{ts}\t{rank}\t{}", clean(key)),
        Ev::Wait {
            ts,
            rank,
            key,
            what,
        } => format!("V\t{ts}\t{rank}\t{}\t{}", clean(key), clean(what)),
        Ev::Enter {
            ts,
            rank,
            key,
            seq,
            idx,
            members,
        } => format!("E\t{ts}\t{rank}\t{}\t{seq}\t{idx}\t{members}", clean(key)),
        Ev::Leave { ts, rank, key, seq } => format!("L\t{ts}\t{rank}\t{}\t{seq}", clean(key)),
    }
}

/// An event from its line (`None` for a line that is not one: a torn last line of a process
/// that died while writing).
pub(crate) fn decode(line: &str) -> Option<Ev> {
    let f: Vec<&str> = line.split('\t').collect();
    let n = |i: usize| -> Option<u64> { f.get(i)?.parse().ok() };
    let u = |i: usize| -> Option<usize> { f.get(i)?.parse().ok() };
    let s = |i: usize| -> Option<String> { f.get(i).map(|x| x.to_string()) };
    let o = |i: usize| -> Option<Option<String>> {
        f.get(i).map(|x| (*x != "-").then(|| x.to_string()))
    };
    Some(match *f.first()? {
        "W" => Ev::Window {
            name: s(1)?,
            buffers: f[2..]
                .chunks(3)
                .filter(|c| c.len() == 3)
                .map(|c| Some((c[0].to_string(), c[1].parse().ok()?, c[2].parse().ok()?)))
                .collect::<Option<_>>()?,
        },
        "B" => Ev::Buffer {
            pid: n(1)? as u32,
            id: n(2)?,
            window: s(3)?,
            rank: u(4)?,
        },
        "X" => Ev::Access {
            ts: n(1)?,
            rank: u(2)?,
            window: s(3)?,
            target: u(4)?,
            off: u(5)?,
            len: u(6)?,
            kind: kind_of(f.get(7)?)?,
            op: s(8)?,
            task: o(9)?.and_then(|t| t.parse().ok()),
            kernel: o(10)?,
        },
        "S" => Ev::Start {
            ts: n(1)?,
            rank: u(2)?,
            token: n(3)?,
        },
        "A" => Ev::Arg {
            ts: n(1)?,
            rank: u(2)?,
            token: n(3)?,
            pid: n(4)? as u32,
            buffer: n(5)?,
            off: u(6)?,
            len: u(7)?,
            kind: kind_of(f.get(8)?)?,
            task: n(9)?,
            kernel: s(10)?,
        },
        "P" => Ev::Span {
            ts: n(1)?,
            rank: u(2)?,
            token: n(3)?,
            window: s(4)?,
            target: u(5)?,
            off: u(6)?,
            len: u(7)?,
            kind: kind_of(f.get(8)?)?,
            op: s(9)?,
            task: n(10)?,
            kernel: s(11)?,
        },
        "R" => Ev::Release {
            ts: n(1)?,
            rank: u(2)?,
            key: s(3)?,
        },
        "Q" => Ev::Acquire {
            ts: n(1)?,
            rank: u(2)?,
            key: s(3)?,
        },
        "V" => Ev::Wait {
            ts: n(1)?,
            rank: u(2)?,
            key: s(3)?,
            what: s(4)?,
        },
        "E" => Ev::Enter {
            ts: n(1)?,
            rank: u(2)?,
            key: s(3)?,
            seq: n(4)?,
            idx: u(5)?,
            members: u(6)?,
        },
        "L" => Ev::Leave {
            ts: n(1)?,
            rank: u(2)?,
            key: s(3)?,
            seq: n(4)?,
        },
        _ => return None,
    })
}

/// Where events go.
pub(crate) enum Sink {
    /// This process's memory (ranks are threads).
    Memory(Mutex<Vec<Ev>>),
    /// A file per process under a folder (ranks are processes, forked after the checker was
    /// installed: each opens its own file at its first event).
    Files {
        dir: PathBuf,
        file: Mutex<Option<(u32, File)>>,
    },
}

impl Sink {
    /// Records `e` (the timestamp is taken under the same lock, so one process's events are in
    /// timestamp order).
    pub(crate) fn push(&self, e: impl FnOnce(u64) -> Ev) {
        match self {
            Sink::Memory(m) => {
                let mut v = m.lock();
                let ts = pto_shm::process::monotonic_ns();
                v.push(e(ts));
            }
            Sink::Files { dir, file } => {
                let mut f = file.lock();
                let pid = std::process::id();
                if f.as_ref().is_none_or(|(p, _)| *p != pid) {
                    *f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(dir.join(format!("{pid}.log")))
                        .ok()
                        .map(|file| (pid, file));
                }
                let ts = pto_shm::process::monotonic_ns();
                if let Some((_, file)) = f.as_mut() {
                    // One write per line: a process that dies leaves whole lines.
                    let _ = file.write_all(format!("{}\n", encode(&e(ts))).as_bytes());
                }
            }
        }
    }

    /// Every event recorded (from every process's file).
    pub(crate) fn events(&self) -> Vec<Ev> {
        match self {
            Sink::Memory(m) => m.lock().clone(),
            Sink::Files { dir, .. } => read_dir(dir),
        }
    }
}

fn read_dir(dir: &Path) -> Vec<Ev> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        if let Ok(text) = std::fs::read_to_string(e.path()) {
            out.extend(text.lines().filter_map(decode));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_their_lines() {
        let evs = vec![
            Ev::Window {
                name: "w.1".into(),
                buffers: vec![("inbox".into(), 0, 64), ("flag".into(), 64, 16)],
            },
            Ev::Buffer {
                pid: 7,
                id: 3,
                window: "w.1".into(),
                rank: 1,
            },
            Ev::Access {
                ts: 5,
                rank: 0,
                window: "w.1".into(),
                target: 1,
                off: 0,
                len: 8,
                kind: AccessKind::Write,
                op: "put".into(),
                task: Some(4),
                kernel: Some("k\\tx".into()),
            },
            Ev::Start {
                ts: 6,
                rank: 1,
                token: 9,
            },
            Ev::Arg {
                ts: 7,
                rank: 1,
                token: 9,
                pid: 7,
                buffer: 3,
                off: 0,
                len: 64,
                kind: AccessKind::Read,
                task: 2,
                kernel: "consume".into(),
            },
            Ev::Span {
                ts: 8,
                rank: 1,
                token: 10,
                window: "w.1".into(),
                target: 1,
                off: 0,
                len: 64,
                kind: AccessKind::Write,
                op: "window pointer".into(),
                task: 3,
                kernel: "look".into(),
            },
            Ev::Release {
                ts: 8,
                rank: 0,
                key: "w.1 1 64".into(),
            },
            Ev::Enter {
                ts: 9,
                rank: 0,
                key: "barrier of w.1".into(),
                seq: 2,
                idx: 0,
                members: 2,
            },
        ];
        for e in evs {
            assert_eq!(decode(&encode(&e)), Some(e.clone()), "{}", encode(&e));
        }
        assert_eq!(decode("X\t1\t2"), None);
        assert_eq!(decode("garbage"), None);
    }
}
