// A one-token pass's embedding row, looked up on the device, so that a decode step can follow
// the previous step's pick without the host in between (CudaModel::forward_greedy).
//
// The token is read from `key`: the argmax key a greedy pass leaves (its low word the id's
// complement, as argmax_key makes it), or the host's token written there the same way. A row
// is dequantized with quant::dequantize's arithmetic (the same bits) and, for
// Ternary-Bonsai-2, un-rotated as model::hadamard::unrotate_embedding does. An id past the
// vocabulary (no finite logit: the key stayed 0) gives a row of zeros, which the host discards.
//
// grid ceil(cols / 1024), block 256: thread t of block b writes values 1024b + 4t .. +3. With
// `signs` (the hidden width's sign vector) cols is a multiple of 1024.

// Formats (plan::EmbedFormat).
#define EMBED_Q1_0 1
#define EMBED_Q2_64 2
#define EMBED_Q2_128 3
#define EMBED_PTQ1_0 4

// Value j (< 128) of a PTQ1_0 block: trit n of byte `byte` (quant/src/ptq1_0.rs `element`,
// inverted), w = (trit − 1)·d.
__device__ __forceinline__ float ptq1_value(const unsigned char* blk, int j, float d) {
    int byte, n;
    if (j < 80) {
        byte = j & 15;
        n = j >> 4;
    } else if (j < 120) {
        byte = 16 + ((j - 80) & 7);
        n = (j - 80) >> 3;
    } else {
        byte = 24 + ((j - 120) & 1);
        n = (j - 120) >> 1;
    }
    const u32 pow3[5] = {1u, 3u, 9u, 27u, 81u};
    const u32 t = (((u32)blk[byte] * pow3[n]) & 0xffu) * 3u >> 8;
    return (float)((int)t - 1) * d;
}

// Value j of a row in format `fmt` starting at `row`.
__device__ __forceinline__ float embed_value(const unsigned char* __restrict__ row, int fmt, int j) {
    switch (fmt) {
        case EMBED_Q1_0: {
            const unsigned char* blk = row + (size_t)(j >> 7) * 18;
            const float d = h2f(*(const u16*)blk);
            const int k = j & 127;
            return (blk[2 + (k >> 3)] >> (k & 7)) & 1 ? d : -d;
        }
        case EMBED_Q2_64:
        case EMBED_Q2_128: {
            const int qk = fmt == EMBED_Q2_64 ? 64 : 128;
            const unsigned char* blk = row + (size_t)(j / qk) * (2 + qk / 4);
            const float d = h2f(*(const u16*)blk);
            const int k = j % qk;
            const int q = (blk[2 + (k >> 2)] >> (2 * (k & 3))) & 3;
            return (float)(q - 1) * d;
        }
        default: {
            const unsigned char* blk = row + (size_t)(j >> 7) * 28;
            return ptq1_value(blk, j & 127, h2f(*(const u16*)(blk + 26)));
        }
    }
}

ENTRY __global__ void __launch_bounds__(256)
embed_row(const unsigned char* __restrict__ table, int fmt, int cols, u64 row_bytes, int vocab,
          const u64* __restrict__ key, const float* __restrict__ signs, float* __restrict__ x) {
    __shared__ float4 sm[256];
    // The key is the previous pass's or the host's, both finished before this pass began.
    const u32 id = ~(u32)*key;
    PDL_ENTRY();
    const int i0 = blockIdx.x * 1024 + threadIdx.x * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (id < (u32)vocab && i0 < cols) {
        const unsigned char* row = table + (size_t)id * (size_t)row_bytes;
        v = make_float4(embed_value(row, fmt, i0), embed_value(row, fmt, i0 + 1), embed_value(row, fmt, i0 + 2),
                        embed_value(row, fmt, i0 + 3));
    }
    if (signs) v = unrot1024(v, signs + blockIdx.x * 1024, (float*)sm);
    if (i0 < cols) *(float4*)(x + i0) = v;
}
