// A decode step's feed-forward block in one launch: gate | up, SwiGLU and its quantization,
// then down added into the residual, and optionally the next norm of the residual. Launched as
// separate kernels, each GEMV pays its ramp and tail and the small kernels run while no weights
// stream; here one producer warp per multiprocessor streams gate | up's tiles and then down's
// into a ring of shared memory without waiting for the arithmetic's dependences, so down's
// weights arrive while SwiGLU runs. The dependences become grid-wide barriers (every block
// resident: one block per multiprocessor, the host's plan). FFN_GROUPS groups of GEMV1_WARPS
// consumer warps take the block's tiles in turn. A row is summed exactly as the decode GEMV
// (gemv1) sums it, SwiGLU quantizes 128-value pieces as quant_swiglu does and the norm is
// quant_rms's: the same bits as the kernels it replaces, on the dp4a path.
//
// Tiles: gate | up's of two rows a warp (16 rows of `hidden` values), down's of one row a warp
// (8 rows of `ffn` values: twice as many tiles as of 16 rows, so that multiprocessors differ by
// at most a small tile at the end). Ring: tiles take consecutive bytes (a tile that would cross
// the end starts again at 0) and are released in order; FFN_SLOTS full / empty barrier pairs,
// one per tile in flight. FFN_GROUPS and FFN_SLOTS come from the host (plan/ffn.rs).
#if !defined(FFN_GROUPS) || !defined(FFN_SLOTS)
#error "FFN_GROUPS and FFN_SLOTS must be defined by the host"
#endif

#define FFN_CONSUMERS (FFN_GROUPS * GEMV1_WARPS)

__device__ __forceinline__ void ffn_consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(FFN_CONSUMERS * 32) : "memory");
}

// A matrix's tiles of `tr` rows: their bytes, and this block's count (tiles blockIdx.x,
// blockIdx.x + gridDim.x, ...).
struct FfnMat {
    const unsigned char* codes;
    const unsigned char* scales;
    int rows, chunks, spr, mine;
    u32 code_bytes, scale_bytes, stage_bytes;
};

template <int FMT>
__device__ __forceinline__ FfnMat ffn_mat(const unsigned char* codes, const unsigned char* scales, int rows,
                                          int cols, int tr) {
    constexpr int CV = FMT == FMT_Q1 ? 128 : 64;
    constexpr int SV = FMT == FMT_Q2G64 ? 64 : 128;
    FfnMat m;
    m.codes = codes;
    m.scales = scales;
    m.rows = rows;
    m.chunks = cols / CV;
    m.spr = cols / SV;
    m.code_bytes = (u32)tr * m.chunks * 16;
    m.scale_bytes = (u32)tr * m.spr * 2;
    m.stage_bytes = (m.code_bytes + m.scale_bytes + 127) & ~127u;
    const int ntiles = (rows + tr - 1) / tr;
    m.mine = (int)blockIdx.x < ntiles ? (ntiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    return m;
}

// Where in the ring (of `ring` bytes) a tile of `bytes` starts, advancing the running `head`;
// positions only grow, the ring offset is the position modulo `ring`.
__device__ __forceinline__ u32 ffn_place(u32& head, u32 bytes, u32 ring) {
    u32 start = head;
    if (start % ring + bytes > ring) start += ring - start % ring;
    head = start + bytes;
    return start;
}

// The activations of a row (`chunks` chunks of P pieces, their `groups` pairs) into shared memory
// piece-major, read from L2 (other blocks of this launch wrote them). Consumer threads only.
template <int P>
__device__ __forceinline__ void ffn_stage_cg(uint4* xsm, float2* ssm, const uint4* src, const float2* xs,
                                             int chunks, int groups, int tid) {
    for (int idx = tid; idx < chunks * P; idx += FFN_CONSUMERS * 32)
        xsm[piece_major_slot<P>(idx, chunks)] = __ldcg(src + idx);
    for (int g = tid; g < groups; g += FFN_CONSUMERS * 32) ssm[g] = __ldcg(xs + g);
}

// quant_rms of the residual row `row` (norm weights `nw`) by one block's consumer warps, read
// from L2: the sum of squares as quant_rms's 256 threads form it (the first eight warps; the
// others add zeros after them), then each 128-value piece scaled and quantized by quant128.
__device__ __forceinline__ void ffn_norm_row(const float* row, int cols, const float* __restrict__ nw, float eps,
                                             int* xq, float2* xs, float* red) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float ss = 0.0f;
    for (int i = tid * 4; tid < 256 && i < cols; i += 1024) {
        const float4 v = __ldcg((const float4*)(row + i));
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    ffn_consumers_sync();
    float s = 0.0f;
    for (int i = 0; i < FFN_CONSUMERS; i++) s += red[i];
    const float scale = 1.0f / sqrtf(s / (float)cols + eps);
    for (int base = warp * 128; base < cols; base += FFN_CONSUMERS * 128) {
        const int i = base + lane * 4;
        float4 v = __ldcg((const float4*)(row + i));
        const float4 g = *(const float4*)(nw + i);
        v.x = v.x * scale * g.x; v.y = v.y * scale * g.y; v.z = v.z * scale * g.z; v.w = v.w * scale * g.w;
        quant128(v, base, xq, xs, nullptr);
    }
}

#if __CUDA_ARCH__ >= 900
// A block's ring as its consumers read it.
struct FfnRing {
    const unsigned char* base;
    u32 bytes;
    u64* full;
    u64* empty;
    const uint4* xsm;
    const float2* ssm;
};

// Tile k of the block's sequence (gate | up's, then down's; tile t of matrix m) by warp `wg` of
// consumer group `group`, if that group takes it: RW rows a warp, 32 / RW lanes a row, the row
// written to `out` (added to what is there with `add`). Every consumer warp calls it for every k
// in order, which keeps `head` where the producer placed the tile.
template <int FMT, int RW>
__device__ __forceinline__ void ffn_consume(const FfnRing& r, u32& head, int k, const FfnMat& m, int t, float* out,
                                            bool add, int group, int wg, int lane) {
    constexpr int L = 32 / RW;
    const u32 start = ffn_place(head, m.stage_bytes, r.bytes);
    if (k % FFN_GROUPS != group) return;
    const int s = k % FFN_SLOTS;
    const int rt = wg * RW + lane / L, sub = lane % L;
    const int row = t * (GEMV1_WARPS * RW) + rt;
    const float prev = add && sub == 0 && row < m.rows ? out[row] : 0.0f;
    mbar_wait(smem_addr(&r.full[s]), (u32)(k / FFN_SLOTS) & 1u);
    const float2 part = tile_row_partials<FMT, L, false>(r.base + start % r.bytes, m.code_bytes, m.chunks, m.spr,
                                                         rt, sub, r.xsm, 0, r.ssm);
    __syncwarp();
    if (lane == 0) mbar_arrive(smem_addr(&r.empty[s]));
    const float acc = tile_row_reduce<L>(part);
    if (sub == 0 && row < m.rows) out[row] = add ? acc + prev : acc;
}

template <int FMT>
__device__ __forceinline__ void ffn_body(const unsigned char* __restrict__ gu_codes,
                                         const unsigned char* __restrict__ gu_scales,
                                         const unsigned char* __restrict__ dn_codes,
                                         const unsigned char* __restrict__ dn_scales, int hidden, int ffn,
                                         int* __restrict__ xq, float2* __restrict__ xs, float* __restrict__ proj,
                                         float* __restrict__ resid, u32* __restrict__ sync, int ring_bytes,
                                         int early, const float* __restrict__ nw, float eps,
                                         const unsigned char* __restrict__ pf_codes, int pf_code_bytes,
                                         const unsigned char* __restrict__ pf_scales, int pf_scale_bytes) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) u64 full[FFN_SLOTS];
    __shared__ __align__(8) u64 empty[FFN_SLOTS];
    __shared__ u32 ends[FFN_SLOTS];
    __shared__ float red[32];
    constexpr int CV = FMT == FMT_Q1 ? 128 : 64;
    constexpr int P = CV / 16;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 ring = (u32)ring_bytes;
    const FfnMat gu = ffn_mat<FMT>(gu_codes, gu_scales, 2 * ffn, hidden, 2 * GEMV1_WARPS);
    const FfnMat dn = ffn_mat<FMT>(dn_codes, dn_scales, hidden, ffn, GEMV1_WARPS);
    const int total = gu.mine + dn.mine;
    // Activations (the wider row's bytes, then its pairs), then the ring.
    const int xrow = (max(hidden, ffn) + 127) & ~127;
    uint4* xsm = (uint4*)smem;
    float2* ssm = (float2*)(smem + xrow);
    unsigned char* ring0 = smem + xrow + ((8 * (max(hidden, ffn) / 64) + 127) & ~127);

    if (tid == 0) {
        for (int s = 0; s < FFN_SLOTS; s++) {
            mbar_init(smem_addr(&full[s]), 1);
            mbar_init(smem_addr(&empty[s]), GEMV1_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == FFN_CONSUMERS) {
        if (lane != 0) return;
        // The producer: the first `early` tiles before the previous kernel ends (weights depend
        // on nothing; more would queue in front of that kernel's reads), the rest after.
        u32 head = 0, freed = 0;
        int oldest = 0;
        for (int k = 0; k < total; k++) {
            if (k == early) pdl_wait();
            const bool second = k >= gu.mine;
            const FfnMat m = second ? dn : gu;
            const size_t t = (size_t)blockIdx.x + (size_t)(second ? k - gu.mine : k) * gridDim.x;
            const u32 start = ffn_place(head, m.stage_bytes, ring);
            // Until the slot is free and the bytes it overwrites are consumed (in order).
            while (oldest <= k - FFN_SLOTS || (oldest < k && start + m.stage_bytes - freed > ring)) {
                mbar_wait(smem_addr(&empty[oldest % FFN_SLOTS]), (u32)(oldest / FFN_SLOTS) & 1u);
                freed = ends[oldest % FFN_SLOTS];
                oldest++;
            }
            const int s = k % FFN_SLOTS;
            ends[s] = start + m.stage_bytes;
            const u32 bar = smem_addr(&full[s]);
            const u32 dst = smem_addr(ring0 + start % ring);
            mbar_expect_tx(bar, m.code_bytes + m.scale_bytes);
            bulk_g2s(dst, m.codes + t * m.code_bytes, m.code_bytes, bar);
            bulk_g2s(dst + m.code_bytes, m.scales + t * m.scale_bytes, m.scale_bytes, bar);
        }
        prefetch_l2_share(pf_codes, pf_code_bytes);
        prefetch_l2_share(pf_scales, pf_scale_bytes);
        return;
    }

    TRACE_WAIT();
    const int group = warp / GEMV1_WARPS, wg = warp % GEMV1_WARPS;
    const int bx = blockIdx.x, gx = gridDim.x;
    stage_row<P>(xsm, ssm, (const uint4*)xq, xs, gu.chunks, hidden / 64, tid, FFN_CONSUMERS * 32);
    ffn_consumers_sync();

    u32 head = 0;
    const FfnRing r = {ring0, ring, full, empty, xsm, ssm};
    for (int k = 0; k < gu.mine; k++) ffn_consume<FMT, 2>(r, head, k, gu, bx + k * gx, proj, false, group, wg, lane);

    // Every gate | up row written: every block is resident from here on, so the next kernel
    // may be scheduled.
    ffn_consumers_sync();
    if (tid == 0) grid_sync_reusable(sync, gridDim.x);
    ffn_consumers_sync();
    pdl_launch();

    // SwiGLU and its quantization, 128 values a warp (piece j: block j mod gridDim.x), as
    // quant_swiglu computes them.
    for (int j = bx + gx * warp; j < ffn / 128; j += gx * FFN_CONSUMERS) {
        const int i = j * 128 + lane * 4;
        const float4 a = __ldcg((const float4*)(proj + i));
        const float4 u = __ldcg((const float4*)(proj + ffn + i));
        const float4 v = make_float4(siluf_(a.x) * u.x, siluf_(a.y) * u.y, siluf_(a.z) * u.z, siluf_(a.w) * u.w);
        quant128(v, j * 128, xq, xs, nullptr);
    }
    ffn_consumers_sync();
    if (tid == 0) grid_sync_reusable(sync, gridDim.x);
    ffn_consumers_sync();

    ffn_stage_cg<P>(xsm, ssm, (const uint4*)xq, xs, dn.chunks, ffn / 64, tid);
    ffn_consumers_sync();
    for (int k = 0; k < dn.mine; k++)
        ffn_consume<FMT, 1>(r, head, gu.mine + k, dn, bx + k * gx, resid, true, group, wg, lane);

    // The next norm, once every residual row is in: one block, as quant_rms.
    if (nw) {
        ffn_consumers_sync();
        if (tid == 0) grid_sync_reusable(sync, gridDim.x);
        ffn_consumers_sync();
        if (bx == 0) ffn_norm_row(resid, hidden, nw, eps, xq, xs, red);
    }
    if (tid == 0) TRACE_EXIT(TRACE_FFN, gu_scales);
}
#define FFN_CALL(FMT)                                                                                      \
    ffn_body<FMT>(gu_codes, gu_scales, dn_codes, dn_scales, hidden, ffn, xq, xs, proj, resid, sync,        \
                  ring_bytes, early, nw, eps, pf_codes, pf_code_bytes, pf_scales, pf_scale_bytes)
#else
#define FFN_CALL(FMT) __trap()
#endif

#define FFN_KERNEL(name, FMT)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * (FFN_CONSUMERS + 1), 1)                              \
        name(const unsigned char* __restrict__ gu_codes, const unsigned char* __restrict__ gu_scales,      \
             const unsigned char* __restrict__ dn_codes, const unsigned char* __restrict__ dn_scales,      \
             int hidden, int ffn, int* __restrict__ xq, float2* __restrict__ xs, float* __restrict__ proj, \
             float* __restrict__ resid, u32* __restrict__ sync, int ring_bytes, int early,                 \
             const float* __restrict__ nw, float eps, const unsigned char* __restrict__ pf_codes,          \
             int pf_code_bytes, const unsigned char* __restrict__ pf_scales, int pf_scale_bytes) {         \
        FFN_CALL(FMT);                                                                                     \
    }

FFN_KERNEL(ffn_decode_q1, FMT_Q1)
FFN_KERNEL(ffn_decode_q2g64, FMT_Q2G64)
FFN_KERNEL(ffn_decode_q2g128, FMT_Q2G128)
