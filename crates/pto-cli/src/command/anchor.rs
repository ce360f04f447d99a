//! Running an anchor: a peer's program (libgomp's tasks, Open MPI's barrier) measured in the
//! same run as the baseline. It runs in a process group of its own that a signal ending pto also
//! ends (`pto_shm::cleanup`), and within a deadline: a stuck anchor is an error, never a hang.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::exit::Usage;

/// Runs `cmd` (called `what` in messages) to its end, at most `limit`; its whole process group
/// is killed at the deadline or when a signal ends pto. A program that cannot be started is a
/// usage error (the path the user gave).
pub fn run(mut cmd: Command, what: &str, limit: Duration) -> anyhow::Result<Output> {
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    pto_shm::cleanup::install();
    let mut child = pto_shm::cleanup::spawn_registered(&mut cmd, true)
        .map_err(|e| Usage(format!("cannot run {what}: {e}")))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, pipe) in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .enumerate()
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut v);
            }
            let _ = tx.send((i, v));
        });
    }
    let kill_group = || {
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
        }
    };
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if started.elapsed() > limit {
            kill_group();
            let _ = child.wait();
            pto_shm::cleanup::forget(pid);
            bail!("{what} did not finish within {limit:?}: stopped");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // What it left running in its group (a background job holding the pipes) ends with it.
    kill_group();
    pto_shm::cleanup::forget(pid);
    let mut out = Output {
        status,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    for _ in 0..2 {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok((0, v)) => out.stdout = v,
            Ok((_, v)) => out.stderr = v,
            Err(_) => break,
        }
    }
    Ok(out)
}
