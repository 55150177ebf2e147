// Attention of a multi-token pass (a prompt chunk) on the tensor cores (sm_80+), query-tiled: a
// block takes 16 tokens of one kv head, a warp per query head of it, and streams the split's
// keys and values once through shared memory for all of them. The
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
// A q8_0 cache (attn_prefill_q8_mma) stages its tiles as cached (codes, then scales) and turns
// each tile's codes into f16, exactly, in a buffer the mmas read as the f16 kernel's stages:
// - keys: each 32-value block's two k16 steps sum in their own accumulators, scaled by the
//   position's key scale in f32 (as attn_split_q8_mma);
// - values: a position's value scale multiplies its weights (the A operand) before the f16
//   split, block by block, times 2^(14 - E) where 2^E bounds the split's largest value scale of
//   that block: the weighted scales stay below 2^14 and, down to 2^-28 of the largest, normal f16
//   numbers, so the pairs keep 22 bits; the accumulators are scaled back at the end (exactly).
//
// Dynamic shared memory (plan/attention_prefill.rs, attn_prefill_launch): the queries (hi, then
// lo: [GQA][16][AP_ROW] f16), then AP_STAGES stages of AP_TILE key rows and AP_TILE value rows
// ([AP_ROW] f16 each, padded by 16 bytes so that ldmatrix's eight rows fall in distinct banks).
// A q8_0 block has instead, after the queries: one such f16 tile (the converted codes), the
// tile's key and value scales as floats ([AP_TILE][AP_NB] each), the blocks' value-scale
// factors ([AP_NB]) and their reduction's room ([GQA][AP_NB]), padded to 16 bytes, then
// AP_STAGES stages as cached (AP_TILE rows of key codes, of value codes, of key scales, of
// value scales). Its scale rows go in 8-byte pieces: heads of whole 128 values (the host
// launches it for no other).
#ifndef AP_TILE
#error "AP_TILE and AP_STAGES must be defined by the host (plan/attention_prefill.rs)"
#endif
#define AP_ROW (HD + 8)
#define AP_TOKENS 16
#define AP_NB (HD / QB)
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

// One tile's online softmax for a thread's two rows (gid and gid + 8 of its warp's 16), on
// scores laid out as the tensor cores' accumulators: s[4·j + c] at positions p + 8·j + 2·tig +
// c % 2, rows gid (c < 2) and gid + 8. Masks positions at or past a row's end (end0, end1) and
// the split's (p1), scales, turns the scores into weights, updates the running max m and this
// lane's share of the sum l, and rescales the rows' outputs o (laid out alike: NO n8 tiles). A
// row with no position yet keeps max −∞ and weights 0 (its corrections use 0 in place of the
// max).
template <int NS, int NO>
__device__ __forceinline__ void tile_softmax(float* s, float* o, int p, int tig, int end0, int end1, int p1,
                                             float scale, float& m0, float& m1, float& l0, float& l1) {
    float t0m = NEG_INF, t1m = NEG_INF;
#pragma unroll
    for (int j = 0; j < NS; j++) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int pp = p + 8 * j + 2 * tig + c;
            s[4 * j + c] = pp < end0 && pp < p1 ? s[4 * j + c] * scale : NEG_INF;
            s[4 * j + 2 + c] = pp < end1 && pp < p1 ? s[4 * j + 2 + c] * scale : NEG_INF;
            t0m = fmaxf(t0m, s[4 * j + c]);
            t1m = fmaxf(t1m, s[4 * j + 2 + c]);
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
    for (int j = 0; j < NS; j++) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
            s[4 * j + c] = expf(s[4 * j + c] - u0);
            s[4 * j + 2 + c] = expf(s[4 * j + 2 + c] - u1);
            r0 += s[4 * j + c];
            r1 += s[4 * j + 2 + c];
        }
    }
    l0 = l0 * c0 + r0;
    l1 = l1 * c1 + r1;
    m0 = n0;
    m1 = n1;
#pragma unroll
    for (int j = 0; j < NO; j++) {
        o[4 * j] *= c0;
        o[4 * j + 1] *= c0;
        o[4 * j + 2] *= c1;
        o[4 * j + 3] *= c1;
    }
}

// Row h (0: gid, 1: gid + 8) of a thread's outputs o (laid out as the tensor cores'
// accumulators: o[4·j + 2·h + c] is head value 8·j + 2·tig + c) with its running max and sum,
// as token t's partial row of query head `head` and split sp (attn_split's layout).
__device__ __forceinline__ void store_partial_row(float* __restrict__ part, int t, int head, int nsplit, int sp,
                                                  const float* o, int h, int tig, float m, float l) {
    float* dst = part + (((size_t)t * NH + head) * nsplit + sp) * (HD + 2);
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
        *(float2*)(dst + 8 * j + 2 * tig) = make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]);
    if (tig == 0) *(float2*)(dst + HD) = make_float2(m, l);
}
#endif

// grid (ceil(ntok / 16), NKV, nsplit), block GQA warps. Split sp covers positions
// [sp·len, (sp + 1)·len) of every token's context (len a multiple of AP_TILE); rows of tokens
// whose context ends before sp·len are not written (the merge reads only the splits before).
// part: as attn_split's.
template <bool Q8>
__device__ __forceinline__ void attn_prefill_body(const float* __restrict__ q, const void* __restrict__ kc,
                                                  const void* __restrict__ vc, const u16* __restrict__ ks,
                                                  const u16* __restrict__ vs, const u32* __restrict__ pos_ptr,
                                                  float scale, int ntok, int nsplit, int len,
                                                  float* __restrict__ part) {
#if __CUDA_ARCH__ >= 800
    constexpr int TILE16 = 2 * AP_TILE * AP_ROW * 2;  // an f16 tile: key rows, then value rows
    constexpr int QBYTES = GQA * AP_TOKENS * AP_ROW * 2;
    // A q8_0 stage: codes of AP_TILE key rows and value rows, then their scales.
    constexpr int RAW = 2 * AP_TILE * HD + 2 * AP_TILE * AP_NB * 2;
    constexpr int STAGE = Q8 ? RAW : TILE16;
    // q8_0: the floats after the converted tile, padded to 16 bytes.
    constexpr int FLOATS = ((2 * AP_TILE * AP_NB + AP_NB + GQA * AP_NB) * 4 + 15) / 16 * 16;
    extern __shared__ __align__(16) unsigned char smem[];
    u16* qh = (u16*)smem;
    u16* ql = (u16*)(smem + QBYTES);
    unsigned char* buf16 = smem + 2 * QBYTES;  // q8_0: the converted tile
    float* ksf = (float*)(buf16 + TILE16);      // q8_0: [AP_TILE][AP_NB] key scales
    float* vsf = ksf + AP_TILE * AP_NB;         // q8_0: value scales times the blocks' factors
    float* vfac = vsf + AP_TILE * AP_NB;        // q8_0: [AP_NB] 2^(14 - E)
    float* vred = vfac + AP_NB;                 // q8_0: [GQA][AP_NB]
    unsigned char* stages = smem + 2 * QBYTES + (Q8 ? TILE16 + FLOATS : 0);
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
        // Rows past the split repeat its last position (finite values; their scores are masked).
        if constexpr (Q8) {
            constexpr int PIECES = HD / 16, SPIECES = AP_NB * 2 / 8;
            each_copy<AP_TILE * PIECES, GQA * 32>(threadIdx.x, [&](int e) {
                const int r = e / PIECES, c = e % PIECES;
                const size_t row = ((size_t)min(p + r, p1 - 1) * NKV + kvh) * HD;
                cp_async16(st + r * HD + c * 16, kb + row + c * 16);
                cp_async16(st + (AP_TILE + r) * HD + c * 16, vb + row + c * 16);
            });
            each_copy<AP_TILE * SPIECES, GQA * 32>(threadIdx.x, [&](int e) {
                const int r = e / SPIECES, c = e % SPIECES;
                const size_t row = ((size_t)min(p + r, p1 - 1) * NKV + kvh) * AP_NB;
                unsigned char* sc = st + 2 * AP_TILE * HD;
                cp_async8(sc + r * AP_NB * 2 + c * 8, ks + row + c * 4);
                cp_async8(sc + (AP_TILE + r) * AP_NB * 2 + c * 8, vs + row + c * 4);
            });
        } else {
            constexpr int PIECES = 2 * HD / 16;
            each_copy<AP_TILE * PIECES, GQA * 32>(threadIdx.x, [&](int e) {
                const int r = e / PIECES, c = e % PIECES;
                const size_t row = ((size_t)min(p + r, p1 - 1) * NKV + kvh) * (2 * HD);
                cp_async16(st + (r * AP_ROW) * 2 + c * 16, kb + row + c * 16);
                cp_async16(st + ((AP_TILE + r) * AP_ROW) * 2 + c * 16, vb + row + c * 16);
            });
        }
    };
#pragma unroll
    for (int i = 0; i < AP_STAGES - 1; i++) {
        if (i < ntiles) copy(i);
        cp_async_commit();
    }
    // The queries, four values a load and a fixed trip count, so that several loads are in
    // flight (a float at a time, every load's latency showed: 6% of the kernel's time); rows
    // past the pass repeat its last token (computed, never written).
#pragma unroll 8
    for (int k = 0; k < HD / 8; k++) {
        const int e = 4 * (threadIdx.x + k * GQA * 32);
        const int g = e / (AP_TOKENS * HD), r = (e / HD) % AP_TOKENS, i = e % HD;
        const int t = min(t0 + r, ntok - 1);
        const float4 v = *(const float4*)(q + ((size_t)t * NH + kvh * GQA + g) * HD + i);
        u32 h01, l01, h23, l23;
        f16_pairs(v.x, v.y, &h01, &l01);
        f16_pairs(v.z, v.w, &h23, &l23);
        const int at = (g * AP_TOKENS + r) * AP_ROW + i;
        *(uint2*)(qh + at) = make_uint2(h01, h23);
        *(uint2*)(ql + at) = make_uint2(l01, l23);
    }
    if constexpr (Q8) {
        // Each value block's largest scale over the split: thread x sees block x % AP_NB only.
        static_assert(!Q8 || ((GQA * 32) % AP_NB == 0 && 32 % AP_NB == 0), "a thread keeps one block");
        // Eight loads in flight a thread (one at a time, their latency took ~9% of the kernel's
        // stall samples: a split of 8,192 positions is 341 scales a thread).
        float mx = 0.0f;
#pragma unroll 8
        for (int idx = threadIdx.x; idx < (p1 - p0) * AP_NB; idx += blockDim.x)
            mx = fmaxf(mx, h2f(vs[((size_t)(p0 + idx / AP_NB) * NKV + kvh) * AP_NB + idx % AP_NB]));
#pragma unroll
        for (int off = AP_NB; off < 32; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if (lane < AP_NB) vred[warp * AP_NB + lane] = mx;
        __syncthreads();
        if (threadIdx.x < AP_NB) {
            float m = 0.0f;
            for (int w = 0; w < GQA; w++) m = fmaxf(m, vred[w * AP_NB + threadIdx.x]);
            int e = 0;
            frexpf(m, &e);  // m < 2^e (0 for m = 0)
            vfac[threadIdx.x] = ldexpf(1.0f, 14 - e);
        }
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
        // Tile i landed for every thread, and every warp is done with tile i - 1.
        cp_async_wait<AP_STAGES - 2>();
        __syncthreads();
        if (i + AP_STAGES - 1 < ntiles) copy(i + AP_STAGES - 1);
        cp_async_commit();
        const unsigned char* st = Q8 ? buf16 : stages + (i % AP_STAGES) * STAGE;
        if constexpr (Q8) {
            // The tile's codes as f16 (exact), 16 at a time: a code c flipped to the byte c + 128
            // and set under the exponent of 1024 is the f16 1024 + c + 128, from which one f16x2
            // subtraction leaves c (converting each code through a float took a third of the
            // kernel's issue slots). Its scales as floats.
            const unsigned char* raw = stages + (i % AP_STAGES) * STAGE;
            each_copy<2 * AP_TILE * HD / 16, GQA * 32>(threadIdx.x, [&](int e) {
                const int r = e / (HD / 16), c = e % (HD / 16);
                const uint4 w = *(const uint4*)(raw + r * HD + c * 16);
                const u32 ws[4] = {w.x, w.y, w.z, w.w};
                u32 h[8];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const u32 x = ws[k] ^ 0x80808080u;
                    h[2 * k] = hsub2(__byte_perm(x, 0x64646464u, 0x4140), 0x64806480u);
                    h[2 * k + 1] = hsub2(__byte_perm(x, 0x64646464u, 0x4342), 0x64806480u);
                }
                uint4* dst = (uint4*)(buf16 + (r * AP_ROW + c * 16) * 2);
                dst[0] = make_uint4(h[0], h[1], h[2], h[3]);
                dst[1] = make_uint4(h[4], h[5], h[6], h[7]);
            });
            const u16* rs = (const u16*)(raw + 2 * AP_TILE * HD);
            for (int e = threadIdx.x; e < 2 * AP_TILE * AP_NB; e += blockDim.x) {
                const float x = h2f(rs[e]);
                if (e < AP_TILE * AP_NB)
                    ksf[e] = x;
                else
                    vsf[e - AP_TILE * AP_NB] = x * vfac[e % AP_NB];
            }
            __syncthreads();
        }
        const u32 ka = smem_addr(st) + (kr * AP_ROW + kd) * 2;
        const u32 va = smem_addr(st) + ((AP_TILE + qr) * AP_ROW + qd) * 2;
        const int p = p0 + i * AP_TILE;

        // s[j]: tokens gid (s0, s1) and gid + 8 (s2, s3), positions p + 8·j + 2·tig and + 1.
        float s[AP_TILE / 8][4];
#pragma unroll
        for (int j = 0; j < AP_TILE / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        // q8_0: a 32-value block's two k16 steps at a time, then scaled by the keys' scales.
#pragma unroll
        for (int kb0 = 0; kb0 < HD; kb0 += (Q8 ? QB : HD)) {
            float sb[AP_TILE / 8][4];
#pragma unroll
            for (int j = 0; j < AP_TILE / 8; j++) sb[j][0] = sb[j][1] = sb[j][2] = sb[j][3] = 0.0f;
#pragma unroll
            for (int kk = kb0; kk < kb0 + (Q8 ? QB : HD); kk += 16) {
                u32 ah[4], al[4];
                ldmatrix_x4(ah, qha + kk * 2);
                ldmatrix_x4(al, qla + kk * 2);
#pragma unroll
                for (int j = 0; j < AP_TILE / 16; j++) {
                    u32 b[4];
                    ldmatrix_x4(b, ka + (j * 16 * AP_ROW + kk) * 2);
                    mma_f16(sb[2 * j], ah, b[0], b[1]);
                    mma_f16(sb[2 * j], al, b[0], b[1]);
                    mma_f16(sb[2 * j + 1], ah, b[2], b[3]);
                    mma_f16(sb[2 * j + 1], al, b[2], b[3]);
                }
            }
#pragma unroll
            for (int j = 0; j < AP_TILE / 8; j++) {
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    if constexpr (Q8) {
                        const float f = ksf[(8 * j + 2 * tig + c) * AP_NB + kb0 / QB];
                        s[j][c] += sb[j][c] * f;
                        s[j][2 + c] += sb[j][2 + c] * f;
                    } else {
                        // One pass over the head: the sums are the scores (no add to zero).
                        s[j][c] = sb[j][c];
                        s[j][2 + c] = sb[j][2 + c];
                    }
                }
            }
        }
        tile_softmax<AP_TILE / 8, HD / 8>(&s[0][0], &o[0][0], p, tig, end0, end1, p1, scale, m0, m1, l0, l1);
        // O += P · V, a k16 step per 16 positions: P's A fragment is S's two n8 tiles (q8_0:
        // times the positions' value scales, a 32-value block of V at a time).
#pragma unroll
        for (int kp = 0; kp < AP_TILE / 16; kp++) {
            const int pa = 16 * kp + 2 * tig;
#pragma unroll
            for (int db = 0; db < HD; db += (Q8 ? QB : HD)) {
                float w0 = 1.0f, w1 = 1.0f, w8 = 1.0f, w9 = 1.0f;
                if constexpr (Q8) {
                    w0 = vsf[pa * AP_NB + db / QB];
                    w1 = vsf[(pa + 1) * AP_NB + db / QB];
                    w8 = vsf[(pa + 8) * AP_NB + db / QB];
                    w9 = vsf[(pa + 9) * AP_NB + db / QB];
                }
                u32 ah[4], al[4];
                f16_pairs(s[2 * kp][0] * w0, s[2 * kp][1] * w1, &ah[0], &al[0]);
                f16_pairs(s[2 * kp][2] * w0, s[2 * kp][3] * w1, &ah[1], &al[1]);
                f16_pairs(s[2 * kp + 1][0] * w8, s[2 * kp + 1][1] * w9, &ah[2], &al[2]);
                f16_pairs(s[2 * kp + 1][2] * w8, s[2 * kp + 1][3] * w9, &ah[3], &al[3]);
#pragma unroll
                for (int j = db / 16; j < (db + (Q8 ? QB : HD)) / 16; j++) {
                    u32 b[4];
                    ldmatrix_x4_trans(b, va + (kp * 16 * AP_ROW + j * 16) * 2);
                    mma_f16(o[2 * j], ah, b[0], b[1]);
                    mma_f16(o[2 * j], al, b[0], b[1]);
                    mma_f16(o[2 * j + 1], ah, b[2], b[3]);
                    mma_f16(o[2 * j + 1], al, b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait<0>();
    if constexpr (Q8) {
        // The value blocks' factors off again (powers of two: exact).
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            const float f = 1.0f / vfac[8 * j / QB];
            o[j][0] *= f;
            o[j][1] *= f;
            o[j][2] *= f;
            o[j][3] *= f;
        }
    }
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
        store_partial_row(part, t, head, nsplit, sp, &o[0][0], h, tig, h == 0 ? m0 : m1, h == 0 ? l0 : l1);
    }
#else
    __trap();
#endif
}

#define ATTN_PREFILL_KERNEL(name, Q8)                                                                       \
    ENTRY __global__ void __launch_bounds__(GQA * 32, 1)                                                  \
        name(const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,        \
             const u16* __restrict__ ks, const u16* __restrict__ vs, const u32* __restrict__ pos_ptr,      \
             float scale, int ntok, int nsplit, int len, float* __restrict__ part) {                       \
        attn_prefill_body<Q8>(q, kc, vc, ks, vs, pos_ptr, scale, ntok, nsplit, len, part);                 \
    }
ATTN_PREFILL_KERNEL(attn_prefill_mma, false)
#if HD % 128 == 0
ATTN_PREFILL_KERNEL(attn_prefill_q8_mma, true)
#else
// Scale rows of whole 8-byte pieces only: the host launches no q8_0 form for these heads.
ENTRY __global__ void attn_prefill_q8_mma() { __trap(); }
#endif
