// Flash-decoding split over an f16 cache on the tensor cores (sm_80+): the same partial rows as
// attn_split_t4/t8 (attention.cu), with the dot products and the weighted sums as
// mma.m16n8k16 (f16 inputs, f32 accumulation) instead of one FMA per value and head.
//
// A warp takes 16 cache positions at a time. Scores: S^T (16 positions × 8 heads) = K · Q^T, K
// straight from the staged rows by ldmatrix, Q^T from shared memory. Weighted sums: O^T
// (HD × 8 heads) += V^T · P^T, V^T by ldmatrix.trans from the same staged rows, P^T through
// shared memory. Query heads GQA..7 are zero columns. The queries and the weights are f32; each
// goes in as an f16 pair hi + lo (hi = f16(x), lo = f16(x - hi), 22 significant bits) through
// two mmas, so the products are as exact as the f16 cache values allow.
//
// Dynamic shared memory (plan/attention.rs, attn_split_launch): each warp's ring of MW_STAGES tiles
// (K then V rows, padded by 16 bytes so that ldmatrix's eight rows fall in distinct banks), the
// queries (hi, lo: [8][HD + 8] f16) and each warp's P^T (hi, lo: [8][24] f16). The rings are reused
// for the merge of the warps.
// Warps of a q8_0 block (MW_WARPS) and of an f16 one (AM_WARPS, from the host).
#define MW_WARPS 2
#ifndef AM_WARPS
#error "AM_WARPS must be defined by the host (plan/attention.rs: ATTN_MMA_WARPS)"
#endif
#define MW_TILE 16
#ifndef AM_STAGES
#error "AM_STAGES must be defined by the host (plan/attention.rs: ATTN_MMA_STAGES)"
#endif
#define MW_STAGES AM_STAGES
#ifndef AM_PREFETCH
#error "AM_PREFETCH must be defined by the host (plan/attention.rs: ATTN_MMA_PREFETCH)"
#endif
#define MW_ROW (2 * HD + 16)
#define MW_QROW (HD + 8)
#define MW_PROW 24
static_assert(GQA <= 8 && HD % 16 == 0, "one n8 tile of query heads, whole k16 steps");

#if __CUDA_ARCH__ >= 800
// Asks the L2 cache for one global row of `bytes` (a multiple of 16, 16-byte aligned).
__device__ __forceinline__ void prefetch_row_l2(const void* p, int bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    for (int o = 0; o < bytes; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"((const char*)p + o));
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void f16_pair(float x, u16* hi, u16* lo) {
    *hi = f2h(x);
    *lo = f2h(x - h2f(*hi));
}

// The queries of kv head kvh's GQA heads for token t as f16 pairs (hi: [8][MW_QROW], then lo),
// heads GQA..7 zero; every thread of the block calls it (it synchronizes).
__device__ __forceinline__ void mma_queries(const float* __restrict__ q, int t, int kvh, u16* qh, u16* ql) {
    for (int idx = threadIdx.x; idx < 8 * HD; idx += blockDim.x) {
        const int g = idx / HD, i = idx % HD;
        const float v = g < GQA ? q[((size_t)t * NH + kvh * GQA + g) * HD + i] : 0.0f;
        f16_pair(v, qh + g * MW_QROW + i, ql + g * MW_QROW + i);
    }
    __syncthreads();
}

// One tile's online softmax from its scores s (positions gid (s0, s1) and gid + 8 (s2, s3),
// heads 2·tig (s0, s2) and 2·tig + 1; v0, v1: whether those positions lie in the split): the
// tile's weights e in s's layout, the factors c by which each head's earlier sums shrink, and
// the running maxima m and this lane's share of the sums l updated.
__device__ __forceinline__ void mma_softmax(const float (&s)[4], float scale, bool v0, bool v1, float& m0,
                                            float& m1, float& l0, float& l1, float& e0, float& e1, float& e2,
                                            float& e3, float& c0, float& c1) {
    const float x0 = v0 ? s[0] * scale : NEG_INF, x1 = v0 ? s[1] * scale : NEG_INF;
    const float x2 = v1 ? s[2] * scale : NEG_INF, x3 = v1 ? s[3] * scale : NEG_INF;
    float t0 = fmaxf(x0, x2), t1 = fmaxf(x1, x3);
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
        t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, off));
        t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, off));
    }
    // Every tile holds a position of the context: the new maxima are finite.
    const float n0 = fmaxf(m0, t0), n1 = fmaxf(m1, t1);
    c0 = expf(m0 - n0);
    c1 = expf(m1 - n1);
    e0 = expf(x0 - n0);
    e1 = expf(x1 - n1);
    e2 = expf(x2 - n0);
    e3 = expf(x3 - n1);
    l0 = l0 * c0 + (e0 + e2);
    l1 = l1 * c1 + (e1 + e3);
    m0 = n0;
    m1 = n1;
}

// The end of a tensor-core split: each head's softmax sum over the lanes of its positions, then
// the warps merged in order through shared memory (the rings, no longer read: every copy has
// landed) into the split's partial rows. o, m, l as the loops leave them: o[mt] rows gid and
// gid + 8 are dims 16·mt + gid and + 8, or with PAIRED 16·mt + 2·gid and + 1; heads 2·tig
// and 2·tig + 1.
template <bool PAIRED, int WARPS>
__device__ __forceinline__ void attn_mma_finish(float (&o)[HD / 16][4], float m0, float m1, float l0, float l1,
                                                float* __restrict__ part, int t, int kvh, int sp, int nsplit) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    // Merge the warps: the rings become [WARPS][GQA][HD] accumulators and (m, l) pairs.
    __syncthreads();
    float* sm_acc = (float*)smem;
    float* sm_ml = sm_acc + WARPS * GQA * HD;
    const int h0 = 2 * tig, h1 = 2 * tig + 1;
#pragma unroll
    for (int mt = 0; mt < HD / 16; mt++) {
        const int d0 = PAIRED ? 16 * mt + 2 * gid : 16 * mt + gid, d1 = PAIRED ? d0 + 1 : d0 + 8;
        if (h0 < GQA) {
            sm_acc[(warp * GQA + h0) * HD + d0] = o[mt][0];
            sm_acc[(warp * GQA + h0) * HD + d1] = o[mt][2];
        }
        if (h1 < GQA) {
            sm_acc[(warp * GQA + h1) * HD + d0] = o[mt][1];
            sm_acc[(warp * GQA + h1) * HD + d1] = o[mt][3];
        }
    }
    if (gid == 0) {
        if (h0 < GQA) {
            sm_ml[(warp * GQA + h0) * 2] = m0;
            sm_ml[(warp * GQA + h0) * 2 + 1] = l0;
        }
        if (h1 < GQA) {
            sm_ml[(warp * GQA + h1) * 2] = m1;
            sm_ml[(warp * GQA + h1) * 2 + 1] = l1;
        }
    }
    __syncthreads();
    attn_merge_warps(sm_acc, sm_ml, WARPS, part, t, kvh, sp, nsplit);
}
#endif

// grid (NKV, nsplit, ntok) (or attn_block_token's order), block AM_WARPS warps. part: as
// attn_split's.
ENTRY __global__ void __launch_bounds__(AM_WARPS * 32)
    attn_split_mma(const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,
                   const u16* __restrict__ ks, const u16* __restrict__ vs, const u32* __restrict__ pos_ptr,
                   float scale, int nsplit, float* __restrict__ part) {
#if __CUDA_ARCH__ >= 800
    constexpr int STAGE = 2 * MW_TILE * MW_ROW;
    extern __shared__ __align__(16) unsigned char smem[];
    u16* qh = (u16*)(smem + AM_WARPS * MW_STAGES * STAGE);
    u16* ql = qh + 8 * MW_QROW;
    PDL_ENTRY();
    const int kvh = blockIdx.x, sp = attn_block_split(), t = attn_block_token();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    int p0, p1, mine;
    if (!attn_split_range(pos_ptr, t, sp, nsplit, MW_TILE, AM_WARPS, warp, &p0, &p1, &mine)) return;
    unsigned char* ring = smem + warp * MW_STAGES * STAGE;
    u16* pth = ql + 8 * MW_QROW + warp * 2 * 8 * MW_PROW;
    u16* ptl = pth + 8 * MW_PROW;
    const unsigned char *kb = (const unsigned char*)kc, *vb = (const unsigned char*)vc;
    auto tile_pos = [&](int i) { return p0 + (warp + i * AM_WARPS) * MW_TILE; };
    auto copy = [&](int i) {
        unsigned char* st = ring + (i % MW_STAGES) * STAGE;
        const int p = tile_pos(i);
        constexpr int PIECES = 2 * HD / 16;
#ifndef ABLATE_ATTNCOPY
        each_copy<MW_TILE * PIECES, 32>(lane, [&](int e) {
            const int r = e / PIECES, c = e % PIECES;
            const size_t row = ((size_t)min(p + r, p1 - 1) * NKV + kvh) * (2 * HD);
            cp_async16(st + r * MW_ROW + c * 16, kb + row + c * 16);
            cp_async16(st + MW_TILE * MW_ROW + r * MW_ROW + c * 16, vb + row + c * 16);
        });
#else
        (void)st;
        (void)p;
#endif
    };
#ifdef ABLATE_ATTNCOPY
    // Finite scores from rings that are never filled.
    for (int e = lane; e < MW_STAGES * STAGE / 16; e += 32) ((uint4*)ring)[e] = make_uint4(0, 0, 0, 0);
#endif
    // Tile i's rows asked of L2 (lanes 0-15 the keys', 16-31 the values'), AM_PREFETCH tiles
    // ahead of the ring's newest.
    auto prefetch = [&](int i) {
        if (AM_PREFETCH > 0 && i < mine) {
            const int r = lane & 15;
            const size_t row = ((size_t)min(tile_pos(i) + r, p1 - 1) * NKV + kvh) * (2 * HD);
            prefetch_row_l2((lane < 16 ? kb : vb) + row, 2 * HD);
        }
    };
#pragma unroll
    for (int i = 0; i < MW_STAGES - 1; i++) {
        if (i < mine) copy(i);
        cp_async_commit();
    }
#pragma unroll
    for (int i = MW_STAGES - 1; i < MW_STAGES - 1 + AM_PREFETCH; i++) prefetch(i);
    mma_queries(q, t, kvh, qh, ql);

    float o[HD / 16][4];
#pragma unroll
    for (int mt = 0; mt < HD / 16; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    // Heads 2·tig and 2·tig + 1: running max and this lane's share of the sum.
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    // ldmatrix row addresses: K as A (matrix j = lane / 8: positions 8·(j & 1) + lane % 8, dims
    // 8·(j / 2)); V^T as A via .trans (positions 8·(j / 2) + lane % 8, dims 8·(j & 1)).
    const int kr = (lane & 7) + ((lane >> 3) & 1) * 8, kd = (lane >> 4) * 8;
    const int vr = (lane & 7) + (lane >> 4) * 8, vd = ((lane >> 3) & 1) * 8;
    for (int i = 0; i < mine; i++) {
        if (i + MW_STAGES - 1 < mine) copy(i + MW_STAGES - 1);
        cp_async_commit();
        prefetch(i + MW_STAGES - 1 + AM_PREFETCH);
        cp_async_wait<MW_STAGES - 1>();
        __syncwarp();
#ifdef ABLATE_ATTNMATH
        continue;
#endif
        const unsigned char* st = ring + (i % MW_STAGES) * STAGE;
        const u32 ka = smem_addr(st) + kr * MW_ROW + kd * 2;
        const u32 va = smem_addr(st + MW_TILE * MW_ROW) + vr * MW_ROW + vd * 2;
        const int p = tile_pos(i);
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int kk = 0; kk < HD; kk += 16) {
            u32 a[4];
            ldmatrix_x4(a, ka + kk * 2);
            const u16* bh = qh + gid * MW_QROW + kk + 2 * tig;
            const u16* bl = ql + gid * MW_QROW + kk + 2 * tig;
            mma_f16(s, a, *(const u32*)bh, *(const u32*)(bh + 8));
            mma_f16(s, a, *(const u32*)bl, *(const u32*)(bl + 8));
        }
        // s: positions gid (s0, s1) and gid + 8 (s2, s3), heads 2·tig (s0, s2) and 2·tig + 1.
        float e0, e1, e2, e3, c0, c1;
        mma_softmax(s, scale, p + gid < p1, p + gid + 8 < p1, m0, m1, l0, l1, e0, e1, e2, e3, c0, c1);
        // P^T ([head][position]) for the B fragments of the weighted sum.
        f16_pair(e0, pth + (2 * tig) * MW_PROW + gid, ptl + (2 * tig) * MW_PROW + gid);
        f16_pair(e1, pth + (2 * tig + 1) * MW_PROW + gid, ptl + (2 * tig + 1) * MW_PROW + gid);
        f16_pair(e2, pth + (2 * tig) * MW_PROW + gid + 8, ptl + (2 * tig) * MW_PROW + gid + 8);
        f16_pair(e3, pth + (2 * tig + 1) * MW_PROW + gid + 8, ptl + (2 * tig + 1) * MW_PROW + gid + 8);
        __syncwarp();
        const u16* ph = pth + gid * MW_PROW + 2 * tig;
        const u16* pl = ptl + gid * MW_PROW + 2 * tig;
        const u32 bh0 = *(const u32*)ph, bh1 = *(const u32*)(ph + 8);
        const u32 bl0 = *(const u32*)pl, bl1 = *(const u32*)(pl + 8);
        // o[mt]: dims 16·mt + gid (o0, o1) and + 8 (o2, o3), heads 2·tig (o0, o2) and 2·tig + 1.
#pragma unroll
        for (int mt = 0; mt < HD / 16; mt++) {
            o[mt][0] *= c0;
            o[mt][1] *= c1;
            o[mt][2] *= c0;
            o[mt][3] *= c1;
            u32 a[4];
            ldmatrix_x4_trans(a, va + mt * 32);
            mma_f16(o[mt], a, bh0, bh1);
            mma_f16(o[mt], a, bl0, bl1);
        }
        // The stage and P^T are rewritten next iteration.
        __syncwarp();
    }
    cp_async_wait<0>();
#ifdef ABLATE_ATTNMATH
    // Finite partial rows without the arithmetic.
    m0 = m1 = 0.0f;
    l0 = l1 = 1.0f;
#endif
    attn_mma_finish<false, AM_WARPS>(o, m0, m1, l0, l1, part, t, kvh, sp, nsplit);
#else
    __trap();
#endif
}

// ---- The same split over a q8_0 cache (attn_split_q8_mma). A warp's ring holds tiles as cached
// (int8 codes, then their f16 scales: 9.25 KiB a tile of 16 positions against an f16 tile's 16.5),
// and the codes go from there into the MMA fragments as f16, exactly (integers an f16 holds):
// - keys: a thread's fragment columns are dimensions 8·tig + 4·j .. + 3 of a 32-value block in
//   k step j (the queries' fragments follow the same order), so one 8-byte load gives a row's
//   codes for both k steps of a block; a block's two steps sum in their own accumulators, scaled
//   by the position's key scale in f32;
// - values: ldmatrix.trans of byte pairs gives a thread two positions' codes of dimensions 2c
//   and 2c + 1; the fragment's rows gid and gid + 8 are those two dimensions (attn_mma_finish's
//   PAIRED order); a value block's scales multiply the weights of its positions (the B operand
//   of the block's two m-tiles) before the f16 split, with a power of two per block that puts
//   the largest near 2^14, so the f16 pairs keep 22 bits where small weights would otherwise be
//   subnormal; the accumulators are rescaled exactly when it changes, and unscaled at the end.
#ifndef AQ_STAGES
#error "AQ_STAGES must be defined by the host (plan/attention.rs: ATTN_Q8_MMA_STAGES)"
#endif
#define MQ_NB (HD / QB)
#define MQ_KROW (HD + 32)  // key rows: 8-byte loads of 16 lanes in distinct banks
#define MQ_VROW (HD + 16)  // value rows: ldmatrix's eight rows in distinct banks
#define MQ_STAGE (MW_TILE * (MQ_KROW + MQ_VROW) + 2 * MW_TILE * MQ_NB * 2)
#define MQ_PROW 20
static_assert(HD % 64 == 0 && MQ_STAGE % 16 == 0, "whole q8_0 blocks, 16-byte stages");

#if __CUDA_ARCH__ >= 800
// Bytes (S0, S2) and (S1, S3) of the word picked by prmt selectors SLO and SHI (codes as int8)
// as f16 pairs, exactly: each code, offset to 0..255, becomes the low mantissa byte of 1024
// (0x6400), and 1024 + 128 (0x6480) comes off again.
template <u32 SLO, u32 SHI>
__device__ __forceinline__ void i8_f16_pairs(u32 w, u32& lo, u32& hi) {
    const u32 u = w ^ 0x80808080u, top = 0x64646464u, off = 0x64806480u;
    u32 a, b;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(a) : "r"(u), "r"(top), "n"(SLO));
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(b) : "r"(u), "r"(top), "n"(SHI));
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(lo) : "r"(a), "r"(off));
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(hi) : "r"(b), "r"(off));
}

// A row's MQ_NB f16 scales as floats, read two at a time.
__device__ __forceinline__ void q8_scales(const u16* row, float* d) {
#pragma unroll
    for (int b = 0; b < MQ_NB; b += 2) {
        const u32 w = *(const u32*)(row + b);
        d[b] = h2f((u16)(w & 0xffffu));
        d[b + 1] = h2f((u16)(w >> 16));
    }
}
#endif

// grid (NKV, nsplit, ntok) (or attn_block_token's order), block MW_WARPS warps. part: as
// attn_split's. Dynamic shared memory (plan/attention.rs): the rings (AQ_STAGES stages a warp),
// the queries as the f16 kernel's, each warp's weights ([8][MQ_PROW] f32). The rings are reused
// for the merge.
ENTRY __global__ void __launch_bounds__(MW_WARPS * 32)
    attn_split_q8_mma(const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,
                      const u16* __restrict__ ks, const u16* __restrict__ vs, const u32* __restrict__ pos_ptr,
                      float scale, int nsplit, float* __restrict__ part) {
#if __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) unsigned char smem[];
    u16* qh = (u16*)(smem + MW_WARPS * AQ_STAGES * MQ_STAGE);
    u16* ql = qh + 8 * MW_QROW;
    float* pw_all = (float*)(ql + 8 * MW_QROW);
    PDL_ENTRY();
    const int kvh = blockIdx.x, sp = attn_block_split(), t = attn_block_token();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    int p0, p1, mine;
    if (!attn_split_range(pos_ptr, t, sp, nsplit, MW_TILE, MW_WARPS, warp, &p0, &p1, &mine)) return;
    unsigned char* ring = smem + warp * AQ_STAGES * MQ_STAGE;
    float* pw = pw_all + warp * 8 * MQ_PROW;
    const unsigned char *kb = (const unsigned char*)kc, *vb = (const unsigned char*)vc;
    const unsigned char *ksb = (const unsigned char*)ks, *vsb = (const unsigned char*)vs;
    auto tile_pos = [&](int i) { return p0 + (warp + i * MW_WARPS) * MW_TILE; };
    auto copy = [&](int i) {
        unsigned char* st = ring + (i % AQ_STAGES) * MQ_STAGE;
        const int p = tile_pos(i);
        constexpr int PIECES = HD / 16;
        each_copy<MW_TILE * PIECES, 32>(lane, [&](int e) {
            const int r = e / PIECES, c = e % PIECES;
            const size_t row = (size_t)min(p + r, p1 - 1) * NKV + kvh;
            cp_async16(st + r * MQ_KROW + c * 16, kb + row * HD + c * 16);
            cp_async16(st + MW_TILE * MQ_KROW + r * MQ_VROW + c * 16, vb + row * HD + c * 16);
        });
        constexpr int SP = MQ_NB / 2;  // 4-byte pieces of a row's scales
        unsigned char* sc = st + MW_TILE * (MQ_KROW + MQ_VROW);
        each_copy<MW_TILE * SP, 32>(lane, [&](int e) {
            const int r = e / SP, c = e % SP;
            const size_t row = (size_t)min(p + r, p1 - 1) * NKV + kvh;
            cp_async4(sc + (r * MQ_NB + 2 * c) * 2, ksb + (row * MQ_NB + 2 * c) * 2);
            cp_async4(sc + ((MW_TILE + r) * MQ_NB + 2 * c) * 2, vsb + (row * MQ_NB + 2 * c) * 2);
        });
    };
#pragma unroll
    for (int i = 0; i < AQ_STAGES - 1; i++) {
        if (i < mine) copy(i);
        cp_async_commit();
    }
    mma_queries(q, t, kvh, qh, ql);

    // This thread's query fragments (hi, lo) of every k step, in the keys' order: registers,
    // as the blocks per multiprocessor are few.
    uint2 qfh[MQ_NB][2], qfl[MQ_NB][2];
#pragma unroll
    for (int b = 0; b < MQ_NB; b++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int d = 32 * b + 8 * tig + 4 * j;
            qfh[b][j] = *(const uint2*)(qh + gid * MW_QROW + d);
            qfl[b][j] = *(const uint2*)(ql + gid * MW_QROW + d);
        }
    // o as the weights' power of two per value block scales it (fe: that power's biased
    // exponent, 127 for 1).
    float o[HD / 16][4];
    int fe[MQ_NB];
#pragma unroll
    for (int mt = 0; mt < HD / 16; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
#pragma unroll
    for (int b = 0; b < MQ_NB; b++) fe[b] = 127;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    // ldmatrix.trans rows of the values: matrix j = lane / 8 is positions 8·(j & 1) .. + 7,
    // bytes 16·(j / 2) .. + 15 of a block's 32 (m-tiles 2b and 2b + 1).
    const int vr = (lane & 7) + ((lane >> 3) & 1) * 8, vc16 = (lane >> 4) * 16;
    for (int i = 0; i < mine; i++) {
        if (i + AQ_STAGES - 1 < mine) copy(i + AQ_STAGES - 1);
        cp_async_commit();
        cp_async_wait<AQ_STAGES - 1>();
        __syncwarp();
        const unsigned char* st = ring + (i % AQ_STAGES) * MQ_STAGE;
        const unsigned char* vst = st + MW_TILE * MQ_KROW;
        const u16* ksc = (const u16*)(st + MW_TILE * (MQ_KROW + MQ_VROW));
        const u16* vsc = ksc + MW_TILE * MQ_NB;
        const int p = tile_pos(i);
        // The key scales of positions gid and gid + 8, by block.
        float dk[2][MQ_NB];
        q8_scales(ksc + gid * MQ_NB, dk[0]);
        q8_scales(ksc + (gid + 8) * MQ_NB, dk[1]);
        // s: positions gid (s0, s1) and gid + 8 (s2, s3), heads 2·tig (s0, s2) and 2·tig + 1.
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int b = 0; b < MQ_NB; b++) {
            const uint2 k0 = *(const uint2*)(st + gid * MQ_KROW + 32 * b + 8 * tig);
            const uint2 k1 = *(const uint2*)(st + (gid + 8) * MQ_KROW + 32 * b + 8 * tig);
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int j = 0; j < 2; j++) {
                u32 a[4];
                i8_f16_pairs<0x5140, 0x5342>(j ? k0.y : k0.x, a[0], a[2]);
                i8_f16_pairs<0x5140, 0x5342>(j ? k1.y : k1.x, a[1], a[3]);
                mma_f16(c, a, qfh[b][j].x, qfh[b][j].y);
                mma_f16(c, a, qfl[b][j].x, qfl[b][j].y);
            }
            s[0] = fmaf(dk[0][b], c[0], s[0]);
            s[1] = fmaf(dk[0][b], c[1], s[1]);
            s[2] = fmaf(dk[1][b], c[2], s[2]);
            s[3] = fmaf(dk[1][b], c[3], s[3]);
        }
        float e0, e1, e2, e3, c0, c1;
        mma_softmax(s, scale, p + gid < p1, p + gid + 8 < p1, m0, m1, l0, l1, e0, e1, e2, e3, c0, c1);
        // The weights as [head][position]: a thread's B fragment is head gid's positions
        // 2·tig, 2·tig + 1, 2·tig + 8, 2·tig + 9.
        pw[(2 * tig) * MQ_PROW + gid] = e0;
        pw[(2 * tig + 1) * MQ_PROW + gid] = e1;
        pw[(2 * tig) * MQ_PROW + gid + 8] = e2;
        pw[(2 * tig + 1) * MQ_PROW + gid + 8] = e3;
        __syncwarp();
        const float* pr = pw + gid * MQ_PROW + 2 * tig;
        const float w[4] = {pr[0], pr[1], pr[8], pr[9]};
        const u32 va = smem_addr(vst) + vr * MQ_VROW + vc16;
#pragma unroll
        for (int b = 0; b < MQ_NB; b++) {
            // The value scales of the thread's weight positions 2·tig, 2·tig + 1, 2·tig + 8,
            // 2·tig + 9. The tile's largest of this block (every lane's tig covers four of the
            // 16 positions) sets the power of two: the weights times scales stay below 2^15.
            float dv[4];
#pragma unroll
            for (int k = 0; k < 4; k++) dv[k] = h2f(vsc[(2 * tig + (k & 1) + 8 * (k >> 1)) * MQ_NB + b]);
            float dmax = fmaxf(fmaxf(dv[0], dv[1]), fmaxf(dv[2], dv[3]));
            dmax = fmaxf(dmax, __shfl_xor_sync(0xffffffffu, dmax, 1));
            dmax = fmaxf(dmax, __shfl_xor_sync(0xffffffffu, dmax, 2));
            const int ex = (__float_as_int(dmax) >> 23) & 0xff;
            const int fn = dmax > 0.0f && ex < 255 ? 268 - ex : fe[b];
            const float f = __int_as_float(fn << 23), up = __int_as_float((fn - fe[b] + 127) << 23);
            const float r0 = c0 * up, r1 = c1 * up;
            fe[b] = fn;
            u16 h[4], lo[4];
#pragma unroll
            for (int k = 0; k < 4; k++) f16_pair(w[k] * dv[k] * f, &h[k], &lo[k]);
            const u32 bh0 = h[0] | ((u32)h[1] << 16), bh1 = h[2] | ((u32)h[3] << 16);
            const u32 bl0 = lo[0] | ((u32)lo[1] << 16), bl1 = lo[2] | ((u32)lo[3] << 16);
            u32 r[4];
            ldmatrix_x4_trans(r, va + 32 * b);
#pragma unroll
            for (int hm = 0; hm < 2; hm++) {
                float* om = o[2 * b + hm];
                om[0] *= r0;
                om[1] *= r1;
                om[2] *= r0;
                om[3] *= r1;
                // Positions 2·tig, 2·tig + 1 (r[2·hm]) and + 8 (r[2·hm + 1]): even bytes are
                // dimension 2c (row gid), odd ones 2c + 1 (row gid + 8).
                u32 a[4];
                i8_f16_pairs<0x5240, 0x5341>(r[2 * hm], a[0], a[1]);
                i8_f16_pairs<0x5240, 0x5341>(r[2 * hm + 1], a[2], a[3]);
                mma_f16(om, a, bh0, bh1);
                mma_f16(om, a, bl0, bl1);
            }
        }
        // The stage and the weights are rewritten next iteration.
        __syncwarp();
    }
    cp_async_wait<0>();
#pragma unroll
    for (int mt = 0; mt < HD / 16; mt++) {
        const float u = __int_as_float((254 - fe[mt / 2]) << 23);
        o[mt][0] *= u;
        o[mt][1] *= u;
        o[mt][2] *= u;
        o[mt][3] *= u;
    }
    attn_mma_finish<true, MW_WARPS>(o, m0, m1, l0, l1, part, t, kvh, sp, nsplit);
#else
    __trap();
#endif
}
