//! Command-line definitions.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// pto: tensor task graphs on simulated chips.
#[derive(Debug, Parser)]
#[command(name = "pto", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an example and check it against its golden (exit 0 only on a match).
    Run(RunArgs),
    /// List the examples.
    List,
    /// Run a benchmark.
    Bench(BenchArgs),
    /// Print the PTO_* environment variables pto reads, with their values.
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

#[derive(Debug, Args)]
pub struct CleanArgs {
    /// Only list; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also remove segments whose creator is alive (dangerous while pto runs).
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The example (see `pto list`).
    pub example: String,
    /// Ranks (chips) for a distributed example (default 1; under mpirun, the job's size).
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Where the ranks run: shm (processes on this host), local (threads) or mpi (the
    /// processes of an MPI job; started with mpirun when pto is not already under it).
    #[arg(long, default_value = "shm")]
    pub backend: String,
    /// Problem size, in the example's own unit.
    #[arg(long)]
    pub size: Option<usize>,
    /// Logical AIC cores per chip.
    #[arg(long, default_value_t = 2)]
    pub aic: u32,
    /// Logical AIV cores per chip.
    #[arg(long, default_value_t = 4)]
    pub aiv: u32,
    /// Write a Chrome trace (open it in Perfetto) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    pub what: BenchKind,
    /// Backend for `comm`: local (threads) or shm (processes).
    #[arg(long, default_value = "shm")]
    pub backend: String,
    /// Ranks for `comm`.
    #[arg(long, default_value_t = 2)]
    pub ranks: usize,
    /// Tasks per pattern.
    #[arg(long, default_value_t = 200_000)]
    pub tasks: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// OS threads for the chip (default: one per CPU).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The OpenMP anchor binary (`omp_deps` from shared/anchors), run in the same process
    /// run as the baseline.
    #[arg(long)]
    pub omp_anchor: Option<PathBuf>,
    /// Print JSON lines instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BenchKind {
    /// Per-task cost of dependency-inferred graphs: a serial chain and a 1 -> N fan.
    Dag,
    /// Barrier, put bandwidth and signal ping-pong across ranks.
    Comm,
    /// Allreduce (f32 sum) over OSU-style sizes from 8 B to 64 MiB.
    Allreduce,
    /// Deferred completion: condition-to-consumer latency and completion-queue throughput.
    Deferred,
    /// The host Worker: init with 4 chips, and the round trip of an empty chip task.
    Worker,
}
