//! The TensorMap's own unit tests (the engine's tests exercise it through submits).

use proptest::prelude::*;

use super::Probe;
use crate::dtype::DType;
use crate::geometry::Region;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// The one-pass probe agrees with the region's own byte range and contiguity test.
    #[test]
    fn probe_matches_the_region(
        offset in 0usize..50,
        dims in proptest::collection::vec((0usize..4, 1usize..30), 1..=5),
        wide in any::<bool>(),
        row_major in any::<bool>(),
    ) {
        let shape: Vec<usize> = dims.iter().map(|d| d.0).collect();
        let dtype = if wide { DType::F64 } else { DType::I16 };
        let r = if row_major {
            Region::contiguous(dtype, offset, &shape)
        } else {
            let strides: Vec<usize> = dims.iter().map(|d| d.1).collect();
            Region::checked(dtype, offset, &shape, &strides).unwrap()
        };
        let p = Probe::of(&r);
        prop_assert_eq!((p.start, p.end), r.byte_range());
        prop_assert_eq!(p.contig, r.is_contiguous());
    }
}
