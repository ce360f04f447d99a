use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

fn elems(r: &Region) -> BTreeSet<usize> {
    let mut s = BTreeSet::new();
    let sz = r.dtype.size();
    crate::view::for_each_offset(r, |o| {
        for b in 0..sz {
            s.insert((r.offset + o) * sz + b);
        }
    });
    s
}

fn region(dtype: DType, offset: usize, shape: &[usize], strides: &[usize]) -> Region {
    Region::checked(dtype, offset, shape, strides).unwrap()
}

#[test]
fn views_are_metadata_only() {
    let t = Tensor::from_slice(&[2, 3, 4], &(0..24).collect::<Vec<i32>>()).unwrap();
    let v = t.view(&[1, 2, 2], &[1, 1, 2]).unwrap();
    assert_eq!(v.read::<i32>().unwrap(), vec![18, 19, 22, 23]);
    assert_eq!(v.buffer(), t.buffer());
    let s = t.slice(2, 1, 4, 2).unwrap();
    assert_eq!(s.shape(), &[2, 3, 2]);
    assert_eq!(s.read::<i32>().unwrap()[..4], [1, 3, 5, 7]);
    let p = t.permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape(), &[4, 2, 3]);
    assert_eq!(p.read::<i32>().unwrap()[..3], [0, 4, 8]);
    let r = t.reshape(&[6, 4]).unwrap();
    assert_eq!(r.read::<i32>().unwrap(), (0..24).collect::<Vec<_>>());
    assert!(matches!(
        p.reshape(&[24]),
        Err(TensorError::Reshape {
            why: "tensor is not contiguous",
            ..
        })
    ));
    assert!(matches!(
        t.reshape(&[5, 5]),
        Err(TensorError::Reshape { .. })
    ));
}

#[test]
fn bad_geometry_is_an_error() {
    let b = Buffer::zeroed(64).unwrap();
    assert_eq!(
        Tensor::new(b.clone(), DType::F32, &[17], 0).unwrap_err(),
        TensorError::OutOfBuffer {
            needed: 68,
            len: 64
        }
    );
    assert_eq!(
        Tensor::new(b.clone(), DType::F32, &[], 0).unwrap_err(),
        TensorError::BadRank { ndims: 0 }
    );
    assert_eq!(
        Tensor::new(b.clone(), DType::F32, &[1, 1, 1, 1, 1, 1], 0).unwrap_err(),
        TensorError::BadRank { ndims: 6 }
    );
    assert_eq!(
        Tensor::strided(b.clone(), DType::F32, &[2, 2], &[0, 1], 0).unwrap_err(),
        TensorError::ZeroStride { dim: 0 }
    );
    assert_eq!(
        Tensor::strided(b.clone(), DType::U8, &[2], &[usize::MAX], 0).unwrap_err(),
        TensorError::DimTooLarge {
            what: "stride",
            dim: 0,
            value: usize::MAX
        }
    );
    assert_eq!(
        Tensor::strided(b.clone(), DType::U8, &[2, 2], &[1 << 32, 1], 0).unwrap_err(),
        TensorError::DimTooLarge {
            what: "stride",
            dim: 0,
            value: 1 << 32
        }
    );
    // Checked before any allocation: these would need 8 and 32 GiB.
    assert_eq!(
        Tensor::zeros(&[1, 1 << 33], DType::U8).unwrap_err(),
        TensorError::DimTooLarge {
            what: "size",
            dim: 1,
            value: 1 << 33
        }
    );
    assert_eq!(
        Tensor::zeros(&[4, 1 << 16, 1 << 16], DType::F32).unwrap_err(),
        TensorError::DimTooLarge {
            what: "row-major stride",
            dim: 0,
            value: 1 << 32
        }
    );
    let msg = Tensor::zeros(&[1 << 33], DType::U8)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("4294967295"), "{msg}");
    // A step too large for the stride is an error unless it never applies. (4 GiB of address
    // space, never touched: calloc maps it lazily.)
    let wide = Buffer::zeroed((1 << 32) + 1).unwrap();
    let v = Tensor::strided(wide, DType::U8, &[3], &[1 << 31], 0).unwrap();
    assert_eq!(
        v.slice(0, 0, 3, 2).unwrap_err(),
        TensorError::DimTooLarge {
            what: "stride",
            dim: 0,
            value: 1 << 32
        }
    );
    assert_eq!(v.slice(0, 0, 3, usize::MAX).unwrap().shape(), [1]);
    assert_eq!(v.slice(0, 1, 3, 1 << 40).unwrap().strides(), [1 << 31]);
    // The largest supported size and stride still make a region.
    let big = Region::checked(DType::U8, 0, &[1, 2], &[MAX_DIM_LEN, MAX_DIM_LEN]).unwrap();
    assert_eq!(big.strides(), [MAX_DIM_LEN, MAX_DIM_LEN]);
    assert_eq!(big.byte_range(), (0, MAX_DIM_LEN + 1));
    let t = Tensor::new(b, DType::F32, &[4, 4], 0).unwrap();
    assert!(matches!(
        t.view(&[2, 2], &[3, 0]),
        Err(TensorError::OutOfRange { .. })
    ));
    for (shape, offsets, want) in [
        (&[2, usize::MAX][..], &[0, 2][..], "dimension 1: 2.."),
        (
            &[1, 1][..],
            &[0, usize::MAX][..],
            "dimension 1: 18446744073709551615..",
        ),
        (&[1][..], &[0, 0][..], "2-d tensor, got shape [1]"),
    ] {
        let e = t.view(shape, offsets).unwrap_err();
        assert!(
            matches!(e, TensorError::OutOfRange { what: "view", .. })
                && e.to_string().contains(want),
            "{e}"
        );
    }
    assert!(matches!(
        t.slice(0, 0, 4, 0),
        Err(TensorError::OutOfRange { .. })
    ));
    assert!(matches!(
        t.transpose(0, 2),
        Err(TensorError::OutOfRange { .. })
    ));
    assert!(matches!(
        t.permute(&[0, 0]),
        Err(TensorError::OutOfRange { .. })
    ));
    assert_eq!(
        t.read::<i32>().unwrap_err(),
        TensorError::DTypeMismatch {
            expected: DType::I32,
            actual: DType::F32
        }
    );
    assert_eq!(
        t.write(&[1.0f32; 3]).unwrap_err(),
        TensorError::LengthMismatch {
            expected: 16,
            actual: 3
        }
    );
}

#[test]
fn zero_size_views_touch_nothing() {
    let t = Tensor::zeros(&[4, 4], DType::F32).unwrap();
    let z = t.view(&[0, 4], &[4, 0]).unwrap();
    assert_eq!(z.numel(), 0);
    assert_eq!(overlap(z.region(), t.region()), Overlap::Disjoint);
    assert!(z.read::<f32>().unwrap().is_empty());
}

#[test]
fn column_blocks_of_a_matrix_are_disjoint() {
    let m = region(DType::F32, 0, &[8, 8], &[8, 1]);
    let left = region(DType::F32, 0, &[8, 4], &[8, 1]);
    let right = region(DType::F32, 4, &[8, 4], &[8, 1]);
    assert_eq!(overlap(&left, &right), Overlap::Disjoint);
    assert_eq!(overlap(&m, &left), Overlap::Covers);
    assert_eq!(overlap(&left, &m), Overlap::Partial);
    let even = region(DType::F32, 0, &[4], &[2]);
    let odd = region(DType::F32, 1, &[4], &[2]);
    assert_eq!(overlap(&even, &odd), Overlap::Disjoint);
}

fn arb_region() -> impl Strategy<Value = Region> {
    (
        prop::sample::select(vec![DType::U8, DType::I16, DType::F32]),
        0usize..12,
        prop::collection::vec((0usize..4, 1usize..7), 1..=3),
    )
        .prop_map(|(dtype, offset, dims)| {
            let shape: Vec<usize> = dims.iter().map(|d| d.0).collect();
            let strides: Vec<usize> = dims.iter().map(|d| d.1).collect();
            region(dtype, offset, &shape, &strides)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The overlap test is sound: `Disjoint` and `Covers` are never wrong.
    #[test]
    fn overlap_is_sound(a in arb_region(), b in arb_region()) {
        let (ea, eb) = (elems(&a), elems(&b));
        match overlap(&a, &b) {
            Overlap::Disjoint => prop_assert!(ea.is_disjoint(&eb), "{a:?} {b:?}"),
            Overlap::Covers => prop_assert!(ea.is_superset(&eb), "{a:?} {b:?}"),
            Overlap::Partial => {}
        }
    }

    /// For views of one row-major layout the test is exact.
    #[test]
    fn overlap_is_exact_on_boxes(
        r0 in 0usize..6, c0 in 0usize..6, h0 in 0usize..4, w0 in 0usize..4,
        r1 in 0usize..6, c1 in 0usize..6, h1 in 0usize..4, w1 in 0usize..4,
    ) {
        let t = Tensor::zeros(&[9, 9], DType::F32).unwrap();
        let a = t.view(&[h0, w0], &[r0, c0]).unwrap();
        let b = t.view(&[h1, w1], &[r1, c1]).unwrap();
        let (ea, eb) = (elems(a.region()), elems(b.region()));
        let expect = if ea.is_disjoint(&eb) {
            Overlap::Disjoint
        } else if ea.is_superset(&eb) {
            Overlap::Covers
        } else {
            Overlap::Partial
        };
        prop_assert_eq!(overlap(a.region(), b.region()), expect);
    }
}

fn arb_view_of_16x16() -> impl Strategy<Value = Region> {
    // Views a program can make of one 16×16 f32 matrix: boxes, strided slices, transposes, and
    // reinterpretations as a flat vector.
    (
        0usize..16,
        1usize..=16,
        0usize..16,
        1usize..=16,
        1usize..4,
        1usize..4,
        0u8..4,
    )
        .prop_map(|(r0, h, c0, w, sr, sc, kind)| {
            let t = Tensor::zeros(&[16, 16], DType::F32).unwrap();
            let (h, w) = (h.min(16 - r0), w.min(16 - c0));
            let b = t.view(&[h, w], &[r0, c0]).unwrap();
            let v = match kind {
                0 => b,
                1 => b.transpose(0, 1).unwrap(),
                2 => b.slice(0, 0, h, sr).unwrap().slice(1, 0, w, sc).unwrap(),
                _ => t
                    .reshape(&[256])
                    .unwrap()
                    .slice(0, r0 * 16 + c0, 256, sr)
                    .unwrap(),
            };
            *v.region()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// `intersects` is exact: true exactly when the regions share a byte.
    #[test]
    fn intersects_is_exact(a in arb_region(), b in arb_region()) {
        let (ea, eb) = (elems(&a), elems(&b));
        prop_assert_eq!(intersects(&a, &b), !ea.is_disjoint(&eb), "{:?} {:?}", a, b);
    }

    #[test]
    fn intersects_is_exact_on_views(a in arb_view_of_16x16(), b in arb_view_of_16x16()) {
        let (ea, eb) = (elems(&a), elems(&b));
        prop_assert_eq!(intersects(&a, &b), !ea.is_disjoint(&eb), "{:?} {:?}", a, b);
    }
}

/// The case that made the borrow table call a valid program racy: a one-element strided write
/// next to a 2×2 box. The conservative test says "maybe" (different layouts); no byte is shared.
#[test]
fn a_box_beside_a_strided_element_does_not_intersect() {
    let a = region(DType::I64, 10, &[1], &[3]);
    let b = region(DType::I64, 8, &[2, 2], &[4, 1]);
    assert_eq!(overlap(&b, &a), Overlap::Partial);
    assert!(!intersects(&b, &a));
    assert!(!intersects(&a, &b));
}
