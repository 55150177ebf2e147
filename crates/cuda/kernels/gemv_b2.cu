// Decode GEMV (one token) of 2-bit rows (Q2_0 g64, and the g128 layouts of PQ2_0, legacy Q2_0
// and widened PTQ1_0) on the binary tensor cores, sm_90: gemv_b1.cu's pipeline — the same
// 16-row tiles in swizzled 128-byte boxes, ring, producer warp and consumer order — over the
// 2-bit codes as repack.rs lays them out for dp4a.
//
// A code c = c0 + 2·c1 weighs (c − 1)·d, so a row's dot with a 64-value activation group
// (codes q, scale s) is d·s·(Σ c0·q + 2·Σ c1·q − Σ q). In the dp4a layout word t of a 16-byte
// chunk (64 values, one activation group) holds the code of value 16t + 4k + b at bits 8b + 2k:
// the chunk is one 128-bit row of the m16n8k128 binary MMA as it stands. Column p of B with
// plane p of value 16t + 4k + b at bit 8b + 2k and zeros between counts, under each row, the
// plane's bits where c0 is set; the same word shifted by one bit where c1 is. So a chunk takes
// two MMAs, as a 1-bit chunk (two groups, as many bytes) does, and the two counts are joined in
// integers (c0 + 2·c1) before the float steps. Per 16 rows × 64 values a consumer issues about
// as many instructions as gemv_b1's per 16 rows × 128, where the dp4a kernel's lanes unpack
// every code to a byte.
//
// Lane (g, t) builds its plane word from activation words 4t … 4t + 3 of the chunk (one 16-byte
// load): byte b of word 4t + k is value 16t + 4k + b, whose plane g goes to bit 8b + 2k. The
// float sums run in another order than the dp4a kernel's (not its bits), deterministically.

#if __CUDA_ARCH__ >= 900
// SV: chunks per weight scale (1: g64, 2: g128). J: chunks per warp, exactly (the plan takes
// the widths a kernel is made for: 5120 and 6144 columns).
template <int SV, int J>
__device__ __forceinline__ void gemv_b2_body(const TmaMap& cmap, const unsigned char* __restrict__ scales,
                                             int rows, int cols, const uint4* __restrict__ xq,
                                             const float2* __restrict__ xs, float* __restrict__ out,
                                             int accumulate, u64* __restrict__ amax, int stages,
                                             const unsigned char* __restrict__ pf_codes, int pf_code_bytes,
                                             const unsigned char* __restrict__ pf_scales, int pf_scale_bytes) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) u64 bars[GEMV1_MAX_STAGES];
    __shared__ __align__(8) u64 empty[GEMV1_MAX_STAGES];
    constexpr int TR = 16;
    __shared__ float part[GEMV1_MAX_STAGES][GEMV1_WARPS][TR];
    static_assert(GEMV1_WARPS == 8, "warp w takes chunks w + 8j: slab j, unit w of each row");
    static_assert(J <= 64, "a lane copies the group pairs of chunks lane and lane + 32");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int chunks = cols / 64, spr = chunks / SV, slabs = chunks / 8;
    const u32 code_bytes = (u32)slabs * 2048, scale_bytes = (u32)TR * spr * 2;
    const u32 stage_bytes = (code_bytes + scale_bytes + 1023) & ~1023u;
    const int ntiles = (rows + TR - 1) / TR;
    const int mine = (int)blockIdx.x < ntiles ? (ntiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    unsigned char* base = smem + ((1024u - (smem_addr(smem) & 1023u)) & 1023u);
    float2* ssm = (float2*)base;
    unsigned char* stage0 = base + ((((8 * chunks + 127) & ~127) + 1023) & ~1023);

    auto issue = [&](int i) {
        const int s = i % stages;
        const int tile = (int)blockIdx.x + i * (int)gridDim.x;
        const u32 bar = smem_addr(&bars[s]);
        const u32 dst = smem_addr(stage0 + (size_t)s * stage_bytes);
        mbar_expect_tx(bar, code_bytes + scale_bytes);
        for (int sl = 0; sl < slabs; sl++) tma_2d(dst + sl * 2048, cmap, sl * 128, tile * TR, bar);
        bulk_g2s(dst + code_bytes, scales + (size_t)tile * scale_bytes, scale_bytes, bar);
    };

    if (tid == 0) ring_init(bars, empty, stages);
    __syncthreads();
    if (tid == 0)
        for (int i = 0; i < min(stages, mine); i++) issue(i);
    PDL_ENTRY();

    if (warp == GEMV1_WARPS) {
        b1_produce<TR>(empty, part, stages, mine, rows, issue, out, accumulate, amax, pf_codes, pf_code_bytes,
                       pf_scales, pf_scale_bytes);
        return;
    }

    // The warp's own chunks' group pairs (chunk c's at float2 c of `ssm`), in flight with the
    // activations' loads; lanes copy chunks lane and lane + 32 of the warp's.
    const float2 zero2 = make_float2(0.0f, 0.0f);
    const float2 p0 = lane < J ? xs[warp + GEMV1_WARPS * lane] : zero2;
    const float2 p1 = lane + 32 < J ? xs[warp + GEMV1_WARPS * (lane + 32)] : zero2;
    u32 bw[J];
    constexpr int BATCH = 8;
#pragma unroll
    for (int j0 = 0; j0 < J; j0 += BATCH) {
        uint4 x[BATCH];
#pragma unroll
        for (int j = j0; j < j0 + BATCH && j < J; j++) x[j - j0] = xq[(warp + GEMV1_WARPS * j) * 4 + t];
#pragma unroll
        for (int j = j0; j < j0 + BATCH && j < J; j++) {
            const uint4 w = x[j - j0];
            bw[j] = ((w.x >> g) & 0x01010101u) | (((w.y >> g) & 0x01010101u) << 2) |
                    (((w.z >> g) & 0x01010101u) << 4) | (((w.w >> g) & 0x01010101u) << 6);
        }
    }
    if (lane < J) ssm[warp + GEMV1_WARPS * lane] = p0;
    if (lane + 32 < J) ssm[warp + GEMV1_WARPS * (lane + 32)] = p1;
    __syncwarp();
    // C's columns of this lane are planes 2t and 2t + 1, of weights 2^2t and 2^(2t+1) (the
    // sign plane −128), as in gemv_b1; Σ q enters a row's sum once, through lane t = 0.
    const int sgn = t == 3 ? -2 : 2;
    const float k1 = (float)(1 << (2 * t));
    const float ysel = t == 0 ? 1.0f : 0.0f;
    const int aoff = g * 128 + ((warp ^ g) << 4) + 4 * t;
    const float2* sc2 = ssm + warp;

    for (int i = 0, s = 0, ph = 0; i < mine; i++) {
        const unsigned char* st = stage0 + (size_t)s * stage_bytes;
        mbar_wait(smem_addr(&bars[s]), (u32)ph);
        const unsigned char* a = st + aoff;
        const u16* dp = (const u16*)(st + code_bytes) + g * spr;
        float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const float2 sc = sc2[GEMV1_WARPS * j];
            const u32 a0 = *(const u32*)(a + j * 2048), a1 = *(const u32*)(a + j * 2048 + 1024);
            int c0[4], c1[4];
            bmma_and_popc(c0, a0, a1, bw[j]);
            bmma_and_popc(c1, a0, a1, bw[j] << 1);
            const int n0 = c0[0] + 2 * c1[0] + sgn * (c0[1] + 2 * c1[1]);
            const int n1 = c0[2] + 2 * c1[2] + sgn * (c0[3] + 2 * c1[3]);
            const int si = (warp + GEMV1_WARPS * j) / SV;
            const float y = ysel * sc.y;
            acc0 += h2f(dp[si]) * (k1 * (sc.x * (float)n0) - y);
            acc1 += h2f(dp[8 * spr + si]) * (k1 * (sc.x * (float)n1) - y);
        }
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
        acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
        acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
        if (t == 0) {
            part[s][warp][g] = acc0;
            part[s][warp][g + 8] = acc1;
        }
        // Every lane is done with stage s, and its partial sums are written, before the warp
        // arrives (a release the producer's wait acquires).
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
        if (++s == stages) {
            s = 0;
            ph ^= 1;
        }
    }
}
#define GEMV_B2_CALL(SV, J)                                                                               \
    gemv_b2_body<SV, J>(cmap, scales, rows, cols, xq, xs, out, accumulate, amax, stages, pf_codes,         \
                        pf_code_bytes, pf_scales, pf_scale_bytes)
#else
#define GEMV_B2_CALL(SV, J) __trap()
#endif

// The arguments of gemv_b1's kernels (the fused norm's are not used: the norm runs apart).
#define GEMV_B2_KERNEL(name, SV, J)                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * (GEMV1_WARPS + 1), 3)                      \
        name(const __grid_constant__ TmaMap cmap, const unsigned char* __restrict__ scales,       \
             int rows, int cols, const uint4* __restrict__ xq, const float2* __restrict__ xs,     \
             float* __restrict__ out, int accumulate, u64* __restrict__ amax, int stages,         \
             const float* __restrict__ xres, int tok0, const float* __restrict__ nw, float eps,   \
             const unsigned char* __restrict__ pf_codes, int pf_code_bytes,                       \
             const unsigned char* __restrict__ pf_scales, int pf_scale_bytes) {                   \
        GEMV_B2_CALL(SV, J);                                                                         \
    }

// 5120 and 6144 columns: ten and twelve chunks a warp.
GEMV_B2_KERNEL(gemv_b2_g64_j10, 1, 10)
GEMV_B2_KERNEL(gemv_b2_g64_j12, 1, 12)
GEMV_B2_KERNEL(gemv_b2_g128_j10, 2, 10)
GEMV_B2_KERNEL(gemv_b2_g128_j12, 2, 12)
