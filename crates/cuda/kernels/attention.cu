// Gated attention: q/k norm + RoPE + cache append, flash-decoding over NSPLIT splits, merge.
#define GQA (NH / NKV)
#define EPL (HD / 32)

// KV caches: [ctx][NKV][HD] f16, or (Q8 = true) q8_0: int8 values [ctx][NKV][HD] and one f16
// scale per 32 values [ctx][NKV][HD/32], quantized as llama.cpp's q8_0 (d = max|x| / 127,
// q = round(x / d)): half the bytes a decode step reads per cached position.
#define QB 32

// One cache row's value i (a thread per value; the 32 of a warp are one q8_0 block).
template <bool Q8>
__device__ __forceinline__ void kv_store(void* cache, u16* scales, size_t at, float v) {
    if (Q8) {
        const float d = warp_max(fabsf(v)) / 127.0f;
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        ((i8*)cache)[at] = (i8)__float2int_rn(v * id);
        if ((threadIdx.x & 31) == 0) scales[at / QB] = f2h(d);
    } else {
        ((u16*)cache)[at] = f2h(v);
    }
}

// Value i (thread i of a block of HD) of a query or key head `v` after its RMS norm (weight `w`)
// and NEOX RoPE at position `pos` on its first ROPE values. Every thread of the block calls it
// (it synchronizes); `buf` holds HD floats, `red` 32.
__device__ __forceinline__ float norm_rope(float v, float w, float eps, float base, u32 pos, float* buf,
                                           float* red) {
    const int i = threadIdx.x;
    const float ss = block_sum(v * v, red);
    v = v * (1.0f / sqrtf(ss / (float)HD + eps)) * w;
    buf[i] = v;
    __syncthreads();
    const int half = ROPE / 2;
    if (i < ROPE) {
        const int fi = i < half ? i : i - half;
        const float inv = 1.0f / powf(base, (float)(2 * fi) / (float)ROPE);
        float sn, cs;
        sincosf((float)pos * inv, &sn, &cs);
        if (i < half) v = buf[i] * cs - buf[i + half] * sn;
        else v = buf[i] * cs + buf[i - half] * sn;
    }
    return v;
}

// grid (NH + NKV, ntok), block HD. proj rows: [q0 g0 q1 g1 ... | k | v]. q_out: [ntok][NH][HD].
template <bool Q8>
__device__ __forceinline__ void attn_prep_body(const float* __restrict__ proj, int stride,
                                               const u32* __restrict__ pos_ptr, const float* __restrict__ qn,
                                               const float* __restrict__ kn, float eps, float base,
                                               float* __restrict__ q_out, void* __restrict__ kc,
                                               void* __restrict__ vc, u16* __restrict__ ks,
                                               u16* __restrict__ vs) {
    __shared__ float buf[HD];
    __shared__ float red[32];
    const int t = blockIdx.y, head = blockIdx.x, i = threadIdx.x;
    const bool isq = head < NH;
    const int kvh = head - NH;
    // The norms' weights are constant: read before waiting for the previous kernel.
    const float w = isq ? qn[i] : kn[i];
    TRACE_ENTRY();
    const u32 pos = *pos_ptr + t;
    const float* p = proj + (size_t)t * stride;
    const float v = norm_rope(isq ? p[head * 2 * HD + i] : p[2 * NH * HD + kvh * HD + i], w, eps, base, pos,
                              buf, red);
    if (isq) {
        q_out[((size_t)t * NH + head) * HD + i] = v;
    } else {
        const size_t at = ((size_t)pos * NKV + kvh) * HD + i;
        kv_store<Q8>(kc, ks, at, v);
        kv_store<Q8>(vc, vs, at, p[2 * NH * HD + NKV * HD + kvh * HD + i]);
    }
    if (i == 0) TRACE_EXIT(TRACE_ATTN_PREP, kc);
}

#define ATTN_PREP_KERNEL(name, Q8)                                                                        \
    ENTRY __global__ void name(const float* __restrict__ proj, int stride, const u32* __restrict__ pos_ptr, \
                                    const float* __restrict__ qn, const float* __restrict__ kn, float eps,   \
                                    float base, float* __restrict__ q_out, void* __restrict__ kc,          \
                                    void* __restrict__ vc, u16* __restrict__ ks, u16* __restrict__ vs) {   \
        attn_prep_body<Q8>(proj, stride, pos_ptr, qn, kn, eps, base, q_out, kc, vc, ks, vs);              \
    }
ATTN_PREP_KERNEL(attn_prep, false)
ATTN_PREP_KERNEL(attn_prep_q8, true)

// Flash-decoding over the cache. AMINLEN comes from the host's plan (plan/attention.rs); so do the
// variants' tile sizes and ring depths, with which it sizes the launches.
#if !defined(AMINLEN) || !defined(ARING)
#error "AMINLEN and ARING must be defined by the host"
#endif
#define AWARPS 4
static_assert(HD % 64 == 0 && EPL >= 2 && EPL <= 8, "a lane holds 2, 4 or 8 values of a head");

// Positions per split for a context of n_ctx split nsplit ways: at least AMINLEN, so that short
// contexts use few splits (and the merge reads few partials). Splits from ceil(n_ctx / len) on
// are empty. The merge kernel applies the same rule.
__device__ __forceinline__ int attn_split_len(int n_ctx, int nsplit) {
    return max((n_ctx + nsplit - 1) / nsplit, AMINLEN);
}

// Which of a split kernel's grid dimensions holds its splits and which its tokens: (NKV,
// nsplit, ntok), or with ATTN_TOKEN_MAJOR (NKV, ntok, nsplit), so that a multi-token pass's
// blocks come a split at a time, its tokens reading the same cache rows together
// (plan::ATTN_TOKEN_MAJOR). The block's work is the same either way.
#ifndef ATTN_TOKEN_MAJOR
#define ATTN_TOKEN_MAJOR 0
#endif
__device__ __forceinline__ int attn_block_split() {
    return ATTN_TOKEN_MAJOR ? blockIdx.z : blockIdx.y;
}
__device__ __forceinline__ int attn_block_token() {
    return ATTN_TOKEN_MAJOR ? blockIdx.y : blockIdx.z;
}

// The cache positions [p0, p1) that split sp of token t covers, and how many of its tiles of
// `tile` positions warp `warp` of `warps` takes (tiles warp, warp + warps, ...). False when the
// split lies past the token's context: the merge reads only the splits before.
__device__ __forceinline__ bool attn_split_range(const u32* __restrict__ pos_ptr, int t, int sp,
                                                 int nsplit, int tile, int warps, int warp,
                                                 int* p0, int* p1, int* mine) {
    const int n_ctx = (int)*pos_ptr + t + 1;
    const int len = attn_split_len(n_ctx, nsplit);
    *p0 = sp * len;
    if (*p0 >= n_ctx) return false;
    *p1 = min(n_ctx, *p0 + len);
    const int ntiles = (*p1 - *p0 + tile - 1) / tile;
    *mine = ntiles > warp ? (ntiles - 1 - warp) / warps + 1 : 0;
    return true;
}

// Bytes of a tile of TILE cache positions of one kv head in shared memory: K values, V values,
// K scales, V scales (scales for q8_0 only).
template <bool Q8, int TILE>
struct KvTile {
    static constexpr int RB = Q8 ? HD : 2 * HD;        // values of one cached row
    static constexpr int SB = Q8 ? 2 * (HD / QB) : 0;  // its scales
    static constexpr int VB = TILE * RB;              // all K (or V) values of the tile
    static constexpr int BYTES = 2 * TILE * (RB + SB);
};

// Starts copying positions p .. p + TILE - 1 (clamped to plast; the extra rows are masked) of
// kv head kvh into a stage, spread over the warp's lanes.
template <bool Q8, int TILE>
__device__ __forceinline__ void kv_tile_copy(unsigned char* st, const unsigned char* __restrict__ kc,
                                             const unsigned char* __restrict__ vc,
                                             const unsigned char* __restrict__ ks,
                                             const unsigned char* __restrict__ vs, int kvh, int p,
                                             int plast, int lane) {
    using T = KvTile<Q8, TILE>;
    constexpr int PIECES = T::RB / 16;
    each_copy<TILE * PIECES, 32>(lane, [&](int e) {
        const int r = e / PIECES, c = e % PIECES;
        const size_t row = (size_t)min(p + r, plast) * NKV + kvh;
        cp_async16(st + r * T::RB + c * 16, kc + row * T::RB + c * 16);
        cp_async16(st + T::VB + r * T::RB + c * 16, vc + row * T::RB + c * 16);
    });
    if (Q8) {
        constexpr int SP = T::SB / 4;
        each_copy<TILE * SP, 32>(lane, [&](int e) {
            const int r = e / SP, c = e % SP;
            const size_t row = (size_t)min(p + r, plast) * NKV + kvh;
            unsigned char* sc = st + 2 * T::VB;
            cp_async4(sc + r * T::SB + c * 4, ks + row * T::SB + c * 4);
            cp_async4(sc + TILE * T::SB + r * T::SB + c * 4, vs + row * T::SB + c * 4);
        });
    }
}

// The lane's EPL values of row r of a staged tile (vals: its K or V values, scales: theirs).
template <bool Q8, int TILE>
__device__ __forceinline__ void kv_row(const unsigned char* vals, const unsigned char* scales, int r,
                                       int lane, float* f) {
    using T = KvTile<Q8, TILE>;
    u32 w[EPL / (Q8 ? 4 : 2) > 0 ? EPL / (Q8 ? 4 : 2) : 1];
    const unsigned char* src = vals + r * T::RB + lane * EPL * (Q8 ? 1 : 2);
    constexpr int BYTES = EPL * (Q8 ? 1 : 2);
    if constexpr (BYTES == 16) {
        const uint4 v = *(const uint4*)src;
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    } else if constexpr (BYTES == 8) {
        const uint2 v = *(const uint2*)src;
        w[0] = v.x; w[1] = v.y;
    } else if constexpr (BYTES == 4) {
        w[0] = *(const u32*)src;
    } else {
        w[0] = *(const unsigned short*)src;
    }
    if constexpr (Q8) {
        const float d = h2f(((const u16*)(scales + r * T::SB))[lane * EPL / QB]);
        // Each code, offset to 0..255, as the low mantissa byte of 2^23 (one prmt), less
        // 2^23 + 128: the code exactly, without the quarter-rate integer-to-float conversion,
        // then the same product.
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            u32 m;
            asm("prmt.b32 %0, %1, %2, %3;" : "=r"(m) : "r"(w[e / 4] ^ 0x80808080u), "r"(0x4B000000u), "r"(0x7650u | (e % 4)));
            f[e] = (__int_as_float(m) - 8388736.0f) * d;
        }
    } else {
#pragma unroll
        for (int e = 0; e < EPL; e++) f[e] = h2f((u16)(w[e / 2] >> (16 * (e % 2))));
    }
}

// Values left per lane after reduce_scatter<n, o>.
__host__ __device__ constexpr int rs_count(int n, int o) {
    return o == 0 ? n : (n % 2 == 0 ? rs_count(n / 2, o / 2) : rs_count(n, o / 2));
}

// Sums v[0..N) over the warp's lanes, scattering the sums: each step on an even count keeps half
// of them (the lanes with bit O set the upper half) and adds the partner's; an odd count is
// summed in full (butterfly). Afterwards v[0..rs_count(N, 16)) are the complete sums of entries
// base, base + 1, ...; lanes sharing a base hold equal bits (a + b == b + a). Fixed order:
// deterministic.
template <int N, int O>
__device__ __forceinline__ void reduce_scatter(float* v, int lane, int& base) {
    if constexpr (O > 0) {
        if constexpr (N % 2 == 0) {
            constexpr int H = N / 2;
            const bool up = (lane & O) != 0;
#pragma unroll
            for (int i = 0; i < H; i++) {
                const float send = up ? v[i] : v[i + H];
                const float keep = up ? v[i + H] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
            }
            if (up) base += H;
            reduce_scatter<H, O / 2>(v, lane, base);
        } else {
#pragma unroll
            for (int i = 0; i < N; i++) v[i] += __shfl_xor_sync(0xffffffffu, v[i], O);
            reduce_scatter<N, O / 2>(v, lane, base);
        }
    }
}

// One warp's step over a staged tile of TILE cache positions (p .. p + TILE − 1, those from p1
// on masked) for G query heads (qr: this lane's EPL dimensions of each): the TILE·G scores
// summed across the warp by one reduce-scatter, the online softmax of each head in lane g < G
// (its running max m and sum l), then every lane's accumulators rescaled and the tile's values
// added with the weights from `w` (TILE·G weights, then the heads' corrections). The split
// kernels (G = GQA) and the short attention (G = 1) take the same step.
template <bool Q8, int TILE, int G>
__device__ __forceinline__ void kv_tile_step(const unsigned char* st, int p, int p1, const float (&qr)[G][EPL],
                                             float (&acc)[G][EPL], float& m, float& l, float* w, float scale,
                                             int lane) {
    using T = KvTile<Q8, TILE>;
    constexpr int NS = TILE * G;
    float sc[NS];
#pragma unroll
    for (int r = 0; r < TILE; r++) {
        float kf[EPL];
        kv_row<Q8, TILE>(st, st + 2 * T::VB, r, lane, kf);
#pragma unroll
        for (int g = 0; g < G; g++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++) d += qr[g][e] * kf[e];
            sc[r * G + g] = d;
        }
    }
    int base = 0;
    reduce_scatter<NS, 16>(sc, lane, base);
#pragma unroll
    for (int k = 0; k < rs_count(NS, 16); k++) w[base + k] = sc[k] * scale;
    __syncwarp();
    if (lane < G) {
        float tmax = NEG_INF;
#pragma unroll
        for (int r = 0; r < TILE; r++)
            if (p + r < p1) tmax = fmaxf(tmax, w[r * G + lane]);
        const float mn = fmaxf(m, tmax);
        const float corr = expf(m - mn);
        float add = 0.0f;
#pragma unroll
        for (int r = 0; r < TILE; r++) {
            const float pe = p + r < p1 ? expf(w[r * G + lane] - mn) : 0.0f;
            w[r * G + lane] = pe;
            add += pe;
        }
        l = l * corr + add;
        m = mn;
        w[NS + lane] = corr;
    }
    __syncwarp();
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float c = w[NS + g];
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[g][e] *= c;
    }
#pragma unroll
    for (int r = 0; r < TILE; r++) {
        float vf[EPL];
        kv_row<Q8, TILE>(st + T::VB, st + 2 * T::VB + TILE * T::SB, r, lane, vf);
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float pe = w[r * G + g];
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[g][e] += pe * vf[e];
        }
    }
    // The stage and the weights are rewritten next.
    __syncwarp();
}

// Merges the per-warp (acc[HD], m, l) of the GQA heads (sm_acc: [nw][GQA][HD], sm_ml:
// [nw][GQA][2]) into this split's partial rows, warps in order: deterministic.
__device__ __forceinline__ void attn_merge_warps(const float* sm_acc, const float* sm_ml, int nw,
                                                 float* __restrict__ part, int t, int kvh, int sp,
                                                 int nsplit) {
    for (int idx = threadIdx.x; idx < GQA * HD; idx += blockDim.x) {
        const int g = idx / HD, i = idx % HD;
        float M = NEG_INF;
        for (int wi = 0; wi < nw; wi++) M = fmaxf(M, sm_ml[(wi * GQA + g) * 2]);
        float L = 0.0f, A = 0.0f;
        if (M != NEG_INF) {
            for (int wi = 0; wi < nw; wi++) {
                const float mw = sm_ml[(wi * GQA + g) * 2];
                if (mw == NEG_INF) continue;
                const float f = expf(mw - M);
                L += sm_ml[(wi * GQA + g) * 2 + 1] * f;
                A += sm_acc[(wi * GQA + g) * HD + i] * f;
            }
        }
        float* dst = part + (((size_t)t * NH + kvh * GQA + g) * nsplit + sp) * (HD + 2);
        dst[i] = A;
        if (i == 0) {
            dst[HD] = M;
            dst[HD + 1] = L;
        }
    }
}

// grid (NKV, nsplit, ntok) (or attn_block_token's order), block AWARPS warps; dynamic shared
// memory: attn_split_launch (plan/attention.rs). Variants by TILE (positions a warp takes at a
// time) and STAGES (tiles in flight per warp). part: [ntok][NH][nsplit][HD + 2] = (acc[HD], m, l).
//
// Each warp streams tiles of TILE consecutive positions (tiles w, w + AWARPS, ... of the split)
// through its own ring of STAGES stages filled by cp.async: no block barrier until the merge,
// and the bytes in flight do not cost registers. A lane holds EPL dimensions of the GQA query
// heads of this kv head; the TILE·GQA partial dot products of a tile are summed across the warp
// by one reduce-scatter (a few shuffles per score instead of a full butterfly each), the online
// softmax of the tile runs in one lane per head, and every lane then updates its accumulators
// with the tile's weights from shared memory. Fixed order throughout: deterministic.
template <bool Q8, int TILE, int STAGES>
__device__ __forceinline__ void attn_split_body(const float* __restrict__ q, const void* __restrict__ kc,
                                                const void* __restrict__ vc, const u16* __restrict__ ks,
                                                const u16* __restrict__ vs, const u32* __restrict__ pos_ptr,
                                                float scale, int nsplit, float* __restrict__ part) {
    using T = KvTile<Q8, TILE>;
    constexpr int NS = TILE * GQA;
    constexpr int NF = rs_count(NS, 16);
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float sw[AWARPS][NS + GQA];
    TRACE_ENTRY();
    const int kvh = blockIdx.x, sp = attn_block_split(), t = attn_block_token();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int p0, p1, mine;
    if (!attn_split_range(pos_ptr, t, sp, nsplit, TILE, AWARPS, warp, &p0, &p1, &mine)) return;
    unsigned char* ring = smem + warp * STAGES * T::BYTES;
    const unsigned char *kb = (const unsigned char*)kc, *vb = (const unsigned char*)vc;
    const unsigned char *ksb = (const unsigned char*)ks, *vsb = (const unsigned char*)vs;
    auto tile_pos = [&](int i) { return p0 + (warp + i * AWARPS) * TILE; };
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) {
        if (i < mine) kv_tile_copy<Q8, TILE>(ring + i * T::BYTES, kb, vb, ksb, vsb, kvh, tile_pos(i), p1 - 1, lane);
        cp_async_commit();
    }

    float qr[GQA][EPL], acc[GQA][EPL];
#pragma unroll
    for (int g = 0; g < GQA; g++)
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            qr[g][e] = q[((size_t)t * NH + kvh * GQA + g) * HD + lane * EPL + e];
            acc[g][e] = 0.0f;
        }
    // Lane g < GQA: the running max and sum of head g.
    float m = NEG_INF, l = 0.0f;
    float* w = sw[warp];
    for (int i = 0; i < mine; i++) {
        const int j = i + STAGES - 1;
        if (j < mine) kv_tile_copy<Q8, TILE>(ring + (j % STAGES) * T::BYTES, kb, vb, ksb, vsb, kvh, tile_pos(j), p1 - 1, lane);
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        __syncwarp();
        kv_tile_step<Q8, TILE, GQA>(ring + (i % STAGES) * T::BYTES, tile_pos(i), p1, qr, acc, m, l, w, scale, lane);
    }
    cp_async_wait<0>();
    // Merge the warps: the rings become [AWARPS][GQA][HD] accumulators and (m, l) pairs.
    __syncthreads();
    float* sm_acc = (float*)smem;
    float* sm_ml = sm_acc + AWARPS * GQA * HD;
#pragma unroll
    for (int g = 0; g < GQA; g++)
#pragma unroll
        for (int e = 0; e < EPL; e++) sm_acc[(warp * GQA + g) * HD + lane * EPL + e] = acc[g][e];
    if (lane < GQA) {
        sm_ml[(warp * GQA + lane) * 2] = m;
        sm_ml[(warp * GQA + lane) * 2 + 1] = l;
    }
    __syncthreads();
    attn_merge_warps(sm_acc, sm_ml, AWARPS, part, t, kvh, sp, nsplit);
    if (threadIdx.x == 0) TRACE_EXIT(TRACE_ATTN_SPLIT, kc);
}

#define ATTN_SPLIT_KERNEL(name, Q8, TILE, STAGES)                                                           \
    ENTRY __global__ void __launch_bounds__(AWARPS * 32)                                               \
        name(const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,        \
             const u16* __restrict__ ks, const u16* __restrict__ vs, const u32* __restrict__ pos_ptr,      \
             float scale, int nsplit, float* __restrict__ part) {                                          \
        attn_split_body<Q8, TILE, STAGES>(q, kc, vc, ks, vs, pos_ptr, scale, nsplit, part);                \
    }
// ARING (from the host, plan/attention.rs: attn_ring_positions) cache positions in flight per warp.
static_assert(ARING % 8 == 0, "whole tiles of 8 in a ring");
ATTN_SPLIT_KERNEL(attn_split_t4, false, 4, ARING / 4)
ATTN_SPLIT_KERNEL(attn_split_q8_t4, true, 4, ARING / 4)
ATTN_SPLIT_KERNEL(attn_split_t8, false, 8, ARING / 8)
ATTN_SPLIT_KERNEL(attn_split_q8_t8, true, 8, ARING / 8)

// The merge's weights of a head's splits for a context of n_ctx positions split nsplit ways
// (splits of `len` positions where len > 0, as attn_prefill_mma's, else attn_split_len's):
// f[s] = exp(m_s − M) and ls[s] its share of the softmax sum (0 for a split the context did not
// reach), M the largest split maximum (fmaxf is exact and order-free: any reduction order gives
// the same M). Returns how many splits the context filled. Every thread of the block calls it
// (it synchronizes); `mred` holds a float per warp.
__device__ __forceinline__ int combine_weights(const float* __restrict__ src, int n_ctx, int nsplit, int len,
                                               float* f, float* ls, float* mred) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (len <= 0) len = attn_split_len(n_ctx, nsplit);
    const int used = (n_ctx + len - 1) / len;
    float mloc = NEG_INF;
    for (int s = threadIdx.x; s < used; s += blockDim.x) mloc = fmaxf(mloc, src[s * (HD + 2) + HD]);
    mloc = warp_max(mloc);
    if (lane == 0) mred[warp] = mloc;
    __syncthreads();
    float M = NEG_INF;
    for (int w = 0; w < nw; w++) M = fmaxf(M, mred[w]);
    for (int s = threadIdx.x; s < used; s += blockDim.x) {
        const float ms = src[s * (HD + 2) + HD];
        f[s] = ms == NEG_INF ? 0.0f : expf(ms - M);
        ls[s] = ms == NEG_INF ? 0.0f : src[s * (HD + 2) + HD + 1];
    }
    __syncthreads();
    return used;
}

// grid (NH, ntok, HD / 32), block 256: merge the splits the token's context filled, and gate.
// The split weights exp(m_s - M) go to shared memory once; warp w then sums splits w, w + 8, ...
// of 32 dimensions (coalesced rows, eight loads in flight per thread where one thread summed
// every split before), and the eight partial sums are added in warp order: deterministic.
#define CW 8
ENTRY __global__ void __launch_bounds__(CW * 32)
    attn_combine(const float* __restrict__ part, int nsplit, const u32* __restrict__ pos_ptr,
                 const float* __restrict__ proj, int stride, float* __restrict__ attn) {
    PDL_ENTRY();
    __shared__ float f[NSPLIT], ls[NSPLIT], red[CW][32], mred[CW], lred[CW];
    const int head = blockIdx.x, t = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int i = blockIdx.z * 32 + lane;
    const float* src = part + ((size_t)t * NH + head) * nsplit * (HD + 2);
    const int used = combine_weights(src, (int)*pos_ptr + t + 1, nsplit, 0, f, ls, mred);
    float A = 0.0f, Lw = 0.0f;
#pragma unroll 4
    for (int s = warp; s < used; s += CW) {
        A += src[s * (HD + 2) + i] * f[s];
        Lw += ls[s] * f[s];
    }
    red[warp][lane] = A;
    if (lane == 0) lred[warp] = Lw;
    __syncthreads();
    if (warp == 0) {
        float a = 0.0f, L = 0.0f;
        for (int w = 0; w < CW; w++) {
            a += red[w][lane];
            L += lred[w];
        }
        const float gate = proj[(size_t)t * stride + head * 2 * HD + HD + i];
        attn[((size_t)t * NH + head) * HD + i] = (a / L) * sigmoidf_(gate);
    }
}

// attn_combine for a one-token pass with the quantization of the attention output folded in
// (no quant_plain launch after it): grid (NH, 1, HD / 128), block 256, each block 128 dimensions
// of a head, four a lane. Every dimension's sums run in attn_combine's order (warp w the splits
// w, w + CW, …, then the warps in order), so `attn` gets the same bits, and warp 0 quantizes
// its 128 values by quant128 as quant_plain would: the same codes and pairs. Models whose
// attention output is Hadamard-rotated, or whose heads are not whole 128-value pieces
// (plan::forward_ops), keep the two kernels (the rotation spans four heads).
__device__ __forceinline__ void attn_combine_quant_body(const float* __restrict__ part, int nsplit,
        const u32* __restrict__ pos_ptr, const float* __restrict__ proj, int stride, float* __restrict__ attn,
        int* __restrict__ xq, float2* __restrict__ xs, u32* __restrict__ xp) {
#if HD % 128 != 0
    __trap();
#else
    TRACE_ENTRY();
    __shared__ float f[NSPLIT], ls[NSPLIT], mred[CW], lred[CW];
    __shared__ float4 red[CW][32];
    const int head = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int i = blockIdx.z * 128 + 4 * lane;
    const float* src = part + (size_t)head * nsplit * (HD + 2);
    const int used = combine_weights(src, (int)*pos_ptr + 1, nsplit, 0, f, ls, mred);
    // A split's row is HD + 2 floats: 8-byte aligned at every split, so two float2 loads.
    float4 A = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float Lw = 0.0f;
#pragma unroll 4
    for (int s = warp; s < used; s += CW) {
        const float2 lo = *(const float2*)(src + s * (HD + 2) + i);
        const float2 hi = *(const float2*)(src + s * (HD + 2) + i + 2);
        A.x += lo.x * f[s];
        A.y += lo.y * f[s];
        A.z += hi.x * f[s];
        A.w += hi.y * f[s];
        Lw += ls[s] * f[s];
    }
    red[warp][lane] = A;
    if (lane == 0) lred[warp] = Lw;
    __syncthreads();
    if (warp == 0) {
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float L = 0.0f;
        for (int w = 0; w < CW; w++) {
            const float4 r = red[w][lane];
            a.x += r.x;
            a.y += r.y;
            a.z += r.z;
            a.w += r.w;
            L += lred[w];
        }
        const float4 gate = *(const float4*)(proj + head * 2 * HD + HD + i);
        const float4 v = make_float4((a.x / L) * sigmoidf_(gate.x), (a.y / L) * sigmoidf_(gate.y),
                                     (a.z / L) * sigmoidf_(gate.z), (a.w / L) * sigmoidf_(gate.w));
        const int base = head * HD + blockIdx.z * 128;
        *(float4*)(attn + base + 4 * lane) = v;
        quant128(v, base, xq, xs, nullptr, xp);
        if (lane == 0) TRACE_EXIT(TRACE_ATTN_MERGE, 0);
    }
#endif
}

// Without plane words, and with them (`_p`: quant128's `xp_tok`, for 1-bit models): the first is
// the kernel the 2-bit models run, the null pointer compiling the words out.
ENTRY __global__ void __launch_bounds__(CW * 32) attn_combine_quant(const float* __restrict__ part,
        int nsplit, const u32* __restrict__ pos_ptr, const float* __restrict__ proj, int stride,
        float* __restrict__ attn, int* __restrict__ xq, float2* __restrict__ xs) {
    attn_combine_quant_body(part, nsplit, pos_ptr, proj, stride, attn, xq, xs, nullptr);
}
ENTRY __global__ void __launch_bounds__(CW * 32) attn_combine_quant_p(const float* __restrict__ part,
        int nsplit, const u32* __restrict__ pos_ptr, const float* __restrict__ proj, int stride,
        float* __restrict__ attn, int* __restrict__ xq, float2* __restrict__ xs, u32* __restrict__ xp) {
    attn_combine_quant_body(part, nsplit, pos_ptr, proj, stride, attn, xq, xs, xp);
}

// A one-token pass's whole attention over a short context in one kernel, in place of attn_prep,
// the split and attn_combine_quant (the host takes it while the context is at most
// plan::ATTN_SHORT_MAX positions): grid (NH), block HD threads, a block per query head.
//
// Thread i norms and rotates value i of the head's query and of its kv head's key by
// norm_rope, as attn_prep does, and the group's first block appends the key and the value to
// the cache by kv_store: the cache gets attn_prep's bytes. The cache's earlier positions were
// written by earlier passes (only this layer's attention writes them, once a pass), so each
// warp requests its first tiles of them before the wait for the previous kernel: warp w takes
// tiles w, w + AS_WARPS, … of AS_TILE positions, in the split kernels' layout, through a ring of
// AS_STAGES. This step's own row is staged from registers as the cache holds it (f16, or q8_0
// codes and scales), row 0 of a tile whose other rows are zeros, and taken by one warp as a tile
// of one position. Each warp keeps a running max, sum and accumulators as the split kernels'
// warps do; the warps are merged in order, the output gated, and its 128-value pieces quantized
// by quant128. Fixed order throughout: deterministic, though not the split path's bits (its
// sums run in another order).
#define AS_WARPS (HD / 32)
template <bool Q8>
__device__ __forceinline__ void attn_short_body(const float* __restrict__ proj, const u32* __restrict__ pos_ptr,
        const float* __restrict__ qn, const float* __restrict__ kn, float eps, float base, float scale,
        void* __restrict__ kc, void* __restrict__ vc, u16* __restrict__ ks, u16* __restrict__ vs,
        float* __restrict__ attn, int* __restrict__ xq, float2* __restrict__ xs, u32* __restrict__ xp) {
#if HD % 128 != 0
    __trap();
#else
    using T = KvTile<Q8, AS_TILE>;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float buf[HD], qv[HD], red[32];
    __shared__ float sw[AS_WARPS][AS_TILE + 1];
    __shared__ float sml[AS_WARPS][2];
    const int head = blockIdx.x, kvh = head / GQA, i = threadIdx.x, lane = i & 31, warp = i >> 5;
    const unsigned char *kb = (const unsigned char*)kc, *vb = (const unsigned char*)vc;
    const unsigned char *ksb = (const unsigned char*)ks, *vsb = (const unsigned char*)vs;
    unsigned char* ring = smem + warp * AS_STAGES * T::BYTES;
    unsigned char* cur = smem + AS_WARPS * AS_STAGES * T::BYTES;
    // Before the wait: the norms' weights (constant), the position (set before the pass) and
    // the first tiles of the positions before it.
    const float wq = qn[i], wk = kn[i];
    const int pos = (int)*pos_ptr;
    const int ntiles = (pos + AS_TILE - 1) / AS_TILE;
    const int mine = ntiles > warp ? (ntiles - 1 - warp) / AS_WARPS + 1 : 0;
    auto tile_pos = [&](int j) { return (warp + j * AS_WARPS) * AS_TILE; };
#pragma unroll
    for (int j = 0; j < AS_STAGES; j++) {
        if (j < mine) kv_tile_copy<Q8, AS_TILE>(ring + j * T::BYTES, kb, vb, ksb, vsb, kvh, tile_pos(j), pos - 1, lane);
        cp_async_commit();
    }
    // The current row's tile: rows past its first are zeros, finite under their zero weights.
    for (int o = 16 * i; o < T::BYTES; o += 16 * HD) *(uint4*)(cur + o) = make_uint4(0u, 0u, 0u, 0u);
    TRACE_ENTRY();
    const float gate = proj[head * 2 * HD + HD + i];
    const float v = proj[2 * NH * HD + NKV * HD + kvh * HD + i];
    const float q = norm_rope(proj[head * 2 * HD + i], wq, eps, base, (u32)pos, buf, red);
    const float k = norm_rope(proj[2 * NH * HD + kvh * HD + i], wk, eps, base, (u32)pos, buf, red);
    qv[i] = q;
    if (head % GQA == 0) {
        const size_t at = ((size_t)pos * NKV + kvh) * HD + i;
        kv_store<Q8>(kc, ks, at, k);
        kv_store<Q8>(vc, vs, at, v);
    }
    kv_store<Q8>(cur, (u16*)(cur + 2 * T::VB), i, k);
    kv_store<Q8>(cur + T::VB, (u16*)(cur + 2 * T::VB + AS_TILE * T::SB), i, v);
    __syncthreads();

    float qr[1][EPL], acc[1][EPL];
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        qr[0][e] = qv[lane * EPL + e];
        acc[0][e] = 0.0f;
    }
    // Lane 0: the running max and sum.
    float m = NEG_INF, l = 0.0f;
    float* w = sw[warp];
    for (int j = 0; j < mine; j++) {
        // Groups committed: AS_STAGES + j; tile j's done leaves at most AS_STAGES − 1 in flight.
        cp_async_wait<AS_STAGES - 1>();
        __syncwarp();
        unsigned char* st = ring + (j % AS_STAGES) * T::BYTES;
        kv_tile_step<Q8, AS_TILE, 1>(st, tile_pos(j), pos, qr, acc, m, l, w, scale, lane);
        if (j + AS_STAGES < mine)
            kv_tile_copy<Q8, AS_TILE>(st, kb, vb, ksb, vsb, kvh, tile_pos(j + AS_STAGES), pos - 1, lane);
        cp_async_commit();
    }
    // This step's row: the warp whose turn the next tile would be.
    if (warp == ntiles % AS_WARPS) kv_tile_step<Q8, AS_TILE, 1>(cur, pos, pos + 1, qr, acc, m, l, w, scale, lane);

    // Merge the warps in order; the rings become their accumulators.
    cp_async_wait<0>();
    __syncthreads();
    float* sm_acc = (float*)smem;
#pragma unroll
    for (int e = 0; e < EPL; e++) sm_acc[warp * HD + lane * EPL + e] = acc[0][e];
    if (lane == 0) {
        sml[warp][0] = m;
        sml[warp][1] = l;
    }
    __syncthreads();
    float M = NEG_INF;
#pragma unroll
    for (int u = 0; u < AS_WARPS; u++) M = fmaxf(M, sml[u][0]);
    float L = 0.0f, A = 0.0f;
#pragma unroll
    for (int u = 0; u < AS_WARPS; u++) {
        if (sml[u][0] == NEG_INF) continue;
        const float f = expf(sml[u][0] - M);
        L += sml[u][1] * f;
        A += sm_acc[u * HD + i] * f;
    }
    const float o = (A / L) * sigmoidf_(gate);
    attn[head * HD + i] = o;
    buf[i] = o;
    __syncthreads();
    if (warp < HD / 128) quant128(*(const float4*)(buf + 128 * warp + 4 * lane), head * HD + 128 * warp, xq, xs, nullptr, xp);
    if (i == 0) TRACE_EXIT(TRACE_ATTN_SHORT, kc);
#endif
}

// Without plane words, and with them (`_p`: quant128's `xp_tok`, for 1-bit models).
#define ATTN_SHORT_PARAMS                                                                                 \
    const float *__restrict__ proj, const u32 *__restrict__ pos_ptr, const float *__restrict__ qn,         \
        const float *__restrict__ kn, float eps, float base, float scale, void *__restrict__ kc,           \
        void *__restrict__ vc, u16 *__restrict__ ks, u16 *__restrict__ vs, float *__restrict__ attn,      \
        int *__restrict__ xq, float2 *__restrict__ xs
#define ATTN_SHORT_KERNEL(name, Q8)                                                                        \
    ENTRY __global__ void __launch_bounds__(HD) name(ATTN_SHORT_PARAMS) {                                   \
        attn_short_body<Q8>(proj, pos_ptr, qn, kn, eps, base, scale, kc, vc, ks, vs, attn, xq, xs, nullptr); \
    }
#define ATTN_SHORT_P_KERNEL(name, Q8)                                                                      \
    ENTRY __global__ void __launch_bounds__(HD) name(ATTN_SHORT_PARAMS, u32* __restrict__ xp) {             \
        attn_short_body<Q8>(proj, pos_ptr, qn, kn, eps, base, scale, kc, vc, ks, vs, attn, xq, xs, xp);      \
    }
ATTN_SHORT_KERNEL(attn_short, false)
ATTN_SHORT_KERNEL(attn_short_q8, true)
ATTN_SHORT_P_KERNEL(attn_short_p, false)
ATTN_SHORT_P_KERNEL(attn_short_q8_p, true)

// The same merge for multi-token passes, one block of HD threads per (head, token): grid (NH,
// ntok). attn_combine's 8·HD/32 small blocks per token spend their time in block scheduling and
// three dependent round trips each (prefill: 77 µs per layer for 256 tokens); here one block
// merges all HD dimensions of a row. Thread i reproduces attn_combine's order exactly — per
// warp slot w the splits w, w + CW, ... in turn, then the slots in order — so both kernels give
// the same bits from the same partial rows. `len`: the query-tiled attention's split length
// (attention_prefill.cu, whose partial rows differ from the split kernels'), or 0 for the split
// kernels' rule.
static_assert(HD % 32 == 0 && HD <= 1024, "attn_combine_rows: one thread per dimension");
ENTRY __global__ void __launch_bounds__(HD)
    attn_combine_rows(const float* __restrict__ part, int nsplit, int len, const u32* __restrict__ pos_ptr,
                      const float* __restrict__ proj, int stride, float* __restrict__ attn) {
    PDL_ENTRY();
    __shared__ float f[NSPLIT], ls[NSPLIT], mred[HD / 32];
    const int head = blockIdx.x, t = blockIdx.y, i = threadIdx.x;
    const float* src = part + ((size_t)t * NH + head) * nsplit * (HD + 2);
    const int used = combine_weights(src, (int)*pos_ptr + t + 1, nsplit, len, f, ls, mred);
    float a = 0.0f, L = 0.0f;
    for (int w = 0; w < CW; w++) {
        float A = 0.0f, Lw = 0.0f;
        for (int s = w; s < used; s += CW) {
            A += src[s * (HD + 2) + i] * f[s];
            Lw += ls[s] * f[s];
        }
        a += A;
        L += Lw;
    }
    const float gate = proj[(size_t)t * stride + head * 2 * HD + HD + i];
    attn[((size_t)t * NH + head) * HD + i] = (a / L) * sigmoidf_(gate);
}

