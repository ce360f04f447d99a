//! The conformance suite on the `mpi` backend (cargo feature `mpi`): each test starts
//! `mpirun`, whose ranks are this test binary re-entered at `rank_entry`. One job of N ranks
//! runs every case at every rank count k ≤ N it lists, on a domain of the first k ranks, with
//! shared windows (one node) and with RMA windows (`PTO_MPI_WINDOWS=rma`). Also: an aborting
//! rank ends the job with its message, a killed rank ends the job, and a collective across two network namespaces joined by
//! a veth pair (two "hosts" with their own addresses, Open MPI over TCP).

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pto_comm::conformance::CASES;
use pto_comm::{Collectives, Comm, ReduceOp, SignalOp, WindowSpec};

const CASE_ENV: &str = "PTO_TEST_CASE";

/// `mpirun` with the options every job here needs: root is allowed (CI containers), more
/// ranks than cores are allowed, and the variables the ranks read are exported.
fn mpirun(n: usize, extra: &[&str]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        &n.to_string(),
    ]);
    cmd.args(extra);
    for v in [
        CASE_ENV,
        "PTO_MPI_WINDOWS",
        "PTO_WAIT_TIMEOUT_MS",
        "PTO_TEST_ONLY",
        "PTO_MPI_NODE_RANKS",
    ] {
        cmd.args(["-x", v]);
    }
    cmd.env("PTO_WAIT_TIMEOUT_MS", "20000");
    cmd
}

fn rank_args(cmd: &mut Command) {
    cmd.arg(std::env::current_exe().unwrap()).args([
        "--exact",
        "rank_entry",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
}

/// Runs `cmd` to completion within `limit` (killed after it); returns success and output.
fn run(mut cmd: Command, limit: Duration) -> (bool, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start mpirun: install Open MPI (see the README)");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = format!("{}{}", t_out.join().unwrap(), t_err.join().unwrap());
    match status {
        Some(st) => (st.success(), text),
        None => (false, format!("killed after {limit:?}\n{text}")),
    }
}

fn conformance(n: usize, windows: &str) {
    let mut cmd = mpirun(n, &[]);
    cmd.env(CASE_ENV, "conformance")
        .env("PTO_MPI_WINDOWS", windows);
    rank_args(&mut cmd);
    let (ok, out) = run(cmd, Duration::from_secs(100));
    assert!(
        ok,
        "conformance on {n} MPI ranks ({windows} windows) failed:\n{out}"
    );
    let passed = out.matches(" ranks ok").count();
    let want: usize = CASES
        .iter()
        .map(|c| c.ranks.iter().filter(|&&k| runs_on(c.name, k, n)).count())
        .sum();
    assert_eq!(passed, want, "cases reported:\n{out}");
}

#[test]
fn conformance_on_2_ranks_shared_windows() {
    conformance(2, "shared");
}

#[test]
fn conformance_on_4_ranks_shared_windows() {
    conformance(4, "shared");
}

#[test]
fn conformance_on_2_ranks_rma_windows() {
    conformance(2, "rma");
}

#[test]
fn conformance_on_4_ranks_rma_windows() {
    conformance(4, "rma");
}

#[test]
fn a_hierarchical_allreduce_over_nodes_of_two_ranks() {
    let mut cmd = mpirun(4, &[]);
    cmd.env(CASE_ENV, "hierarchical")
        .env("PTO_MPI_WINDOWS", "rma")
        .env("PTO_MPI_NODE_RANKS", "2");
    rank_args(&mut cmd);
    let (ok, out) = run(cmd, Duration::from_secs(100));
    assert!(ok && out.contains("hierarchical allreduce ok"), "{out}");
}

#[test]
fn an_aborting_rank_ends_the_job_with_its_message() {
    for windows in ["shared", "rma"] {
        let mut cmd = mpirun(3, &[]);
        cmd.env(CASE_ENV, "abort").env("PTO_MPI_WINDOWS", windows);
        rank_args(&mut cmd);
        let t = Instant::now();
        let (ok, out) = run(cmd, Duration::from_secs(60));
        assert!(!ok, "the job succeeded:\n{out}");
        assert!(
            out.contains("rank 1 aborts the MPI job: rank 1 gives up on purpose"),
            "no message naming rank 1 ({windows}):\n{out}"
        );
        assert!(
            !out.contains("killed after"),
            "the job hung ({windows}):\n{out}"
        );
        eprintln!("abort ({windows}) ended the job in {:?}", t.elapsed());
    }
}

#[test]
fn a_rank_that_dies_ends_the_job() {
    for windows in ["shared", "rma"] {
        let mut cmd = mpirun(3, &[]);
        cmd.env(CASE_ENV, "die").env("PTO_MPI_WINDOWS", windows);
        rank_args(&mut cmd);
        let t = Instant::now();
        let (ok, out) = run(cmd, Duration::from_secs(60));
        assert!(!ok, "the job succeeded:\n{out}");
        assert!(
            !out.contains("killed after"),
            "the job hung ({windows}):\n{out}"
        );
        eprintln!("a dead rank ({windows}) ended the job in {:?}", t.elapsed());
    }
}

/// Two network namespaces joined by a veth pair, removed on drop.
/// Two network namespaces joined by a veth pair, named after this process (`pto_t_<pid>_<i>`,
/// links `ptv<pid>_<i>`), so that two copies of the suite at once each have their own. The
/// addresses are the same in each pair: every pair is a network of its own.
struct Hosts {
    dir: std::path::PathBuf,
    ns: [String; 2],
}

const ADDR: [&str; 2] = ["10.78.0.1", "10.78.0.2"];
const NS_PREFIX: &str = "pto_t_";

fn sh(cmd: &str) -> Result<(), String> {
    let st = Command::new("sh")
        .args(["-c", cmd])
        .status()
        .map_err(|e| e.to_string())?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("`{cmd}` failed: {st}"))
    }
}

impl Hosts {
    fn create() -> Result<Hosts, String> {
        Hosts::sweep_dead();
        let pid = std::process::id();
        let ns = [0, 1].map(|i| format!("{NS_PREFIX}{pid}_{i}"));
        let link = |i: usize| format!("ptv{pid}_{i}");
        // From here on, Drop removes whatever was made.
        let hosts = Hosts {
            dir: std::env::temp_dir().join(format!("pto-two-hosts-{pid}")),
            ns,
        };
        for ns in &hosts.ns {
            sh(&format!("ip netns add {ns}"))?;
            sh(&format!("ip -n {ns} link set lo up"))?;
        }
        sh(&format!(
            "ip link add {} netns {} type veth peer name {} netns {}",
            link(0),
            hosts.ns[0],
            link(1),
            hosts.ns[1]
        ))?;
        for (i, (ns, addr)) in hosts.ns.iter().zip(ADDR).enumerate() {
            sh(&format!("ip -n {ns} addr add {addr}/24 dev {}", link(i)))?;
            sh(&format!("ip -n {ns} link set {} up", link(i)))?;
        }
        // Open MPI starts its daemon on a "host" through this agent instead of ssh.
        std::fs::create_dir_all(&hosts.dir).map_err(|e| e.to_string())?;
        let agent = hosts.agent();
        let script = format!(
            "#!/bin/sh\n# $1 is the host; options before it are ssh's.\nwhile [ \"${{1#-}}\" != \"$1\" ]; do shift; done\nhost=$1; shift\ncase $host in\n  {a0}) ns={n0} ;;\n  {a1}) ns={n1} ;;\n  *) echo \"unknown host $host\" >&2; exit 1 ;;\nesac\nexec ip netns exec $ns /bin/sh -c \"$*\"\n",
            a0 = ADDR[0],
            a1 = ADDR[1],
            n0 = hosts.ns[0],
            n1 = hosts.ns[1]
        );
        std::fs::write(&agent, script).map_err(|e| e.to_string())?;
        sh(&format!("chmod +x {}", agent.display()))?;
        Ok(hosts)
    }

    fn agent(&self) -> std::path::PathBuf {
        self.dir.join("agent.sh")
    }

    /// Removes the namespaces a run of this test that was killed left behind (their process is
    /// gone); a live process's are its own.
    fn sweep_dead() {
        let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
            return;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            let Some(pid) = name
                .strip_prefix(NS_PREFIX)
                .and_then(|r| r.split('_').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = Command::new("ip")
                    .args(["netns", "del", name])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and with it the other end.
        for ns in &self.ns {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_collective_across_two_network_namespaces() {
    // Creating namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), which CI has.
    let root = rustix::process::geteuid().is_root();
    assert!(
        root || std::env::var_os("PTO_SKIP_TWO_HOSTS").is_some(),
        "this test creates network namespaces and needs root; set PTO_SKIP_TWO_HOSTS=1 to skip it knowingly"
    );
    if std::env::var_os("PTO_SKIP_TWO_HOSTS").is_some()
        || !root
        || !Path::new("/usr/bin/ip").exists() && !Path::new("/sbin/ip").exists()
    {
        eprintln!("SKIPPED: PTO_SKIP_TWO_HOSTS, not root or no `ip`");
        return;
    }
    let hosts = Hosts::create().unwrap();
    let inner = format!(
        "--allow-run-as-root --oversubscribe --mca plm_rsh_agent {agent} \
         --mca oob_tcp_if_include 10.78.0.0/24 --mca pml ob1 --mca btl tcp,self \
         --mca btl_tcp_if_include 10.78.0.0/24 --mca osc pt2pt \
         --host {a0}:2,{a1}:2 -n 4 -x {CASE_ENV} -x PTO_WAIT_TIMEOUT_MS -x PTO_MPI_NODE_RANKS",
        agent = hosts.agent().display(),
        a0 = ADDR[0],
        a1 = ADDR[1],
    );
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &hosts.ns[0], "mpirun"]);
    cmd.args(inner.split_whitespace());
    // Both namespaces have the same hostname, which confuses Open MPI's idea of a node: the
    // ranks are grouped as placed (ranks 0-1 on the first host, 2-3 on the second).
    cmd.env(CASE_ENV, "two_hosts")
        .env("PTO_WAIT_TIMEOUT_MS", "20000")
        .env("PTO_MPI_NODE_RANKS", "2");
    rank_args(&mut cmd);
    let (ok, out) = run(cmd, Duration::from_secs(100));
    drop(hosts);
    assert!(ok, "two-host job failed:\n{out}");
    let line = out.lines().find(|l| l.contains("two hosts: allreduce ok"));
    assert!(line.is_some(), "{out}");
    eprintln!("{}", line.unwrap_or_default());
}

/// Whether `case` runs at `k` ranks in a job of `n`: at k < n on a sub-domain, except the
/// domain case, which builds domains of world ranks itself and so needs the whole world.
fn runs_on(case: &str, k: usize, n: usize) -> bool {
    k == n || (k < n && case != "domains")
}

/// Every listed case at each rank count k ≤ size, on the domain of the first k ranks.
fn all_cases(world: &Comm) -> Result<(), String> {
    let only = std::env::var("PTO_TEST_ONLY").ok();
    for case in CASES {
        if only.as_deref().is_some_and(|o| o != case.name) {
            continue;
        }
        for &k in case
            .ranks
            .iter()
            .filter(|&&k| runs_on(case.name, k, world.size()))
        {
            if world.rank() < k {
                let members: Vec<usize> = (0..k).collect();
                let dom = world.domain(&members).map_err(|e| e.to_string())?;
                (case.run)(&dom).map_err(|m| format!("case {} on {k} ranks: {m}", case.name))?;
                if world.rank() == 0 {
                    println!("case {} on {k} ranks ok", case.name);
                }
            }
            world.barrier().map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Allreduces on RMA windows with the ranks grouped in nodes of two (`PTO_MPI_NODE_RANKS=2`):
/// hierarchical (node shared memory, then the leaders), every dtype MPI reduces, every op,
/// counts from 1 to more than one staging slot, on the world and on a domain of 3 ranks (nodes
/// of 2 and 1); each result checked against its formula.
fn hierarchical(world: &Comm) -> Result<(), String> {
    let e = |e: pto_comm::CommError| e.to_string();
    let check = |c: &Comm| -> Result<(), String> {
        let co = Collectives::new(c, 4096).map_err(e)?;
        let (r, n) = (c.rank(), c.size());
        for count in [1usize, 7, 1000, 300_000] {
            let mut f: Vec<f32> = (0..count).map(|i| (r + i % 7) as f32).collect();
            co.allreduce(&mut f, ReduceOp::Sum).map_err(e)?;
            let tri = (n * (n - 1) / 2) as f32;
            if let Some(i) = (0..count).find(|&i| f[i] != (n * (i % 7)) as f32 + tri) {
                return Err(format!("f32 sum of {count} on {n} ranks: [{i}] = {}", f[i]));
            }
            let mut m: Vec<i64> = (0..count).map(|i| ((r * 31 + i) % 97) as i64).collect();
            co.allreduce(&mut m, ReduceOp::Max).map_err(e)?;
            let want = |i: usize| {
                (0..n)
                    .map(|q| ((q * 31 + i) % 97) as i64)
                    .max()
                    .unwrap_or(0)
            };
            if let Some(i) = (0..count).find(|&i| m[i] != want(i)) {
                return Err(format!("i64 max of {count} on {n} ranks: [{i}] = {}", m[i]));
            }
            let mut d: Vec<f64> = (0..count).map(|i| (r as f64) - (i % 5) as f64).collect();
            co.allreduce(&mut d, ReduceOp::Min).map_err(e)?;
            if let Some(i) = (0..count).find(|&i| d[i] != -((i % 5) as f64)) {
                return Err(format!("f64 min of {count} on {n} ranks: [{i}] = {}", d[i]));
            }
            let mut p: Vec<i32> = (0..count).map(|i| 1 + ((r + i) % 2) as i32).collect();
            co.allreduce(&mut p, ReduceOp::Prod).map_err(e)?;
            let want = |i: usize| (0..n).map(|q| 1 + ((q + i) % 2) as i32).product::<i32>();
            if let Some(i) = (0..count).find(|&i| p[i] != want(i)) {
                return Err(format!(
                    "i32 prod of {count} on {n} ranks: [{i}] = {}",
                    p[i]
                ));
            }
        }
        match co.allreduce_algorithm::<f32>(1024) {
            "hierarchical" => Ok(()),
            other => Err(format!(
                "{n} ranks in nodes of 2 ran {other:?}, not hierarchical"
            )),
        }
    };
    check(world)?;
    if world.rank() < 3 {
        check(&world.domain(&[0, 1, 2]).map_err(e)?)?;
    }
    world.barrier().map_err(e)?;
    if world.rank() == 0 {
        println!("hierarchical allreduce ok");
    }
    Ok(())
}

/// Across two hosts, two ranks on each: RMA windows (the default off one node), a put + signal
/// ring, and a hierarchical allreduce; the hosts are two network namespaces.
fn two_hosts(c: &Comm) -> Result<(), String> {
    let e = |e: pto_comm::CommError| e.to_string();
    let ns = std::fs::read_link("/proc/self/ns/net").map_err(|e| e.to_string())?;
    let id: u64 = ns
        .to_string_lossy()
        .trim_matches(|ch: char| !ch.is_ascii_digit())
        .parse()
        .unwrap_or(0);
    let co = Collectives::new(c, 4096).map_err(e)?;
    let mut ids = vec![0u64; c.size()];
    co.allgather(&[id], &mut ids).map_err(e)?;
    let n = c.size();
    if ids[0] == ids[n - 1] {
        return Err(format!(
            "the first and last ranks are both in network namespace {}",
            ids[0]
        ));
    }
    let w = c.alloc_window(&WindowSpec::new(128)).map_err(e)?;
    let next = (c.rank() + 1) % c.size();
    w.put_slice(next, 64, &[c.rank() as u64 + 10]).map_err(e)?;
    w.notify(next, 0, 1, SignalOp::Add).map_err(e)?;
    w.wait_until(0, 1).map_err(e)?;
    let got: Vec<u64> = w.get_vec(c.rank(), 64, 1).map_err(e)?;
    let prev = (c.rank() + c.size() - 1) % c.size();
    if got[0] != prev as u64 + 10 {
        return Err(format!("ring: got {}, want {}", got[0], prev + 10));
    }
    // Two ranks per host: the allreduce is hierarchical (each host's ranks combine in shared
    // memory, the two hosts' leaders over TCP).
    let mut v: Vec<f32> = (0..1000).map(|i| (i + c.rank()) as f32).collect();
    co.allreduce(&mut v, ReduceOp::Sum).map_err(e)?;
    for (i, x) in v.iter().enumerate() {
        let want = (n * i + n * (n - 1) / 2) as f32;
        if *x != want {
            return Err(format!("allreduce[{i}] = {x}, want {want}"));
        }
    }
    let algo = co.allreduce_algorithm::<f32>(4000);
    if algo != "hierarchical" {
        return Err(format!(
            "2 ranks on each of 2 hosts ran a {algo:?} allreduce"
        ));
    }
    if c.rank() == 0 {
        println!("two hosts: allreduce ok ({algo}; namespaces {ids:?})");
    }
    Ok(())
}

/// Not a test on its own: the body of one MPI rank, started by the tests above.
#[test]
#[ignore = "entered by mpirun from the tests of this file"]
fn rank_entry() {
    let Ok(what) = std::env::var(CASE_ENV) else {
        return;
    };
    let comm = pto_comm::mpi::init().unwrap();
    let result = match what.as_str() {
        "conformance" => all_cases(&comm),
        "two_hosts" => two_hosts(&comm),
        "hierarchical" => hierarchical(&comm),
        "abort" => {
            comm.barrier().unwrap();
            if comm.rank() == 1 {
                comm.abort("rank 1 gives up on purpose");
            }
            // The others wait for a barrier rank 1 never reaches; the abort must end them.
            comm.barrier().map_err(|e| e.to_string())
        }
        "die" => {
            comm.barrier().unwrap();
            if comm.rank() == 1 {
                // Gone without a word: no abort, no finalize.
                rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                )
                .unwrap();
            }
            let w = comm
                .alloc_window(&WindowSpec::new(64))
                .map_err(|e| e.to_string());
            w.and_then(|w| w.wait_until(0, 1).map(|_| ()).map_err(|e| e.to_string()))
        }
        other => Err(format!("unknown case {other}")),
    };
    if let Err(msg) = result {
        eprintln!("rank {}: {msg}", comm.rank());
        std::process::exit(1);
    }
}
