//! Host orchestration from Python: [`HostOrch`] records the submissions `orch_fn` makes
//! (checked against the Worker's [`Catalog`] when they are made), for the Worker to run.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use pto_core::{ArgMode, TaskArgs, Tensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use crate::args::{items, repr, string, type_name, usize_in};
use crate::buffer::{is_ndarray, tensor_of};
use crate::errors::{pto_err, Kind};

/// One recorded argument.
#[derive(Debug)]
pub(crate) enum Arg {
    Tensor(Tensor, ArgMode),
    F64(f64),
    I64(i64),
}

#[derive(Debug)]
pub(crate) enum Target {
    Chip(usize),
    Group(Vec<usize>),
    Sub(String),
}

#[derive(Debug)]
pub(crate) struct Submission {
    pub(crate) target: Target,
    pub(crate) program: String,
    pub(crate) args: Vec<Arg>,
}

/// `args` of a submission: `(mode, array)` pairs (from `pto.IN` and friends) and numbers.
/// `func` names the call in errors.
fn parse_args(args: Option<&Bound<'_, PyAny>>, func: &str) -> PyResult<Vec<Arg>> {
    let Some(args) = args.filter(|a| !a.is_none()) else {
        return Ok(Vec::new());
    };
    let list = items(args, &format!("{func}: args"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, a) in list.iter().enumerate() {
        let what = format!("{func}: args[{i}]");
        if let Ok(t) = a.cast::<PyTuple>() {
            if t.len() != 2 || !t.get_item(0)?.is_instance_of::<PyString>() {
                return Err(PyTypeError::new_err(format!(
                    "{what} must be pto.IN(array), pto.OUT(array), pto.INOUT(array), \
                     pto.NODEP(array) or a number, not a tuple of {} items",
                    t.len()
                )));
            }
            let mode: String = t.get_item(0)?.extract()?;
            let m = match mode.as_str() {
                "in" => ArgMode::In,
                "out" => ArgMode::OutputExisting,
                "inout" => ArgMode::InOut,
                "nodep" => ArgMode::NoDep,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "{what}: unknown argument mode {}: use pto.IN, pto.OUT, pto.INOUT \
                         or pto.NODEP",
                        repr(other)
                    )))
                }
            };
            let writes = matches!(m, ArgMode::OutputExisting | ArgMode::InOut);
            let label = format!("{what} ({})", mode.to_uppercase());
            out.push(Arg::Tensor(tensor_of(&t.get_item(1)?, &label, writes)?, m));
        } else if is_ndarray(a)? {
            return Err(PyTypeError::new_err(format!(
                "{what} is a bare array: wrap it as pto.IN(a), pto.OUT(a), pto.INOUT(a) or \
                 pto.NODEP(a) to say how the task uses it"
            )));
        } else if type_name(a) == "bool" || type_name(a) == "bool_" {
            return Err(PyTypeError::new_err(format!(
                "{what} is a bool: pass scalars as int or float"
            )));
        } else if a.hasattr("__index__")? {
            match a.extract::<i64>() {
                Ok(v) => out.push(Arg::I64(v)),
                Err(_) => {
                    return Err(PyValueError::new_err(format!(
                        "{what}: the int is outside the 64-bit range"
                    )))
                }
            }
        } else if let Ok(f) = a.extract::<f64>() {
            out.push(Arg::F64(f));
        } else {
            return Err(PyTypeError::new_err(format!(
                "{what} must be pto.IN(array), pto.OUT(array), pto.INOUT(array), \
                 pto.NODEP(array) or a number (int or float), not {}",
                type_name(a)
            )));
        }
    }
    Ok(out)
}

pub(crate) fn task_args(args: &[Arg]) -> TaskArgs {
    args.iter().fold(TaskArgs::new(), |t, a| match a {
        Arg::Tensor(x, ArgMode::In) => t.input(x),
        Arg::Tensor(x, ArgMode::InOut) => t.inout(x),
        Arg::Tensor(x, ArgMode::NoDep) => t.no_dep(x),
        Arg::Tensor(x, _) => t.output_existing(x),
        Arg::F64(v) => t.scalar(*v),
        Arg::I64(v) => t.scalar(*v),
    })
}

/// "the Worker has 1 chip", "the Worker has 4 chips".
pub(crate) fn chips_text(n: usize) -> String {
    format!("the Worker has {n} chip{}", if n == 1 { "" } else { "s" })
}

/// What a Worker can run, to check submissions when they are made.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    pub(crate) chips: usize,
    pub(crate) programs: BTreeSet<String>,
    pub(crate) subs: BTreeSet<String>,
    pub(crate) sub_workers: usize,
}

impl Catalog {
    fn chip(&self, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
        usize_in(
            obj,
            &format!("{what} ({})", chips_text(self.chips)),
            0,
            self.chips - 1,
        )
    }

    fn program(&self, obj: &Bound<'_, PyAny>, func: &str) -> PyResult<String> {
        let name = string(obj, &format!("{func}: program"))?;
        if !self.programs.contains(&name) {
            return Err(PyValueError::new_err(format!(
                "{func}: unknown chip program {}: use a kernel of pto.kernels() or a \
                 program of pto.programs()",
                repr(&name)
            )));
        }
        Ok(name)
    }
}

/// The host orchestration's recorder: `orch_fn` submits through it, and the Worker runs the
/// submissions in order (dependencies come from the tensors, as always).
#[pyclass(module = "pto._native")]
#[derive(Debug)]
pub(crate) struct HostOrch {
    catalog: Arc<Catalog>,
    /// `None` once the run took the submissions.
    subs: Mutex<Option<Vec<Submission>>>,
}

impl HostOrch {
    pub(crate) fn new(catalog: Arc<Catalog>) -> HostOrch {
        HostOrch {
            catalog,
            subs: Mutex::new(Some(Vec::new())),
        }
    }

    fn push(&self, target: Target, program: String, args: Vec<Arg>) -> PyResult<()> {
        let mut g = self
            .subs
            .lock()
            .map_err(|_| pto_err(Kind::Pto, "orchestration recorder poisoned"))?;
        let subs = g.as_mut().ok_or_else(|| {
            pto_err(
                Kind::Worker,
                "this orchestration has already run: submit only from inside orch_fn",
            )
        })?;
        subs.push(Submission {
            target,
            program,
            args,
        });
        Ok(())
    }

    /// Ends recording: the submissions so far.
    pub(crate) fn finish(&self) -> PyResult<Vec<Submission>> {
        Ok(self
            .subs
            .lock()
            .map_err(|_| pto_err(Kind::Pto, "orchestration recorder poisoned"))?
            .take()
            .unwrap_or_default())
    }
}

#[pymethods]
impl HostOrch {
    /// Runs chip program `program` (a built-in kernel's name, or a registered program) on chip
    /// `chip` with `args`.
    #[pyo3(signature = (chip, program, args=None))]
    fn submit_chip(
        &self,
        chip: &Bound<'_, PyAny>,
        program: &Bound<'_, PyAny>,
        args: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let chip = self.catalog.chip(chip, "submit_chip: chip")?;
        let program = self.catalog.program(program, "submit_chip")?;
        let args = parse_args(args, "submit_chip")?;
        self.push(Target::Chip(chip), program, args)
    }

    /// Starts `program` on every chip of `chips` at once (for programs that communicate).
    #[pyo3(signature = (chips, program, args=None))]
    fn submit_group(
        &self,
        chips: &Bound<'_, PyAny>,
        program: &Bound<'_, PyAny>,
        args: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let list = items(chips, "submit_group: chips")?;
        if list.is_empty() {
            return Err(PyValueError::new_err(
                "submit_group: chips must list at least one chip",
            ));
        }
        let mut group = Vec::with_capacity(list.len());
        for (i, c) in list.iter().enumerate() {
            let c = self.catalog.chip(c, &format!("submit_group: chips[{i}]"))?;
            if group.contains(&c) {
                return Err(PyValueError::new_err(format!(
                    "submit_group: chips lists chip {c} twice"
                )));
            }
            group.push(c);
        }
        let program = self.catalog.program(program, "submit_group")?;
        let args = parse_args(args, "submit_group")?;
        self.push(Target::Group(group), program, args)
    }

    /// Runs the sub-worker callable `name` on a sub-worker process with `args`.
    #[pyo3(signature = (name, args=None))]
    fn submit_sub(&self, name: &Bound<'_, PyAny>, args: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let name = string(name, "submit_sub: name")?;
        if !self.catalog.subs.contains(&name) {
            let known: Vec<&str> = self.catalog.subs.iter().map(String::as_str).collect();
            return Err(PyValueError::new_err(format!(
                "submit_sub: no sub-worker callable {} (the Worker's subs: {})",
                repr(&name),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
        if self.catalog.sub_workers == 0 {
            return Err(PyValueError::new_err(format!(
                "submit_sub: {} needs a sub-worker process, and the Worker has none: \
                 create it with sub_workers=1 or more",
                repr(&name)
            )));
        }
        let args = parse_args(args, "submit_sub")?;
        self.push(Target::Sub(name.clone()), name, args)
    }
}
