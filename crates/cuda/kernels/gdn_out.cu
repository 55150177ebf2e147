// A decode step's recurrence and its out-projection in one kernel (`NIWAKI_CUDA_GDN_OUT=1`;
// plan::Op::GdnDecodeOut). The out-projection's 6144 columns are the 48 value heads' outputs,
// 128 each (one 1-bit chunk, or two 2-bit ones): so block h, which runs head h's recurrence
// (gdn_decode_head), can multiply its own output by head h's columns of every row (the head's
// strip of the matrix) without waiting for the other heads, and writes a partial sum per row.
// The strip (a row's 16 or 32 code bytes and its f16 scales, laid out head by head at upload:
// gpu/strip.rs) is copied into shared memory before the kernel waits for the previous
// one, so that its bytes stream while the recurrence runs rather than after it, and the
// kernel between the recurrence and the out-projection's GEMV goes. Once every block's
// partials are written (one counter, never reset: each block adds 2 or 1 so that a launch adds
// a power of two), block p < rows / 128 adds piece p's partials to the residual in a fixed
// order (each warp a few heads', then the warps' in order) and folds the next norm into it as
// the residual GEMVs' folds do (fold_piece_regs).
//
// The products are gdn_out_rows'; the sums over the heads run in another order than the GEMVs'
// over their chunks, so the residual agrees with the two-kernel path to float rounding, not
// bit for bit. Every block is resident before any
// waits: the grid is HV blocks of one a multiprocessor, and the next kernel launches only once
// each of them has started. That holds while at most two of these launches share the device
// (2 · 48 blocks of the 27B's on 132 multiprocessors): states decoded on more streams at once
// could leave each launch's waiting blocks holding the multiprocessors its others need.
static_assert(DV == 128, "gdn_out: a head's output is one 1-bit chunk, two 2-bit ones");
__host__ __device__ constexpr int pow2_at_least(int n) {
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}
// What a launch adds to the counter, a power of two: the first GDN_OUT_DOUBLE heads add 2.
constexpr int GDN_OUT_ARRIVALS = pow2_at_least(HV);
constexpr int GDN_OUT_DOUBLE = GDN_OUT_ARRIVALS - HV;
static_assert(GDN_OUT_DOUBLE <= HV, "gdn_out: arrivals by ones and twos");
// Heads whose partials each of a reducing block's 16 warps adds.
constexpr int GDN_OUT_PER = (HV + 15) / 16;

__device__ __forceinline__ u32 ld_acquire_u32(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

#if __CUDA_ARCH__ >= 900
// A strip's bytes a row: code bytes (one 16-byte chunk of 128 1-bit values, or two of 64
// 2-bit ones) and f16 scales (one a chunk, or one for g128's two).
template <int FMT>
struct GdnOutStrip {
    static constexpr int CODE = FMT == FMT_Q1 ? 16 : 32;
    static constexpr int SCALES = FMT == FMT_Q2G64 ? 2 : 1;
};

// Each row's product with the head's output: the 1-bit rows by the binary GEMV's arithmetic
// (bmma_and_popc over the output's eight bit planes, 16 rows a warp at a time), the 2-bit ones
// by dp4a over its codes (a thread a row), each chunk's term d·(s·Σcq − s·Σq) as the integer
// twin (repack::dot_row) forms it. `xw`: the output's plane words (1-bit, lane 4g + t: plane
// g, word t) or its codes four a word (2-bit); `pairs`: its two groups' (s, s·Σq).
template <int FMT>
__device__ __forceinline__ void gdn_out_rows(const unsigned char* codes, const u16* dsc, int rows,
                                             const u32* xw, const float2* pairs, float* __restrict__ ph) {
    const int lane = threadIdx.x, w = threadIdx.y;
    const float2 p0 = pairs[0], p1 = pairs[1];
    if constexpr (FMT == FMT_Q1) {
        // Rows 16q .. 16q + 15 for q = w, w + 16, …
        const int g = lane >> 2, t = lane & 3;
        const u32 b = xw[lane];
        const u32 blo = t < 2 ? b : 0u, bhi = t < 2 ? 0u : b;
        const int sgn = t == 3 ? -2 : 2;
        const float k2 = (float)(2 << (2 * t));
        const float y = t == 0 ? p0.y + p1.y : 0.0f;
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
    } else {
        // Word w of a chunk holds the code of value 16w + 4k + b at bits 8b + 2k (repack.rs): its
        // four values 4k apart are codes word 4w + k of the output.
        u32 x[32];
#pragma unroll
        for (int k = 0; k < 32; k++) x[k] = xw[k];
        for (int r = 32 * w + lane; r < rows; r += 512) {
            const uint4* rc = (const uint4*)(codes + (size_t)r * 32);
            const uint4 c[2] = {rc[0], rc[1]};
            int acc[2] = {0, 0};
#pragma unroll
            for (int ch = 0; ch < 2; ch++) {
                const u32 words[4] = {c[ch].x, c[ch].y, c[ch].z, c[ch].w};
#pragma unroll
                for (int wd = 0; wd < 4; wd++)
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        acc[ch] = __dp4a((int)((words[wd] >> (2 * k)) & 0x03030303u), (int)x[16 * ch + 4 * wd + k], acc[ch]);
            }
            const float d0 = h2f(dsc[GdnOutStrip<FMT>::SCALES * r]);
            const float d1 = FMT == FMT_Q2G64 ? h2f(dsc[2 * r + 1]) : d0;
            float total = d0 * (p0.x * (float)acc[0] - p0.y);
            total += d1 * (p1.x * (float)acc[1] - p1.y);
            ph[r] = total;
        }
    }
}

// grid HV, block (32, 16); dynamic shared memory plan::gdn_out_smem (the strip: codes, then
// scales).
template <int FMT>
__device__ __forceinline__ void gdn_out_body(const float* __restrict__ proj, int aoff, int boff,
        int zoff, const u32* __restrict__ pos, float* __restrict__ conv_state, const float* __restrict__ taps,
        const float* __restrict__ a_neg, const float* __restrict__ dt_bias, float* __restrict__ S,
        const float* __restrict__ nw, float eps, const unsigned char* __restrict__ strip_codes,
        const u16* __restrict__ strip_scales, int rows, float* __restrict__ x, float* __restrict__ part,
        u32* __restrict__ cnt, const float* __restrict__ fold_w, int* __restrict__ fold_xq,
        float2* __restrict__ fold_xs, float* __restrict__ fold_ss, u32* __restrict__ fold_xp) {
    using St = GdnOutStrip<FMT>;
    extern __shared__ __align__(128) unsigned char gdn_out_smem[];
    __shared__ __align__(8) u64 wbar;
    // The head's output as gdn_out_rows takes it, and its two groups' pairs (s, s·Σq).
    __shared__ u32 xw[32];
    __shared__ __align__(16) float2 pairs[2];
    __shared__ u32 launch_base;
    const int h = blockIdx.x, lane = threadIdx.x, w = threadIdx.y, tid = 32 * w + lane;
    unsigned char* codes = gdn_out_smem;
    const u16* dsc = (const u16*)(gdn_out_smem + (size_t)rows * St::CODE);
    const u32 bar = smem_addr(&wbar);
    if (tid == 0) {
        const u32 code_bytes = (u32)rows * St::CODE, scale_bytes = (u32)rows * 2u * St::SCALES;
        mbar_init(bar, 1);
        // The barrier's initialization visible to the async proxy before the copies use it.
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        mbar_expect_tx(bar, code_bytes + scale_bytes);
        weights_g2s(smem_addr(codes), strip_codes + (size_t)h * code_bytes, code_bytes, bar);
        weights_g2s(smem_addr(codes) + code_bytes, (const unsigned char*)strip_scales + (size_t)h * scale_bytes,
                    scale_bytes, bar);
    }
    const u32 p = *pos;
    float s[GDN_DECODE_RPL];
    u64 trace_w[2];
    gdn_decode_head(proj, aoff, boff, zoff, p, conv_state, taps, a_neg, dt_bias, S, nw, eps, s, trace_w,
                    [&](float4 v) {
                        float2 pair;
                        const u32 packed = quant128_regs(v, pair);
                        if constexpr (FMT == FMT_Q1) {
                            const int t = lane & 3;
                            u32 q[8];
#pragma unroll
                            for (int k = 0; k < 8; k++) q[k] = __shfl_sync(0xffffffffu, packed, 8 * t + k);
                            xw[lane] = plane_word(q, lane >> 2);
                        } else {
                            xw[lane] = packed;
                        }
                        if ((lane & 15) == 0) pairs[lane >> 4] = pair;
                    });
    __syncthreads();
    mbar_wait(bar, 0u);
    gdn_out_rows<FMT>(codes, dsc, rows, xw, pairs, part + (size_t)h * rows);
    // Every thread's partials visible on the device before the block's arrival.
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const u32 old = atom_add_acq_rel(cnt, h < GDN_OUT_DOUBLE ? 2u : 1u);
        launch_base = old & ~(u32)(GDN_OUT_ARRIVALS - 1);
    }
    // The state's stores go out while the other blocks finish their partials.
    gdn_decode_store(S, p, s);
    // Block p < rows / 128, whose thread 0 took the launch's base: piece p.
    if (h >= rows / 128) return;
    const int row0 = 128 * h + 4 * lane;
    float4 acc = w == 0 ? __ldcg((const float4*)(x + row0)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 gw = w == 0 ? __ldg((const float4*)(fold_w + row0)) : acc;
    if (tid == 0) {
        const u32 target = launch_base + GDN_OUT_ARRIVALS;
        while ((int)(ld_acquire_u32(cnt) - target) < 0) {
        }
    }
    // Past the barrier every thread reads what the arrivals released.
    __syncthreads();
    // Warp w adds heads w·GDN_OUT_PER .. of the piece's rows (past L1, which may hold lines of
    // them from before the other blocks' writes), its loads all in flight, into the strip's
    // place in shared memory (every read of the strip is done); warp 0 then adds the warps'
    // sums in warp order to the residual.
    float4* red = (float4*)gdn_out_smem;
    {
        float4 pk[GDN_OUT_PER];
#pragma unroll
        for (int k = 0; k < GDN_OUT_PER; k++) {
            const int hk = w * GDN_OUT_PER + k;
            pk[k] = hk < HV ? __ldcg((const float4*)(part + (size_t)hk * rows + row0)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float4 sum = pk[0];
#pragma unroll
        for (int k = 1; k < GDN_OUT_PER; k++) {
            sum.x += pk[k].x;
            sum.y += pk[k].y;
            sum.z += pk[k].z;
            sum.w += pk[k].w;
        }
        red[32 * w + lane] = sum;
    }
    __syncthreads();
    if (w != 0) return;
#pragma unroll
    for (int k = 0; k < 16; k++) {
        const float4 v = red[32 * k + lane];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
    }
    *(float4*)(x + row0) = acc;
    fold_piece_regs(acc, gw, 128 * h, fold_xq, fold_xs, fold_ss, fold_xp);
}
#endif

#define GDN_OUT_KERNEL(name, FMT)                                                                               \
    ENTRY __global__ void __launch_bounds__(512) name(const float* __restrict__ proj, int aoff, int boff, int zoff, \
            const u32* __restrict__ pos, float* __restrict__ conv_state, const float* __restrict__ taps,           \
            const float* __restrict__ a_neg, const float* __restrict__ dt_bias, float* __restrict__ S,             \
            const float* __restrict__ nw, float eps, const unsigned char* __restrict__ strip_codes,                \
            const u16* __restrict__ strip_scales, int rows, float* __restrict__ x, float* __restrict__ part,       \
            u32* __restrict__ cnt, const float* __restrict__ fold_w, int* __restrict__ fold_xq,                    \
            float2* __restrict__ fold_xs, float* __restrict__ fold_ss, u32* __restrict__ fold_xp) {               \
        GDN_OUT_CALL(FMT);                                                                                     \
    }
#if __CUDA_ARCH__ >= 900
#define GDN_OUT_CALL(FMT)                                                                                      \
    gdn_out_body<FMT>(proj, aoff, boff, zoff, pos, conv_state, taps, a_neg, dt_bias, S, nw, eps, strip_codes,  \
                      strip_scales, rows, x, part, cnt, fold_w, fold_xq, fold_xs, fold_ss, fold_xp)
#else
#define GDN_OUT_CALL(FMT) __trap()
#endif
GDN_OUT_KERNEL(gdn_out_q1, FMT_Q1)
GDN_OUT_KERNEL(gdn_out_q2g64, FMT_Q2G64)
GDN_OUT_KERNEL(gdn_out_q2g128, FMT_Q2G128)

// Head h's columns of every row, head by head: the strip gdn_out_* copies (codes [HV][rows]
// of `cpr` 16-byte chunks, scales [HV][rows] of `spr`: 1 and 1 for 1-bit rows, 2 and 2 for
// Q2_0 g64, 2 and 1 for g128). Made once at upload. grid (ceil(rows / 256), HV), block 256.
ENTRY __global__ void __launch_bounds__(256) strip_image(const uint4* __restrict__ codes,
        const u16* __restrict__ scales, int rows, int cpr, int spr, uint4* __restrict__ out_codes,
        u16* __restrict__ out_scales) {
    PDL_ENTRY();
    const int r = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    if (r >= rows) return;
    for (int c = 0; c < cpr; c++)
        out_codes[((size_t)h * rows + r) * cpr + c] = codes[((size_t)r * HV + h) * cpr + c];
    for (int c = 0; c < spr; c++)
        out_scales[((size_t)h * rows + r) * spr + c] = scales[((size_t)r * HV + h) * spr + c];
}
