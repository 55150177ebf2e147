// The binary decode GEMVs' codes laid out as their ring's stages hold them (gemv_b1.cu): per
// tile of `tr` rows, boxes of 128 bytes × `tr` rows with the 128-byte swizzle, so that one
// bulk copy brings a tile where the tensor map takes a copy per box. Unit p (16 bytes) of row r
// of box b holds the row's unit 8b + (p ^ (r & 7)); units past the row, or rows past the padded
// upload, are zero, as the tensor map fills them. `units`: 16-byte units per row.
ENTRY __global__ void __launch_bounds__(256) b1_tile_image(const uint4* __restrict__ codes, int rows, int units,
                                                           int tr, int slabs, uint4* __restrict__ img,
                                                           long long total) {
    const long long per_tile = (long long)slabs * 8 * tr;
    for (long long q = blockIdx.x * 256ll + threadIdx.x; q < total; q += (long long)gridDim.x * 256) {
        const long long tile = q / per_tile;
        const int rem = (int)(q - tile * per_tile);
        const int b = rem / (8 * tr), r = (rem >> 3) % tr, p = rem & 7;
        const int u = 8 * b + (p ^ (r & 7));
        const long long row = tile * tr + r;
        img[q] = row < rows && u < units ? codes[row * units + u] : make_uint4(0u, 0u, 0u, 0u);
    }
}
