//! Device memory: allocations with their raw addresses, the re-tiled weight matrices, and the
//! copies between host and device.

use std::sync::Arc;

use cudarc::driver::{result, CudaSlice, CudaStream, DevicePtr};

use super::{Arg, Gpu, TileImage};
use crate::error::{Context, CudaError, Result};
use crate::plan::{self, TILE_PAD_ROWS};
use crate::repack::{GpuFormat, Packed};
use crate::tma::{self, TensorMap};

/// A device allocation with its raw address.
pub struct DevBuf {
    _mem: CudaSlice<u8>,
    pub ptr: u64,
    pub bytes: usize,
}

impl DevBuf {
    pub fn at(&self, offset: usize) -> u64 {
        debug_assert!(offset <= self.bytes);
        self.ptr + offset as u64
    }
}

/// A re-tiled weight matrix on the device.
pub struct DevMat {
    pub format: GpuFormat,
    pub rows: usize,
    pub cols: usize,
    pub codes: DevBuf,
    pub scales: DevBuf,
    /// The codes again in the binary decode kernel's tiles, where it takes them from an image
    /// (`gpu/tile_image.rs`).
    pub(crate) image: Option<TileImage>,
    /// The scales again in stage order, where the f16 GEMM reads them so
    /// ([`crate::stage_scales`]; made on devices with warpgroup MMA only).
    pub stage_scales: Option<DevBuf>,
}

impl DevMat {
    /// The leading kernel arguments of every GEMV and GEMM: codes, scales, rows, columns.
    pub(super) fn args(&self) -> [Arg; 4] {
        [
            Arg::Ptr(self.codes.ptr),
            Arg::Ptr(self.scales.ptr),
            Arg::I32(self.rows as i32),
            Arg::I32(self.cols as i32),
        ]
    }

    /// The tensor map through which the binary decode kernels copy the codes: boxes of 128
    /// bytes by `tile_rows` rows of the padded upload, with the 128-byte swizzle.
    pub fn codes_map(&self, tile_rows: usize) -> Result<TensorMap> {
        let row_bytes = self.cols / self.format.chunk_values() * 16;
        tma::encode(
            self.codes.ptr,
            &tma::Tile {
                elem: tma::Elem::U8,
                cols: row_bytes,
                rows: self.rows.div_ceil(TILE_PAD_ROWS) * TILE_PAD_ROWS,
                row_bytes,
                box_cols: 128,
                box_rows: tile_rows,
                swizzle: tma::Swizzle::B128,
            },
        )
    }

    /// Bytes of the matrix proper (the upload's padding rows are not counted).
    pub fn bytes(&self) -> usize {
        let f = self.format;
        self.rows * (self.cols / f.chunk_values() * 16 + self.cols / f.scale_values() * 2)
    }

    /// Device bytes of the matrix's tile image (0: none).
    pub fn image_bytes(&self) -> usize {
        self.image.as_ref().map_or(0, |im| im.buf.bytes)
    }

    /// Device bytes of the matrix's stage-ordered scales (0: none).
    pub fn stage_scale_bytes(&self) -> usize {
        self.stage_scales.as_ref().map_or(0, |b| b.bytes)
    }

    /// Whether the f16 GEMM can take the matrix: whole stages, and its scales in stage order
    /// where it reads them so.
    pub fn hgemm_ready(&self) -> bool {
        plan::hgemm_takes(self.cols)
            && (!plan::hgemm_stage_scales(self.format) || self.stage_scales.is_some())
    }
}

impl Gpu {
    pub fn free_bytes(&self) -> Result<usize> {
        Ok(self.ctx.mem_get_info().ctx(|| "memory info".into())?.0)
    }

    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().ctx(|| "creating a stream".into())
    }

    /// A zeroed allocation of `bytes` (at least 1).
    pub fn alloc(&self, bytes: usize, what: &str) -> Result<DevBuf> {
        let mem =
            self.stream
                .alloc_zeros::<u8>(bytes.max(1))
                .map_err(|e| match self.free_bytes() {
                    Ok(free) => CudaError::OutOfMemory {
                        what: what.into(),
                        need_mib: (bytes as u64).div_ceil(1 << 20),
                        free_mib: free as u64 >> 20,
                        breakdown: e.to_string(),
                    },
                    Err(_) => CudaError::Driver {
                        what: format!("allocating {bytes} bytes for {what}"),
                        source: e,
                    },
                })?;
        let ptr = mem.device_ptr(&self.stream).0;
        Ok(DevBuf {
            _mem: mem,
            ptr,
            bytes,
        })
    }

    pub fn upload<T: Copy>(&self, data: &[T], what: &str) -> Result<DevBuf> {
        let bytes = std::mem::size_of_val(data);
        let buf = self.alloc(bytes, what)?;
        self.write(&self.stream, buf.ptr, data)?;
        Ok(buf)
    }

    /// Host → device copy on `stream`. Pageable host data is staged before this returns;
    /// page-locked data is read by the copy itself, later: the caller keeps it unchanged until
    /// the stream is synchronized.
    pub fn write<T: Copy>(&self, stream: &CudaStream, dst: u64, data: &[T]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst` is an allocation of this context at least `size_of_val(data)` long
        // (callers pass offsets inside their own buffers); pageable source memory is copied
        // before the call returns, and callers passing page-locked memory hold it unchanged
        // until they synchronize the stream (`CudaModel::run`).
        unsafe { result::memcpy_htod_async(dst, data, stream.cu_stream()) }
            .ctx(|| "host to device copy".into())
    }

    /// Device → host copy on `stream`, synchronising it.
    pub fn read<T: Copy>(&self, stream: &CudaStream, src: u64, out: &mut [T]) -> Result<()> {
        // SAFETY: `src` holds at least `size_of_val(out)` bytes; the stream is synchronised
        // before `out` is used.
        unsafe { result::memcpy_dtoh_async(out, src, stream.cu_stream()) }
            .ctx(|| "device to host copy".into())?;
        stream.synchronize().ctx(|| "synchronising".into())
    }

    /// Uploads a re-tiled matrix with its rows padded (zeros) to a multiple of
    /// [`TILE_PAD_ROWS`], so that the decode GEMV copies whole tiles only.
    pub fn upload_packed(&self, p: &Packed, name: &str) -> Result<DevMat> {
        let padded = p.rows.div_ceil(TILE_PAD_ROWS) * TILE_PAD_ROWS;
        let put = |data: &[u8]| -> Result<DevBuf> {
            let buf = self.alloc(data.len() / p.rows.max(1) * padded, name)?;
            self.write(&self.stream, buf.ptr, data)?;
            Ok(buf)
        };
        let scale_bytes: Vec<u8> = p.scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        let codes = put(&p.codes)?;
        let image = self.make_tile_image(p.format, p.rows, p.cols, codes.ptr)?;
        let stage_scales = match self.stage_scale_need(p) {
            0 => None,
            _ => crate::stage_scales::by_stage(p)
                .map(|s| self.upload(&s, &format!("{name}'s scales in stage order")))
                .transpose()?,
        };
        Ok(DevMat {
            format: p.format,
            rows: p.rows,
            cols: p.cols,
            codes,
            scales: put(&scale_bytes)?,
            image,
            stage_scales,
        })
    }

    /// Device bytes of the stage-ordered scales [`Gpu::upload_packed`] makes beside `p` (0:
    /// none), for the load's memory check.
    pub fn stage_scale_need(&self, p: &Packed) -> usize {
        if self.info.wgmma() {
            plan::hgemm_stage_scale_bytes(p.format, p.rows, p.cols)
        } else {
            0
        }
    }
}
