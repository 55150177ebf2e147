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
#define MW_WARPS 2
#define MW_TILE 16
#define MW_STAGES 2
#define MW_ROW (2 * HD + 16)
#define MW_QROW (HD + 8)
#define MW_PROW 24
static_assert(GQA <= 8 && HD % 16 == 0, "one n8 tile of query heads, whole k16 steps");

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void ldmatrix_x4_trans(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void f16_pair(float x, u16* hi, u16* lo) {
    *hi = f2h(x);
    *lo = f2h(x - h2f(*hi));
}
#endif

// grid (NKV, nsplit, ntok), block MW_WARPS warps. part: as attn_split's.
extern "C" __global__ void __launch_bounds__(MW_WARPS * 32)
    attn_split_mma(const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,
                   const u16* __restrict__ ks, const u16* __restrict__ vs, const u32* __restrict__ pos_ptr,
                   float scale, int nsplit, float* __restrict__ part) {
#if __CUDA_ARCH__ >= 800
    constexpr int STAGE = 2 * MW_TILE * MW_ROW;
    extern __shared__ __align__(16) unsigned char smem[];
    u16* qh = (u16*)(smem + MW_WARPS * MW_STAGES * STAGE);
    u16* ql = qh + 8 * MW_QROW;
    PDL_ENTRY();
    const int kvh = blockIdx.x, sp = blockIdx.y, t = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    int p0, p1, mine;
    if (!attn_split_range(pos_ptr, t, sp, nsplit, MW_TILE, MW_WARPS, warp, &p0, &p1, &mine)) return;
    unsigned char* ring = smem + warp * MW_STAGES * STAGE;
    u16* pth = ql + 8 * MW_QROW + warp * 2 * 8 * MW_PROW;
    u16* ptl = pth + 8 * MW_PROW;
    const unsigned char *kb = (const unsigned char*)kc, *vb = (const unsigned char*)vc;
    auto tile_pos = [&](int i) { return p0 + (warp + i * MW_WARPS) * MW_TILE; };
    auto copy = [&](int i) {
        unsigned char* st = ring + (i % MW_STAGES) * STAGE;
        const int p = tile_pos(i);
        constexpr int PIECES = 2 * HD / 16;
        each_copy<MW_TILE * PIECES, 32>(lane, [&](int e) {
            const int r = e / PIECES, c = e % PIECES;
            const size_t row = ((size_t)min(p + r, p1 - 1) * NKV + kvh) * (2 * HD);
            cp_async16(st + r * MW_ROW + c * 16, kb + row + c * 16);
            cp_async16(st + MW_TILE * MW_ROW + r * MW_ROW + c * 16, vb + row + c * 16);
        });
    };
#pragma unroll
    for (int i = 0; i < MW_STAGES - 1; i++) {
        if (i < mine) copy(i);
        cp_async_commit();
    }
    for (int idx = threadIdx.x; idx < 8 * HD; idx += blockDim.x) {
        const int g = idx / HD, i = idx % HD;
        const float v = g < GQA ? q[((size_t)t * NH + kvh * GQA + g) * HD + i] : 0.0f;
        f16_pair(v, qh + g * MW_QROW + i, ql + g * MW_QROW + i);
    }
    __syncthreads();

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
        cp_async_wait<MW_STAGES - 1>();
        __syncwarp();
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
        const bool v0 = p + gid < p1, v1 = p + gid + 8 < p1;
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
        const float c0 = expf(m0 - n0), c1 = expf(m1 - n1);
        const float e0 = expf(x0 - n0), e1 = expf(x1 - n1), e2 = expf(x2 - n0), e3 = expf(x3 - n1);
        l0 = l0 * c0 + (e0 + e2);
        l1 = l1 * c1 + (e1 + e3);
        m0 = n0;
        m1 = n1;
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
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    // Merge the warps: the rings become [MW_WARPS][GQA][HD] accumulators and (m, l) pairs.
    __syncthreads();
    float* sm_acc = (float*)smem;
    float* sm_ml = sm_acc + MW_WARPS * GQA * HD;
    const int h0 = 2 * tig, h1 = 2 * tig + 1;
#pragma unroll
    for (int mt = 0; mt < HD / 16; mt++) {
        const int d0 = 16 * mt + gid;
        if (h0 < GQA) {
            sm_acc[(warp * GQA + h0) * HD + d0] = o[mt][0];
            sm_acc[(warp * GQA + h0) * HD + d0 + 8] = o[mt][2];
        }
        if (h1 < GQA) {
            sm_acc[(warp * GQA + h1) * HD + d0] = o[mt][1];
            sm_acc[(warp * GQA + h1) * HD + d0 + 8] = o[mt][3];
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
    attn_merge_warps(sm_acc, sm_ml, MW_WARPS, part, t, kvh, sp, nsplit);
#else
    __trap();
#endif
}
