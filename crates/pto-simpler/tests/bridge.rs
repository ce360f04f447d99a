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
    ];
    let r = libtest_mimic::run(&args, tests);
    let _ = std::fs::remove_dir_all(out_dir());
    r.exit();
}
