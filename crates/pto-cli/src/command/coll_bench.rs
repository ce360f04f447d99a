//! `pto bench allreduce|allgather|reduce_scatter|broadcast|all_to_all`: nccl-tests style.
//! Sizes from `-b` to `-e` by factor `-f`; per size, every rank times `--iters` calls after
//! `--warmup`, and rank 0 prints the time over ranks (min/avg/max), algbw and busbw (nccl-tests'
//! definitions), the algorithm chosen and, with `--check`, how many elements were wrong on
//! every rank. Output comes from typed rows: a table, or JSON lines with `--json`.

use std::time::Instant;

use anyhow::bail;
use pto_comm::{Algorithm, Collectives, Comm, ReduceOp, Reducible, Window, WindowSpec};
use serde::{Deserialize, Serialize};

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Allreduce,
    Allgather,
    ReduceScatter,
    Broadcast,
    AllToAll,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Allreduce => "allreduce",
            Op::Allgather => "allgather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::AllToAll => "all_to_all",
        }
    }

    /// nccl-tests' bus bandwidth factor for `n` ranks.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::Allreduce => 2.0 * (n - 1.0) / n,
            Op::Allgather | Op::ReduceScatter | Op::AllToAll => (n - 1.0) / n,
            Op::Broadcast => 1.0,
        }
    }
}

/// What every rank measures (sent to rank processes as JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Config {
    pub op: Op,
    pub min_bytes: usize,
    pub max_bytes: usize,
    pub step: usize,
    pub iters: Option<usize>,
    pub warmup: usize,
    pub dtype: String,
    pub reduce_op: String,
    pub check: bool,
    pub json: bool,
    pub backend: String,
    /// `--algorithm`: see [`Target`].
    pub algorithm: String,
}

/// What an allreduce runs: an algorithm on the caller's buffer, or `allreduce_window` on
/// data already in a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Algo(Algorithm),
    Window,
}

impl Target {
    pub fn parse(s: &str) -> Option<Target> {
        Some(match s {
            "auto" => Target::Algo(Algorithm::Auto),
            "mesh" => Target::Algo(Algorithm::Mesh),
            "two-phase" => Target::Algo(Algorithm::TwoPhase),
            "ring" => Target::Algo(Algorithm::Ring),
            "single-copy" => Target::Algo(Algorithm::SingleCopy),
            "tree" => Target::Algo(Algorithm::Tree),
            "window" => Target::Window,
            _ => return None,
        })
    }
}

/// The first line: what was run where.
#[derive(Serialize)]
struct Header<'a> {
    bench: &'static str,
    op: &'static str,
    host: String,
    backend: &'a str,
    ranks: usize,
    version: &'static str,
    dtype: &'a str,
    reduce_op: &'a str,
}

/// One size's figures.
#[derive(Serialize)]
struct Row {
    bench: &'static str,
    bytes: usize,
    count: usize,
    dtype: String,
    algorithm: &'static str,
    time_min_us: f64,
    time_avg_us: f64,
    time_max_us: f64,
    algbw_gbps: f64,
    busbw_gbps: f64,
    wrong: Option<u64>,
}

const COLUMNS: [(&str, usize); 10] = [
    ("bytes", 12),
    ("count", 11),
    ("dtype", 9),
    ("algorithm", 10),
    ("min_us", 11),
    ("avg_us", 11),
    ("max_us", 11),
    ("algbw_GB/s", 11),
    ("busbw_GB/s", 11),
    ("wrong", 6),
];

fn print_row(json: bool, r: &Row) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string(r).unwrap_or_default());
        return Ok(());
    }
    let f = |x: f64| format!("{x:.2}");
    outln!(
        "{}",
        super::stats::table_line(
            &[
                r.bytes.to_string(),
                r.count.to_string(),
                r.dtype.clone(),
                r.algorithm.to_string(),
                f(r.time_min_us),
                f(r.time_avg_us),
                f(r.time_max_us),
                f(r.algbw_gbps),
                f(r.busbw_gbps),
                r.wrong.map_or_else(|| "-".into(), |w| w.to_string()),
            ],
            &COLUMNS
        )
    );
    Ok(())
}

/// This machine's host name, for benchmark headers.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// An element type the benchmark can fill and check.
trait Elem: Reducible {
    fn of(x: f64) -> Self;
    fn to(self) -> f64;
}

macro_rules! elem {
    ($t:ty, $of:expr, $to:expr) => {
        impl Elem for $t {
            fn of(x: f64) -> Self {
                $of(x)
            }
            fn to(self) -> f64 {
                $to(self)
            }
        }
    };
}
elem!(f32, |x| x as f32, f64::from);
elem!(f64, |x| x, |x| x);
elem!(i32, |x| x as i32, f64::from);
elem!(i64, |x| x as i64, |x| x as f64);
elem!(half::f16, half::f16::from_f64, half::f16::to_f64);
elem!(half::bf16, half::bf16::from_f64, half::bf16::to_f64);

fn reduce_op(s: &str) -> anyhow::Result<ReduceOp> {
    Ok(match s {
        "sum" => ReduceOp::Sum,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "prod" => ReduceOp::Prod,
        o => bail!("--reduce-op {o:?}: sum, max, min or prod"),
    })
}

/// Rank `r`'s input value at `i` (small integers, exact in every dtype).
fn input(r: usize, i: usize, op: ReduceOp) -> f64 {
    match op {
        ReduceOp::Prod => ((i + r) % 2 + 1) as f64,
        _ => ((r + 1) * (i % 7 + 1)) as f64,
    }
}

fn reduced(n: usize, i: usize, op: ReduceOp) -> f64 {
    let vals = (0..n).map(|r| input(r, i, op));
    match op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Max => vals.fold(f64::MIN, f64::max),
        ReduceOp::Min => vals.fold(f64::MAX, f64::min),
        _ => vals.product(),
    }
}

/// The sizes from `min` to `max`, multiplied by `step` each time.
fn sizes(cfg: &Config) -> Vec<usize> {
    let mut v = Vec::new();
    let mut b = cfg.min_bytes.max(1);
    while b <= cfg.max_bytes {
        v.push(b);
        if cfg.step <= 1 {
            break;
        }
        b = b.saturating_mul(cfg.step);
    }
    v
}

/// Every rank runs this; rank 0 prints. With `--check`, the elements found wrong over every
/// size and rank (the same number on every rank); 0 without it.
pub fn run_rank(comm: &Comm, cfg: &Config) -> anyhow::Result<u64> {
    let co = Collectives::new(comm, 16 << 20)?;
    let op = reduce_op(&cfg.reduce_op)?;
    if comm.rank() == 0 {
        let h = Header {
            bench: "header",
            op: cfg.op.name(),
            host: host_name(),
            backend: &cfg.backend,
            ranks: comm.size(),
            version: env!("CARGO_PKG_VERSION"),
            dtype: &cfg.dtype,
            reduce_op: &cfg.reduce_op,
        };
        if cfg.json {
            outln!("{}", serde_json::to_string(&h)?);
        } else {
            outln!(
                "# pto bench {}: host {}, backend {}, {} ranks, pto {}, dtype {}{}",
                h.op,
                h.host,
                h.backend,
                h.ranks,
                h.version,
                h.dtype,
                if cfg.op == Op::Allreduce || cfg.op == Op::ReduceScatter {
                    format!(", op {}", h.reduce_op)
                } else {
                    String::new()
                }
            );
            outln!("{}", super::stats::table_header(&COLUMNS));
        }
    }
    let mut wrong = 0u64;
    for bytes in sizes(cfg) {
        let row = match cfg.dtype.as_str() {
            "float32" | "f32" => measure::<f32>(&co, comm, cfg, op, bytes)?,
            "float64" | "f64" => measure::<f64>(&co, comm, cfg, op, bytes)?,
            "int32" | "i32" => measure::<i32>(&co, comm, cfg, op, bytes)?,
            "int64" | "i64" => measure::<i64>(&co, comm, cfg, op, bytes)?,
            "float16" | "f16" => measure::<half::f16>(&co, comm, cfg, op, bytes)?,
            "bfloat16" | "bf16" => measure::<half::bf16>(&co, comm, cfg, op, bytes)?,
            d => bail!("--dtype {d:?}: float32, float64, int32, int64, float16 or bfloat16"),
        };
        wrong += row.wrong.unwrap_or(0);
        if comm.rank() == 0 {
            print_row(cfg.json, &row)?;
        }
    }
    if cfg.check && comm.rank() == 0 && !cfg.json {
        // nccl-tests' closing line, which its users read (and grep) for the verdict.
        outln!(
            "# Out of bounds values : {wrong} {}",
            if wrong == 0 { "OK" } else { "FAILED" }
        );
    }
    comm.barrier()?;
    Ok(wrong)
}

/// `--check` found wrong elements: the benchmark fails with exit code 1 (a wrong result), as
/// nccl-tests' `#wrong` column leads its users to expect.
#[derive(Debug, thiserror::Error)]
#[error("wrong result: {what} of {op} were wrong (the rows' `wrong` column says where)", what = match .wrong {
    Some(w) => format!("{w} elements"),
    None => "elements".to_string(),
})]
pub struct WrongResult {
    pub op: &'static str,
    /// How many, when the caller knows (not the parent of rank processes).
    pub wrong: Option<u64>,
}

impl Config {
    /// The verdict of a run whose ranks found `wrong` elements.
    pub fn verdict(&self, wrong: u64) -> Result<(), WrongResult> {
        if wrong == 0 {
            return Ok(());
        }
        Err(WrongResult {
            op: self.op.name(),
            wrong: Some(wrong),
        })
    }

    /// The verdict of rank processes, one of which exited with 1 (a wrong result).
    pub fn wrong_in_ranks(&self) -> WrongResult {
        WrongResult {
            op: self.op.name(),
            wrong: None,
        }
    }
}

/// What a measured allreduce calls (the window is this size's own).
enum Run {
    Algo(Algorithm),
    Window(Window),
}

/// One call of the collective on the buffers; `out` receives results where the call does not
/// work in place.
fn call<T: Elem>(
    co: &Collectives,
    op: Op,
    rop: ReduceOp,
    data: &mut [T],
    out: &mut Vec<T>,
    target: &Run,
) -> anyhow::Result<()> {
    match op {
        Op::Allreduce => match target {
            Run::Algo(a) => co.allreduce_with(data, rop, *a)?,
            Run::Window(w) => co.allreduce_window::<T>(w, 0, data.len(), rop)?,
        },
        Op::Allgather => co.allgather(data, out)?,
        Op::ReduceScatter => *out = co.reduce_scatter(data, rop)?,
        Op::Broadcast => co.broadcast(data, 0)?,
        Op::AllToAll => co.all_to_all(data, out)?,
    }
    Ok(())
}

fn measure<T: Elem>(
    co: &Collectives,
    comm: &Comm,
    cfg: &Config,
    rop: ReduceOp,
    bytes: usize,
) -> anyhow::Result<Row> {
    let (me, n) = (comm.rank(), comm.size());
    let size = std::mem::size_of::<T>();
    // `count` as nccl-tests counts it: the whole buffer (allgather: the output; reduce_scatter
    // and all_to_all: the input, a multiple of the rank count).
    let mut count = (bytes / size).max(1);
    if matches!(cfg.op, Op::Allgather | Op::ReduceScatter | Op::AllToAll) {
        count = count.div_ceil(n) * n;
    }
    let mine = if cfg.op == Op::Allgather {
        count / n
    } else {
        count
    };
    let mut data: Vec<T> = (0..mine).map(|i| T::of(input(me, i, rop))).collect();
    let mut out: Vec<T> = vec![
        T::of(0.0);
        if cfg.op == Op::Allgather || cfg.op == Op::AllToAll {
            count
        } else {
            0
        }
    ];
    let iters = cfg
        .iters
        .unwrap_or(((64usize << 20) / bytes.max(1)).clamp(5, 2000));
    let run = match Target::parse(&cfg.algorithm).unwrap_or(Target::Algo(Algorithm::Auto)) {
        Target::Algo(a) => Run::Algo(a),
        Target::Window => {
            let w = comm.alloc_window(&WindowSpec::new((mine * size).max(1)))?;
            w.put_slice(me, 0, &data)?;
            w.barrier()?;
            Run::Window(w)
        }
    };
    for _ in 0..cfg.warmup {
        call(co, cfg.op, rop, &mut data, &mut out, &run)?;
    }
    comm.barrier()?;
    let t = Instant::now();
    for _ in 0..iters {
        call(co, cfg.op, rop, &mut data, &mut out, &run)?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64;
    let mut all = vec![0f64; n];
    co.allgather(&[us], &mut all)?;
    let wrong = if cfg.check {
        let w = check::<T>(co, cfg.op, rop, me, n, count, &run)?;
        let mut ws = vec![0u64; n];
        co.allgather(&[w], &mut ws)?;
        Some(ws.iter().sum())
    } else {
        None
    };
    let avg = all.iter().sum::<f64>() / n as f64;
    let min = all.iter().copied().fold(f64::MAX, f64::min);
    let max = all.iter().copied().fold(f64::MIN, f64::max);
    let total = count * size;
    let algbw = total as f64 / avg / 1e3;
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    Ok(Row {
        bench: cfg.op.name(),
        bytes: total,
        count,
        dtype: T::DTYPE.to_string(),
        algorithm: match (cfg.op, &run) {
            (Op::Allreduce, Run::Window(_)) => "window",
            (Op::Allreduce, Run::Algo(a)) => co.allreduce_algorithm_with::<T>(total, *a),
            _ => "mesh",
        },
        time_min_us: r2(min),
        time_avg_us: r2(avg),
        time_max_us: r2(max),
        algbw_gbps: r2(algbw),
        busbw_gbps: r2(algbw * cfg.op.bus_factor(n)),
        wrong,
    })
}

/// `PTO_BENCH_INJECT_WRONG=R` (a test hook, not a setting): rank R corrupts one element of the
/// result it checks, so that tests can see what a wrong collective does to the verdict.
fn injected_wrong_rank() -> Option<usize> {
    std::env::var("PTO_BENCH_INJECT_WRONG")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// One call on fresh inputs; how many elements of this rank's result are wrong.
fn check<T: Elem>(
    co: &Collectives,
    op: Op,
    rop: ReduceOp,
    me: usize,
    n: usize,
    count: usize,
    run: &Run,
) -> anyhow::Result<u64> {
    let mine = if op == Op::Allgather {
        count / n
    } else {
        count
    };
    let mut data: Vec<T> = (0..mine).map(|i| T::of(input(me, i, rop))).collect();
    let mut out: Vec<T> = vec![
        T::of(-1.0);
        if op == Op::Allgather || op == Op::AllToAll {
            count
        } else {
            0
        }
    ];
    if let Run::Window(w) = run {
        // Fresh inputs into the window, reduced there, read back.
        w.put_slice(me, 0, &data)?;
        w.barrier()?;
        call(co, op, rop, &mut data, &mut out, run)?;
        data = w.get_vec(me, 0, data.len())?;
        w.barrier()?;
    } else {
        call(co, op, rop, &mut data, &mut out, run)?;
    }
    if let Some(r) = injected_wrong_rank() {
        // Test hook: this rank's result gets one wrong element, to test the verdict.
        if r == me {
            let v = if matches!(op, Op::Allreduce | Op::Broadcast) {
                data.first_mut()
            } else {
                out.first_mut()
            };
            if let Some(v) = v {
                *v = T::of(v.to() + 1.0);
            }
        }
    }
    let bad = |got: T, want: f64| (got.to() - want).abs() > 1e-6 * want.abs().max(1.0);
    let block = count / n;
    let wrong = match op {
        Op::Allreduce => (0..count)
            .filter(|&i| bad(data[i], reduced(n, i, rop)))
            .count(),
        Op::Allgather => (0..count)
            .filter(|&i| bad(out[i], input(i / block, i % block, rop)))
            .count(),
        Op::ReduceScatter => (0..out.len())
            .filter(|&j| {
                // This rank's share: its block of the reduced vector.
                let share = pto_core::block_range(count, me as u32, n as u32);
                bad(out[j], reduced(n, share.start + j, rop))
            })
            .count(),
        Op::Broadcast => (0..count)
            .filter(|&i| bad(data[i], input(0, i, rop)))
            .count(),
        // Block s of the result is block `me` of rank s's input.
        Op::AllToAll => (0..count)
            .filter(|&i| bad(out[i], input(i / block, me * block + i % block, rop)))
            .count(),
    };
    Ok(wrong as u64)
}
