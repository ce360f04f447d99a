//! The Worker's run thread ([`Runner`]) and a run on it that the calling thread waits for in
//! slices, so that Ctrl-C aborts the run at once ([`run_interruptibly`]).

use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;

use crate::errors::{panic_text, pto_err, worker_err, Kind};
use crate::orch::{task_args, Submission, Target};
use crate::wait::{recv_detached, SIGNAL_SLICE};

/// What the run thread sends back.
type RunResult =
    std::thread::Result<Result<pto_worker::WorkerReport, Box<pto_worker::WorkerError>>>;

/// A job for the run thread.
type Job = Box<dyn FnOnce() + Send>;

/// The thread that runs a Worker's runs, so that the thread that called `run` can wait for
/// them in slices and look for signals in between. It lives as long as the Worker: handing a
/// run to a waiting thread costs microseconds, starting a thread per run tens of them.
#[derive(Debug)]
pub(crate) struct Runner {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Runner {
    pub(crate) fn start() -> std::io::Result<Runner> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("pto-run".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })?;
        Ok(Runner {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    fn submit(&self, job: Job) -> bool {
        self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok())
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs the submissions on `w` on the run thread, while this thread waits without the GIL in
/// short slices and checks for signals between them: Ctrl-C (or any signal handler that
/// raises) aborts the Worker, which fails the run at once, and its exception is raised.
pub(crate) fn run_interruptibly(
    py: Python<'_>,
    runner: &Runner,
    w: &Arc<pto_worker::Worker>,
    subs: Vec<Submission>,
    trace: bool,
) -> PyResult<pto_worker::WorkerReport> {
    let interrupted = |e: PyErr| {
        let why = format!(
            "interrupted ({})",
            Python::attach(|py| e.get_type(py).name().map(|n| n.to_string()))
                .unwrap_or_else(|_| "a signal".into())
        );
        tracing::info!(why = why.as_str(), "aborting the Worker's run");
        w.abort(&why);
        e
    };
    let (tx, rx) = mpsc::sync_channel::<RunResult>(1);
    let rx = Mutex::new(rx);
    let worker = w.clone();
    let job: Job = Box::new(move || {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            worker
                .run_with(
                    move |h| {
                        for s in &subs {
                            let a = task_args(&s.args);
                            match &s.target {
                                Target::Chip(c) => h.submit_chip(*c, &s.program, a)?,
                                Target::Group(cs) => h.submit_group(cs, &s.program, a)?,
                                Target::Sub(n) => h.submit_sub(n, a)?,
                            };
                        }
                        Ok(())
                    },
                    trace,
                )
                .map_err(Box::new)
        }));
        drop(worker);
        let _ = tx.send(r);
    });
    if !runner.submit(job) {
        return Err(worker_err("the Worker's run thread is gone"));
    }
    loop {
        match recv_detached(py, &rx, Some(SIGNAL_SLICE)) {
            Ok(r) => {
                // A signal that came with the end of the run (children interrupted by the same
                // Ctrl-C fail their tasks) wins over the run's own result.
                py.check_signals().map_err(interrupted)?;
                return match r {
                    Ok(r) => r.map_err(worker_err),
                    Err(p) => Err(pto_err(
                        Kind::Worker,
                        format!("the run panicked: {}", panic_text(&*p)),
                    )),
                };
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    let e = interrupted(e);
                    // The abort fails the run within milliseconds; wait for it.
                    let _ = recv_detached(py, &rx, None);
                    return Err(e);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(worker_err("the run thread ended without a result"))
            }
        }
    }
}
