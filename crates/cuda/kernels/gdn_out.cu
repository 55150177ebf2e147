// A decode step's recurrence and its out-projection in one kernel, for 1-bit rows
// (`NIWAKI_CUDA_GDN_OUT=1`; plan::Op::GdnDecodeOut). The out-projection's 6144 columns are the
// 48 value heads' outputs, 128 each, and a 1-bit chunk is 128 columns: so block h, which runs
// head h's recurrence (gdn_decode_head), can multiply its own output by chunk h of every row
// (the head's strip of the matrix) without waiting for the other heads, and writes a partial
// sum per row. The strip (16 code bytes and one f16 scale a row, laid out head by head at
// upload: gpu/strip.rs) is copied into shared memory before the kernel waits for the previous
// one, so that its bytes stream while the recurrence runs rather than after it, and the
// kernel between the recurrence and the out-projection's GEMV goes. Once every block's
// partials are written (one counter, never reset: each block adds 2 or 1 so that a launch adds
// a power of two), block p < rows / 128 adds piece p's partials in head order to the residual
// and folds the next norm into it as the residual GEMVs' folds do (fold_piece_regs).
//
// The products are the binary GEMV's (gemv_b1.cu: bmma_and_popc over the activations' eight bit
// planes, the counts scaled by the same float operations), one chunk a row; the sums over the
// heads run in another order than the GEMV's over its chunks, so the residual agrees with the
// two-kernel path to float rounding, not bit for bit. Every block is resident before any
// waits: the grid is HV blocks of one a multiprocessor, and the next kernel launches only once
// each of them has started. That holds while at most two of these launches share the device
// (2 · 48 blocks of the 27B's on 132 multiprocessors): states decoded on more streams at once
// could leave each launch's waiting blocks holding the multiprocessors its others need.
static_assert(DV == 128, "gdn_out_q1: a head's output is one 1-bit chunk");
__host__ __device__ constexpr int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}
// What a launch adds to the counter, a power of two: the first GDN_OUT_DOUBLE heads add 2.
constexpr int GDN_OUT_ARRIVALS = pow2_at_least(HV);
constexpr int GDN_OUT_DOUBLE = GDN_OUT_ARRIVALS - HV;
static_assert(GDN_OUT_DOUBLE <= HV, "gdn_out_q1: arrivals by ones and twos");
// Heads whose partials a reducing lane has in flight at once.
constexpr int GDN_OUT_BATCH = HV % 16 == 0 ? 16 : HV % 8 == 0 ? 8 : HV % 4 == 0 ? 4 : 1;

__device__ __forceinline__ u32 ld_acquire_u32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// grid HV, block (32, 16); dynamic shared memory rows · 18 bytes (the strip).
ENTRY __global__ void __launch_bounds__(512) gdn_out_q1(const float* __restrict__ proj, int aoff, int boff,
        int zoff, const u32* __restrict__ pos, float* __restrict__ conv_state, const float* __restrict__ taps,
        const float* __restrict__ a_neg, const float* __restrict__ dt_bias, float* __restrict__ S,
        const float* __restrict__ nw, float eps, const unsigned char* __restrict__ strip_codes,
        const u16* __restrict__ strip_scales, int rows, float* __restrict__ x, float* __restrict__ part,
        u32* __restrict__ cnt, const float* __restrict__ fold_w, int* __restrict__ fold_xq,
        float2* __restrict__ fold_xs, float* __restrict__ fold_ss, u32* __restrict__ fold_xp) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char gdn_out_smem[];
    __shared__ __align__(8) u64 wbar;
    // The head's output as the binary MMA's B: plane g, word t at lane 4g + t (quant128's order).
    __shared__ u32 planes[32];
    // Its two groups' pairs (d, d·Σq).
    __shared__ __align__(16) float2 pairs[2];
    __shared__ u32 launch_base;
    const int h = blockIdx.x, lane = threadIdx.x, w = threadIdx.y, tid = 32 * w + lane;
    unsigned char* codes = gdn_out_smem;
    const u16* dsc = (const u16*)(gdn_out_smem + (size_t)rows * 16);
    const u32 bar = smem_addr(&wbar);
    if (tid == 0) {
        mbar_init(bar, 1);
        mbar_expect_tx(bar, (u32)rows * 18u);
        weights_g2s(smem_addr(codes), strip_codes + (size_t)h * rows * 16, (u32)rows * 16u, bar);
        weights_g2s(smem_addr(codes) + (u32)rows * 16u, strip_scales + (size_t)h * rows, (u32)rows * 2u, bar);
    }
    const u32 p = *pos;
    float s[GDN_DECODE_RPL];
    u64 trace_w[2];
    gdn_decode_head(proj, aoff, boff, zoff, p, conv_state, taps, a_neg, dt_bias, S, nw, eps, s, trace_w,
                    [&](float4 v) {
                        float2 pair;
                        const u32 packed = quant128_regs(v, pair);
                        const int t = lane & 3;
                        u32 xw[8];
#pragma unroll
                        for (int k = 0; k < 8; k++) xw[k] = __shfl_sync(0xffffffffu, packed, 8 * t + k);
                        planes[lane] = plane_word(xw, lane >> 2);
                        if ((lane & 15) == 0) pairs[lane >> 4] = pair;
                    });
    __syncthreads();
    mbar_wait(bar, 0u);

    // Rows 16q .. 16q + 15 for q = w, w + 16, …: the binary GEMV's arithmetic on one chunk.
    {
        const int g = lane >> 2, t = lane & 3;
        const u32 b = planes[lane];
        const u32 blo = t < 2 ? b : 0u, bhi = t < 2 ? 0u : b;
        const float2 p0 = pairs[0], p1 = pairs[1];
        const int sgn = t == 3 ? -2 : 2;
        const float k2 = (float)(2 << (2 * t));
        const float y = t == 0 ? p0.y + p1.y : 0.0f;
        float* ph = part + (size_t)h * rows;
        for (int q = w; q < rows / 16; q += 16) {
            const unsigned char* a = codes + (size_t)(16 * q + g) * 16 + 4 * t;
            const u32 a0 = *(const u32*)a, a1 = *(const u32*)(a + 128);
            int lo[4], hi[4];
            bmma_and_popc(lo, a0, a1, blo);
            bmma_and_popc(hi, a0, a1, bhi);
            const float f0 = p0.x * (float)(lo[0] + sgn * lo[1]) + p1.x * (float)(hi[0] + sgn * hi[1]);
            const float f1 = p0.x * (float)(lo[2] + sgn * lo[3]) + p1.x * (float)(hi[2] + sgn * hi[3]);
            float r0 = h2f(dsc[16 * q + g]) * (k2 * f0 - y);
            float r1 = h2f(dsc[16 * q + g + 8]) * (k2 * f1 - y);
            r0 += __shfl_xor_sync(0xffffffffu, r0, 1);
            r0 += __shfl_xor_sync(0xffffffffu, r0, 2);
            r1 += __shfl_xor_sync(0xffffffffu, r1, 1);
            r1 += __shfl_xor_sync(0xffffffffu, r1, 2);
            if (t == 0) {
                ph[16 * q + g] = r0;
                ph[16 * q + g + 8] = r1;
            }
        }
    }
    // Every thread's partials visible on the device before the block's arrival.
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const u32 old = atom_add_acq_rel(cnt, h < GDN_OUT_DOUBLE ? 2u : 1u);
        launch_base = old & ~(u32)(GDN_OUT_ARRIVALS - 1);
    }
    // The state's stores go out while the other blocks finish their partials.
    gdn_decode_store(S, p, s);
    // Warp 0 of block p < rows / 128, whose thread 0 took the launch's base: piece p.
    if (h >= rows / 128 || w != 0) return;
    __syncwarp();
    const u32 target = launch_base + GDN_OUT_ARRIVALS;
    if (lane == 0)
        while ((int)(ld_acquire_u32(cnt) - target) < 0) {
        }
    __syncwarp();
    const int row0 = 128 * h + 4 * lane;
    float4 acc = __ldcg((const float4*)(x + row0));
    const float4 gw = __ldg((const float4*)(fold_w + row0));
    // The heads' partials, a batch of loads in flight at a time, added in head order. Past L1,
    // which may hold lines of them from before the other blocks' writes.
    constexpr int BATCH = GDN_OUT_BATCH;
    for (int k0 = 0; k0 < HV; k0 += BATCH) {
        float4 pk[BATCH];
#pragma unroll
        for (int k = 0; k < BATCH; k++) pk[k] = __ldcg((const float4*)(part + (size_t)(k0 + k) * rows + row0));
#pragma unroll
        for (int k = 0; k < BATCH; k++) {
            acc.x += pk[k].x;
            acc.y += pk[k].y;
            acc.z += pk[k].z;
            acc.w += pk[k].w;
        }
    }
    *(float4*)(x + row0) = acc;
    fold_piece_regs(acc, gw, 128 * h, fold_xq, fold_xs, fold_ss, fold_xp);
#else
    __trap();
#endif
}

// Head h's chunk of every row of a 1-bit matrix of HV·128 columns, head by head: the strip
// gdn_out_q1 copies (codes [HV][rows] of 16 bytes, scales [HV][rows]). Made once at upload.
// grid (ceil(rows / 256), HV), block 256.
ENTRY __global__ void __launch_bounds__(256) strip_image_q1(const uint4* __restrict__ codes,
        const u16* __restrict__ scales, int rows, uint4* __restrict__ out_codes, u16* __restrict__ out_scales) {
    PDL_ENTRY();
    const int r = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (r >= rows) return;
    out_codes[(size_t)h * rows + r] = codes[(size_t)r * HV + h];
    out_scales[(size_t)h * rows + r] = scales[(size_t)r * HV + h];
}
