//! Tile images (`kernels/tile_image.cu`): a matrix's codes laid out as the binary kernel's stages
//! hold them.

use super::*;

/// The shape of a tile image (`kernels/tile_image.cu`): a matrix's rows padded to
/// [`TILE_PAD_ROWS`], its 16-byte units a row, and the rows of the tiles it is laid out in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileImageShape {
    pub rows: usize,
    pub units: usize,
    pub tile_rows: usize,
}

impl TileImageShape {
    /// The image of a `rows` × `cols` matrix of `format` in tiles of `tile_rows` rows (shapes
    /// [`gemv_b1_launch`] takes: whole 128-byte boxes a row, tiles of 16 or 32 rows).
    pub fn new(format: GpuFormat, rows: usize, cols: usize, tile_rows: usize) -> Self {
        debug_assert!(cols >= format.chunk_values() && tile_rows > 0);
        TileImageShape {
            rows: rows.div_ceil(TILE_PAD_ROWS) * TILE_PAD_ROWS,
            units: cols / format.chunk_values(),
            tile_rows,
        }
    }

    /// 16-byte units of a tile.
    fn tile_units(&self) -> usize {
        b1_slabs(self.units) * 8 * self.tile_rows
    }

    /// 16-byte units of the image.
    pub fn units_total(&self) -> usize {
        self.rows.div_ceil(self.tile_rows) * self.tile_units()
    }

    /// Device bytes of the image.
    pub fn bytes(&self) -> usize {
        16 * self.units_total()
    }

    /// Where unit `q` of the image comes from: the row-major upload's unit `row · units + u`,
    /// or `None` for a zero unit. Unit p of row r of a tile's box b holds the row's unit
    /// 8b + (p ^ (r & 7)), the tensor map's 128-byte swizzle (the scalar twin of the kernel).
    pub fn source(&self, q: usize) -> Option<usize> {
        let tr = self.tile_rows;
        let (tile, rem) = (q / self.tile_units(), q % self.tile_units());
        let (b, r, p) = (rem / (8 * tr), (rem / 8) % tr, rem % 8);
        let u = 8 * b + (p ^ (r & 7));
        let row = tile * tr + r;
        (row < self.rows && u < self.units).then_some(row * self.units + u)
    }
}
