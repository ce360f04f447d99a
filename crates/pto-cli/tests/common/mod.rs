//! Running `pto` in a private /dev/shm (shared by several test targets, each using a part).

#![allow(dead_code)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a script printed and how it ended.
pub struct ShOut {
    pub code: Option<i32>,
    pub out: String,
    pub err: String,
    pub took: Duration,
}

/// Runs `sh -c script` (with `$PTO` the pto binary) in a private /dev/shm: a tmpfs mounted in a
/// private mount namespace (as root, or as a user with user namespaces), so that what it puts
/// there (stale segments, FIFOs) and what `pto` sweeps cannot touch other tests. Falls back to
/// the real /dev/shm where namespaces are refused. Killed after 60 s.
#[allow(clippy::unwrap_used)]
pub fn in_private_shm(script: &str) -> ShOut {
    let wrapped = format!("mount -t tmpfs -o size=256m tmpfs /dev/shm && {script}");
    let root = rustix::process::getuid().is_root();
    let ns_args: &[&str] = if root {
        &["--mount", "--propagation", "private"]
    } else {
        &[
            "--user",
            "--map-root-user",
            "--mount",
            "--propagation",
            "private",
        ]
    };
    let usable = Command::new("unshare")
        .args(ns_args)
        .args(["sh", "-c", "mount -t tmpfs tmpfs /dev/shm"])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut c = if usable {
        let mut c = Command::new("unshare");
        c.args(ns_args).args(["sh", "-c", &wrapped]);
        c
    } else {
        eprintln!("note: no private mount namespace here: using the real /dev/shm");
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    };
    let t = Instant::now();
    let mut child = c
        .env("PTO", env!("CARGO_BIN_EXE_pto"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut o, mut e) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let to = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = o.read_to_string(&mut s);
        s
    });
    let te = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = e.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("script hung for 60 s: {script}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    ShOut {
        code: status.code(),
        out: to.join().unwrap(),
        err: te.join().unwrap(),
        took: t.elapsed(),
    }
}

/// A C plugin built for a test, in a folder removed when it drops.
pub struct BuiltPlugin {
    pub path: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl Drop for BuiltPlugin {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Builds `src` (relative to the repository root) with `cc -shared -fPIC` and the `-D` flags
/// `defines`, against `pto include-dir`, as a user would.
#[allow(clippy::unwrap_used)]
pub fn build_plugin(src: &str, defines: &[&str]) -> BuiltPlugin {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let inc = Command::new(env!("CARGO_BIN_EXE_pto"))
        .arg("include-dir")
        .output()
        .unwrap();
    assert!(inc.status.success(), "pto include-dir failed");
    let inc = String::from_utf8(inc.stdout).unwrap().trim().to_string();
    let dir = std::env::temp_dir().join(format!(
        "pto-plugin-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("libplugin.so");
    let mut cc = Command::new("cc");
    cc.args(["-std=c99", "-Wall", "-Werror", "-shared", "-fPIC"])
        .arg(format!("-I{inc}"));
    for d in defines {
        cc.arg(format!("-D{d}"));
    }
    let out = cc
        .arg(root.join(src))
        .arg("-o")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc {src}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    BuiltPlugin { path, dir }
}

/// The pids whose parent is `ppid`, read from `/proc` (as `pgrep -P` would, without needing
/// procps, which minimal machines lack).
pub fn children_of(ppid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| parent_of(p) == Some(ppid))
        .collect()
}

/// The parent pid of `pid` (`/proc/PID/stat`'s fourth field; the command name before it is
/// in parentheses and may hold spaces), or `None` when it has ended.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `pid`'s command line, its arguments split (empty when it has ended).
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `pid` runs (a zombie has ended).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim().to_string()))
        .is_some_and(|r| !r.starts_with('Z'))
}

/// Runs the `pto` binary with `args` and the extra environment `env`; its exit code (-1 when a
/// signal ended it), stdout and stderr.
pub fn pto_with(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pto"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("the pto binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
