//! Tensor maps for the tensor memory accelerator (TMA, sm_90): a box of a row-major matrix
//! copied into shared memory by one instruction, in the layout (swizzle) a kernel reads.
//!
//! A [`Tile`] describes the matrix and the box without an address, so that the rules the
//! driver enforces are checked (and unit-tested) on the host; [`encode`] makes the map.

use cudarc::driver::sys;

use crate::error::{CudaError, Result};

/// Element type of a tensor map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    U8,
    F16,
}

impl Elem {
    pub const fn bytes(self) -> usize {
        match self {
            Elem::U8 => 1,
            Elem::F16 => 2,
        }
    }
}

/// How a box's rows land in shared memory: as they are, or with the 16-byte units of each
/// 32- or 128-byte span permuted (the unit index XORed with address bits 7 and up: bit 7 for
/// 32 bytes, bits 7-9 for 128), the layouts wgmma reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swizzle {
    None,
    B32,
    B128,
}

impl Swizzle {
    /// Most bytes of a box row this swizzle takes.
    const fn span(self) -> usize {
        match self {
            Swizzle::None => usize::MAX,
            Swizzle::B32 => 32,
            Swizzle::B128 => 128,
        }
    }
}

/// A row-major matrix of `rows` rows of `cols` elements (`row_bytes` apart) and the box one
/// copy brings: `box_cols` × `box_rows`. Boxes reaching past the matrix arrive zero-filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub elem: Elem,
    pub cols: usize,
    pub rows: usize,
    pub row_bytes: usize,
    pub box_cols: usize,
    pub box_rows: usize,
    pub swizzle: Swizzle,
}

impl Tile {
    /// Bytes of one box in shared memory.
    pub const fn box_bytes(&self) -> usize {
        self.box_cols * self.box_rows * self.elem.bytes()
    }

    /// The driver's rules for a tiled map (CUDA driver API, `cuTensorMapEncodeTiled`).
    pub fn check(&self) -> std::result::Result<(), String> {
        let inner = self.box_cols * self.elem.bytes();
        if self.cols == 0 || self.rows == 0 {
            return Err(format!("empty matrix {self:?}"));
        }
        if self.cols as u64 > 1 << 32
            || self.rows as u64 > 1 << 32
            || self.row_bytes as u64 >= 1 << 40
        {
            return Err(format!("matrix {self:?} beyond the driver's limits (2³² elements a dimension, strides under 2⁴⁰ bytes)"));
        }
        if !self.row_bytes.is_multiple_of(16) || self.row_bytes < self.cols * self.elem.bytes() {
            return Err(format!(
                "row stride {} (multiple of 16, holding a row)",
                self.row_bytes
            ));
        }
        if !(1..=256).contains(&self.box_cols) || !(1..=256).contains(&self.box_rows) {
            return Err(format!(
                "box {}×{} (1..=256 each)",
                self.box_cols, self.box_rows
            ));
        }
        if !inner.is_multiple_of(16) || inner > self.swizzle.span() {
            return Err(format!(
                "box rows of {inner} bytes (a multiple of 16, at most the {:?} span)",
                self.swizzle
            ));
        }
        Ok(())
    }
}

/// An encoded tensor map, passed to a kernel by value (a `__grid_constant__` parameter).
#[derive(Clone, Copy, Debug)]
pub struct TensorMap(pub(crate) sys::CUtensorMap);

impl TensorMap {
    /// The parameter of a kernel told (by another parameter) not to read its map.
    pub fn unused() -> TensorMap {
        // SAFETY: CUtensorMap is an array of integers, for which all zeros is a value.
        TensorMap(unsafe { std::mem::zeroed() })
    }
}

/// The map of `tile` for the matrix at device address `ptr` (16-byte aligned).
pub fn encode(ptr: u64, tile: &Tile) -> Result<TensorMap> {
    tile.check()
        .and_then(|()| {
            if ptr.is_multiple_of(16) {
                Ok(())
            } else {
                Err(format!("address {ptr:#x} is not 16-byte aligned"))
            }
        })
        .map_err(|e| CudaError::Unsupported(format!("tensor map: {e}")))?;
    use sys::CUtensorMapDataType as T;
    use sys::CUtensorMapSwizzle as S;
    let dtype = match tile.elem {
        Elem::U8 => T::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        Elem::F16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    };
    let swizzle = match tile.swizzle {
        Swizzle::None => S::CU_TENSOR_MAP_SWIZZLE_NONE,
        Swizzle::B32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
        Swizzle::B128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
    };
    let dims = [tile.cols as u64, tile.rows as u64];
    let strides = [tile.row_bytes as u64];
    let boxes = [tile.box_cols as u32, tile.box_rows as u32];
    let elem_strides = [1u32, 1];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every pointer refers to a live array of the rank (2) the call is given, or
    // rank − 1 for the strides; `map` is written by the call; the address is only recorded.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dtype,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(|source| CudaError::Driver {
        what: format!("encoding a tensor map for {tile:?}"),
        source,
    })?;
    // SAFETY: zero-initialised, then filled by the successful call.
    Ok(TensorMap(unsafe { map.assume_init() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tile() -> Tile {
        Tile {
            elem: Elem::F16,
            cols: 5120,
            rows: 256,
            row_bytes: 10240,
            box_cols: 64,
            box_rows: 128,
            swizzle: Swizzle::B128,
        }
    }

    #[test]
    fn the_drivers_rules_are_checked_on_the_host() {
        assert_eq!(tile().check(), Ok(()));
        assert_eq!(tile().box_bytes(), 16384);
        let bad = [
            Tile {
                box_cols: 128,
                ..tile()
            },
            Tile {
                box_rows: 257,
                ..tile()
            },
            Tile {
                row_bytes: 10248,
                ..tile()
            },
            Tile {
                row_bytes: 5120,
                ..tile()
            },
            Tile {
                box_cols: 4,
                ..tile()
            },
            Tile { rows: 0, ..tile() },
            Tile {
                rows: (1 << 32) + 1,
                ..tile()
            },
        ];
        for t in bad {
            assert!(t.check().is_err(), "{t:?}");
        }
        let b32 = Tile {
            elem: Elem::U8,
            box_cols: 32,
            swizzle: Swizzle::B32,
            ..tile()
        };
        assert_eq!(b32.check(), Ok(()));
        assert!(Tile {
            box_cols: 64,
            ..b32
        }
        .check()
        .is_err());
    }
}
