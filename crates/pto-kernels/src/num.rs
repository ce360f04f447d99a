//! The arithmetic the kernels need, per element type.

use half::{bf16, f16};
use pto_core::Element;

/// An element type the arithmetic kernels support.
///
/// Integer arithmetic wraps (two's complement), as a hardware vector unit does; it never panics.
/// `from_f64` rounds to nearest for floats, and for integers rounds half away from zero and
/// saturates to the type's range (NaN becomes 0).
pub(crate) trait Num: Element + PartialOrd {
    const ZERO: Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    /// `max(x, 0)`, keeping NaN.
    fn relu(self) -> Self {
        if self < Self::ZERO {
            Self::ZERO
        } else {
            self
        }
    }
    /// The sum of `xs`: floats accumulate in f64 and round once; integers wrap in their type.
    fn sum(xs: impl Iterator<Item = Self>) -> Self;
}

macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const ZERO: Self = 0;
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn sub(self, o: Self) -> Self { self.wrapping_sub(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[allow(clippy::cast_lossless, clippy::cast_precision_loss)]
            fn to_f64(self) -> f64 { self as f64 }
            #[allow(clippy::cast_possible_truncation)]
            fn from_f64(v: f64) -> Self { v.round() as $t }
            fn sum(xs: impl Iterator<Item = Self>) -> Self { xs.fold(0, <$t>::wrapping_add) }
        }
    )*};
}

int_num!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! native_float {
    ($($t:ty => $to:expr, $from:expr);* $(;)?) => {$(
        impl Num for $t {
            const ZERO: Self = 0.0;
            fn add(self, o: Self) -> Self { self + o }
            fn sub(self, o: Self) -> Self { self - o }
            fn mul(self, o: Self) -> Self { self * o }
            fn to_f64(self) -> f64 { ($to)(self) }
            fn from_f64(v: f64) -> Self { ($from)(v) }
            fn sum(xs: impl Iterator<Item = Self>) -> Self {
                Self::from_f64(xs.fold(0.0f64, |a, x| a + x.to_f64()))
            }
        }
    )*};
}

#[allow(clippy::cast_possible_truncation)]
fn f64_to_f32(v: f64) -> f32 {
    v as f32
}

native_float! {
    f64 => |x: f64| x, |v: f64| v;
    f32 => f64::from, f64_to_f32;
}

// The half types compute in f64 and round once: for add, sub and mul that equals the directly
// rounded IEEE result (f64 has more than twice their precision).
macro_rules! half_float {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const ZERO: Self = <$t>::ZERO;
            fn add(self, o: Self) -> Self { Self::from_f64(self.to_f64() + o.to_f64()) }
            fn sub(self, o: Self) -> Self { Self::from_f64(self.to_f64() - o.to_f64()) }
            fn mul(self, o: Self) -> Self { Self::from_f64(self.to_f64() * o.to_f64()) }
            fn to_f64(self) -> f64 { <$t>::to_f64(self) }
            fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            fn sum(xs: impl Iterator<Item = Self>) -> Self {
                Self::from_f64(xs.fold(0.0f64, |a, x| a + x.to_f64()))
            }
        }
    )*};
}

half_float!(f16, bf16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_wrap_and_saturate() {
        assert_eq!(i32::MAX.add(1), i32::MIN);
        assert_eq!(i8::from_f64(1000.0), i8::MAX);
        assert_eq!(u8::from_f64(-3.0), 0);
        assert_eq!(i64::from_f64(f64::NAN), 0);
        assert_eq!(i32::from_f64(-2.5), -3);
        assert_eq!(<u16 as Num>::sum([u16::MAX, 2].into_iter()), 1);
    }

    #[test]
    fn floats_round_once() {
        assert_eq!(<f32 as Num>::add(0.1, 0.2), 0.1f32 + 0.2f32);
        assert_eq!(
            f16::from_f32(1.5).mul(f16::from_f32(2.0)),
            f16::from_f32(3.0)
        );
        assert!(f32::NAN.relu().is_nan());
        assert_eq!((-1.0f64).relu(), 0.0);
        assert_eq!(bf16::from_f32(-2.0).relu(), bf16::ZERO);
    }
}
