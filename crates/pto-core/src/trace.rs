//! Per-run task traces, written as Chrome trace-event JSON (opens in Perfetto).
//!
//! Tracing is off unless a run asks for it; when off, the scheduler does not read the clock.

use std::io;
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::args::TaskId;
use crate::kernel::{CoreId, CoreKind};

/// Microseconds on the host's monotonic clock (`CLOCK_MONOTONIC`), shared by every process, so
/// the traces of several chips (processes) line up.
pub fn now_us() -> f64 {
    pto_shm::process::monotonic_ns() as f64 / 1e3
}

/// A point inside a kernel's block that a layer above marks (a notify, a wait that returned),
/// drawn as an instant event; marks with the same `key` on different ranks are joined by an
/// arrow from the notify to the wait.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    /// When, on the trace clock.
    pub ts_us: f64,
    /// What (`notify`, `wait`).
    pub name: &'static str,
    /// What it is about (a signal's window, rank and offset).
    pub key: String,
}

thread_local! {
    static MARKS: std::cell::RefCell<Option<Vec<Mark>>> = const { std::cell::RefCell::new(None) };
}

/// Marks a point of the kernel block running on this thread, when its chip is tracing
/// (otherwise nothing happens).
pub fn mark(name: &'static str, key: impl FnOnce() -> String) {
    MARKS.with(|m| {
        if let Some(v) = m.borrow_mut().as_mut() {
            v.push(Mark {
                ts_us: now_us(),
                name,
                key: key(),
            });
        }
    });
}

/// Starts collecting this thread's marks (a traced kernel block begins).
pub(crate) fn begin_marks() {
    MARKS.with(|m| *m.borrow_mut() = Some(Vec::new()));
}

/// Stops collecting and returns what was marked.
pub(crate) fn end_marks() -> Vec<Mark> {
    MARKS.with(|m| m.borrow_mut().take()).unwrap_or_default()
}

/// One block of one task, as it ran.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    /// The task.
    pub task: TaskId,
    /// Its kernel's name.
    pub kernel: Arc<str>,
    /// The core it ran on.
    pub core: CoreId,
    /// The block index.
    pub block: u32,
    /// Start, in microseconds on the trace clock.
    pub start_us: f64,
    /// End, in microseconds on the trace clock.
    pub end_us: f64,
    /// The tasks it depended on.
    pub deps: Vec<TaskId>,
    /// False for a kernel block; true for a deferred task's whole span, from its first block's
    /// start to its real completion (drawn on a separate "deferred" track of its core).
    pub deferred: bool,
    /// Points the block marked (notifies, waits), in order.
    pub marks: Vec<Mark>,
}

/// The events of one run on one chip.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// The chip's number (the trace's process id).
    pub chip: u32,
    /// Events in completion order.
    pub events: Vec<TraceEvent>,
}

// Lane (thread) ids start at 1: Perfetto treats tid 0 (and pid 0) as "unknown".
fn tid(core: CoreId) -> u32 {
    match core.kind {
        CoreKind::Aic | CoreKind::Mix => 1 + core.index,
        CoreKind::Aiv => 1001 + core.index,
    }
}

fn event_tid(e: &TraceEvent) -> u32 {
    tid(e.core) + if e.deferred { 10_000 } else { 0 }
}

/// How a chip's lanes are named in a trace document.
#[derive(Clone, Debug)]
pub struct Lanes {
    /// The trace process id (not 0).
    pub pid: u32,
    /// The process's name (`rank 3 / chip`, `host`).
    pub process: String,
    /// A host-level chip: its lanes are the host's task lanes, not AIC/AIV cores.
    pub host: bool,
}

impl Trace {
    /// The trace-event objects of this chip (metadata, complete events, and a flow arrow from
    /// each task to every consumer that depended on it), named `rank <chip> / chip`.
    pub fn chrome_events(&self) -> Vec<Value> {
        self.chrome_events_as(&Lanes {
            pid: self.chip + 1,
            process: format!("rank {} / chip", self.chip),
            host: false,
        })
    }

    /// [`Trace::chrome_events`] with the lanes named as `lanes` says.
    pub fn chrome_events_as(&self, lanes: &Lanes) -> Vec<Value> {
        let pid = lanes.pid.max(1);
        let mut out = vec![json!({
            "ph": "M", "name": "process_name", "pid": pid,
            "args": { "name": lanes.process }
        })];
        let mut tracks: Vec<(u32, CoreId, bool)> = self
            .events
            .iter()
            .map(|e| (event_tid(e), e.core, e.deferred))
            .collect();
        tracks.sort_by_key(|t| t.0);
        tracks.dedup_by_key(|t| t.0);
        for (t, c, deferred) in tracks {
            let name = match (lanes.host, c.kind) {
                (true, _) => format!("host lane {}", t % 1000),
                (false, CoreKind::Aiv) => format!("AIV{}", c.index),
                (false, _) => format!("AIC{}", c.index),
            };
            let name = if deferred {
                format!("{name} deferred")
            } else {
                name
            };
            out.push(json!({
                "ph": "M", "name": "thread_name", "pid": pid, "tid": t,
                "args": { "name": name }
            }));
        }
        // Where each task ended (its last block, or its deferred span), for the arrows.
        let mut ends: std::collections::HashMap<u64, (f64, u32)> = Default::default();
        for e in &self.events {
            let v = ends.entry(e.task.get()).or_insert((e.end_us, event_tid(e)));
            if e.end_us >= v.0 {
                *v = (e.end_us, event_tid(e));
            }
        }
        let mut flow = (u64::from(pid)) << 32;
        for e in &self.events {
            out.push(json!({
                "ph": "X", "name": &*e.kernel, "cat": if e.deferred { "deferred" } else { "task" },
                "pid": pid, "tid": event_tid(e),
                "ts": e.start_us, "dur": (e.end_us - e.start_us).max(0.0),
                "args": {
                    "task": e.task.get(), "block": e.block, "core": e.core.to_string(),
                    "deps": e.deps.iter().map(|d| d.get()).collect::<Vec<_>>(),
                }
            }));
            for m in &e.marks {
                out.push(json!({
                    "ph": "i", "s": "t", "name": m.name, "cat": "signal",
                    "pid": pid, "tid": event_tid(e), "ts": m.ts_us,
                    "args": { "key": m.key, "task": e.task.get() },
                }));
            }
            if e.block != 0 || e.deferred {
                continue;
            }
            for d in &e.deps {
                let Some(&(end, ptid)) = ends.get(&d.get()) else {
                    continue;
                };
                flow += 1;
                out.push(json!({
                    "ph": "s", "name": "dependency", "cat": "flow", "id": flow,
                    "pid": pid, "tid": ptid, "ts": end.min(e.start_us),
                }));
                out.push(json!({
                    "ph": "f", "bp": "e", "name": "dependency", "cat": "flow", "id": flow,
                    "pid": pid, "tid": event_tid(e), "ts": e.start_us,
                }));
            }
        }
        out
    }

    /// Arrows across ranks: for each `wait` mark among `events` (every chip's trace events of
    /// one run), an arrow from the latest `notify` mark of the same signal before it. Returns
    /// the flow events to add.
    pub fn signal_flows(events: &[Value]) -> Vec<Value> {
        let mut notifies: std::collections::HashMap<&str, Vec<(f64, &Value)>> = Default::default();
        for e in events {
            if e["ph"] == "i" && e["name"] == "notify" {
                if let (Some(k), Some(ts)) = (e["args"]["key"].as_str(), e["ts"].as_f64()) {
                    notifies.entry(k).or_default().push((ts, e));
                }
            }
        }
        let mut out = Vec::new();
        let mut id: u64 = 1 << 62;
        for e in events {
            if e["ph"] != "i" || e["name"] != "wait" {
                continue;
            }
            let (Some(k), Some(ts)) = (e["args"]["key"].as_str(), e["ts"].as_f64()) else {
                continue;
            };
            let Some(n) = notifies.get(k).and_then(|v| {
                v.iter()
                    .filter(|(t, _)| *t <= ts)
                    .max_by(|a, b| a.0.total_cmp(&b.0))
            }) else {
                continue;
            };
            id += 1;
            out.push(json!({
                "ph": "s", "name": "signal", "cat": "flow", "id": id,
                "pid": n.1["pid"], "tid": n.1["tid"], "ts": n.0,
            }));
            out.push(json!({
                "ph": "f", "bp": "e", "name": "signal", "cat": "flow", "id": id,
                "pid": e["pid"], "tid": e["tid"], "ts": ts,
            }));
        }
        out
    }

    /// The whole trace as a Chrome trace-event JSON document.
    pub fn to_chrome_json(&self) -> Value {
        json!({ "traceEvents": self.chrome_events(), "displayTimeUnit": "ns" })
    }

    /// Writes [`Trace::to_chrome_json`] to `path`.
    ///
    /// # Errors
    ///
    /// Any I/O error.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.to_chrome_json().to_string())
    }
}
