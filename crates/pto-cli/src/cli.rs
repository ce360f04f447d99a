//! Command-line definitions. Every number is range-checked here, so a bad value is a usage
//! error (exit 2) that names the argument and its range.

use std::path::PathBuf;

use clap::builder::TypedValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

/// pto: tensor task graphs on simulated chips.
///
/// Exit codes: 0 passed, 1 wrong result (a golden mismatch), 2 usage error (bad arguments or
/// PTO_* variables), 3 runtime failure (a failed task, a dead or stopped rank, a deadline),
/// 4 environment or setup failure (no space in /dev/shm, MPI missing), 5 a race found by
/// `pto check`, 128 + N when signal N
/// (SIGINT 130, SIGTERM 143, SIGHUP 129) ended it after stopping every child and removing its
/// segments. Logging: RUST_LOG or PTO_LOG (error, warn, info, debug, trace, or target=level
/// lists), or -v/-q; quiet (warnings only) by default.
#[derive(Debug, Parser)]
#[command(name = "pto", version, about, long_about)]
pub struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); overrides RUST_LOG and PTO_LOG.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only errors in the log, and no notes.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an example and check it against its golden (exit 0 only on a match), or a C
    /// plugin's program (--plugin; exit 0 only when every rank's program finished without a
    /// failed task).
    Run(RunArgs),
    /// Run an example (or a C plugin's program) under the happens-before checker: report
    /// window accesses of different ranks that no notify -> wait, barrier or collective orders
    /// (exit 5), and the wait-for graph when a wait passes its deadline.
    Check(CheckArgs),
    /// List the examples, or a C plugin's programs, kernels and buffers (--plugin).
    List(ListArgs),
    /// Print the folder that holds pto.h, the C header of plugins
    /// (cc -shared -fPIC -I"$(pto include-dir)" mine.c -o libmine.so), or with --simpler the
    /// folder of pto's simpler-compatible headers (tensor.h, pto_orchestration_api.h, ...).
    IncludeDir(IncludeDirArgs),
    /// Run a benchmark.
    Bench(BenchArgs),
    /// Print the PTO_* environment variables pto reads, with their values and ranges.
    Env,
    /// List pto shared-memory segments and remove those whose creator is dead.
    Clean(CleanArgs),
    /// Internal: the body of a rank process started by `pto` itself.
    #[command(hide = true, name = "__rank")]
    Rank {
        /// The job.
        job: String,
    },
}

/// The problem size and the cores of every chip (`run` and `check`).
#[derive(Debug, Args)]
pub struct ChipArgs {
    /// Problem size, in the example's own unit (at least 1; it must fit in memory).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=pto_examples::MAX_SIZE as u64).map(|v| v as usize))]
    pub size: Option<usize>,
    /// Logical AIC cores per chip, 0 to 1024.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub aic: u32,
    /// Logical AIV cores per chip, 0 to 2048.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=2048))]
    pub aiv: u32,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The example (see `pto list`), or with --plugin the plugin's program.
    pub example: String,
    /// Load this C plugin and check its program EXAMPLE.
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// Ranks, 1 to 1024.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=pto_comm::MAX_RANKS as u64).map(|v| v as usize))]
    pub ranks: usize,
    /// Where the ranks run: threads of this process (local) or processes through the Worker
    /// (shm).
    #[arg(long, value_enum, default_value = "local")]
    pub backend: BackendArg,
    #[command(flatten)]
    pub chip: ChipArgs,
    /// Run it this many times, 1 to 10000, each on a schedule perturbed from its own seed
    /// (pauses before puts, notifies and kernels), so that order-dependent bugs show.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10_000).map(|v| v as usize))]
    pub schedules: usize,
    /// The first schedule's seed (the k-th uses seed + k); without it and with one schedule,
    /// the run is not perturbed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one JSON object: every race as an object, the wait-for graph, the run's verdict.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// A C plugin (a shared library built against pto.h): list what it registers.
    #[arg(long)]
    pub plugin: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CleanArgs {
    /// Only list; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also remove segments whose creator is alive (dangerous while pto runs).
    #[arg(long)]
    pub all: bool,
}

/// Where ranks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// Processes on this host over POSIX shared memory.
    Shm,
    /// Threads of this process.
    Local,
    /// The processes of an MPI job (started with mpirun when pto is not already under it).
    Mpi,
}

impl BackendArg {
    pub fn backend(self) -> pto_comm::Backend {
        match self {
            BackendArg::Shm => pto_comm::Backend::Shm,
            BackendArg::Local => pto_comm::Backend::Local,
            BackendArg::Mpi => pto_comm::Backend::Mpi,
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The example (see `pto list`), or with --plugin the plugin's program.
    pub example: String,
    /// Load this C plugin (a shared library built against pto.h, see `pto include-dir`) and
    /// run its program EXAMPLE on every rank.
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// Ranks (chips) for a distributed example, 1 to 1024 (default 1; under mpirun, the job's
    /// size).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=pto_comm::MAX_RANKS as u64).map(|v| v as usize))]
    pub ranks: Option<usize>,
    /// Where the ranks run.
    #[arg(long, value_enum, default_value = "shm")]
    pub backend: BackendArg,
    #[command(flatten)]
    pub chip: ChipArgs,
    /// Write a Chrome trace (open it in Perfetto) to this file: lanes `rank R / chip / AIC0`,
    /// an arrow from each task to its consumers.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write the task graph that ran (every chip's tasks and their dependencies) to this file
    /// in Graphviz dot.
    #[arg(long)]
    pub dag: Option<PathBuf>,
    /// Print one JSON object (always one, also on failure: see its `error` field).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    pub what: BenchKind,
    /// Backend for `comm` and `allreduce`.
    #[arg(long, value_enum, default_value = "shm")]
    pub backend: BackendArg,
    /// Ranks for `comm` and `allreduce`, 1 to 1024.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=pto_comm::MAX_RANKS as u64).map(|v| v as usize))]
    pub ranks: usize,
    /// Tasks per pattern (`dag`), 1 to 100000000.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000).map(|v| v as usize))]
    pub tasks: usize,
    /// Dag: measure only these patterns (repeat the flag or separate with commas:
    /// chain, fan, diamond, granularity). Default: all four.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub pattern: Vec<DagPattern>,
    /// Repetitions (the median is reported), 1 to 1000.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000).map(|v| v as usize))]
    pub reps: usize,
    /// OS threads for the chip, 1 to 1024 (default: one per CPU).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024).map(|v| v as usize))]
    pub threads: Option<usize>,
    /// The OpenMP anchor, run in the same run as the baseline (the same graphs with libgomp's
    /// `depend` tasks): build it with `gcc -O2 -fopenmp -o omp_deps scripts/anchors/omp_deps.c`
    /// and pass `--omp-anchor ./omp_deps`; its ratios print beside chain, fan and diamond.
    /// pto and the anchor take turns, one repetition each, and the ratio is the median of
    /// each repetition's ratio (on a shared machine the CPUs' speed drifts within seconds).
    #[arg(long)]
    pub omp_anchor: Option<PathBuf>,
    /// The C plugin for `plugin` (built from examples/plugin/empty.c).
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// Scale: the largest rank count, 2 to 1024 (the counts are the powers of two below it, then it).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(2..=pto_comm::MAX_RANKS as u64).map(|v| v as usize))]
    pub max_ranks: usize,
    /// Scale: the Open MPI anchor binary (`mpi_bar8` from shared/anchors), run under `mpirun`
    /// at the same rank counts in the same run as the baseline.
    #[arg(long)]
    pub mpi_anchor: Option<PathBuf>,
    /// Collectives: the smallest message, in bytes (at least 1; K, M and G suffixes are
    /// binary: 64K, 1M).
    #[arg(short = 'b', long, default_value = "8", value_parser = parse_bytes)]
    pub min_bytes: usize,
    /// Collectives: the largest message, in bytes (up to 4G; suffixes as for -b).
    #[arg(short = 'e', long, default_value = "64M", value_parser = parse_bytes)]
    pub max_bytes: usize,
    /// Collectives: each size is the one before times this, 2 to 1024.
    #[arg(short = 'f', long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(2..=1024).map(|v| v as usize))]
    pub step_factor: usize,
    /// Collectives: timed calls per size, 1 to 1000000 (default: by size, 5 to 2000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000).map(|v| v as usize))]
    pub iters: Option<usize>,
    /// Collectives: untimed calls per size first, 0 to 100000.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=100_000).map(|v| v as usize))]
    pub warmup: usize,
    /// Collectives: the element type (float32, float64, int32, int64, float16, bfloat16).
    #[arg(long, default_value = "float32")]
    pub dtype: String,
    /// Collectives: the reduction of allreduce and reduce_scatter (sum, max, min, prod).
    #[arg(long, default_value = "sum")]
    pub reduce_op: String,
    /// Collectives: verify every rank's result, print how many elements were wrong (the `wrong`
    /// column, and nccl-tests' closing `# Out of bounds values : N OK|FAILED` line) and exit 1
    /// when any was.
    #[arg(long)]
    pub check: bool,
    /// Allreduce: the algorithm (auto, mesh, two-phase, ring, single-copy, tree), or `window`: the
    /// data already in a window (`allreduce_window`, no copy in or out: the memory-limit
    /// reference the others are measured against).
    #[arg(long, default_value = "auto")]
    pub algorithm: String,
    /// Print JSON lines instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A pattern of `pto bench dag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DagPattern {
    /// Every task updates one tensor (INOUT): a serial chain.
    Chain,
    /// One task writes a tensor, every other task reads it and writes its own cell.
    Fan,
    /// Layers of width 8, each task reading two tasks of the layer before.
    Diamond,
    /// The smallest busy-wait task at which the threads reach 50% efficiency (METG(50%)).
    Granularity,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BenchKind {
    /// Per-task cost of dependency-inferred graphs: a serial chain and a 1 -> N fan.
    Dag,
    /// Barrier, put bandwidth and signal ping-pong across ranks.
    Comm,
    /// Allreduce: time over ranks, algbw and busbw per size (-b, -e, -f, --dtype, --reduce-op,
    /// --check; on --backend mpi, MPI_Allreduce beside it).
    Allreduce,
    /// Allgather, as allreduce.
    Allgather,
    /// Reduce-scatter, as allreduce.
    #[value(alias = "reduce_scatter")]
    ReduceScatter,
    /// Broadcast from rank 0, as allreduce.
    Broadcast,
    /// All-to-all, as allreduce.
    #[value(alias = "all_to_all")]
    AllToAll,
    /// Deferred completion: condition-to-consumer latency and completion-queue throughput.
    Deferred,
    /// The host Worker: init with 4 chips, and the round trip of an empty chip task.
    Worker,
    /// A C plugin's kernel task beside a built-in one's (--plugin, see examples/plugin/empty.c).
    Plugin,
    /// Bring-up, barrier, small allreduce and close through the Worker from 2 to --max-ranks
    /// ranks, with a fit of how each grows (--mpi-anchor: Open MPI's beside it).
    Scale,
}

/// A byte count: digits with an optional binary suffix (`K`, `M`, `G`, any case, an optional
/// trailing `B` or `iB`), from 1 byte to 4 GiB.
fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 10),
        Some('m') => (&body[..body.len() - 1], 20),
        Some('g') => (&body[..body.len() - 1], 30),
        _ => (body, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{t:?} is not a byte count (write 8, 64K, 1M or 4G)"))?;
    let v = n
        .checked_mul(1u64 << shift)
        .filter(|v| (1..=1u64 << 32).contains(v))
        .ok_or_else(|| format!("{t:?} is out of range: 1 byte to 4G"))?;
    usize::try_from(v).map_err(|_| format!("{t:?} does not fit this machine's sizes"))
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts_take_binary_suffixes_and_refuse_nonsense() {
        assert_eq!(parse_bytes("8"), Ok(8));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        assert_eq!(parse_bytes("1m"), Ok(1 << 20));
        assert_eq!(parse_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(parse_bytes("4G"), Ok(4 << 30));
        assert_eq!(parse_bytes("2kb"), Ok(2048));
        for bad in ["0", "", "K", "5G", "-1", "1.5M", "12Q"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}

/// `pto include-dir` options.
#[derive(Debug, clap::Args)]
pub struct IncludeDirArgs {
    /// The folder of pto's headers for simpler's kernels and orchestrations (compile them with
    /// -I"$(pto include-dir --simpler)" before pto-isa's folders; see docs/design/simpler.md).
    #[arg(long)]
    pub simpler: bool,
}
