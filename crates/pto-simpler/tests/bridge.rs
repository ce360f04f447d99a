//! simpler-style programs (plain C++ over pto's simpler headers, no pto-isa) on a pto Worker's
//! chips, driven by requests as the Python layer sends them. The Worker forks, which needs a
//! single-threaded process: this target has `harness = false` and runs every test on the main
//! thread (libtest-mimic).

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};
use pto_core::{DType, TaskArgs, Tensor};
use pto_worker::Worker;
use serde_json::json;

/// A build folder of this test process.
fn out_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("pto-simpler-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles `tests/programs/<src>` into a shared library, as simpler's driver would.
fn compile(src: &str) -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = out_dir().join(src.replace(".cpp", ".so"));
    let o = Command::new("c++")
        .args(["-shared", "-fPIC", "-O2", "-std=c++17"])
        .arg(format!("-I{}", here.join("include/simpler").display()))
        .arg(format!("-I{}", here.join("tests/programs").display()))
        .arg(here.join("tests/programs").join(src))
        .arg("-o")
        .arg(&out)
        .output()
        .expect("c++ (install build-essential)");
    assert!(
        o.status.success(),
        "{src}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn worker(chips: usize) -> Worker {
    Worker::builder()
        .chips(chips)
        .cores(1, 2)
        .threads(3)
        .timeout(Duration::from_secs(30))
        .program(
            pto_simpler::PROGRAM,
            pto_simpler::kernel::registry().unwrap(),
            pto_simpler::chip_program,
        )
        .init()
        .unwrap()
}

/// A host tensor holding `bytes`.
fn bytes_tensor(w: &Worker, bytes: &[u8]) -> Tensor {
    let t = w.tensor(&[bytes.len()], DType::U8).unwrap();
    t.write_bytes(bytes).unwrap();
    t
}

/// Runs request `req` on `chips` as one group, with `tensors` after the request.
fn group(
    w: &Worker,
    chips: &[usize],
    req: &serde_json::Value,
    tensors: &[(Tensor, bool)],
) -> Result<(), String> {
    let r = bytes_tensor(w, req.to_string().as_bytes());
    let mut args = TaskArgs::new().input(&r);
    for (t, write) in tensors {
        args = if *write {
            args.output_existing(t)
        } else {
            args.input(t)
        };
    }
    let chips = chips.to_vec();
    w.run(move |h| {
        h.submit_group(&chips, pto_simpler::PROGRAM, args.clone())
            .map(|_| ())
    })
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// Allocates domain `id` over `members` with one buffer `scratch` of `nbytes`; each member's
/// CommContext address.
fn alloc_domain(w: &Worker, id: u64, members: &[usize], nbytes: u64) -> Vec<u64> {
    let rows = w.tensor(&[members.len(), 8], DType::U64).unwrap();
    let req = json!({"op": "alloc_domain", "id": id, "name": "default", "members": members,
        "window_size": 4096, "buffers": [{"name": "scratch", "nbytes": nbytes}]});
    group(w, members, &req, &[(rows.clone(), true)]).unwrap();
    let v: Vec<u64> = rows.read().unwrap();
    v.chunks(8).map(|r| r[0]).collect()
}

fn allreduce(n: usize) -> Result<(), Failed> {
    const COUNT: usize = 256;
    let kernel = compile("allreduce_kernel.cpp");
    let orch = compile("allreduce_orch.cpp");
    let w = worker(n);
    let members: Vec<usize> = (0..n).collect();
    let ctx = alloc_domain(&w, 1, &members, (COUNT * 4 + 64 * 4) as u64);
    assert!(ctx.iter().all(|&c| c != 0), "{ctx:?}");
    let mut tensors = Vec::new();
    let mut args = Vec::new();
    for (r, &ctx_r) in ctx.iter().enumerate() {
        let input = w.tensor(&[COUNT], DType::F32).unwrap();
        input
            .write(&(0..COUNT).map(|i| (i + 100 * r) as f32).collect::<Vec<_>>())
            .unwrap();
        let out = w.tensor(&[COUNT], DType::F32).unwrap();
        args.push(json!({"chip": r, "tensors": [
            {"kind": "host", "index": 1 + 2 * r, "shape": [COUNT], "dtype": "float32"},
            {"kind": "host", "index": 2 + 2 * r, "shape": [COUNT], "dtype": "float32"},
            {"kind": "window", "domain": 1, "offset": 0, "shape": [COUNT + 64], "dtype": "float32"}],
            "scalars": [n, ctx_r]}));
        tensors.push((input, false));
        tensors.push((out, true));
    }
    let req = json!({"op": "run", "callable": {"name": "allreduce",
        "orchestration": orch, "function": "allreduce_entry", "config": "allreduce_config",
        "source": "allreduce_orch.cpp",
        "kernels": [{"func_id": 0, "path": kernel, "core": "aiv", "source": "allreduce_kernel.cpp"}]},
        "members": args});
    group(&w, &members, &req, &tensors)?;
    for r in 0..n {
        let got: Vec<f32> = tensors[2 * r + 1].0.read().unwrap();
        for (i, g) in got.iter().enumerate() {
            let want = (n * i + 100 * n * (n - 1) / 2) as f32;
            assert_eq!(*g, want, "rank {r} element {i}");
        }
    }
    group(&w, &members, &json!({"op": "free_domain", "id": 1}), &[])?;
    w.close();
    Ok(())
}

/// A callable's request part: orchestration `orch` (entry `function`, config `config`) and
/// kernels `(func_id, source, core)`.
fn callable(
    name: &str,
    orch: &str,
    function: &str,
    config: &str,
    kernels: &[(i32, &str, &str)],
) -> serde_json::Value {
    let ks: Vec<serde_json::Value> = kernels
        .iter()
        .map(|(f, src, core)| json!({"func_id": f, "path": compile(src), "core": core, "source": src}))
        .collect();
    json!({"name": name, "orchestration": compile(orch), "function": function, "config": config,
        "source": orch, "kernels": ks})
}

fn host(index: usize, n: usize, dtype: &str) -> serde_json::Value {
    json!({"kind": "host", "index": index, "shape": [n], "dtype": dtype})
}

fn f32_tensor(w: &Worker, v: &[f32]) -> Tensor {
    let t = w.tensor(&[v.len()], DType::F32).unwrap();
    t.write(v).unwrap();
    t
}

fn two_callables_linked_by_a_tensor() -> Result<(), Failed> {
    let w = worker(1);
    let x: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let (xt, yt, zt) = (
        f32_tensor(&w, &x),
        f32_tensor(&w, &[0.0; 64]),
        f32_tensor(&w, &[0.0; 64]),
    );
    let a = callable(
        "scale",
        "scale_orch.cpp",
        "scale_entry",
        "scale_config",
        &[(0, "scale_kernel.cpp", "aic")],
    );
    let b = callable(
        "add",
        "add_orch.cpp",
        "add_entry",
        "",
        &[(0, "add_kernel.cpp", "aiv")],
    );
    let ra = bytes_tensor(
        &w,
        json!({"op": "run", "callable": a, "members": [{"chip": 0,
        "tensors": [host(1, 64, "float32"), host(2, 64, "float32")], "scalars": []}]})
        .to_string()
        .as_bytes(),
    );
    let rb = bytes_tensor(&w, json!({"op": "run", "callable": b, "members": [{"chip": 0,
        "tensors": [host(1, 64, "float32"), host(2, 64, "float32"), host(3, 64, "float32")], "scalars": []}]}).to_string().as_bytes());
    let (x2, y2, z2) = (xt.clone(), yt.clone(), zt.clone());
    // One run: the host orders the second callable after the first through y.
    w.run(move |h| {
        h.submit_chip(
            0,
            pto_simpler::PROGRAM,
            TaskArgs::new().input(&ra).input(&x2).output_existing(&y2),
        )?;
        h.submit_chip(
            0,
            pto_simpler::PROGRAM,
            TaskArgs::new()
                .input(&rb)
                .input(&y2)
                .input(&x2)
                .output_existing(&z2),
        )?;
        Ok(())
    })?;
    let z: Vec<f32> = zt.read().unwrap();
    assert_eq!(z, x.iter().map(|v| 3.0 * v).collect::<Vec<_>>());
    w.close();
    Ok(())
}

fn runtime_outputs_scopes_spmd_and_explicit_dependencies() -> Result<(), Failed> {
    let w = worker(1);
    let n = 1000;
    let x: Vec<f32> = (0..n).map(|i| (i % 97) as f32).collect();
    let (xt, out) = (f32_tensor(&w, &x), f32_tensor(&w, &vec![0.0; n]));
    let c = callable(
        "pipeline",
        "pipeline_orch.cpp",
        "pipeline_entry",
        "pipeline_config",
        &[(0, "scale_kernel.cpp", "aiv"), (1, "add_kernel.cpp", "aiv")],
    );
    let req = json!({"op": "run", "callable": c, "members": [{"chip": 0,
        "tensors": [host(1, n, "float32"), host(2, n, "float32")], "scalars": []}]});
    group(&w, &[0], &req, &[(xt, false), (out.clone(), true)])?;
    let got: Vec<f32> = out.read().unwrap();
    assert_eq!(got, x.iter().map(|v| 5.0 * v).collect::<Vec<_>>());
    w.close();
    Ok(())
}

fn a_deferred_notify_through_the_completion_slab() -> Result<(), Failed> {
    let w = worker(2);
    let ctx = alloc_domain(&w, 3, &[0, 1], 256);
    let mut tensors = Vec::new();
    let mut members = Vec::new();
    for (r, &c) in ctx.iter().enumerate() {
        tensors.push((f32_tensor(&w, &[10.0 * r as f32; 8]), false));
        tensors.push((f32_tensor(&w, &[0.0; 8]), true));
        members.push(json!({"chip": r, "tensors": [host(1 + 2 * r, 8, "float32"), host(2 + 2 * r, 8, "float32"),
            {"kind": "window", "domain": 3, "offset": 0, "shape": [64], "dtype": "int32"}], "scalars": [r, c]}));
    }
    let c = callable(
        "deferred",
        "deferred_orch.cpp",
        "deferred_entry",
        "deferred_config",
        &[
            (0, "deferred_kernel.cpp", "aiv"),
            (1, "copy_kernel.cpp", "aiv"),
        ],
    );
    group(
        &w,
        &[0, 1],
        &json!({"op": "run", "callable": c, "members": members}),
        &tensors,
    )?;
    for r in 0..2 {
        let got: Vec<f32> = tensors[2 * r + 1].0.read().unwrap();
        assert_eq!(got, vec![10.0 * r as f32 + r as f32 + 1.0; 8], "rank {r}");
    }
    w.close();
    Ok(())
}

/// Runs a one-chip request whose run must fail; the error's text.
fn failing(w: &Worker, req: serde_json::Value, tensors: &[(Tensor, bool)]) -> String {
    match group(w, &[0], &req, tensors) {
        Ok(()) => panic!("the run succeeded: {req}"),
        Err(e) => e,
    }
}

fn failures_name_the_callable_the_chip_and_the_cause() -> Result<(), Failed> {
    let w = Worker::builder()
        .chips(2)
        .cores(1, 2)
        .threads(3)
        .timeout(Duration::from_secs(2))
        .program(
            pto_simpler::PROGRAM,
            pto_simpler::kernel::registry().unwrap(),
            pto_simpler::chip_program,
        )
        .init()
        .unwrap();
    let ts = || {
        vec![
            (f32_tensor(&w, &[1.0; 4]), false),
            (f32_tensor(&w, &[0.0; 4]), true),
        ]
    };
    let args = json!([{"chip": 0, "tensors": [host(1, 4, "float32"), host(2, 4, "float32")], "scalars": []}]);
    let run = |c: serde_json::Value| json!({"op": "run", "callable": c, "members": args});
    let e = failing(
        &w,
        run(callable("fatal", "fatal_orch.cpp", "fatal_entry", "", &[])),
        &ts(),
    );
    assert!(
        e.contains("callable fatal (fatal_orch.cpp) on chip 0")
            && e.contains("the program gave up: 42"),
        "{e}"
    );
    let e = failing(
        &w,
        run(callable("throw", "fatal_orch.cpp", "throw_entry", "", &[])),
        &ts(),
    );
    assert!(e.contains("a C++ exception from the orchestration"), "{e}");
    let e = failing(
        &w,
        run(callable(
            "badfunc",
            "fatal_orch.cpp",
            "bad_func_entry",
            "",
            &[(0, "scale_kernel.cpp", "aiv")],
        )),
        &ts(),
    );
    assert!(
        e.contains("func_id 7 is not a kernel of callable badfunc"),
        "{e}"
    );
    let e = failing(
        &w,
        run(callable(
            "count",
            "scale_orch.cpp",
            "scale_entry",
            "scale_config",
            &[(0, "scale_kernel.cpp", "aic")],
        ))
        .to_string()
        .replace("\"scalars\":[]", "\"scalars\":[5]")
        .parse()
        .unwrap(),
        &ts(),
    );
    assert!(
        e.contains("scale_config expects 2 arguments, the task has 3"),
        "{e}"
    );
    let e = failing(
        &w,
        run(callable(
            "noentry",
            "scale_orch.cpp",
            "scale_entry",
            "",
            &[(0, "no_entry.cpp", "aic")],
        )),
        &ts(),
    );
    assert!(e.contains("no symbol kernel_entry"), "{e}");
    // A deferred task whose counter no peer raises fails at the deadline, naming the counter.
    let ctx = alloc_domain(&w, 4, &[0, 1], 256);
    let c = callable(
        "stuck",
        "deferred_orch.cpp",
        "deferred_entry",
        "deferred_config",
        &[
            (0, "deferred_kernel.cpp", "aiv"),
            (1, "copy_kernel.cpp", "aiv"),
        ],
    );
    let req = json!({"op": "run", "callable": c, "members": [{"chip": 0, "tensors": [host(1, 4, "float32"), host(2, 4, "float32"),
        {"kind": "window", "domain": 4, "offset": 0, "shape": [64], "dtype": "int32"}], "scalars": [0, ctx[0]]}]});
    let e = failing(&w, req, &ts());
    assert!(e.contains("counter at"), "{e}");
    w.close();
    // A kernel that crashes its chip: the chip is named with its signal.
    let w1 = worker(1);
    let ts1 = vec![
        (f32_tensor(&w1, &[1.0; 4]), false),
        (f32_tensor(&w1, &[0.0; 4]), true),
    ];
    let e = failing(
        &w1,
        run(callable(
            "crash",
            "scale_orch.cpp",
            "scale_entry",
            "",
            &[(0, "crash_kernel.cpp", "aic")],
        )),
        &ts1,
    );
    assert!(e.contains("chip 0") && e.contains("signal 6"), "{e}");
    w1.close();
    Ok(())
}

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    let tests = vec![
        Trial::test("an_allreduce_through_comm_context_on_2_chips", || {
            allreduce(2)
        }),
        Trial::test("an_allreduce_through_comm_context_on_4_chips", || {
            allreduce(4)
        }),
        Trial::test(
            "two_callables_linked_by_a_tensor",
            two_callables_linked_by_a_tensor,
        ),
        Trial::test(
            "runtime_outputs_scopes_spmd_and_explicit_dependencies",
            runtime_outputs_scopes_spmd_and_explicit_dependencies,
        ),
        Trial::test(
            "a_deferred_notify_through_the_completion_slab",
            a_deferred_notify_through_the_completion_slab,
        ),
        Trial::test(
            "failures_name_the_callable_the_chip_and_the_cause",
            failures_name_the_callable_the_chip_and_the_cause,
        ),
    ];
    let r = libtest_mimic::run(&args, tests);
    let _ = std::fs::remove_dir_all(out_dir());
    r.exit();
}
