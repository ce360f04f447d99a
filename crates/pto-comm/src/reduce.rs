//! How values combine: the reduction operations and the element types collectives reduce.
//! Vocabulary shared by the collectives and the backends below them.

use pto_core::DType;

/// How values combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Product.
    Prod,
}

impl ReduceOp {
    /// `"sum"`, `"max"`, `"min"` or `"prod"`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
        }
    }
}

/// An element type collectives can reduce.
pub trait Reducible: bytemuck::Pod + Send + Sync + 'static {
    /// Its dtype.
    const DTYPE: DType;
    /// `a op b`.
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self;
}

macro_rules! reducible_num {
    ($t:ty, $d:ident, $add:expr, $mul:expr) => {
        impl Reducible for $t {
            const DTYPE: DType = DType::$d;
            #[inline]
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => $add(a, b),
                    ReduceOp::Prod => $mul(a, b),
                    ReduceOp::Max => {
                        if b > a {
                            b
                        } else {
                            a
                        }
                    }
                    ReduceOp::Min => {
                        if b < a {
                            b
                        } else {
                            a
                        }
                    }
                }
            }
        }
    };
}

reducible_num!(f32, F32, |a: f32, b: f32| a + b, |a: f32, b: f32| a * b);
reducible_num!(f64, F64, |a: f64, b: f64| a + b, |a: f64, b: f64| a * b);
reducible_num!(i32, I32, i32::wrapping_add, i32::wrapping_mul);
reducible_num!(i64, I64, i64::wrapping_add, i64::wrapping_mul);

macro_rules! reducible_half {
    ($t:ty, $d:ident) => {
        impl Reducible for $t {
            const DTYPE: DType = DType::$d;
            #[inline]
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                <$t>::from_f32(f32::combine(a.to_f32(), b.to_f32(), op))
            }
        }
    };
}

reducible_half!(half::f16, F16);
reducible_half!(half::bf16, Bf16);

/// `acc[i] = acc[i] op v[i]`, or `acc[i] = v[i] op acc[i]` when `v_first` (the order matters
/// for bit-identical results: max and min of a NaN, signed zeros). The operation is chosen once
/// per slice, not per element, so each loop compiles to vector code.
#[inline]
pub(crate) fn combine_into<T: Reducible>(acc: &mut [T], v: &[T], op: ReduceOp, v_first: bool) {
    #[inline(always)]
    fn go<T: Reducible>(acc: &mut [T], v: &[T], f: impl Fn(T, T) -> T) {
        for (a, b) in acc.iter_mut().zip(v) {
            *a = f(*a, *b);
        }
    }
    macro_rules! with {
        ($op:expr) => {
            if v_first {
                go(acc, v, |a, b| T::combine(b, a, $op))
            } else {
                go(acc, v, |a, b| T::combine(a, b, $op))
            }
        };
    }
    match op {
        ReduceOp::Sum => with!(ReduceOp::Sum),
        ReduceOp::Max => with!(ReduceOp::Max),
        ReduceOp::Min => with!(ReduceOp::Min),
        ReduceOp::Prod => with!(ReduceOp::Prod),
    }
}
