//! The 2-bit binary decode GEMVs' codes laid out as their ring's stages hold them
//! (`kernels/tile_image.cu`), so that one bulk copy brings a tile where the tensor map takes a
//! copy per 128-byte box (10 or 12 a tile on the 27B). Each image is a second copy of its
//! matrix's codes: the prefill and the dp4a kernels keep reading the row-major upload.
//! `NIWAKI_CUDA_B1_IMAGE=0` makes none. The 1-bit kernels (5 to 17 boxes a tile) measured
//! slower from images and take none.

use super::{Arg, DevBuf, DevMat, Gpu};
use crate::error::Result;
use crate::plan::{self, TILE_PAD_ROWS};
use crate::repack::{GpuFormat, Packed};

impl Gpu {
    /// Makes `m`'s image for the binary decode kernel's tiles of 16 rows where `m` is 2-bit
    /// and the kernel takes its shape (also where the dp4a kernel is preferred, so that the
    /// harness's launches of every shape read images).
    pub(super) fn make_tile_images(&self, m: &DevMat) -> Result<()> {
        if !self.tile_images {
            return Ok(());
        }
        let poisoned = || crate::error::CudaError::Unsupported("tile images poisoned".into());
        // A matrix since freed may have left images at this address.
        self.images
            .lock()
            .map_err(|_| poisoned())?
            .retain(|&(ptr, _), _| ptr != m.codes.ptr);
        if let Some(tr) = self.image_tile_rows(m.format, m.rows, m.cols) {
            let image = self.tile_image_of(m, tr)?;
            self.images
                .lock()
                .map_err(|_| poisoned())?
                .insert((m.codes.ptr, tr), image);
        }
        // Launches on other streams read the images.
        self.stream
            .synchronize()
            .map_err(|e| crate::error::CudaError::Unsupported(format!("tile images: {e}")))
    }

    /// The tile rows of the image a matrix of that format and shape gets, if any.
    fn image_tile_rows(&self, format: GpuFormat, rows: usize, cols: usize) -> Option<usize> {
        let two_bit = matches!(format, GpuFormat::Q2G64 | GpuFormat::Q2G128);
        (self.tile_images && two_bit)
            .then(|| self.b1_plan_shape(format, rows, cols, false))
            .flatten()
            .map(|l| l.tile_rows)
    }

    /// Device bytes of the image [`Gpu::upload_packed`] makes beside `p` (0: none), for the
    /// load's memory check.
    pub fn tile_image_need(&self, p: &Packed) -> usize {
        self.image_tile_rows(p.format, p.rows, p.cols)
            .map_or(0, |tr| {
                let rows = p.rows.div_ceil(TILE_PAD_ROWS) * TILE_PAD_ROWS;
                16 * plan::tile_image_units(rows, p.cols / p.format.chunk_values(), tr)
            })
    }

    /// The image of `m`'s codes in tiles of `tr` rows.
    fn tile_image_of(&self, m: &DevMat, tr: usize) -> Result<DevBuf> {
        let units = m.cols / m.format.chunk_values();
        let rows = m.rows.div_ceil(TILE_PAD_ROWS) * TILE_PAD_ROWS;
        let slabs = plan::b1_slabs(units);
        let total = plan::tile_image_units(rows, units, tr);
        let image = self.alloc(16 * total, "tile image")?;
        let blocks = total.div_ceil(256).min(65_535) as u32;
        self.launch(
            &self.stream,
            "b1_tile_image",
            (blocks, 1, 1),
            (256, 1, 1),
            &[
                Arg::Ptr(m.codes.ptr),
                Arg::I32(rows as i32),
                Arg::I32(units as i32),
                Arg::I32(tr as i32),
                Arg::I32(slabs as i32),
                Arg::Ptr(image.ptr),
                Arg::U64(total as u64),
            ],
        )?;
        Ok(image)
    }

    /// The bytes of `m`'s image in tiles of `tr` rows, where one was made (for the harness to
    /// compare with [`plan::tile_image_source`]'s twin).
    #[doc(hidden)]
    pub fn tile_image_bytes(&self, m: &DevMat, tr: usize) -> Result<Option<Vec<u8>>> {
        let ptr = self.tile_image(m, tr);
        if ptr == 0 {
            return Ok(None);
        }
        let rows = m.rows.div_ceil(TILE_PAD_ROWS) * TILE_PAD_ROWS;
        let units = m.cols / m.format.chunk_values();
        let mut v = vec![0u8; 16 * plan::tile_image_units(rows, units, tr)];
        self.read(&self.stream, ptr, &mut v)?;
        Ok(Some(v))
    }

    /// Device bytes the images take in all.
    pub fn tile_image_total(&self) -> usize {
        self.images
            .lock()
            .map_or(0, |im| im.values().map(|b| b.bytes).sum())
    }

    /// The image of `m` in tiles of `tr` rows, where one was made (0: none).
    pub(super) fn tile_image(&self, m: &DevMat, tr: usize) -> u64 {
        self.images
            .lock()
            .ok()
            .and_then(|im| im.get(&(m.codes.ptr, tr)).map(|b| b.ptr))
            .unwrap_or(0)
    }
}
