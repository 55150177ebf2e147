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

// grid (NH + NKV, ntok), block HD. proj rows: [q0 g0 q1 g1 ... | k | v]. q_out: [ntok][NH][HD].
template <bool Q8>
__device__ __forceinline__ void attn_prep_body(const float* __restrict__ proj, int stride,
                                               const u32* __restrict__ pos_ptr, const float* __restrict__ qn,
                                               const float* __restrict__ kn, float eps, float base,
                                               float* __restrict__ q_out, void* __restrict__ kc,
                                               void* __restrict__ vc, u16* __restrict__ ks,
                                               u16* __restrict__ vs) {
    PDL_ENTRY();
    __shared__ float buf[HD];
    __shared__ float red[32];
    const int t = blockIdx.y, head = blockIdx.x, i = threadIdx.x;
    const u32 pos = *pos_ptr + t;
    const float* p = proj + (size_t)t * stride;
    const bool isq = head < NH;
    const int kvh = head - NH;
    float v = isq ? p[head * 2 * HD + i] : p[2 * NH * HD + kvh * HD + i];
    const float w = isq ? qn[i] : kn[i];
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
    if (isq) {
        q_out[((size_t)t * NH + head) * HD + i] = v;
    } else {
        const size_t at = ((size_t)pos * NKV + kvh) * HD + i;
        kv_store<Q8>(kc, ks, at, v);
        kv_store<Q8>(vc, vs, at, p[2 * NH * HD + NKV * HD + kvh * HD + i]);
    }
}

#define ATTN_PREP_KERNEL(name, Q8)                                                                        \
    extern "C" __global__ void name(const float* __restrict__ proj, int stride, const u32* __restrict__ pos_ptr, \
                                    const float* __restrict__ qn, const float* __restrict__ kn, float eps,   \
                                    float base, float* __restrict__ q_out, void* __restrict__ kc,          \
                                    void* __restrict__ vc, u16* __restrict__ ks, u16* __restrict__ vs) {   \
        attn_prep_body<Q8>(proj, stride, pos_ptr, qn, kn, eps, base, q_out, kc, vc, ks, vs);              \
    }
ATTN_PREP_KERNEL(attn_prep, false)
ATTN_PREP_KERNEL(attn_prep_q8, true)

// EPL consecutive f16 values of a cache row: 16-byte loads where the width allows.
__device__ __forceinline__ void load_halves(const u16* __restrict__ p, float* f) {
    if (EPL % 8 == 0) {
#pragma unroll
        for (int i = 0; i < EPL / 8; i++) {
            const uint4 v = __ldg((const uint4*)p + i);
            const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                f[8 * i + 2 * j] = h2f((u16)(w[j] & 0xffffu));
                f[8 * i + 2 * j + 1] = h2f((u16)(w[j] >> 16));
            }
        }
    } else {
#pragma unroll
        for (int e = 0; e < EPL; e++) f[e] = h2f(p[e]);
    }
}

// EPL consecutive values of a q8_0 cache row starting at element `at` (a multiple of EPL).
__device__ __forceinline__ void load_q8(const i8* __restrict__ c, const u16* __restrict__ sc, size_t at,
                                        float* f) {
    if (EPL == 8) {
        const uint2 w = __ldg((const uint2*)(c + at));
        const float d = h2f(__ldg(sc + at / QB));
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = (float)(signed char)(((e < 4 ? w.x : w.y) >> (8 * (e & 3))) & 0xff) * d;
    } else {
#pragma unroll
        for (int e = 0; e < EPL; e++) f[e] = (float)c[at + e] * h2f(__ldg(sc + (at + e) / QB));
    }
}

template <bool Q8>
__device__ __forceinline__ void load_kv(const void* __restrict__ c, const u16* __restrict__ sc, size_t at, float* f) {
    if (Q8) load_q8((const i8*)c, sc, at, f);
    else load_halves((const u16*)c + at, f);
}

// grid (NKV, nsplit, ntok), block 128 (4 warps, one cache position each at a time); nsplit ≤
// NSPLIT (fewer for the short contexts of a prefill pass: plan.rs, attn_splits).
// part: [ntok][NH][nsplit][HD + 2] = (acc[HD], m, l).
template <bool Q8>
__device__ __forceinline__ void attn_split_body(const float* __restrict__ q, const void* __restrict__ kc,
                                                const void* __restrict__ vc, const u16* __restrict__ ks,
                                                const u16* __restrict__ vs, const u32* __restrict__ pos_ptr,
                                                float scale, int nsplit, float* __restrict__ part) {
    PDL_ENTRY();
    __shared__ float sm_acc[4][GQA][HD];
    __shared__ float sm_ml[4][GQA][2];
    const int kvh = blockIdx.x, sp = blockIdx.y, t = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_ctx = (int)*pos_ptr + t + 1;
    const int len = (n_ctx + nsplit - 1) / nsplit;
    const int p0 = sp * len;
    const int p1 = min(n_ctx, p0 + len);

    float qr[GQA][EPL], acc[GQA][EPL], m[GQA], l[GQA];
#pragma unroll
    for (int g = 0; g < GQA; g++) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            qr[g][e] = q[((size_t)t * NH + kvh * GQA + g) * HD + lane * EPL + e];
            acc[g][e] = 0.0f;
        }
    }
    // Two cache positions per iteration (p and p + 4, the order of the one-at-a-time loop, so the
    // arithmetic is unchanged): their loads and dot-product reductions overlap.
    for (int p = p0 + warp; p < p1; p += 8) {
        const bool two = p + 4 < p1;
        float kf[2][EPL], vf[2][EPL];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int pu = u == 0 || two ? p + 4 * u : p;
            const size_t at = ((size_t)pu * NKV + kvh) * HD + lane * EPL;
            load_kv<Q8>(kc, ks, at, kf[u]);
            load_kv<Q8>(vc, vs, at, vf[u]);
        }
        float sc[2][GQA];
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int g = 0; g < GQA; g++) {
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; e++) dot += qr[g][e] * kf[u][e];
                sc[u][g] = warp_sum(dot) * scale;
            }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (u == 1 && !two) break;
#pragma unroll
            for (int g = 0; g < GQA; g++) {
                const float mn = fmaxf(m[g], sc[u][g]);
                const float corr = expf(m[g] - mn);
                const float pe = expf(sc[u][g] - mn);
                l[g] = l[g] * corr + pe;
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[g][e] = acc[g][e] * corr + pe * vf[u][e];
                m[g] = mn;
            }
        }
    }
#pragma unroll
    for (int g = 0; g < GQA; g++) {
#pragma unroll
        for (int e = 0; e < EPL; e++) sm_acc[warp][g][lane * EPL + e] = acc[g][e];
        if (lane == 0) { sm_ml[warp][g][0] = m[g]; sm_ml[warp][g][1] = l[g]; }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < GQA * HD; idx += blockDim.x) {
        const int g = idx / HD, i = idx % HD;
        float M = NEG_INF;
        for (int wi = 0; wi < 4; wi++) M = fmaxf(M, sm_ml[wi][g][0]);
        float L = 0.0f, A = 0.0f;
        if (M != NEG_INF) {
            for (int wi = 0; wi < 4; wi++) {
                const float mw = sm_ml[wi][g][0];
                if (mw == NEG_INF) continue;
                const float f = expf(mw - M);
                L += sm_ml[wi][g][1] * f;
                A += sm_acc[wi][g][i] * f;
            }
        }
        float* dst = part + (((size_t)t * NH + kvh * GQA + g) * nsplit + sp) * (HD + 2);
        dst[i] = A;
        if (i == 0) { dst[HD] = M; dst[HD + 1] = L; }
    }
}

#define ATTN_SPLIT_KERNEL(name, Q8)                                                                         \
    extern "C" __global__ void __launch_bounds__(128)                                                       \
        name(const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,        \
             const u16* __restrict__ ks, const u16* __restrict__ vs, const u32* __restrict__ pos_ptr,      \
             float scale, int nsplit, float* __restrict__ part) {                                          \
        attn_split_body<Q8>(q, kc, vc, ks, vs, pos_ptr, scale, nsplit, part);                              \
    }
ATTN_SPLIT_KERNEL(attn_split, false)
ATTN_SPLIT_KERNEL(attn_split_q8, true)

// grid (NH, ntok), block HD: merge the splits and gate. The split weights exp(m_s - M) are
// computed once per split into shared memory (not by every thread in a serial chain); each
// thread then sums in split order exactly as before, so the result has the same bits.
extern "C" __global__ void attn_combine(const float* __restrict__ part, int nsplit,
                                        const float* __restrict__ proj, int stride,
                                        float* __restrict__ attn) {
    PDL_ENTRY();
    __shared__ float f[NSPLIT], ls[NSPLIT], red[32];
    const int head = blockIdx.x, t = blockIdx.y, i = threadIdx.x;
    const float* src = part + ((size_t)t * NH + head) * nsplit * (HD + 2);
    float mloc = NEG_INF;
    for (int s = i; s < nsplit; s += blockDim.x) mloc = fmaxf(mloc, src[s * (HD + 2) + HD]);
    // fmaxf is exact and order-free: any reduction order gives the serial loop's M.
    mloc = warp_max(mloc);
    if ((i & 31) == 0) red[i >> 5] = mloc;
    __syncthreads();
    float M = NEG_INF;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) M = fmaxf(M, red[w]);
    for (int s = i; s < nsplit; s += blockDim.x) {
        const float ms = src[s * (HD + 2) + HD];
        f[s] = ms == NEG_INF ? 0.0f : expf(ms - M);
        ls[s] = ms == NEG_INF ? 0.0f : src[s * (HD + 2) + HD + 1];
    }
    __syncthreads();
    float L = 0.0f, A = 0.0f;
    // Deep unrolling keeps many of the independent partial-sum loads in flight at once.
#pragma unroll 32
    for (int s = 0; s < nsplit; s++) {
        // Empty splits were skipped before; adding exact zeros keeps every sum unchanged.
        L += ls[s] * f[s];
        A += src[s * (HD + 2) + i] * f[s];
    }
    const float gate = proj[(size_t)t * stride + head * 2 * HD + HD + i];
    attn[((size_t)t * NH + head) * HD + i] = (A / L) * sigmoidf_(gate);
}
