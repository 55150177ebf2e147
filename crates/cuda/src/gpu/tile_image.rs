//! The 2-bit binary decode GEMVs' codes laid out as their ring's stages hold them
//! (`kernels/tile_image.cu`), so that one bulk copy brings a tile where the tensor map takes a
//! copy per 128-byte box (10 or 12 a tile on the 27B). Each image is a second copy of its
//! matrix's codes, owned by the matrix: the prefill and the dp4a kernels keep reading the
//! row-major upload. `NIWAKI_CUDA_B1_IMAGE=0` makes none. The 1-bit kernels (5 to 17 boxes a
//! tile) measured slower from images and take none.

use std::sync::atomic::{AtomicU8, Ordering};

use super::{Arg, DevBuf, Gpu};
use crate::error::{Context, Result};
use crate::plan::TileImageShape;
use crate::repack::{GpuFormat, Packed};

/// A matrix's codes in the layout of the binary decode kernel's stages.
pub(crate) struct TileImage {
    pub(crate) shape: TileImageShape,
    pub(crate) buf: DevBuf,
}

/// Which 2-bit matrices get a tile image at upload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ImageUse {
    /// None (`NIWAKI_CUDA_B1_IMAGE=0`, or a device before sm_90).
    Off,
    /// Those whose one-token GEMV the binary kernel takes (the default on sm_90), by the
    /// settings at their upload. Two cases still leave an image unread: a residual GEMV that
    /// folds the next norm in a cluster (the `_c` kernels take tiles by the tensor map: on the
    /// 27B Q2_0 g64 files by default, [`crate::plan::ClusterFold`], the 64 matrices of 5120 ×
    /// 6144), and the binary kernels turned off after the upload.
    Taken,
    /// Every shape the binary kernel's plan takes, preferred for it or not (the harness's
    /// checks launch the kernel on shapes the decode sends to dp4a).
    Every,
}

impl ImageUse {
    pub(super) fn atomic(self) -> AtomicU8 {
        AtomicU8::new(self as u8)
    }

    fn from_u8(x: u8) -> ImageUse {
        match x {
            x if x == ImageUse::Taken as u8 => ImageUse::Taken,
            x if x == ImageUse::Every as u8 => ImageUse::Every,
            _ => ImageUse::Off,
        }
    }
}

impl Gpu {
    /// The image a matrix of that format and shape gets: 2-bit rows the binary decode kernel
    /// takes, in its plan's tiles ([`ImageUse`]).
    fn image_shape(&self, format: GpuFormat, rows: usize, cols: usize) -> Option<TileImageShape> {
        let two_bit = matches!(format, GpuFormat::Q2G64 | GpuFormat::Q2G128);
        let wanted = match self.image_use() {
            ImageUse::Off => false,
            ImageUse::Taken => self.gemv1() && self.prefers_b1_shape(format, rows),
            ImageUse::Every => true,
        };
        (two_bit && wanted)
            .then(|| self.b1_plan_shape(format, rows, cols, false))
            .flatten()
            .map(|l| TileImageShape::new(format, rows, cols, l.tile_rows))
    }

    /// Device bytes of the image [`Gpu::upload_packed`] makes beside `p` (0: none), for the
    /// load's memory check.
    pub fn tile_image_need(&self, p: &Packed) -> usize {
        self.image_shape(p.format, p.rows, p.cols)
            .map_or(0, |s| s.bytes())
    }

    /// The image of the codes just uploaded at `codes` (a `rows` × `cols` matrix of
    /// `format`), if it gets one.
    pub(super) fn make_tile_image(
        &self,
        format: GpuFormat,
        rows: usize,
        cols: usize,
        codes: u64,
    ) -> Result<Option<TileImage>> {
        let Some(shape) = self.image_shape(format, rows, cols) else {
            return Ok(None);
        };
        let total = shape.units_total();
        let buf = self.alloc(
            shape.bytes(),
            "a tile image (NIWAKI_CUDA_B1_IMAGE=0 makes none)",
        )?;
        let blocks = total.div_ceil(256).min(65_535) as u32;
        self.launch(
            &self.stream,
            "b1_tile_image",
            (blocks, 1, 1),
            (256, 1, 1),
            &[
                Arg::Ptr(codes),
                Arg::I32(shape.rows as i32),
                Arg::I32(shape.units as i32),
                Arg::I32(shape.tile_rows as i32),
                Arg::I32(crate::plan::b1_slabs(shape.units) as i32),
                Arg::Ptr(buf.ptr),
                Arg::U64(total as u64),
            ],
        )?;
        // Launches on other streams read the image.
        self.stream
            .synchronize()
            .ctx(|| "making a tile image".into())?;
        Ok(Some(TileImage { shape, buf }))
    }

    /// Which matrices uploaded from now on get images; returns the previous setting. Matrices
    /// uploaded before keep what they got.
    #[doc(hidden)]
    pub fn set_image_use(&self, u: ImageUse) -> ImageUse {
        ImageUse::from_u8(self.image_use.swap(u as u8, Ordering::Relaxed))
    }

    /// Which 2-bit matrices get tile images at upload.
    pub fn image_use(&self) -> ImageUse {
        ImageUse::from_u8(self.image_use.load(Ordering::Relaxed))
    }

    /// The bytes of `m`'s image, where it has one (for the harness to compare with its twin,
    /// [`TileImageShape::source`]).
    #[doc(hidden)]
    pub fn tile_image_bytes(&self, m: &super::DevMat) -> Result<Option<(TileImageShape, Vec<u8>)>> {
        let Some(im) = &m.image else {
            return Ok(None);
        };
        let mut v = vec![0u8; im.shape.bytes()];
        self.read(&self.stream, im.buf.ptr, &mut v)?;
        Ok(Some((im.shape, v)))
    }
}
