//! Element types of tensors.

use std::fmt;

/// The element type of a tensor.
///
/// Every dtype has a fixed size in bytes; [`Element`] connects a Rust type to its dtype so that
/// kernels read and write typed data, and a mismatch is an error rather than a reinterpretation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// IEEE 754 binary32.
    F32 = 0,
    /// IEEE 754 binary64.
    F64 = 1,
    /// IEEE 754 binary16.
    F16 = 2,
    /// bfloat16.
    Bf16 = 3,
    /// Signed 8-bit integer.
    I8 = 4,
    /// Signed 16-bit integer.
    I16 = 5,
    /// Signed 32-bit integer.
    I32 = 6,
    /// Signed 64-bit integer.
    I64 = 7,
    /// Unsigned 8-bit integer.
    U8 = 8,
    /// Unsigned 16-bit integer.
    U16 = 9,
    /// Unsigned 32-bit integer.
    U32 = 10,
    /// Unsigned 64-bit integer.
    U64 = 11,
    /// Boolean stored in one byte (0 or 1); Rust code accesses it as [`Bool`].
    Bool = 12,
}

impl DType {
    /// Every dtype, in discriminant order.
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::Bf16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::Bf16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The lower-case name used in files, the CLI and Python (`"f32"`, `"bf16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bool => "bool",
        }
    }

    /// Parses a name as printed by [`DType::name`]; `None` for anything else.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Decodes the `repr(u8)` discriminant, as stored in shared memory.
    pub fn from_u8(v: u8) -> Option<DType> {
        DType::ALL.get(usize::from(v)).copied()
    }

    /// True for the floating-point dtypes.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::Bf16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A boolean element as stored in a [`DType::Bool`] tensor: one byte, 0 or 1.
///
/// A plain `bool` cannot be read from arbitrary memory (any byte other than 0 or 1 would be
/// undefined behaviour), so bool tensors are accessed through this wrapper.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct Bool(pub u8);

impl Bool {
    /// The truth value: any non-zero byte is true.
    pub const fn get(self) -> bool {
        self.0 != 0
    }
}

impl From<bool> for Bool {
    fn from(b: bool) -> Self {
        Bool(u8::from(b))
    }
}

/// A Rust type that is the element type of one [`DType`].
///
/// Implemented for `f32`, `f64`, [`half::f16`], [`half::bf16`], the signed and unsigned integers
/// from 8 to 64 bits, and [`Bool`]. The `Pod` bound is what makes reading any bit pattern sound.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The dtype of this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: DType = DType::$d; })*
    };
}

element! {
    f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => Bf16,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    u8 => U8, u16 => U16, u32 => U32, u64 => U64, Bool => Bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(DType::from_u8(d as u8), Some(d));
        }
        assert_eq!(std::mem::size_of::<half::bf16>(), DType::Bf16.size());
        assert_eq!(std::mem::size_of::<Bool>(), DType::Bool.size());
        assert_eq!(DType::from_name("f8"), None);
        assert_eq!(DType::from_u8(13), None);
    }
}
