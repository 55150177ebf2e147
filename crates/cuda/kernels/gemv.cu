// Packed-weight GEMV with int8 activations and dp4a, for up to NT tokens per weight read.
//
// Layouts (see repack.rs): a chunk is 16 bytes = 4 words. 1-bit: word w holds values
// 32w+4k+b at bit 8b+k (128 values). 2-bit: word w holds the code of value 16w+4k+b at bits
// 8b+2k (64 values). Activations: int8 (as int words) and (d, d*sum q) per 64 values.

#define GEMV_R 4

#define FMT_Q1 0
#define FMT_Q2G64 1
#define FMT_Q2G128 2

// dp4a of unsigned weight bytes with signed activation bytes.
__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ u32 word_of(const uint4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

template <int FMT>
__device__ __forceinline__ void load_rows(const uint4* __restrict__ codes, const u16* __restrict__ scales,
                                          int rows, int chunks, int r0, int c, uint4* w, float* d) {
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) {
        const int row = min(r0 + r, rows - 1);
        w[r] = ld_stream(codes + (size_t)row * chunks + c);
        const size_t si = FMT == FMT_Q2G128 ? (size_t)row * (chunks / 2) + c / 2
                                            : (size_t)row * chunks + c;
        d[r] = h2f(__ldg(scales + si));
    }
}

template <int FMT, int NT>
__device__ __forceinline__ void dot_chunk(const uint4* w, const float* d, int c, const int* __restrict__ xq,
                                          const float2* __restrict__ xs, int xwords, int groups, int ntok,
                                          float (*acc)[NT]) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < ntok) {
            const int4* xp = (const int4*)(xq + (size_t)t * xwords);
            if (FMT == FMT_Q1) {
                int xw[32];
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    int4 v = __ldg(xp + c * 8 + i);
                    xw[4 * i] = v.x; xw[4 * i + 1] = v.y; xw[4 * i + 2] = v.z; xw[4 * i + 3] = v.w;
                }
                const float2 s0 = __ldg(xs + (size_t)t * groups + 2 * c);
                const float2 s1 = __ldg(xs + (size_t)t * groups + 2 * c + 1);
#pragma unroll
                for (int r = 0; r < GEMV_R; r++) {
                    int a0 = 0, a1 = 0;
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        a0 = __dp4a((int)((w[r].x >> k) & 0x01010101u), xw[k], a0);
                        a0 = __dp4a((int)((w[r].y >> k) & 0x01010101u), xw[8 + k], a0);
                        a1 = __dp4a((int)((w[r].z >> k) & 0x01010101u), xw[16 + k], a1);
                        a1 = __dp4a((int)((w[r].w >> k) & 0x01010101u), xw[24 + k], a1);
                    }
                    acc[r][t] += d[r] * (2.0f * (s0.x * (float)a0 + s1.x * (float)a1) - (s0.y + s1.y));
                }
            } else {
                int xw[16];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int4 v = __ldg(xp + c * 4 + i);
                    xw[4 * i] = v.x; xw[4 * i + 1] = v.y; xw[4 * i + 2] = v.z; xw[4 * i + 3] = v.w;
                }
                const float2 s = __ldg(xs + (size_t)t * groups + c);
#pragma unroll
                for (int r = 0; r < GEMV_R; r++) {
                    // Code field k masked in place is 4^k times the code: one accumulator per k.
                    int b[4] = {0, 0, 0, 0};
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const u32 wj = word_of(w[r], j);
#pragma unroll
                        for (int k = 0; k < 4; k++)
                            b[k] = dp4a_us(wj & (0x03030303u << (2 * k)), xw[4 * j + k], b[k]);
                    }
                    const int a = b[0] + (b[1] >> 2) + (b[2] >> 4) + (b[3] >> 6);
                    acc[r][t] += d[r] * (s.x * (float)a - s.y);
                }
            }
        }
    }
}

// Each warp owns groups of GEMV_R rows (grid-stride), its lanes take every 32nd chunk, and the
// next chunk's weights are loaded before the current one is multiplied. One warp reduces each
// row, in a fixed order: results are deterministic.
template <int FMT, int NT>
__device__ __forceinline__ void gemv_body(const uint4* __restrict__ codes,
                                          const u16* __restrict__ scales, int rows, int cols,
                                          const int* __restrict__ xq, const float2* __restrict__ xs,
                                          int ntok, float* __restrict__ out, int out_stride,
                                          int accumulate, u64* __restrict__ amax) {
    const int lane = threadIdx.x & 31;
    const int wpb = blockDim.x >> 5;
    const int cv = FMT == FMT_Q1 ? 128 : 64;
    const int chunks = cols / cv;
    const int groups = cols / 64;
    const int xwords = cols / 4;
    const int nrg = (rows + GEMV_R - 1) / GEMV_R;
    for (int rg = blockIdx.x * wpb + (threadIdx.x >> 5); rg < nrg; rg += gridDim.x * wpb) {
        const int r0 = rg * GEMV_R;
        float acc[GEMV_R][NT];
#pragma unroll
        for (int r = 0; r < GEMV_R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
        uint4 w[GEMV_R];
        float d[GEMV_R];
        int c = lane;
        if (c < chunks) load_rows<FMT>(codes, scales, rows, chunks, r0, c, w, d);
        while (c < chunks) {
            const int cn = c + 32;
            uint4 wn[GEMV_R];
            float dn[GEMV_R];
            if (cn < chunks) load_rows<FMT>(codes, scales, rows, chunks, r0, cn, wn, dn);
            dot_chunk<FMT, NT>(w, d, c, xq, xs, xwords, groups, ntok, acc);
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) { w[r] = wn[r]; d[r] = dn[r]; }
            c = cn;
        }
#pragma unroll
        for (int r = 0; r < GEMV_R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float v0 = warp_sum(acc[r][t]);
                const int row = r0 + r;
                if (lane == 0 && row < rows && t < ntok) {
                    float* o = out + (size_t)t * out_stride + row;
                    const float v = accumulate ? v0 + *o : v0;
                    *o = v;
                    if (amax) atomicMax(amax + t, argmax_key(v, (u32)row));
                }
            }
    }
}

#define GEMV_KERNEL(name, FMT, NT)                                                              \
    extern "C" __global__ void __launch_bounds__(256, 2)                                          \
        name(const uint4* __restrict__ codes, const u16* __restrict__ scales, int rows, int cols, \
             const int* __restrict__ xq, const float2* __restrict__ xs, int ntok,              \
             float* __restrict__ out, int out_stride, int accumulate, u64* __restrict__ amax) { \
        gemv_body<FMT, NT>(codes, scales, rows, cols, xq, xs, ntok, out, out_stride, accumulate, \
                           amax);                                                              \
    }

GEMV_KERNEL(gemv_q1_t1, FMT_Q1, 1)
GEMV_KERNEL(gemv_q1_t8, FMT_Q1, 8)
GEMV_KERNEL(gemv_q2g64_t1, FMT_Q2G64, 1)
GEMV_KERNEL(gemv_q2g64_t8, FMT_Q2G64, 8)
GEMV_KERNEL(gemv_q2g128_t1, FMT_Q2G128, 1)
GEMV_KERNEL(gemv_q2g128_t8, FMT_Q2G128, 8)
