// Multi-token GEMM on int8 tensor cores (mma.sync m16n8k32, sm_80+), for prefill.
//
// out[t][r] (+)= W[r] · x[t] for a tile of 128·MI rows and MM_BN tokens per block. The dp4a
// kernels of gemv.cu spend two to three instructions per four weights for every token; here one
// mma multiplies a 16×32 weight tile by 32×8 activations. The weights stay packed on their way
// through shared memory: a thread turns the 16-byte chunk of a row into its A fragments with one
// shift and one mask per four values, since the layouts of gemv.cu put four consecutive values
// into the four bytes of a word, which is exactly what a fragment register holds (codes 0..3, or
// bits 0/1, are valid s8 operands). Activations (int8) are copied as they lie and reach the B
// fragments through ldmatrix.
//
// The integer dot of each 64-value group is exact; the thread that owns an output scales it and
// adds it in float, in group order: results are deterministic (though not the bits of the
// dp4a kernels, which add in another order).
//
// 8 warps; warp w owns rows 16·MI·w .. +16·MI−1 of the tile (MI 16-row mma tiles) for all MM_BN
// tokens. MI = 2 shares each activation fragment between two row tiles; MI = 1 needs about half
// the registers, so two blocks fit on a multiprocessor. A grid's z index splits K (gemm_reduce
// adds the partial sums in order).
//
// K advances MM_KC values (whole chunks) of every row per stage, through a ring of MM_STAGES
// stages filled by cp.async. Per stage (shared memory): the weight chunks (MM_WSTRIDE bytes per
// row: the 8 rows a quad-broadcast load touches fall in distinct banks), the activations
// (token-major, padded so that an 8×16-byte ldmatrix is conflict-free), their (d, d·Σq) pairs
// (group-major, so that a thread's two tokens are one 16-byte load). The tile and ring sizes
// come from the host's plan (plan/gemm.rs), which sizes the launches with them.
#if !defined(MM_WARPS) || !defined(MM_BN) || !defined(MM_STAGES) || !defined(MM_KC) || !defined(MM_WSTRIDE)
#error "MM_WARPS, MM_BN, MM_STAGES, MM_KC and MM_WSTRIDE must be defined by the host"
#endif
#define MM_NT (MM_BN / 8)
static_assert(MM_BN % 8 == 0 && MM_STAGES >= 2 && MM_KC % 128 == 0, "tile shape");

// 1.5·2^23 and its bits: every integer n with |n| < 2^22 added to it is exact in a float.
#define MM_MAGIC 12582912.0f
#define MM_MAGIC_BITS 0x4B400000
static_assert(3 * 64 * 127 < (1 << 22), "a 64-value group's dot fits the magic mantissa");

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void ldmatrix_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += A (16×32, s8, row-major) · B (32×8, s8, column-major).
__device__ __forceinline__ void mma_s8(int* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragments of one 64-value group for the two mmas that cover it (k 0-31, 32-63): lo and
// hi are the chunks of rows g and g+8. Register order: (row g, k 4t..), (row g+8, k 4t..),
// (row g, k 16+4t..), (row g+8, k 16+4t..), with t the lane's index in its quad.
template <int FMT>
__device__ __forceinline__ void a_frags(const uint4& lo, const uint4& hi, int gi, int tig, u32 (*a)[4]) {
    if (FMT == FMT_Q1) {
        // Word w holds values 32w+4k+b at bit 8b+k: group gi is words 2gi (k 0-31), 2gi+1.
        const u32 m = 0x01010101u;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const u32 wl = word_of(lo, 2 * gi + j), wh = word_of(hi, 2 * gi + j);
            a[j][0] = (wl >> tig) & m;
            a[j][1] = (wh >> tig) & m;
            a[j][2] = (wl >> (tig + 4)) & m;
            a[j][3] = (wh >> (tig + 4)) & m;
        }
    } else {
        // Word w holds the code of value 16w+4k+b at bits 8b+2k: the chunk is the group.
        const u32 m = 0x03030303u;
        const int sh = 2 * tig;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            a[j][0] = (word_of(lo, 2 * j) >> sh) & m;
            a[j][1] = (word_of(hi, 2 * j) >> sh) & m;
            a[j][2] = (word_of(lo, 2 * j + 1) >> sh) & m;
            a[j][3] = (word_of(hi, 2 * j + 1) >> sh) & m;
        }
    }
}

template <int FMT, int MM_MI>
__device__ __forceinline__ void gemm_body(const uint4* __restrict__ codes, const u16* __restrict__ scales,
                                          int rows, int cols, const unsigned char* __restrict__ xq,
                                          const float2* __restrict__ xs, int ntok,
                                          float* __restrict__ out, int out_stride, int accumulate,
                                          long long zstride) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int CV = FMT == FMT_Q1 ? 128 : 64;      // values per chunk
    constexpr int GPC = CV / 64;                       // 64-groups per chunk
    constexpr int KC = MM_KC;                          // values per stage
    constexpr int CPS = KC / CV;                       // chunks per row per stage
    static_assert(CPS * 16 <= MM_WSTRIDE, "a stage's chunks fit the row stride");
    constexpr int GPS = KC / 64;                       // groups per stage
    constexpr int XSTRIDE = KC + 16;
    constexpr int MM_BM = MM_WARPS * 16 * MM_MI;
    constexpr int W_BYTES = MM_BM * MM_WSTRIDE;
    constexpr int X_BYTES = MM_BN * XSTRIDE;
    constexpr int STAGE = W_BYTES + X_BYTES + GPS * MM_BN * 8;
    constexpr int SPS = FMT == FMT_Q2G128 ? KC / 128 : CPS; // weight scales per row per stage
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int tok0 = blockIdx.x * MM_BN, row0 = blockIdx.y * MM_BM;
    const int chunks = cols / CV, groups = cols / 64, spr = FMT == FMT_Q2G128 ? cols / 128 : chunks;
    // Split K: block z of gridDim.z takes its share of the stages and writes its partial sums
    // zstride floats further on (gemm_reduce adds them up in order).
    const int nst = (chunks + CPS - 1) / CPS;
    const int st0 = (int)((long long)nst * blockIdx.z / gridDim.z);
    const int st1 = (int)((long long)nst * (blockIdx.z + 1) / gridDim.z);
    out += blockIdx.z * zstride;
    PDL_ENTRY();

    constexpr int NTH = MM_WARPS * 32;
    constexpr int W_COPIES = MM_BM * CPS, X_COPIES = MM_BN * (KC / 16), S_COPIES = GPS * MM_BN;
    auto load_stage = [&](int s) {
        unsigned char* st = smem + (s % MM_STAGES) * STAGE;
        unsigned char* xsm = st + W_BYTES;
        unsigned char* ssm = xsm + X_BYTES;
        each_copy<W_COPIES, NTH>(tid, [&](int e) {
            const int r = e / CPS, cc = e % CPS, c = s * CPS + cc;
            const int row = min(row0 + r, rows - 1);
            if (c < chunks) cp_async16(st + r * MM_WSTRIDE + cc * 16, codes + (size_t)row * chunks + c);
        });
        each_copy<X_COPIES, NTH>(tid, [&](int e) {
            const int t = e / (KC / 16), p = e % (KC / 16), k = s * KC + p * 16;
            const int tok = min(tok0 + t, ntok - 1);
            if (k < cols) cp_async16(xsm + t * XSTRIDE + p * 16, xq + (size_t)tok * cols + k);
        });
        each_copy<S_COPIES, NTH>(tid, [&](int e) {
            const int gg = e / MM_BN, t = e % MM_BN, gr = s * GPS + gg;
            const int tok = min(tok0 + t, ntok - 1);
            if (gr < groups) cp_async8(ssm + (gg * MM_BN + t) * 8, xs + (size_t)tok * groups + gr);
        });
    };
    // This thread's weight scales for stage s: rows (mi, g / g+8), SPS per row.
    auto load_scales = [&](int s, float (*d)[2][SPS]) {
#pragma unroll
        for (int mi = 0; mi < MM_MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = min(row0 + warp * 16 * MM_MI + mi * 16 + h * 8 + g, rows - 1);
#pragma unroll
                for (int j = 0; j < SPS; j++) {
                    const int si = s * SPS + j;
                    d[mi][h][j] = si < spr ? h2f(__ldg(scales + (size_t)row * spr + si)) : 0.0f;
                }
            }
    };

    float acc[MM_MI][MM_NT][4];
#pragma unroll
    for (int mi = 0; mi < MM_MI; mi++)
#pragma unroll
        for (int ni = 0; ni < MM_NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < MM_STAGES - 1; s++) {
        if (st0 + s < st1) load_stage(st0 + s);
        cp_async_commit();
    }
    float dw[MM_MI][2][SPS];
    load_scales(st0, dw);
    for (int s = st0; s < st1; s++) {
        cp_async_wait<MM_STAGES - 2>();
        // Stage s has landed for every thread, and every warp is done with stage s-1, whose
        // buffer the next load reuses.
        __syncthreads();
        if (s + MM_STAGES - 1 < st1) load_stage(s + MM_STAGES - 1);
        cp_async_commit();
        float dn[MM_MI][2][SPS];
        if (s + 1 < st1) load_scales(s + 1, dn);
        const unsigned char* st = smem + (s % MM_STAGES) * STAGE;
        const unsigned char* xsm = st + W_BYTES;
        const float2* ssm = (const float2*)(xsm + X_BYTES);
        // This lane's ldmatrix row: token lane % 8 of a tile, 16 bytes at (lane / 8)·16.
        const u32 xrow = smem_addr(xsm) + (lane & 7) * XSTRIDE + 16 * (lane >> 3);
#pragma unroll
        for (int cc = 0; cc < CPS; cc++) {
            if (s * CPS + cc >= chunks) break;
            uint4 lo[MM_MI], hi[MM_MI];
#pragma unroll
            for (int mi = 0; mi < MM_MI; mi++) {
                const unsigned char* wr = st + (warp * 16 * MM_MI + mi * 16 + g) * MM_WSTRIDE + cc * 16;
                lo[mi] = *(const uint4*)wr;
                hi[mi] = *(const uint4*)(wr + 8 * MM_WSTRIDE);
            }
#pragma unroll
            for (int gi = 0; gi < GPC; gi++) {
                const int gs = cc * GPC + gi; // group within the stage
                u32 a[MM_MI][2][4];
#pragma unroll
                for (int mi = 0; mi < MM_MI; mi++) a_frags<FMT>(lo[mi], hi[mi], gi, tig, a[mi]);
                // Tokens past ntok in the last tile are computed too (their loads repeat the last
                // token) and not written: a branch per tile made the compiler redo the A
                // fragments inside every branch.
#pragma unroll
                for (int ni = 0; ni < MM_NT; ni++) {
                    {
                        u32 b[4];
                        ldmatrix_x4(b, xrow + ni * 8 * XSTRIDE + gs * 64);
                        const float4 sx = *(const float4*)(ssm + gs * MM_BN + ni * 8 + 2 * tig);
#pragma unroll
                        for (int mi = 0; mi < MM_MI; mi++) {
                            // The accumulators start at the bits of 1.5·2^23, so that the
                            // integer sum lands in the mantissa of a float: one exact FFMA
                            // turns it into the dot (|dot| < 2^22), where a conversion
                            // instruction runs at a quarter of the FP32 rate or less.
                            int c[4] = {MM_MAGIC_BITS, MM_MAGIC_BITS, MM_MAGIC_BITS, MM_MAGIC_BITS};
                            mma_s8(c, a[mi][0], b[0], b[1]);
                            mma_s8(c, a[mi][1], b[2], b[3]);
                            // 1-bit: value = (2·bit − 1)·d, so Σ = 2·Σ bit·q − Σ q.
                            const float k = FMT == FMT_Q1 ? 2.0f : 1.0f;
                            const float d0 = dw[mi][0][FMT == FMT_Q2G128 ? cc / 2 : cc];
                            const float d1 = dw[mi][1][FMT == FMT_Q2G128 ? cc / 2 : cc];
                            const float f0 = fmaf(__int_as_float(c[0]), k, -k * MM_MAGIC);
                            const float f1 = fmaf(__int_as_float(c[1]), k, -k * MM_MAGIC);
                            const float f2 = fmaf(__int_as_float(c[2]), k, -k * MM_MAGIC);
                            const float f3 = fmaf(__int_as_float(c[3]), k, -k * MM_MAGIC);
                            acc[mi][ni][0] += d0 * (sx.x * f0 - sx.y);
                            acc[mi][ni][1] += d0 * (sx.z * f1 - sx.w);
                            acc[mi][ni][2] += d1 * (sx.x * f2 - sx.y);
                            acc[mi][ni][3] += d1 * (sx.z * f3 - sx.w);
                        }
                    }
                }
            }
        }
        if (s + 1 < st1) {
#pragma unroll
            for (int mi = 0; mi < MM_MI; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int j = 0; j < SPS; j++) dw[mi][h][j] = dn[mi][h][j];
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int mi = 0; mi < MM_MI; mi++)
#pragma unroll
        for (int ni = 0; ni < MM_NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = row0 + warp * 16 * MM_MI + mi * 16 + g + (e >> 1) * 8;
                const int tok = tok0 + ni * 8 + 2 * tig + (e & 1);
                if (row < rows && tok < ntok) {
                    float* o = out + (size_t)tok * out_stride + row;
                    *o = accumulate ? acc[mi][ni][e] + *o : acc[mi][ni][e];
                }
            }
}
#endif

#if __CUDA_ARCH__ >= 800
#define GEMM_CALL(FMT, MI) \
    gemm_body<FMT, MI>(codes, scales, rows, cols, xq, xs, ntok, out, out_stride, accumulate, zstride)
#else
#define GEMM_CALL(FMT, MI) __trap()
#endif

// grid (ceil(ntok / MM_BN), ceil(rows / (128·MI)), K splits), block 256, dynamic shared memory
// MM_STAGES stages (plan/gemm.rs: gemm_smem_bytes); 3 − MI blocks per multiprocessor.
#define GEMM_KERNEL(name, FMT, MI)                                                             \
    ENTRY __global__ void __launch_bounds__(MM_WARPS * 32, 3 - MI)                         \
        name(const uint4* __restrict__ codes, const u16* __restrict__ scales, int rows, int cols, \
             const unsigned char* __restrict__ xq, const float2* __restrict__ xs, int ntok,     \
             float* __restrict__ out, int out_stride, int accumulate, long long zstride) {      \
        GEMM_CALL(FMT, MI);                                                                     \
    }

GEMM_KERNEL(gemm_q1_m1, FMT_Q1, 1)
GEMM_KERNEL(gemm_q1_m2, FMT_Q1, 2)
GEMM_KERNEL(gemm_q2g64_m1, FMT_Q2G64, 1)
GEMM_KERNEL(gemm_q2g64_m2, FMT_Q2G64, 2)
GEMM_KERNEL(gemm_q2g128_m1, FMT_Q2G128, 1)
GEMM_KERNEL(gemm_q2g128_m2, FMT_Q2G128, 2)

// out[t][r] (+)= Σ_z part[z][t][r], z in order: the partial sums of a split-K GEMM (each
// [ntok][rows], zstride floats apart). grid (ceil(rows / 256), ntok), block 256.
ENTRY __global__ void gemm_reduce(const float* __restrict__ part, int nsplit, long long zstride,
                                       int rows, float* __restrict__ out, int out_stride,
                                       int accumulate) {
    PDL_ENTRY();
    const int r = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (r >= rows) return;
    const float* p = part + (size_t)t * rows + r;
    float v = p[0];
    for (int z = 1; z < nsplit; z++) v += p[z * zstride];
    float* o = out + (size_t)t * out_stride + r;
    *o = accumulate ? v + *o : v;
}
