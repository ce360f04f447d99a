//! Per-run task traces, written as Chrome trace-event JSON (opens in Perfetto).
//!
//! Tracing is off unless a run asks for it; when off, the scheduler does not read the clock.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Instant;

use serde_json::{json, Value};

use crate::args::TaskId;
use crate::kernel::{CoreId, CoreKind};

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Microseconds since this process's trace epoch (the first call).
pub fn now_us() -> f64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e6
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
}

/// The events of one run on one chip.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// The chip's number (the trace's process id).
    pub chip: u32,
    /// Events in completion order.
    pub events: Vec<TraceEvent>,
}

fn tid(core: CoreId) -> u32 {
    match core.kind {
        CoreKind::Aic | CoreKind::Mix => core.index,
        CoreKind::Aiv => 1000 + core.index,
    }
}

impl Trace {
    /// The trace-event objects of this chip (metadata and complete events).
    pub fn chrome_events(&self) -> Vec<Value> {
        let mut out = vec![json!({
            "ph": "M", "name": "process_name", "pid": self.chip,
            "args": { "name": format!("chip {}", self.chip) }
        })];
        let mut cores: Vec<CoreId> = self.events.iter().map(|e| e.core).collect();
        cores.sort_by_key(|c| tid(*c));
        cores.dedup_by_key(|c| tid(*c));
        for c in cores {
            let name = match c.kind {
                CoreKind::Aiv => format!("AIV{}", c.index),
                _ => format!("AIC{}", c.index),
            };
            out.push(json!({
                "ph": "M", "name": "thread_name", "pid": self.chip, "tid": tid(c),
                "args": { "name": name }
            }));
        }
        for e in &self.events {
            out.push(json!({
                "ph": "X", "name": &*e.kernel, "cat": "task",
                "pid": self.chip, "tid": tid(e.core),
                "ts": e.start_us, "dur": (e.end_us - e.start_us).max(0.0),
                "args": {
                    "task": e.task.get(), "block": e.block, "core": e.core.to_string(),
                    "deps": e.deps.iter().map(|d| d.get()).collect::<Vec<_>>(),
                }
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
