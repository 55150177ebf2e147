// Attention of a multi-token pass (a prompt chunk) over an f16 cache on the tensor cores
// (sm_80+), query-tiled: a block takes 16 tokens of one kv head, a warp per query head of it,
// and streams the split's keys and values once through shared memory for all of them. The
// flash-decoding split kernels run a token at a time: every token read the whole cache of the
// layer and did its dot products one FMA per value.
//
// Per tile of AP_TILE positions a warp computes S (16 tokens × AP_TILE positions) = Q · K^T and
// O (16 tokens × HD) += P · V as mma.m16n8k16 (f16 inputs, f32 accumulation), P straight from S's
// accumulators. The queries and the weights go in as f16 pairs hi + lo (hi = f16(x),
// lo = f16(x - hi)) through two mmas each, as in attn_split_mma, so the products are as exact as
// the f16 cache values allow. The partial rows are attn_split's, with splits of a fixed `len`
// positions for every token of the pass (attn_combine_rows takes the same `len`).
//
// Dynamic shared memory (plan/attention_prefill.rs, attn_prefill_launch): the queries (hi, then lo:
// [GQA][16][AP_ROW] f16), then AP_STAGES stages of AP_TILE key rows and AP_TILE value rows
// ([AP_ROW] f16 each, padded by 16 bytes so that ldmatrix's eight rows fall in distinct banks).
#ifndef AP_TILE
#error "AP_TILE and AP_STAGES must be defined by the host (plan/attention_prefill.rs)"
#endif
#define AP_ROW (HD + 8)
#define AP_TOKENS 16
static_assert(AP_TILE % 16 == 0 && AP_STAGES >= 2 && HD % 16 == 0, "whole k16 steps and n16 pairs");

#if __CUDA_ARCH__ >= 800
// Two floats as an f16 pair each: the hi halves packed (x in the low half), and the lo halves.
__device__ __forceinline__ void f16_pairs(float x, float y, u32* hi, u32* lo) {
    u16 xh, xl, yh, yl;
    f16_pair(x, &xh, &xl);
    f16_pair(y, &yh, &yl);
    *hi = (u32)xh | ((u32)yh << 16);
    *lo = (u32)xl | ((u32)yl << 16);
}
#endif

// grid (ceil(ntok / 16), NKV, nsplit), block GQA warps. Split sp covers positions
// [sp·len, (sp + 1)·len) of every token's context (len a multiple of AP_TILE); rows of tokens
// whose context ends before sp·len are not written (the merge reads only the splits before).
// part: as attn_split's.
ENTRY __global__ void __launch_bounds__(GQA * 32, 1)
    attn_prefill_mma(const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,
                     const u32* __restrict__ pos_ptr, float scale, int ntok, int nsplit, int len,
                     float* __restrict__ part) {
#if __CUDA_ARCH__ >= 800
    constexpr int STAGE = 2 * AP_TILE * AP_ROW * 2;
    constexpr int QBYTES = GQA * AP_TOKENS * AP_ROW * 2;
    extern __shared__ __align__(16) unsigned char smem[];
    u16* qh = (u16*)smem;
    u16* ql = (u16*)(smem + QBYTES);
    unsigned char* stages = smem + 2 * QBYTES;
    PDL_ENTRY();
    const int t0 = blockIdx.x * AP_TOKENS, kvh = blockIdx.y, sp = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int pos = (int)*pos_ptr;
    // The block's longest context: its last token's.
    const int ctx_end = pos + min(ntok, t0 + AP_TOKENS);
    const int p0 = sp * len;
    if (p0 >= ctx_end) return;
    const int p1 = min(ctx_end, p0 + len);
    const int ntiles = (p1 - p0 + AP_TILE - 1) / AP_TILE;
    const unsigned char *kb = (const unsigned char*)kc, *vb = (const unsigned char*)vc;
    auto copy = [&](int i) {
        unsigned char* st = stages + (i % AP_STAGES) * STAGE;
        const int p = p0 + i * AP_TILE;
        constexpr int PIECES = 2 * HD / 16;
        // Rows past the split repeat its last position (finite values; their scores are masked).
        each_copy<AP_TILE * PIECES, GQA * 32>(threadIdx.x, [&](int e) {
            const int r = e / PIECES, c = e % PIECES;
            const size_t row = ((size_t)min(p + r, p1 - 1) * NKV + kvh) * (2 * HD);
            cp_async16(st + (r * AP_ROW) * 2 + c * 16, kb + row + c * 16);
            cp_async16(st + ((AP_TILE + r) * AP_ROW) * 2 + c * 16, vb + row + c * 16);
        });
    };
#pragma unroll
    for (int i = 0; i < AP_STAGES - 1; i++) {
        if (i < ntiles) copy(i);
        cp_async_commit();
    }
    // The queries; rows past the pass repeat its last token (computed, never written).
    for (int idx = threadIdx.x; idx < GQA * AP_TOKENS * HD; idx += blockDim.x) {
        const int g = idx / (AP_TOKENS * HD), r = (idx / HD) % AP_TOKENS, i = idx % HD;
        const int t = min(t0 + r, ntok - 1);
        const float v = q[((size_t)t * NH + kvh * GQA + g) * HD + i];
        f16_pair(v, qh + (g * AP_TOKENS + r) * AP_ROW + i, ql + (g * AP_TOKENS + r) * AP_ROW + i);
    }

    // o[j]: tokens gid (o0, o1) and gid + 8 (o2, o3), dims 8·j + 2·tig and + 1.
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    // Tokens gid and gid + 8: running max and this lane's share of the sum.
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    // A token's context ends at pos + t + 1: positions from there on are masked.
    const int end0 = pos + t0 + gid + 1, end1 = end0 + 8;
    // ldmatrix row addresses. Q as A (matrix j = lane / 8: tokens 8·(j & 1) + lane % 8, dims
    // 8·(j / 2)); K as B (positions 8·(j / 2) + lane % 8, dims 8·(j & 1)); V as B via .trans
    // (positions 8·(j & 1) + lane % 8, dims 8·(j / 2)).
    const int qr = (lane & 7) + ((lane >> 3) & 1) * 8, qd = (lane >> 4) * 8;
    const int kr = (lane & 7) + (lane >> 4) * 8, kd = ((lane >> 3) & 1) * 8;
    const u32 qha = smem_addr(qh) + ((warp * AP_TOKENS + qr) * AP_ROW + qd) * 2;
    const u32 qla = smem_addr(ql) + ((warp * AP_TOKENS + qr) * AP_ROW + qd) * 2;
    for (int i = 0; i < ntiles; i++) {
        // Tile i landed for every thread, and every warp is done with tile i - 1's stage.
        cp_async_wait<AP_STAGES - 2>();
        __syncthreads();
        if (i + AP_STAGES - 1 < ntiles) copy(i + AP_STAGES - 1);
        cp_async_commit();
        const unsigned char* st = stages + (i % AP_STAGES) * STAGE;
        const u32 ka = smem_addr(st) + (kr * AP_ROW + kd) * 2;
        const u32 va = smem_addr(st) + ((AP_TILE + qr) * AP_ROW + qd) * 2;
        const int p = p0 + i * AP_TILE;

        // s[j]: tokens gid (s0, s1) and gid + 8 (s2, s3), positions p + 8·j + 2·tig and + 1.
        float s[AP_TILE / 8][4];
#pragma unroll
        for (int j = 0; j < AP_TILE / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD; kk += 16) {
            u32 ah[4], al[4];
            ldmatrix_x4(ah, qha + kk * 2);
            ldmatrix_x4(al, qla + kk * 2);
#pragma unroll
            for (int j = 0; j < AP_TILE / 16; j++) {
                u32 b[4];
                ldmatrix_x4(b, ka + (j * 16 * AP_ROW + kk) * 2);
                mma_f16(s[2 * j], ah, b[0], b[1]);
                mma_f16(s[2 * j], al, b[0], b[1]);
                mma_f16(s[2 * j + 1], ah, b[2], b[3]);
                mma_f16(s[2 * j + 1], al, b[2], b[3]);
            }
        }
        // The tile's online softmax per token; a row with no position yet keeps max −∞ and
        // weights 0 (its corrections use 0 in place of the max).
        float t0m = NEG_INF, t1m = NEG_INF;
#pragma unroll
        for (int j = 0; j < AP_TILE / 8; j++) {
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int pp = p + 8 * j + 2 * tig + c;
                s[j][c] = pp < end0 && pp < p1 ? s[j][c] * scale : NEG_INF;
                s[j][2 + c] = pp < end1 && pp < p1 ? s[j][2 + c] * scale : NEG_INF;
                t0m = fmaxf(t0m, s[j][c]);
                t1m = fmaxf(t1m, s[j][2 + c]);
            }
        }
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            t0m = fmaxf(t0m, __shfl_xor_sync(0xffffffffu, t0m, off));
            t1m = fmaxf(t1m, __shfl_xor_sync(0xffffffffu, t1m, off));
        }
        const float n0 = fmaxf(m0, t0m), n1 = fmaxf(m1, t1m);
        const float u0 = n0 == NEG_INF ? 0.0f : n0, u1 = n1 == NEG_INF ? 0.0f : n1;
        const float c0 = expf(m0 - u0), c1 = expf(m1 - u1);
        float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
        for (int j = 0; j < AP_TILE / 8; j++) {
#pragma unroll
            for (int c = 0; c < 2; c++) {
                s[j][c] = expf(s[j][c] - u0);
                s[j][2 + c] = expf(s[j][2 + c] - u1);
                r0 += s[j][c];
                r1 += s[j][2 + c];
            }
        }
        l0 = l0 * c0 + r0;
        l1 = l1 * c1 + r1;
        m0 = n0;
        m1 = n1;
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            o[j][0] *= c0;
            o[j][1] *= c0;
            o[j][2] *= c1;
            o[j][3] *= c1;
        }
        // O += P · V, a k16 step per 16 positions: P's A fragment is S's two n8 tiles.
#pragma unroll
        for (int kp = 0; kp < AP_TILE / 16; kp++) {
            u32 ah[4], al[4];
            f16_pairs(s[2 * kp][0], s[2 * kp][1], &ah[0], &al[0]);
            f16_pairs(s[2 * kp][2], s[2 * kp][3], &ah[1], &al[1]);
            f16_pairs(s[2 * kp + 1][0], s[2 * kp + 1][1], &ah[2], &al[2]);
            f16_pairs(s[2 * kp + 1][2], s[2 * kp + 1][3], &ah[3], &al[3]);
#pragma unroll
            for (int j = 0; j < HD / 16; j++) {
                u32 b[4];
                ldmatrix_x4_trans(b, va + (kp * 16 * AP_ROW + j * 16) * 2);
                mma_f16(o[2 * j], ah, b[0], b[1]);
                mma_f16(o[2 * j], al, b[0], b[1]);
                mma_f16(o[2 * j + 1], ah, b[2], b[3]);
                mma_f16(o[2 * j + 1], al, b[2], b[3]);
            }
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    const int head = kvh * GQA + warp;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int t = t0 + gid + 8 * h;
        // Written where the token's context reaches this split: then the row saw a position.
        if (t >= ntok || p0 >= pos + t + 1) continue;
        float* dst = part + (((size_t)t * NH + head) * nsplit + sp) * (HD + 2);
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            *(float2*)(dst + 8 * j + 2 * tig) = make_float2(o[j][2 * h], o[j][2 * h + 1]);
        if (tig == 0) *(float2*)(dst + HD) = h == 0 ? make_float2(m0, l0) : make_float2(m1, l1);
    }
#else
    __trap();
#endif
}
