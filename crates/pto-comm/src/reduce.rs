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
                    // A NaN wins wherever it is, as numpy's maximum and minimum say (`b != b`
                    // only for a NaN: always false for integers).
                    #[allow(clippy::eq_op)]
                    ReduceOp::Max => {
                        if b > a || b != b {
                            b
                        } else {
                            a
                        }
                    }
                    #[allow(clippy::eq_op)]
                    ReduceOp::Min => {
                        if b < a || b != b {
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
/// for bit-identical results: which of two NaNs, signed zeros). The operation is chosen once
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_and_min_keep_a_nan_on_either_side() {
        for op in [ReduceOp::Max, ReduceOp::Min] {
            assert!(f32::combine(f32::NAN, 1.0, op).is_nan(), "{op:?}");
            assert!(f32::combine(1.0, f32::NAN, op).is_nan(), "{op:?}");
            assert!(f64::combine(2.0, f64::NAN, op).is_nan(), "{op:?}");
            let h = half::f16::from_f32(1.0);
            assert!(half::f16::combine(h, half::f16::NAN, op).is_nan(), "{op:?}");
        }
        assert_eq!(f32::combine(1.0, 2.0, ReduceOp::Max), 2.0);
        assert_eq!(f32::combine(1.0, 2.0, ReduceOp::Min), 1.0);
        assert_eq!(i32::combine(-3, 7, ReduceOp::Max), 7);
        assert_eq!(i64::combine(-3, 7, ReduceOp::Min), -3);
        let mut acc = [1.0f32, f32::NAN, 3.0];
        combine_into(&mut acc, &[f32::NAN, 0.0, 1.0], ReduceOp::Max, false);
        assert!(acc[0].is_nan() && acc[1].is_nan() && acc[2] == 3.0);
    }
}
