//! Chip programs of the distributed examples, by name, for any host that drives a
//! [`pto_worker::Worker`]: the Rust Worker examples here and the Python package (`pto-py`).
//! Each takes its sizes from its tensor arguments, so a host only has to stack one row per
//! chip (`[chips, ...]`) and start the program on every chip as a group.

use pto_core::{DType, KernelRegistry, Orch, OrchError, TaskArgs, Tensor};
use pto_worker::ChipCall;

use crate::ExampleError;

/// A chip program: the orchestration a chip runs for one host task.
pub type ProgramFn = fn(&mut Orch<'_>, &ChipCall) -> Result<(), OrchError>;

/// One registered chip program: its name, its kernels and its orchestration.
#[derive(Clone, Copy, Debug)]
pub struct ChipProgram {
    /// The name hosts submit it by.
    pub name: &'static str,
    /// What it does and which tensors it takes.
    pub about: &'static str,
    /// The kernels it submits.
    pub kernels: fn() -> Result<KernelRegistry, ExampleError>,
    /// The orchestration.
    pub orch: ProgramFn,
}

/// The registered chip programs.
pub const PROGRAMS: &[ChipProgram] = &[
    ChipProgram {
        name: "ffn_tp_parallel",
        about: "args x[chips,d,d], w[chips,d,d] (IN), y[chips,d,d] (OUT): y[r] = sum_k x[k] w[k] (matmul on AIC, allreduce on AIV); needs collectives",
        kernels: crate::collectives::kernels,
        orch: ffn,
    },
    ChipProgram {
        name: "allreduce_distributed",
        about: "args in[chips,n] (IN), out[chips,n] (OUT): out[r] = sum_k in[k] by the four-phase kernel; needs window buffers scratch (f32, n) and signals (u32, 16 chips)",
        kernels: crate::collectives::kernels,
        orch: allreduce_four_phase,
    },
    ChipProgram {
        name: "deferred_notify",
        about: "args in[chips,n] (IN), result[chips,n] (OUT): rank r puts in[r] into rank r+1's mailbox; a deferred wait gates result[r] = in[r-1]; needs window buffers mailbox (f32, n) and counter (u32, 1)",
        kernels: crate::notify::kernels,
        orch: deferred_notify,
    },
];

/// The program named `name`.
pub fn find(name: &str) -> Option<&'static ChipProgram> {
    PROGRAMS.iter().find(|p| p.name == name)
}

/// Row `rank` of a stacked host tensor `[chips, ...]`, as a tensor of the remaining dims.
///
/// # Errors
///
/// A tensor of fewer than two dims, or a rank past its first dim.
pub fn row(t: &Tensor, rank: usize) -> Result<Tensor, OrchError> {
    let rest = t.shape().get(1..).unwrap_or(&[]).to_vec();
    if rest.is_empty() || rank >= t.shape()[0] {
        return Err(OrchError::msg(format!(
            "chip {rank} needs row {rank} of a [chips, ...] tensor; got shape {:?}",
            t.shape()
        )));
    }
    let mut shape = vec![1];
    shape.extend_from_slice(&rest);
    let mut offs = vec![rank];
    offs.extend(rest.iter().map(|_| 0));
    Ok(t.view(&shape, &offs)?.reshape(&rest)?)
}

pub(crate) fn ffn(o: &mut Orch<'_>, call: &ChipCall) -> Result<(), OrchError> {
    let r = call.rank;
    let (x, wt, y) = (
        row(call.tensor(0)?, r)?,
        row(call.tensor(1)?, r)?,
        row(call.tensor(2)?, r)?,
    );
    let rows = x.shape()[0];
    let cols = wt.shape().get(1).copied().unwrap_or(1);
    let partial = o
        .submit(
            "matmul",
            TaskArgs::new()
                .input(&x)
                .input(&wt)
                .output(&[rows, cols], DType::F32),
        )?
        .out(0)?;
    o.submit("allreduce_sum", TaskArgs::new().inout(&partial))?;
    o.submit(
        "copy_f32",
        TaskArgs::new().input(&partial).output_existing(&y),
    )?;
    Ok(())
}

pub(crate) fn allreduce_four_phase(o: &mut Orch<'_>, call: &ChipCall) -> Result<(), OrchError> {
    let r = call.rank;
    let (i, out) = (row(call.tensor(0)?, r)?, row(call.tensor(1)?, r)?);
    o.submit(
        "allreduce_4phase",
        TaskArgs::new().input(&i).output_existing(&out),
    )
    .map(|_| ())
}

pub(crate) fn deferred_notify(o: &mut Orch<'_>, call: &ChipCall) -> Result<(), OrchError> {
    let r = call.rank;
    let (i, res) = (row(call.tensor(0)?, r)?, row(call.tensor(1)?, r)?);
    let mailbox = call
        .comm
        .as_ref()
        .ok_or_else(|| OrchError::msg("deferred_notify needs a comm window (mailbox, counter)"))?
        .window(0)
        .and_then(|w| w.local_tensor("mailbox"))
        .map_err(|e| OrchError::msg(e.to_string()))?;
    crate::notify::deferred_notify_tasks(o, &i, &mailbox, &res)
}
