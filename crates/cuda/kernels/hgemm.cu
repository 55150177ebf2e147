// Multi-token GEMM on f16 tensor cores (mma.sync m16n8k16, f32 accumulation), for prefill.
//
// The int8 GEMM (gemm.cu) must scale every 64-value group's integer dot by a weight scale and
// an activation scale in float: three FFMAs per output and group, six per mma, half of its
// instructions. Here both scales travel inside the operands instead: the activations arrive as
// f16 (the quantization kernels write them beside the int8 ones, quant.cu), and each thread
// turns its packed weight codes into f16 values (code − 1)·d, or (2·bit − 1)·d, exactly (every
// such product is an f16), so the tensor cores produce the finished sum.
//
// Dequantizing without shifts: a code field masked in place and ORed into the bits of 2^e,
// with e chosen so that the field's lowest bit is worth 1, is the f16 value 2^e + code; one
// f16x2 subtraction leaves the code and one f16x2 FMA the weight. The k order inside each
// 64-value block is permuted so that a thread's fragment pairs are the fields one mask selects:
// thread t of a quad, at mma step j of the block, holds values 16t + 4j + {0, 2} in its first
// pair and 16t + 4j + {1, 3} in its second (for 2-bit codes: word t, field j, bytes 0/2 and
// 1/3). The quantization kernels store f16 activations in that order (hgemm_slot, quant.cu); the sum over
// k does not care.
//
// Tiles: 8 warps; warp w owns rows 32w .. 32w+31 of the block's 256 (two 16-row mma tiles) for
// all MM_BN tokens. K advances MM_KC values per stage through a ring of HG_STAGES cp.async
// stages: the weight chunks (two 16-byte slots per row, swapped on rows 4-7 of every 8 so that a
// warp's code loads hit 32 distinct banks) and the f16 activations (token-major, rows padded by
// 16 bytes so that an 8×16-byte ldmatrix is conflict-free). Weight scales go straight to
// registers one stage ahead. A grid's z index splits K (gemm_reduce adds the partial sums).
#if !defined(HG_STAGES)
#error "HG_STAGES must be defined by the host"
#endif
#define HG_WSTRIDE 32
#define HG_XSTRIDE (2 * MM_KC + 16)
static_assert(HG_STAGES >= 2 && MM_KC % 128 == 0 && MM_KC <= 128, "hgemm tile shape");

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ u32 hadd2(u32 a, u32 b) {
    u32 d;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

#if __CUDA_ARCH__ >= 800
template <int FMT>
__device__ __forceinline__ void hgemm_body(const uint4* __restrict__ codes, const u16* __restrict__ scales,
                                           int rows, int cols, const u16* __restrict__ xh, int ntok,
                                           float* __restrict__ out, int out_stride, int accumulate,
                                           long long zstride) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int CV = FMT == FMT_Q1 ? 128 : 64;       // values per chunk
    constexpr int KC = MM_KC;
    constexpr int CPS = KC / CV;                        // chunks per row per stage
    constexpr int SV = FMT == FMT_Q2G64 ? 64 : 128;     // values per weight scale
    constexpr int SPS = KC / SV;                        // weight scales per row per stage
    constexpr int BM = MM_WARPS * 32;
    constexpr int W_BYTES = BM * HG_WSTRIDE;
    constexpr int STAGE = W_BYTES + MM_BN * HG_XSTRIDE;
    constexpr int STEPS = KC / 16;
    constexpr int NTH = MM_WARPS * 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int tok0 = blockIdx.x * MM_BN, row0 = blockIdx.y * BM;
    const int chunks = cols / CV, spr = cols / SV;
    const int nst = (chunks + CPS - 1) / CPS;
    const int st0 = (int)((long long)nst * blockIdx.z / gridDim.z);
    const int st1 = (int)((long long)nst * (blockIdx.z + 1) / gridDim.z);
    out += blockIdx.z * zstride;
    // Rows 4-7 of every 8 keep their chunks in swapped slots (bank spread of the code loads).
    const int swz = (g >> 2) & 1;
    PDL_ENTRY();

    auto load_stage = [&](int s) {
        unsigned char* st = smem + (s % HG_STAGES) * STAGE;
        unsigned char* xsm = st + W_BYTES;
        each_copy<BM * CPS, NTH>(tid, [&](int e) {
            const int r = e / CPS, cc = e % CPS, c = s * CPS + cc;
            const int row = min(row0 + r, rows - 1);
            if (c < chunks)
                cp_async16(st + r * HG_WSTRIDE + ((cc ^ (r >> 2)) & 1) * 16, codes + (size_t)row * chunks + c);
        });
        each_copy<MM_BN * (KC / 8), NTH>(tid, [&](int e) {
            const int tt = e / (KC / 8), p = e % (KC / 8), k = s * KC + p * 8;
            const int tok = min(tok0 + tt, ntok - 1);
            if (k < cols) cp_async16(xsm + tt * HG_XSTRIDE + p * 16, xh + (size_t)tok * cols + k);
        });
    };
    // This thread's weight scales of stage s (raw f16 bits): rows g and g+8 of each tile.
    auto load_scales = [&](int s, u32 (*d)[2][SPS]) {
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = min(row0 + warp * 32 + mi * 16 + h * 8 + g, rows - 1);
#pragma unroll
                for (int j = 0; j < SPS; j++) {
                    const int si = s * SPS + j;
                    d[mi][h][j] = si < spr ? (u32)__ldg(scales + (size_t)row * spr + si) : 0u;
                }
            }
    };

    float acc[2][MM_NT][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < MM_NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < HG_STAGES - 1; s++) {
        if (st0 + s < st1) load_stage(st0 + s);
        cp_async_commit();
    }
    u32 dw[2][2][SPS];
    load_scales(st0, dw);
    // This lane's ldmatrix row: token (lane % 8) + 8·(lane / 16), bytes 16·((lane / 8) % 2).
    const u32 xrow = ((lane & 7) + 8 * (lane >> 4)) * HG_XSTRIDE + 16 * ((lane >> 3) & 1);
    for (int s = st0; s < st1; s++) {
        cp_async_wait<HG_STAGES - 2>();
        // Stage s has landed for every thread, and every warp is done with stage s-1, whose
        // buffer the next load reuses.
        __syncthreads();
        if (s + HG_STAGES - 1 < st1) load_stage(s + HG_STAGES - 1);
        cp_async_commit();
        u32 dn[2][2][SPS];
        if (s + 1 < st1) load_scales(s + 1, dn);
        const unsigned char* st = smem + (s % HG_STAGES) * STAGE;
        const u32 xbase = smem_addr(st + W_BYTES) + xrow;
        u32 wd[2][2];
#pragma unroll
        for (int step = 0; step < STEPS; step++) {
            const int i = step >> 2, j = step & 3;
            if (FMT != FMT_Q1 && s * CPS + i >= chunks) break;
            if (j == 0) {
                // The code words of this 64-value block this thread reads: 2-bit, word t of
                // chunk i; 1-bit, word 2i + t/2 of the chunk.
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const u32* rw = (const u32*)(st + (warp * 32 + mi * 16 + h * 8 + g) * HG_WSTRIDE);
                        wd[mi][h] = FMT == FMT_Q1 ? rw[swz * 4 + 2 * i + (t >> 1)] : rw[((i ^ swz) & 1) * 4 + t];
                    }
            }
            // The field this step reads and the f16 bits of 2^e that make its lowest bit 1.
            const int field = FMT == FMT_Q1 ? 4 * (t & 1) + j : 2 * j;
            const u32 mask = (FMT == FMT_Q1 ? 0x00010001u : 0x00030003u) << field;
            const u32 magic = (u32)(25 - field) * 0x04000400u;
            u32 a[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const u32 d16 = dw[mi][h][FMT == FMT_Q2G64 ? i : 0];
                    const u32 dd = d16 | (d16 << 16);
                    // 2-bit: c·d − d; 1-bit: b·2d − d.
                    const u32 mul = FMT == FMT_Q1 ? hadd2(dd, dd) : dd;
                    const u32 neg = dd ^ 0x80008000u;
                    const u32 w = wd[mi][h];
                    a[mi][h] = hfma2(hsub2((w & mask) | magic, magic), mul, neg);
                    a[mi][2 + h] = hfma2(hsub2(((w >> 8) & mask) | magic, magic), mul, neg);
                }
#pragma unroll
            for (int p = 0; p < MM_NT / 2; p++) {
                u32 b[4];
                ldmatrix_x4(b, xbase + p * 16 * HG_XSTRIDE + step * 32);
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    mma_f16(acc[mi][2 * p], a[mi], b[0], b[1]);
                    mma_f16(acc[mi][2 * p + 1], a[mi], b[2], b[3]);
                }
            }
        }
        if (s + 1 < st1) {
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int j = 0; j < SPS; j++) dw[mi][h][j] = dn[mi][h][j];
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < MM_NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = row0 + warp * 32 + mi * 16 + g + (e >> 1) * 8;
                const int tok = tok0 + ni * 8 + 2 * t + (e & 1);
                if (row < rows && tok < ntok) {
                    float* o = out + (size_t)tok * out_stride + row;
                    *o = accumulate ? acc[mi][ni][e] + *o : acc[mi][ni][e];
                }
            }
}
#define HGEMM_CALL(FMT) hgemm_body<FMT>(codes, scales, rows, cols, xh, ntok, out, out_stride, accumulate, zstride)
#else
#define HGEMM_CALL(FMT) __trap()
#endif

// grid (ceil(ntok / MM_BN), ceil(rows / 256), K splits), block 256, dynamic shared memory
// HG_STAGES stages (plan/gemm.rs: hgemm_smem_bytes); two blocks per multiprocessor.
#define HGEMM_KERNEL(name, FMT)                                                                 \
    extern "C" __global__ void __launch_bounds__(MM_WARPS * 32, 2)                              \
        name(const uint4* __restrict__ codes, const u16* __restrict__ scales, int rows, int cols, \
             const u16* __restrict__ xh, int ntok, float* __restrict__ out, int out_stride,      \
             int accumulate, long long zstride) {                                               \
        HGEMM_CALL(FMT);                                                                        \
    }

HGEMM_KERNEL(hgemm_q1, FMT_Q1)
HGEMM_KERNEL(hgemm_q2g64, FMT_Q2G64)
HGEMM_KERNEL(hgemm_q2g128, FMT_Q2G128)
