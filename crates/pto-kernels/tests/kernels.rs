//! The built-in kernels run on a real simulated chip; results are checked against values
//! computed directly in the test.

// Helpers outside `#[test]` functions unwrap too (clippy's allow-unwrap-in-tests covers only the
// test functions themselves).
#![allow(clippy::unwrap_used)]

use std::sync::OnceLock;

use half::{bf16, f16};
use pto_core::{
    Bool, Chip, CoreKind, DType, Element, KernelRegistry, Program, RegistryError, RunError,
    RunReport, TaskArgs, Tensor,
};

/// One chip shared by every test: runs on a chip are serialised, and a chip that is never
/// dropped never waits for its worker threads to notice shutdown.
fn chip() -> &'static Chip {
    static CHIP: OnceLock<Chip> = OnceLock::new();
    CHIP.get_or_init(|| {
        Chip::builder()
            .aic_cores(1)
            .aiv_cores(2)
            .threads(2)
            .build()
            .unwrap()
    })
}

fn registry() -> KernelRegistry {
    let mut reg = KernelRegistry::new();
    pto_kernels::register_all(&mut reg).unwrap();
    reg
}

/// Runs one task of `kernel` with `args`.
fn run(kernel: &'static str, args: TaskArgs) -> Result<RunReport, RunError> {
    chip().run(&Program::new(kernel, registry(), move |o| {
        o.submit(kernel, args.clone()).map(|_| ())
    }))
}

/// Runs one task and returns the error message it must fail with.
fn run_err(kernel: &'static str, args: TaskArgs) -> String {
    let err = run(kernel, args).expect_err("the task should fail");
    assert!(
        matches!(err, RunError::TaskFailed { failed: 1, .. }),
        "{err}"
    );
    err.to_string()
}

/// Deterministic test data: `n` values in [-8, 8) with quarter steps (exact in every float type).
fn data(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % 64) as f64 / 4.0 - 8.0
        })
        .collect()
}

fn f32s(n: usize, seed: u64) -> Vec<f32> {
    data(n, seed).into_iter().map(|v| v as f32).collect()
}

fn tensor<T: Element>(shape: &[usize], v: &[T]) -> Tensor {
    Tensor::from_slice(shape, v).unwrap()
}

fn zeros(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::zeros(shape, dtype).unwrap()
}

/// Naive `i-j-k` reference: `c0 + a @ b`, accumulated in f64 over increasing `k`.
fn naive_matmul(
    a: &[f64],
    b: &[f64],
    c0: Option<&[f64]>,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = c0.map_or(0.0, |c0| c0[i * n + j]);
            for p in 0..k {
                s += a[i * k + p] * b[p * n + j];
            }
            c[i * n + j] = s;
        }
    }
    c
}

#[test]
fn register_all_registers_every_name_once() {
    let reg = registry();
    assert_eq!(reg.len(), pto_kernels::NAMES.len());
    for name in pto_kernels::NAMES {
        let k = reg.lookup(name).unwrap();
        let want = if name.starts_with("matmul") {
            CoreKind::Aic
        } else {
            CoreKind::Aiv
        };
        assert_eq!(k.kind(), want, "{name}");
    }
    let mut again = registry();
    assert!(matches!(
        pto_kernels::register_all(&mut again),
        Err(RegistryError::Duplicate(_))
    ));
    assert_eq!(
        pto_kernels::registry().unwrap().len(),
        pto_kernels::NAMES.len()
    );
}

#[test]
fn binary_ops_f32() {
    let (a, b) = (f32s(10, 1), f32s(10, 2));
    type Op = fn(f32, f32) -> f32;
    let cases: [(&'static str, Op); 3] = [
        ("vector_add", |x, y| x + y),
        ("vector_sub", |x, y| x - y),
        ("vector_mul", |x, y| x * y),
    ];
    for (name, op) in cases {
        let out = zeros(&[2, 5], DType::F32);
        let args = TaskArgs::new()
            .input(tensor(&[2, 5], &a))
            .input(tensor(&[2, 5], &b))
            .output_existing(&out);
        run(name, args).unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(&x, &y)| op(x, y)).collect();
        assert_eq!(out.read::<f32>().unwrap(), want, "{name}");
    }
}

/// `vector_add` of the test data converted to `T`, checked against `add` on the same values.
fn add_in<T: Element>(conv: fn(f64) -> T, add: fn(T, T) -> T) {
    let a: Vec<T> = data(9, 3).into_iter().map(conv).collect();
    let b: Vec<T> = data(9, 4).into_iter().map(conv).collect();
    let out = zeros(&[3, 3], T::DTYPE);
    run(
        "vector_add",
        TaskArgs::new()
            .input(tensor(&[3, 3], &a))
            .input(tensor(&[3, 3], &b))
            .output_existing(&out),
    )
    .unwrap();
    let want: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| add(x, y)).collect();
    assert_eq!(out.read::<T>().unwrap(), want, "{}", T::DTYPE);
}

#[test]
fn dtype_coverage() {
    add_in::<f64>(|v| v, |x, y| x + y);
    add_in::<f32>(|v| v as f32, |x, y| x + y);
    add_in::<i32>(|v| (v * 4.0) as i32, |x, y| x + y);
    add_in::<i64>(|v| (v * 4.0) as i64, |x, y| x + y);
    add_in::<i8>(|v| (v * 4.0) as i8, i8::wrapping_add);
    add_in::<u16>(|v| (v * 4.0 + 40.0) as u16, |x, y| x + y);
    add_in::<f16>(f16::from_f64, |x, y| x + y);
    add_in::<bf16>(bf16::from_f64, |x, y| x + y);

    // Integers wrap rather than panic.
    let out = zeros(&[2], DType::I32);
    run(
        "vector_add",
        TaskArgs::new()
            .input(tensor(&[2], &[i32::MAX, -1]))
            .input(tensor(&[2], &[1i32, 1]))
            .output_existing(&out),
    )
    .unwrap();
    assert_eq!(out.read::<i32>().unwrap(), vec![i32::MIN, 0]);
}

#[test]
fn scale_and_add_scalar() {
    // f64 factor on f32: widened, multiplied, rounded once.
    let a = f32s(6, 5);
    let out = zeros(&[6], DType::F32);
    run(
        "vector_scale",
        TaskArgs::new()
            .input(tensor(&[6], &a))
            .output_existing(&out)
            .scalar(0.1f64),
    )
    .unwrap();
    let want: Vec<f32> = a.iter().map(|&x| (f64::from(x) * 0.1) as f32).collect();
    assert_eq!(out.read::<f32>().unwrap(), want);

    // f64 factor on i32: rounded half away from zero, saturated.
    let out = zeros(&[4], DType::I32);
    run(
        "vector_scale",
        TaskArgs::new()
            .input(tensor(&[4], &[-3i32, 1, 4, i32::MAX]))
            .output_existing(&out)
            .scalar(2.5f64),
    )
    .unwrap();
    assert_eq!(out.read::<i32>().unwrap(), vec![-8, 3, 10, i32::MAX]);

    // A factor of the tensor's own dtype is exact (i64 beyond 2^53).
    let big = (1i64 << 60) + 1;
    let out = zeros(&[2], DType::I64);
    run(
        "vector_scale",
        TaskArgs::new()
            .input(tensor(&[2], &[big, -7]))
            .output_existing(&out)
            .scalar(3i64),
    )
    .unwrap();
    assert_eq!(out.read::<i64>().unwrap(), vec![big.wrapping_mul(3), -21]);

    let out = zeros(&[3], DType::F64);
    run(
        "vector_add_scalar",
        TaskArgs::new()
            .input(tensor(&[3], &[1.0f64, -2.0, 0.5]))
            .output_existing(&out)
            .scalar(0.25f64),
    )
    .unwrap();
    assert_eq!(out.read::<f64>().unwrap(), vec![1.25, -1.75, 0.75]);

    let out = zeros(&[3], DType::I64);
    run(
        "vector_add_scalar",
        TaskArgs::new()
            .input(tensor(&[3], &[big, 0, -5]))
            .output_existing(&out)
            .scalar(10i64),
    )
    .unwrap();
    assert_eq!(out.read::<i64>().unwrap(), vec![big + 10, 10, 5]);

    let out = zeros(&[2], DType::Bf16);
    let x = [bf16::from_f32(1.5), bf16::from_f32(-3.0)];
    run(
        "vector_add_scalar",
        TaskArgs::new()
            .input(tensor(&[2], &x))
            .output_existing(&out)
            .scalar(1.0f64),
    )
    .unwrap();
    assert_eq!(
        out.read::<bf16>().unwrap(),
        vec![bf16::from_f32(2.5), bf16::from_f32(-2.0)]
    );
}

#[test]
fn relu_copy_fill() {
    let x = [-1.5f32, 0.0, 2.0, f32::NAN, -0.25, 7.0];
    let out = zeros(&[6], DType::F32);
    run(
        "relu",
        TaskArgs::new()
            .input(tensor(&[6], &x))
            .output_existing(&out),
    )
    .unwrap();
    let got = out.read::<f32>().unwrap();
    assert_eq!(got[..3], [0.0, 0.0, 2.0]);
    assert!(got[3].is_nan());
    assert_eq!(got[4..], [0.0, 7.0]);

    let out = zeros(&[4], DType::I64);
    run(
        "relu",
        TaskArgs::new()
            .input(tensor(&[4], &[-3i64, 3, i64::MIN, 0]))
            .output_existing(&out),
    )
    .unwrap();
    assert_eq!(out.read::<i64>().unwrap(), vec![0, 3, 0, 0]);

    let bools: Vec<Bool> = [true, false, true].into_iter().map(Bool::from).collect();
    let out = zeros(&[3], DType::Bool);
    run(
        "copy",
        TaskArgs::new()
            .input(tensor(&[3], &bools))
            .output_existing(&out),
    )
    .unwrap();
    assert_eq!(out.read::<Bool>().unwrap(), bools);

    let out = zeros(&[2, 2], DType::I16);
    run("fill", TaskArgs::new().output_existing(&out).scalar(-9i16)).unwrap();
    assert_eq!(out.read::<i16>().unwrap(), vec![-9; 4]);

    let out = zeros(&[3], DType::F16);
    run(
        "fill",
        TaskArgs::new()
            .output_existing(&out)
            .scalar(f16::from_f32(0.5)),
    )
    .unwrap();
    assert_eq!(out.read::<f16>().unwrap(), vec![f16::from_f32(0.5); 3]);
}

#[test]
fn spmd_elementwise_with_three_blocks() {
    let (a, b) = (f32s(7 * 4, 6), f32s(7 * 4, 7));
    let (ta, tb) = (tensor(&[7, 4], &a), tensor(&[7, 4], &b));

    let out = zeros(&[7, 4], DType::F32);
    let report = run(
        "vector_mul",
        TaskArgs::new()
            .input(&ta)
            .input(&tb)
            .output_existing(&out)
            .blocks(3),
    )
    .unwrap();
    assert_eq!(report.stats.blocks, 3);
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
    assert_eq!(out.read::<f32>().unwrap(), want);

    let out = zeros(&[7, 4], DType::F32);
    run(
        "vector_scale",
        TaskArgs::new()
            .input(&ta)
            .output_existing(&out)
            .scalar(-2.0f64)
            .blocks(3),
    )
    .unwrap();
    assert_eq!(
        out.read::<f32>().unwrap(),
        a.iter().map(|x| x * -2.0).collect::<Vec<_>>()
    );

    let out = zeros(&[7, 4], DType::F32);
    run(
        "relu",
        TaskArgs::new().input(&tb).output_existing(&out).blocks(3),
    )
    .unwrap();
    assert_eq!(
        out.read::<f32>().unwrap(),
        b.iter().map(|x| x.max(0.0)).collect::<Vec<_>>()
    );

    let out = zeros(&[7, 4], DType::F32);
    run(
        "copy",
        TaskArgs::new().input(&ta).output_existing(&out).blocks(3),
    )
    .unwrap();
    assert_eq!(out.read::<f32>().unwrap(), a);

    let out = zeros(&[7, 4], DType::U32);
    run(
        "fill",
        TaskArgs::new()
            .output_existing(&out)
            .scalar(42u32)
            .blocks(3),
    )
    .unwrap();
    assert_eq!(out.read::<u32>().unwrap(), vec![42; 28]);

    // More blocks than rows: the extra blocks get empty chunks.
    let out = zeros(&[2, 3], DType::I32);
    run(
        "fill",
        TaskArgs::new().output_existing(&out).scalar(5i32).blocks(3),
    )
    .unwrap();
    assert_eq!(out.read::<i32>().unwrap(), vec![5; 6]);
}

#[test]
fn strided_views() {
    // a: a [3, 4] tensor read transposed as [4, 3]; b: every other row of an [8, 3] tensor.
    let raw_a = f32s(12, 8);
    let at = tensor(&[3, 4], &raw_a).transpose(0, 1).unwrap();
    assert!(!at.is_contiguous());
    let raw_b = f32s(24, 9);
    let bs = tensor(&[8, 3], &raw_b).slice(0, 0, 8, 2).unwrap();
    assert!(!bs.is_contiguous());
    // The output is the left half of a [4, 6] tensor.
    let full = zeros(&[4, 6], DType::F32);
    let out = full.view(&[4, 3], &[0, 0]).unwrap();
    assert!(!out.is_contiguous());
    run(
        "vector_add",
        TaskArgs::new()
            .input(&at)
            .input(&bs)
            .output_existing(&out)
            .blocks(3),
    )
    .unwrap();
    let got = full.read::<f32>().unwrap();
    for i in 0..4 {
        for j in 0..3 {
            let want = raw_a[j * 4 + i] + raw_b[(2 * i) * 3 + j];
            assert_eq!(got[i * 6 + j], want, "({i}, {j})");
            assert_eq!(got[i * 6 + 3 + j], 0.0);
        }
    }

    // copy of a transposed view materialises the transpose.
    let out = zeros(&[4, 3], DType::F32);
    run("copy", TaskArgs::new().input(&at).output_existing(&out)).unwrap();
    let want: Vec<f32> = (0..12).map(|x| raw_a[(x % 3) * 4 + x / 3]).collect();
    assert_eq!(out.read::<f32>().unwrap(), want);

    // reduce_sum over a strided view.
    let out = zeros(&[1], DType::F32);
    run(
        "reduce_sum",
        TaskArgs::new().input(&bs).output_existing(&out),
    )
    .unwrap();
    let want: f64 = (0..4)
        .flat_map(|r| (0..3).map(move |c| (r, c)))
        .map(|(r, c)| f64::from(raw_b[2 * r * 3 + c]))
        .sum();
    assert_eq!(out.read::<f32>().unwrap(), vec![want as f32]);
}

#[test]
fn reduce_sum_dtypes() {
    let x = f32s(100, 10);
    let out = zeros(&[1, 1], DType::F32);
    run(
        "reduce_sum",
        TaskArgs::new()
            .input(tensor(&[10, 10], &x))
            .output_existing(&out),
    )
    .unwrap();
    let want = x.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
    assert_eq!(out.read::<f32>().unwrap(), vec![want]);

    let out = zeros(&[1], DType::I64);
    let xs: Vec<i64> = (1..=50).collect();
    run(
        "reduce_sum",
        TaskArgs::new()
            .input(tensor(&[50], &xs))
            .output_existing(&out),
    )
    .unwrap();
    assert_eq!(out.read::<i64>().unwrap(), vec![1275]);

    let out = zeros(&[1], DType::U8);
    run(
        "reduce_sum",
        TaskArgs::new()
            .input(tensor(&[3], &[200u8, 100, 1]))
            .output_existing(&out),
    )
    .unwrap();
    assert_eq!(out.read::<u8>().unwrap(), vec![45]); // 301 wraps to 45
}

/// Runs `matmul` on `[m, k] @ [k, n]` in `T` and checks it against the naive reference.
fn check_matmul<T: Element>(
    m: usize,
    k: usize,
    n: usize,
    blocks: u32,
    conv: fn(f64) -> T,
    back: fn(T) -> f64,
) {
    let a: Vec<T> = data(m * k, 11).into_iter().map(conv).collect();
    let b: Vec<T> = data(k * n, 12).into_iter().map(conv).collect();
    let c = zeros(&[m, n], T::DTYPE);
    let report = run(
        "matmul",
        TaskArgs::new()
            .input(tensor(&[m, k], &a))
            .input(tensor(&[k, n], &b))
            .output_existing(&c)
            .blocks(blocks),
    )
    .unwrap();
    assert_eq!(report.stats.blocks, u64::from(blocks));
    let af: Vec<f64> = a.iter().map(|&x| back(x)).collect();
    let bf: Vec<f64> = b.iter().map(|&x| back(x)).collect();
    let want: Vec<T> = naive_matmul(&af, &bf, None, m, k, n)
        .into_iter()
        .map(conv)
        .collect();
    assert_eq!(
        c.read::<T>().unwrap(),
        want,
        "{} {m}x{k}x{n} in {blocks} blocks",
        T::DTYPE
    );
}

#[test]
fn matmul_matches_naive_reference() {
    check_matmul::<f32>(5, 7, 3, 1, |v| v as f32, f64::from);
    check_matmul::<f64>(6, 4, 9, 1, |v| v, |v| v);
    check_matmul::<f32>(8, 5, 6, 3, |v| v as f32, f64::from);
    check_matmul::<f64>(2, 3, 4, 3, |v| v, |v| v); // fewer rows than blocks
    check_matmul::<f16>(4, 4, 4, 2, f16::from_f64, f16::to_f64);
    check_matmul::<bf16>(3, 2, 5, 1, bf16::from_f64, bf16::to_f64);
    check_matmul::<f64>(3, 0, 2, 1, |v| v, |v| v); // K = 0: all zeros
                                                   // Fractions that do not add up exactly: the f64 accumulation still matches.
    let a: Vec<f32> = (0..12).map(|i| 0.1 * i as f32 + 0.3).collect();
    let b: Vec<f32> = (0..12).map(|i| 1.0 / (i as f32 + 1.0)).collect();
    let c = zeros(&[3, 3], DType::F32);
    run(
        "matmul",
        TaskArgs::new()
            .input(tensor(&[3, 4], &a))
            .input(tensor(&[4, 3], &b))
            .output_existing(&c),
    )
    .unwrap();
    let af: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
    let bf: Vec<f64> = b.iter().map(|&x| f64::from(x)).collect();
    let want: Vec<f32> = naive_matmul(&af, &bf, None, 3, 4, 3)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    assert_eq!(c.read::<f32>().unwrap(), want);
}

#[test]
fn matmul_with_strided_operands() {
    // b is stored as [n, k] and passed transposed; c is a column block of a wider tensor.
    let (m, k, n) = (6, 5, 4);
    let a = data(m * k, 13);
    let bt = data(n * k, 14);
    let b_view = tensor(&[n, k], &bt).transpose(0, 1).unwrap();
    let wide = zeros(&[m, n + 2], DType::F64);
    let c = wide.view(&[m, n], &[0, 2]).unwrap();
    run(
        "matmul",
        TaskArgs::new()
            .input(tensor(&[m, k], &a))
            .input(&b_view)
            .output_existing(&c)
            .blocks(3),
    )
    .unwrap();
    let b: Vec<f64> = (0..k * n).map(|x| bt[(x % n) * k + x / n]).collect();
    let want = naive_matmul(&a, &b, None, m, k, n);
    let got = wide.read::<f64>().unwrap();
    for i in 0..m {
        assert_eq!(got[i * (n + 2)..i * (n + 2) + 2], [0.0, 0.0]);
        assert_eq!(
            got[i * (n + 2) + 2..(i + 1) * (n + 2)],
            want[i * n..(i + 1) * n]
        );
    }
}

#[test]
fn matmul_acc_accumulates_partial_products() {
    // c = c0 + a[:, :3] @ b[:3, :] + a[:, 3:] @ b[3:, :], as two dependent matmul_acc tasks.
    let (m, k, n) = (5, 7, 4);
    let a = f32s(m * k, 15);
    let b = f32s(k * n, 16);
    let c0 = f32s(m * n, 17);
    let (ta, tb) = (tensor(&[m, k], &a), tensor(&[k, n], &b));
    let c = tensor(&[m, n], &c0);
    let cc = c.clone();
    let program = Program::new("acc", registry(), move |o| {
        for (lo, hi) in [(0, 3), (3, k)] {
            let a_part = ta.slice(1, lo, hi, 1)?;
            let b_part = tb.slice(0, lo, hi, 1)?;
            o.submit(
                "matmul_acc",
                TaskArgs::new()
                    .input(&a_part)
                    .input(&b_part)
                    .inout(&cc)
                    .blocks(2),
            )?;
        }
        Ok(())
    });
    let report = chip().run(&program).unwrap();
    assert_eq!(report.stats.tasks, 2);
    let af: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
    let bf: Vec<f64> = b.iter().map(|&x| f64::from(x)).collect();
    let c0f: Vec<f64> = c0.iter().map(|&x| f64::from(x)).collect();
    // Each task rounds once to f32; the test data are small quarter-step values, so every
    // partial sum is exact and the two-step result equals the one-step reference.
    let want: Vec<f32> = naive_matmul(&af, &bf, Some(&c0f), m, k, n)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    assert_eq!(c.read::<f32>().unwrap(), want);
}

#[test]
fn kernels_chain_through_runtime_outputs() {
    // x = fill(2); y = x * x + x; s = sum(relu(y - 10))  over [6, 3].
    let result = zeros(&[1], DType::I32);
    let r = result.clone();
    let program = Program::new("chain", registry(), move |o| {
        let x = o
            .submit(
                "fill",
                TaskArgs::new()
                    .output(&[6, 3], DType::I32)
                    .scalar(2i32)
                    .blocks(2),
            )?
            .out(0)?;
        let xx = o
            .submit(
                "vector_mul",
                TaskArgs::new()
                    .input(&x)
                    .input(&x)
                    .output(&[6, 3], DType::I32),
            )?
            .out(0)?;
        let y = o
            .submit(
                "vector_add",
                TaskArgs::new()
                    .input(&xx)
                    .input(&x)
                    .output(&[6, 3], DType::I32)
                    .blocks(3),
            )?
            .out(0)?;
        let z = o
            .submit(
                "vector_add_scalar",
                TaskArgs::new()
                    .input(&y)
                    .output(&[6, 3], DType::I32)
                    .scalar(-10.0f64),
            )?
            .out(0)?;
        let w = o
            .submit(
                "relu",
                TaskArgs::new().input(&z).output(&[6, 3], DType::I32),
            )?
            .out(0)?;
        o.submit("reduce_sum", TaskArgs::new().input(&w).output_existing(&r))?;
        Ok(())
    });
    let report = chip().run(&program).unwrap();
    assert_eq!(report.stats.tasks, 6);
    assert_eq!(result.read::<i32>().unwrap(), vec![0]); // 2*2+2-10 = -4 -> relu 0

    let result = zeros(&[1], DType::I32);
    let r = result.clone();
    let program = Program::new("chain2", registry(), move |o| {
        let x = o
            .submit(
                "fill",
                TaskArgs::new().output(&[6, 3], DType::I32).scalar(4i32),
            )?
            .out(0)?;
        let y = o
            .submit(
                "vector_scale",
                TaskArgs::new()
                    .input(&x)
                    .output(&[6, 3], DType::I32)
                    .scalar(1.5f64),
            )?
            .out(0)?;
        let z = o
            .submit(
                "vector_sub",
                TaskArgs::new()
                    .input(&y)
                    .input(&x)
                    .output(&[6, 3], DType::I32),
            )?
            .out(0)?;
        o.submit("reduce_sum", TaskArgs::new().input(&z).output_existing(&r))?;
        Ok(())
    });
    chip().run(&program).unwrap();
    assert_eq!(result.read::<i32>().unwrap(), vec![2 * 18]);
}

#[test]
fn bad_arguments_fail_the_task() {
    let f = |shape: &[usize]| zeros(shape, DType::F32);

    let msg = run_err(
        "vector_add",
        TaskArgs::new()
            .input(f(&[4]))
            .input(f(&[5]))
            .output_existing(f(&[4])),
    );
    assert!(
        msg.contains("shape mismatch") && msg.contains("[4]") && msg.contains("[5]"),
        "{msg}"
    );

    let msg = run_err(
        "vector_add",
        TaskArgs::new()
            .input(f(&[4]))
            .input(zeros(&[4], DType::F64))
            .output_existing(f(&[4])),
    );
    assert!(
        msg.contains("dtype mismatch") && msg.contains("f64"),
        "{msg}"
    );

    let b = zeros(&[2], DType::Bool);
    let msg = run_err(
        "vector_add",
        TaskArgs::new()
            .input(&b)
            .input(&b)
            .output_existing(zeros(&[2], DType::Bool)),
    );
    assert!(msg.contains("unsupported dtype bool"), "{msg}");

    let msg = run_err("vector_add", TaskArgs::new().input(f(&[4])).input(f(&[4])));
    assert!(msg.contains("tensor argument 2 out of range"), "{msg}");

    let msg = run_err(
        "vector_scale",
        TaskArgs::new()
            .input(f(&[4]))
            .output_existing(f(&[4]))
            .scalar(pto_core::Bool(1)),
    );
    assert!(
        msg.contains("must be a number") && msg.contains("got bool"),
        "{msg}"
    );

    let msg = run_err(
        "vector_scale",
        TaskArgs::new().input(f(&[4])).output_existing(f(&[4])),
    );
    assert!(msg.contains("scalar argument 0 out of range"), "{msg}");

    let msg = run_err(
        "fill",
        TaskArgs::new()
            .output_existing(f(&[4]))
            .scalar(pto_core::Bool(1)),
    );
    assert!(msg.contains("must be a number"), "{msg}");

    let msg = run_err(
        "copy",
        TaskArgs::new()
            .input(f(&[2, 3]))
            .output_existing(f(&[3, 2])),
    );
    assert!(msg.contains("[2, 3]") && msg.contains("[3, 2]"), "{msg}");

    let msg = run_err(
        "reduce_sum",
        TaskArgs::new().input(f(&[6])).output_existing(f(&[2])),
    );
    assert!(msg.contains("exactly 1 element"), "{msg}");

    let msg = run_err(
        "reduce_sum",
        TaskArgs::new()
            .input(f(&[6]))
            .output_existing(f(&[1]))
            .blocks(2),
    );
    assert!(msg.contains("single block"), "{msg}");

    let msg = run_err(
        "matmul",
        TaskArgs::new()
            .input(f(&[2, 3]))
            .input(f(&[4, 5]))
            .output_existing(f(&[2, 5])),
    );
    assert!(
        msg.contains("shape mismatch") && msg.contains("[2, 3]") && msg.contains("[4, 5]"),
        "{msg}"
    );
    assert!(msg.contains("inner dimensions differ"), "{msg}");

    let msg = run_err(
        "matmul",
        TaskArgs::new()
            .input(f(&[2, 3]))
            .input(f(&[3, 5]))
            .output_existing(f(&[5, 2])),
    );
    assert!(
        msg.contains("c [5, 2]") && msg.contains("must be [2, 5]"),
        "{msg}"
    );

    let msg = run_err(
        "matmul",
        TaskArgs::new()
            .input(f(&[6]))
            .input(f(&[6]))
            .output_existing(f(&[1])),
    );
    assert!(msg.contains("2-d"), "{msg}");

    let i = zeros(&[2, 2], DType::I32);
    let msg = run_err(
        "matmul",
        TaskArgs::new()
            .input(&i)
            .input(&i)
            .output_existing(zeros(&[2, 2], DType::I32)),
    );
    assert!(msg.contains("unsupported dtype i32"), "{msg}");

    let msg = run_err(
        "matmul_acc",
        TaskArgs::new()
            .input(f(&[2, 2]))
            .input(f(&[2, 2]))
            .output_existing(f(&[2, 2])),
    );
    assert!(msg.contains("must be INOUT"), "{msg}");

    // The chip stays usable after failures.
    let out = f(&[1]);
    run("fill", TaskArgs::new().output_existing(&out).scalar(3.0f32)).unwrap();
    assert_eq!(out.read::<f32>().unwrap(), vec![3.0]);
}

#[test]
fn scalars_of_another_numeric_dtype_are_converted() {
    // As Python's ints and floats arrive (i64, f64), on tensors of other dtypes.
    let t = Tensor::zeros(&[4], DType::F32).unwrap();
    run("fill", TaskArgs::new().output_existing(&t).scalar(7i64)).unwrap();
    assert_eq!(t.read::<f32>().unwrap(), vec![7.0; 4]);
    let u = Tensor::zeros(&[3], DType::U8).unwrap();
    run("fill", TaskArgs::new().output_existing(&u).scalar(7.0f64)).unwrap();
    assert_eq!(u.read::<u8>().unwrap(), vec![7; 3]);
    let out = Tensor::zeros(&[4], DType::F32).unwrap();
    run(
        "vector_scale",
        TaskArgs::new().input(&t).output_existing(&out).scalar(2i32),
    )
    .unwrap();
    assert_eq!(out.read::<f32>().unwrap(), vec![14.0; 4]);
    let i = Tensor::from_slice(&[2], &[5i32, -3]).unwrap();
    let o = Tensor::zeros(&[2], DType::I32).unwrap();
    run(
        "vector_add_scalar",
        TaskArgs::new().input(&i).output_existing(&o).scalar(10i64),
    )
    .unwrap();
    assert_eq!(o.read::<i32>().unwrap(), vec![15, 7]);
}
