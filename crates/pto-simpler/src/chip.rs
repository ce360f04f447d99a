//! The chip program `simpler`: what a chip does with a request from the host.

use std::collections::HashMap;

use pto_core::{CoreKind, Orch, OrchError, Tensor};
use pto_worker::ChipCall;

use crate::abi::INVALID_TASK;
use crate::library;
use crate::request::{self, ArgTensor, Request, RunRequest, DOMAIN_ROW};
use crate::runtime::{descriptor, dtype_of, Kernel, Session};
use crate::{device, domain, SimplerError};

fn orch_err(e: SimplerError) -> OrchError {
    OrchError::Other(e.to_string())
}

/// The chip program: reads the request (tensor 0) and runs a callable, or allocates or frees a
/// domain.
///
/// # Errors
///
/// A request that cannot be read, a library that cannot be loaded, an orchestration's fatal
/// error, a domain that cannot be made: each names the callable, the chip and the cause.
pub fn chip_program(orch: &mut Orch<'_>, call: &ChipCall) -> Result<(), OrchError> {
    crate::entry::install_crash_notes();
    let bytes = orch.read_bytes(call.tensor(0)?)?;
    let req = request::parse(&bytes).map_err(orch_err)?;
    match req {
        Request::Run(r) => run(orch, call, &r).map_err(orch_err),
        Request::AllocDomain(d) => {
            let world = call
                .comm
                .as_ref()
                .ok_or_else(|| {
                    orch_err(SimplerError::Domain {
                        name: d.name.clone(),
                        why: "this Worker has no communication (make it with comm)".into(),
                    })
                })?
                .comm();
            let row = domain::alloc(call.rank, world, &d).map_err(orch_err)?;
            let pos = d
                .members
                .iter()
                .position(|&m| m == call.rank)
                .ok_or_else(|| OrchError::msg(format!("chip {} is not a member", call.rank)))?;
            let out = call.tensor(1)?;
            let mine = out
                .view(&[1, DOMAIN_ROW], &[pos, 0])
                .map_err(|e| OrchError::msg(format!("domain result tensor: {e}")))?;
            orch.write(&mine, &row)
        }
        Request::FreeDomain { id } => domain::free(call.rank, id).map_err(orch_err),
        Request::AllocDevice { id, nbytes } => {
            let addr = device::alloc(call.rank, id, nbytes).map_err(orch_err)?;
            orch.write(call.tensor(1)?, &[addr])
        }
        Request::FreeDevice { id } => device::free(call.rank, id).map_err(orch_err),
        Request::CopyTo { id, offset, index } => {
            let src = call.tensor(index)?;
            let bytes = orch.read_bytes(src)?;
            let dst = device::bytes(call.rank, id, offset, bytes.len() as u64).map_err(orch_err)?;
            orch.write_bytes(&dst, &bytes)
        }
        Request::CopyFrom { id, offset, index } => {
            let dst = call.tensor(index)?;
            let (s0, e0) = dst.region().byte_range();
            let src = device::bytes(call.rank, id, offset, (e0 - s0) as u64).map_err(orch_err)?;
            let bytes = orch.read_bytes(&src)?;
            orch.write_bytes(dst, &bytes)
        }
    }
}

/// The descriptor of a tensor at `offset` in memory of this chip (`place`: its base address,
/// length and name), checked to fit.
fn in_memory(
    (base, len, what): (u64, usize, String),
    offset: u64,
    shape: &[u32],
    dtype: &str,
) -> Result<crate::abi::ChipTensor, String> {
    let (code, dt) = dtype_of(dtype)?;
    let shape: Vec<usize> = shape.iter().map(|&s| s as usize).collect();
    let need = Tensor::byte_size(&shape, dt).map_err(|e| e.to_string())?;
    if offset + need as u64 > len as u64 {
        return Err(format!(
            "{need} bytes at offset {offset} do not fit {what} of {len} bytes"
        ));
    }
    Ok(descriptor(base + offset, &shape, code, INVALID_TASK))
}

/// The bytes of a host tensor argument at its start, in this process.
fn host_addr(t: &Tensor) -> u64 {
    t.buffer().addr() as u64 + (t.region().offset() * t.dtype().size()) as u64
}

fn run(orch: &mut Orch<'_>, call: &ChipCall, r: &RunRequest) -> Result<(), SimplerError> {
    let c = &r.callable;
    let fail = |why: String| SimplerError::Run {
        callable: c.name.clone(),
        orchestration: c.source.clone(),
        chip: call.rank,
        why,
    };
    let member = r
        .members
        .iter()
        .find(|m| m.chip == call.rank)
        .ok_or_else(|| fail("the request has no arguments for this chip".into()))?;
    let olib = library::open(&c.orchestration)?;
    let glue = olib.orchestration_glue()?;
    let entry = olib.function(&c.function, "entry")?;
    let config = if c.config.is_empty() {
        None
    } else {
        Some(olib.function(&c.config, "config")?)
    };
    let mut kernels = HashMap::new();
    for k in &c.kernels {
        let lib = library::open(&k.path)?;
        let core = match k.core.as_str() {
            "aic" => Some(CoreKind::Aic),
            "aiv" => Some(CoreKind::Aiv),
            "" => None,
            other => {
                return Err(fail(format!(
                    "kernel func_id {}: core type {other:?} (aic or aiv)",
                    k.func_id
                )))
            }
        };
        let entry = lib.kernel_entry()?;
        kernels.insert(
            k.func_id,
            Kernel {
                lib,
                entry,
                core,
                source: if k.source.is_empty() {
                    k.path.clone()
                } else {
                    k.source.clone()
                },
            },
        );
    }
    let (aic, aiv) = orch.core_counts();
    let mut session = Session::new(orch, call.rank, c.name.clone(), kernels, (aic, aiv));
    for (buffer, base, len) in domain::all_parts(call.rank)
        .into_iter()
        .chain(device::all(call.rank))
    {
        session.add_region(buffer, base, len);
    }
    let mut tensors = Vec::with_capacity(member.tensors.len());
    for (i, a) in member.tensors.iter().enumerate() {
        let d = match a {
            ArgTensor::Host {
                index,
                offset,
                shape,
                dtype,
            } => {
                let (t, _) = call
                    .tensors
                    .get(*index)
                    .ok_or_else(|| fail(format!("tensor {i}: no host tensor {index}")))?;
                let (code, dt) = dtype_of(dtype).map_err(|e| fail(format!("tensor {i}: {e}")))?;
                let shape: Vec<usize> = shape.iter().map(|&s| s as usize).collect();
                let need = Tensor::byte_size(&shape, dt).map_err(|e| fail(e.to_string()))?;
                let (s0, e0) = t.region().byte_range();
                let have = (e0 - s0) as u64;
                let end = offset + need as u64;
                if end > have {
                    return Err(fail(format!(
                        "tensor {i}: shape {shape:?} of {dtype} at byte {offset} needs {end} bytes, the host tensor has {have}"
                    )));
                }
                session.add_region(
                    t.buffer().clone(),
                    t.buffer().addr() as u64,
                    t.buffer().len(),
                );
                descriptor(host_addr(t) + offset, &shape, code, INVALID_TASK)
            }
            ArgTensor::Device {
                id,
                offset,
                shape,
                dtype,
            } => {
                let (_, base, len) = device::get(call.rank, *id).ok_or_else(|| {
                    fail(format!(
                        "tensor {i}: chip memory #{id} is not allocated on this chip"
                    ))
                })?;
                let place = (base, len, format!("chip memory #{id}"));
                in_memory(place, *offset, shape, dtype)
                    .map_err(|e| fail(format!("tensor {i}: {e}")))?
            }
            ArgTensor::Window {
                domain: id,
                offset,
                shape,
                dtype,
            } => {
                let (_, base, len) = domain::local_part(call.rank, *id).ok_or_else(|| {
                    fail(format!(
                        "tensor {i}: domain {id} is not allocated on this chip"
                    ))
                })?;
                let place = (base, len, "the domain's window".to_string());
                in_memory(place, *offset, shape, dtype)
                    .map_err(|e| fail(format!("tensor {i}: {e}")))?
            }
        };
        tensors.push(d);
    }
    let given = tensors.len() + member.scalars.len();
    let note = format!(
        "chip {}: orchestration {} ({}) of callable {}",
        call.rank, c.function, c.source, c.name
    )
    .into_bytes();
    let _mark = crate::entry::Running::new(&note);
    if let Some(cfg) = config {
        let expected = crate::entry::call_orchestration(
            &mut session,
            glue,
            cfg,
            true,
            &tensors,
            &member.scalars,
        )
        .map_err(|e| fail(format!("{} threw: {e}", c.config)))?;
        if expected >= 0 && expected as usize != given {
            return Err(fail(format!(
                "{} expects {expected} arguments, the task has {given} ({} tensors, {} scalars)",
                c.config,
                tensors.len(),
                member.scalars.len()
            )));
        }
    }
    // The implicit outer scope simpler's runtime wraps the entry in.
    session.scope_begin(false);
    if let Err(e) = crate::entry::call_orchestration(
        &mut session,
        glue,
        entry,
        false,
        &tensors,
        &member.scalars,
    ) {
        session.fail(format!("{} threw: {e}", c.function));
    }
    match session.fatal.take() {
        Some(why) => Err(fail(why)),
        None => Ok(()),
    }
}
