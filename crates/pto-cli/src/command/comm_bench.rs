//! `pto bench comm`: barrier latency, put bandwidth and signal ping-pong, with single-core
//! memcpy as the bandwidth baseline measured in the same run.

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pto_comm::{Comm, SignalOp, WindowSpec};
use serde_json::json;

use crate::cli::BackendArg;
use crate::cli::BenchArgs;

const SIZES: [usize; 4] = [8, 4096, 1 << 20, 64 << 20];

use super::stats::median;

/// Microseconds per call of `f`, the median of 5 batches of `iters`.
fn time_us(iters: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let mut v = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        v.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    Ok(median(v))
}

fn memcpy_gbps(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src); // fault the pages in
    let iters = (256 << 20) / bytes.max(1) + 1;
    // Both sides through `black_box`: with link-time optimisation a copy whose destination
    // is never read again, from a source that never changes, was hoisted out of the loop
    // (a "memcpy" of 7 500 GB/s).
    let us = time_us(iters.min(100_000), || {
        let d = std::hint::black_box(&mut dst[..]);
        d.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(d);
        Ok(())
    })
    .unwrap_or(f64::NAN);
    bytes as f64 / us / 1e3
}

/// Every rank runs this; rank 0 prints the JSON lines.
fn run(comm: &Comm, json: bool, backend: &str) -> anyhow::Result<()> {
    let (me, n) = (comm.rank(), comm.size());
    let max = *SIZES.iter().max().unwrap_or(&8);
    let w = comm.alloc_window(&WindowSpec::new(max + 64))?;
    let emit = |v: serde_json::Value| -> anyhow::Result<()> {
        if me == 0 {
            super::print_line(json, &v)?;
        }
        Ok(())
    };
    // Barrier.
    for _ in 0..1000 {
        comm.barrier()?;
    }
    let us = time_us(20_000, || Ok(comm.barrier()?))?;
    emit(
        json!({"bench": "barrier", "backend": backend, "ranks": n, "us": (us * 1000.0).round() / 1000.0}),
    )?;
    // Put then quiet, rank 0 to rank 1 (to itself with one rank).
    let peer = 1 % n;
    for bytes in SIZES {
        let src = vec![0x5au8; bytes];
        comm.barrier()?;
        if me == 0 {
            w.put(peer, 64, &src)?;
            let iters = ((1usize << 30) / bytes).clamp(4, 200_000);
            let us = time_us(iters, || {
                w.put(peer, 64, &src)?;
                w.quiet();
                Ok(())
            })?;
            let gbps = bytes as f64 / us / 1e3;
            let base = memcpy_gbps(bytes);
            emit(json!({
                "bench": "put", "backend": backend, "ranks": n, "bytes": bytes,
                "us": (us * 1000.0).round() / 1000.0, "GBps": (gbps * 100.0).round() / 100.0,
                "memcpy_GBps": (base * 100.0).round() / 100.0,
                "ratio_vs_memcpy": (gbps / base * 1000.0).round() / 1000.0,
            }))?;
        }
        comm.barrier()?;
    }
    // Signal ping-pong between ranks 0 and 1.
    if n >= 2 {
        let rounds = 20_000u32;
        comm.barrier()?;
        let t = Instant::now();
        for i in 1..=rounds {
            match me {
                0 => {
                    w.notify(1, 0, 1, SignalOp::Add)?;
                    w.wait_until(0, i)?;
                }
                1 => {
                    w.wait_until(0, i)?;
                    w.notify(0, 0, 1, SignalOp::Add)?;
                }
                _ => break,
            }
        }
        let one_way = t.elapsed().as_secs_f64() * 1e6 / f64::from(rounds) / 2.0;
        emit(
            json!({"bench": "signal_pingpong", "backend": backend, "ranks": 2, "us": (one_way * 1000.0).round() / 1000.0}),
        )?;
        comm.barrier()?;
    }
    Ok(())
}

/// OSU-style allreduce sizes, in bytes.
const ALLREDUCE_SIZES: [usize; 12] = [
    8,
    64,
    512,
    1 << 10,
    4 << 10,
    32 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
];

/// Prints one allreduce line: `{"bench", "ranks", "bytes", "us", "algbw_GBps"}`.
fn emit_allreduce(
    json: bool,
    bench: &str,
    ranks: usize,
    bytes: usize,
    us: f64,
) -> anyhow::Result<()> {
    let l = json!({
        "bench": bench, "ranks": ranks, "bytes": bytes,
        "us": (us * 1000.0).round() / 1000.0,
        "algbw_GBps": ((bytes as f64 / us / 1e3) * 1000.0).round() / 1000.0,
    });
    super::print_line(json, &l)
}

/// Every rank runs this; rank 0 prints one JSON line per size. Returns `(bytes, us)` per size.
fn allreduce(comm: &Comm, json: bool) -> anyhow::Result<Vec<(usize, f64)>> {
    let n = comm.size();
    let mut out = Vec::new();
    let co = pto_comm::Collectives::new(comm, 16 << 20)?;
    for bytes in ALLREDUCE_SIZES {
        let count = (bytes / 4).max(1);
        let mut v = vec![1.0f32; count];
        let iters = ((64usize << 20) / bytes).clamp(3, 20_000);
        for _ in 0..iters.min(100) {
            co.allreduce(&mut v, pto_comm::ReduceOp::Sum)?;
        }
        comm.barrier()?;
        let us = time_us(iters, || {
            co.allreduce(&mut v, pto_comm::ReduceOp::Sum)?;
            Ok(())
        })?;
        comm.barrier()?;
        if comm.rank() == 0 {
            emit_allreduce(json, "allreduce", n, bytes, us)?;
        }
        out.push((bytes, us));
    }
    // Data already in a window: no staging copy (the memory-bound path).
    let w = comm.alloc_window(&pto_comm::WindowSpec::new(64 + (64 << 20)))?;
    for bytes in [1usize << 20, 64 << 20] {
        let count = bytes / 4;
        w.put_slice(comm.rank(), 64, &vec![1.0f32; count])?;
        let iters = ((256usize << 20) / bytes).clamp(3, 200);
        co.allreduce_window::<f32>(&w, 64, count, pto_comm::ReduceOp::Sum)?;
        comm.barrier()?;
        let us = time_us(iters, || {
            co.allreduce_window::<f32>(&w, 64, count, pto_comm::ReduceOp::Sum)?;
            Ok(())
        })?;
        comm.barrier()?;
        if comm.rank() == 0 {
            emit_allreduce(json, "allreduce_window", n, bytes, us)?;
        }
    }
    Ok(out)
}

/// `--backend mpi`: pto's allreduce, then MPI's own `MPI_Allreduce` on the same ranks and
/// sizes in the same job, and their ratio per size (`"bench": "allreduce_vs_mpi"`).
#[cfg(feature = "mpi")]
fn mpi_bench(
    a: &BenchArgs,
    is_allreduce: bool,
    coll: Option<&super::coll_bench::Config>,
) -> anyhow::Result<ExitCode> {
    if !pto_comm::mpi::detected() {
        return super::mpi_launch::relaunch(a.ranks);
    }
    let comm = pto_comm::mpi::init().context("starting MPI")?;
    let Some(cfg) = coll else {
        run(&comm, a.json, "mpi")?;
        return Ok(ExitCode::SUCCESS);
    };
    let wrong = super::coll_bench::run_rank(&comm, cfg)?;
    if wrong > 0 {
        // Every rank exits 1 (mpirun's code); rank 0 says why before any rank exits (mpirun
        // ends the job at the first non-zero exit).
        if let (0, Err(e)) = (comm.rank(), cfg.verdict(wrong)) {
            pto_shm::eprint_line!("pto: {e}");
        }
        comm.barrier()?;
        return Ok(crate::exit::code(crate::exit::WRONG_RESULT));
    }
    if !is_allreduce {
        return Ok(ExitCode::SUCCESS);
    }
    let ours = allreduce(&comm, a.json)?;
    let n = comm.size();
    for (bytes, us_ours) in ours {
        let count = (bytes / 4).max(1);
        let send = vec![1.0f32; count];
        let mut recv = vec![0.0f32; count];
        let iters = ((64usize << 20) / bytes).clamp(3, 20_000);
        for _ in 0..iters.min(100) {
            pto_comm::mpi::baseline_allreduce_f32(&comm, &send, &mut recv)?;
        }
        comm.barrier()?;
        let us = time_us(iters, || {
            pto_comm::mpi::baseline_allreduce_f32(&comm, &send, &mut recv)?;
            Ok(())
        })?;
        comm.barrier()?;
        if recv.first().is_some_and(|&x| x != n as f32) {
            bail!("MPI_Allreduce returned {:?}, not {n}", recv.first());
        }
        if comm.rank() == 0 {
            emit_allreduce(a.json, "mpi_allreduce", n, bytes, us)?;
            let l = json!({
                "bench": "allreduce_vs_mpi", "ranks": n, "bytes": bytes,
                "ratio": ((us_ours / us) * 1000.0).round() / 1000.0,
            });
            super::print_line(a.json, &l)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `pto bench <collective>` measures, from its arguments.
fn coll_config(a: &BenchArgs, backend: &str) -> Option<super::coll_bench::Config> {
    use super::coll_bench::Op;
    let op = match a.what {
        crate::cli::BenchKind::Allreduce => Op::Allreduce,
        crate::cli::BenchKind::Allgather => Op::Allgather,
        crate::cli::BenchKind::ReduceScatter => Op::ReduceScatter,
        crate::cli::BenchKind::Broadcast => Op::Broadcast,
        crate::cli::BenchKind::AllToAll => Op::AllToAll,
        _ => return None,
    };
    Some(super::coll_bench::Config {
        op,
        min_bytes: a.min_bytes,
        max_bytes: a.max_bytes,
        step: a.step_factor,
        iters: a.iters,
        warmup: a.warmup,
        dtype: a.dtype.clone(),
        reduce_op: a.reduce_op.clone(),
        check: a.check,
        json: a.json,
        backend: backend.to_string(),
        algorithm: a.algorithm.clone(),
    })
}

/// The body of a rank process started by `bench` for a collective (its configuration in
/// `PTO_BENCH_CFG`).
pub fn coll_rank_main() -> anyhow::Result<ExitCode> {
    let comm = pto_comm::shm::from_env()?.context("not started as a rank")?;
    let cfg: super::coll_bench::Config =
        serde_json::from_str(&std::env::var("PTO_BENCH_CFG").context("PTO_BENCH_CFG is not set")?)?;
    if super::coll_bench::run_rank(&comm, &cfg)? > 0 {
        // The parent says it once for every rank.
        return Ok(crate::exit::code(crate::exit::WRONG_RESULT));
    }
    Ok(ExitCode::SUCCESS)
}

/// The body of a rank process started by `bench`.
pub fn rank_main(allreduce_bench: bool) -> anyhow::Result<ExitCode> {
    let comm = pto_comm::shm::from_env()?.context("not started as a rank")?;
    let json = std::env::var("PTO_BENCH_JSON").is_ok();
    if allreduce_bench {
        allreduce(&comm, json)?;
    } else {
        run(&comm, json, "shm")?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<ExitCode> {
    let is_allreduce = matches!(a.what, crate::cli::BenchKind::Allreduce);
    let coll = coll_config(a, a.backend.backend().name());
    if let Some(cfg) = &coll {
        if a.min_bytes > a.max_bytes {
            return Err(crate::exit::Usage(format!(
                "-b/--min-bytes {} is above -e/--max-bytes {}",
                a.min_bytes, a.max_bytes
            ))
            .into());
        }
        // Refuse a bad dtype or reduction before any rank starts.
        if ![
            "float32", "f32", "float64", "f64", "int32", "i32", "int64", "i64", "float16", "f16",
            "bfloat16", "bf16",
        ]
        .contains(&cfg.dtype.as_str())
        {
            return Err(crate::exit::Usage(format!(
                "--dtype {:?}: float32, float64, int32, int64, float16 or bfloat16",
                cfg.dtype
            ))
            .into());
        }
        if super::coll_bench::Target::parse(&cfg.algorithm).is_none() {
            return Err(crate::exit::Usage(format!(
                "--algorithm {:?}: auto, mesh, two-phase, ring, single-copy, tree or window",
                cfg.algorithm
            ))
            .into());
        }
        if cfg.algorithm != "auto" && cfg.op != super::coll_bench::Op::Allreduce {
            return Err(crate::exit::Usage(format!(
                "--algorithm {:?} applies to allreduce only: the other collectives take auto",
                cfg.algorithm
            ))
            .into());
        }
        if !["sum", "max", "min", "prod"].contains(&cfg.reduce_op.as_str()) {
            return Err(crate::exit::Usage(format!(
                "--reduce-op {:?}: sum, max, min or prod",
                cfg.reduce_op
            ))
            .into());
        }
    }
    match a.backend {
        BackendArg::Local => {
            let results = pto_comm::local::run(a.ranks, |c| match &coll {
                Some(cfg) => super::coll_bench::run_rank(&c, cfg).map_err(|e| e.to_string()),
                None => run(&c, a.json, "local")
                    .map(|()| 0)
                    .map_err(|e| e.to_string()),
            })?;
            let mut wrong = 0;
            for (r, res) in results.into_iter().enumerate() {
                match res {
                    Ok(Ok(w)) => wrong = wrong.max(w),
                    Ok(Err(e)) | Err(e) => bail!("rank {r}: {e}"),
                }
            }
            if let Some(cfg) = &coll {
                cfg.verdict(wrong)?;
            }
        }
        BackendArg::Shm => {
            pto_shm::cleanup::install();
            let mut world = pto_comm::shm::ShmWorld::create(a.ranks)?;
            let exe = std::env::current_exe()?;
            for r in 0..a.ranks {
                let mut cmd = Command::new(&exe);
                cmd.args([
                    "__rank",
                    if coll.is_some() {
                        "bench-coll"
                    } else {
                        "bench-comm"
                    },
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::inherit())
                .stderr(Stdio::inherit());
                if a.json {
                    cmd.env("PTO_BENCH_JSON", "1");
                }
                if let Some(cfg) = &coll {
                    cmd.env("PTO_BENCH_CFG", serde_json::to_string(cfg)?);
                }
                world.spawn(r, cmd)?;
            }
            let mut wrong = false;
            for (r, st) in world.wait(Duration::from_secs(600))? {
                match (st.code(), &coll) {
                    (Some(0), _) => {}
                    (Some(c), Some(_)) if c == i32::from(crate::exit::WRONG_RESULT) => wrong = true,
                    _ => bail!("rank {r} exited with {st}"),
                }
            }
            if let (true, Some(cfg)) = (wrong, &coll) {
                return Err(cfg.wrong_in_ranks().into());
            }
        }
        #[cfg(feature = "mpi")]
        BackendArg::Mpi => return mpi_bench(a, is_allreduce, coll.as_ref()),
        #[cfg(not(feature = "mpi"))]
        BackendArg::Mpi => {
            let _ = is_allreduce;
            return Err(crate::exit::no_mpi());
        }
    }
    Ok(ExitCode::SUCCESS)
}
