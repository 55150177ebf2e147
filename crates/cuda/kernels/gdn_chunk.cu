// Gated delta net over a multi-token pass in chunks of GC tokens (the chunked form of the
// recurrence gdn_step runs token by token).
//
// Per value head, with S0 the state at a chunk's start, and for its tokens t: c_t the sum of
// the log-gates up to t, γ_t = exp(c_t), β_t the update strengths, k_t, q_t (L2-normalized)
// and v_t. The step's δ_t = β_t (v_t − g_t S_{t−1}ᵀ k_t) unrolls to
//   (I + L) Δ = B (V − Γ K S0),  L[t][i] = β_t e^{c_t − c_i} k_t·k_i (i < t),
// so Δ = U − W S0 with W = (I + L)⁻¹ B Γ K and U = (I + L)⁻¹ B V, neither depending on the
// state; and
//   o_t = scale (γ_t S0ᵀ q_t + Σ_{i≤t} e^{c_t − c_i} (k_i·q_t) δ_i),
//   S_end = γ_end S0 + Σ_i e^{c_end − c_i} k_i δ_iᵀ.
// gdn_chunk_prep computes W, U, P[t][i] = scale e^{c_t − c_i} q_t·k_i (i ≤ t), γ and the
// ratios to the chunk's end for every chunk of every head at once (forward substitution, one
// column per thread); gdn_chunk_scan then carries the state through the chunks, one block per
// 32 value columns of a head, with matrix products only. Decay ratios come from differences
// of the log-gates, so small gates never make 0/0. Tokens past the pass are padding with zero
// inputs, a log-gate of 0 and β = 0: they change nothing.
#ifndef GC
#error "GC (tokens per chunk) must be defined by the host"
#endif
#define GDN_CHUNK_FLOATS (GC * DK + GC * DV + GC * GC + 2 * GC)
static_assert(GC == 64 && DK == 128 && DV % 32 == 0, "gdn chunks: 64 tokens, 128 key rows, 32-column blocks");

// grid (HV, chunks), block 256, dynamic shared memory GDN_PREP_SMEM (plan: gdn_prep_smem).
// chunks: per (head, chunk) GDN_CHUNK_FLOATS: W [GC][DK], U [GC][DV], P [GC][GC], γ [GC],
// e^{c_end − c_t} [GC].
ENTRY __global__ void __launch_bounds__(256)
gdn_chunk_prep(const float* __restrict__ conv, const float* __restrict__ proj, int stride, int aoff,
               const float* __restrict__ a_neg, const float* __restrict__ dt_bias, const float* __restrict__ qk,
               const float2* __restrict__ gb, int ntok, float* __restrict__ chunks) {
    extern __shared__ __align__(16) float sh[];
    constexpr int KS = DK + 4; // row stride: the four rows a quad reads start in distinct banks
    float* Ks = sh;
    float* Qs = Ks + GC * KS;
    float* Ls = Qs + GC * KS; // [GC][GC]
    float* cs = Ls + GC * GC;
    float* bs = cs + GC;
    const int h = blockIdx.x, ch = blockIdx.y, kh = h % HK, tid = threadIdx.x;
    const int t0 = ch * GC, n = min(GC, ntok - t0);
    float* out = chunks + ((size_t)h * gridDim.y + ch) * GDN_CHUNK_FLOATS;
    float* W = out;
    float* U = W + GC * DK;
    float* P = U + GC * DV;
    float* gam = P + GC * GC;
    float* rho = gam + GC;
    PDL_ENTRY();
    for (int e = tid; e < GC * DK / 4; e += blockDim.x) {
        const int t = e / (DK / 4), k = 4 * (e % (DK / 4));
        float4 qv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), kv = qv;
        if (t < n) {
            const float* src = qk + (size_t)(t0 + t) * 2 * HK * DK + kh * DK + k;
            qv = *(const float4*)src;
            kv = *(const float4*)(src + HK * DK);
        }
        *(float4*)(Qs + t * KS + k) = qv;
        *(float4*)(Ks + t * KS + k) = kv;
    }
    if (tid < GC) {
        float lg = 0.0f, b = 0.0f;
        if (tid < n) {
            const int tok = t0 + tid;
            lg = gdn_log_gate(proj[(size_t)tok * stride + aoff + h], a_neg[h], dt_bias[h]);
            b = gb[(size_t)tok * HV + h].y;
        }
        cs[tid] = lg;
        bs[tid] = b;
    }
    __syncthreads();
    if (tid == 0) {
        float c = 0.0f;
        for (int t = 0; t < GC; t++) {
            c += cs[t];
            cs[t] = c;
        }
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)DK);
    {
        // Thread (t, i0): entries (t, i0 + 4m) of L and P, only on and below the diagonal.
        const int t = tid >> 2;
        const float* kt = Ks + t * KS;
        const float* qt = Qs + t * KS;
        for (int m = 0; m < GC / 4; m++) {
            const int i = (tid & 3) + 4 * m;
            float kk = 0.0f, qq = 0.0f;
            if (i <= t) {
                const float* ki = Ks + i * KS;
                float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
#pragma unroll 8
                for (int k = 0; k < DK; k += 4) {
                    const float4 x = *(const float4*)(ki + k), y = *(const float4*)(kt + k),
                                 z = *(const float4*)(qt + k);
                    a.x += x.x * y.x; a.y += x.y * y.y; a.z += x.z * y.z; a.w += x.w * y.w;
                    b.x += x.x * z.x; b.y += x.y * z.y; b.z += x.z * z.z; b.w += x.w * z.w;
                }
                kk = (a.x + a.y) + (a.z + a.w);
                qq = (b.x + b.y) + (b.z + b.w);
            }
            const float r = i <= t ? expf(cs[t] - cs[i]) : 0.0f;
            Ls[t * GC + i] = i < t ? bs[t] * r * kk : 0.0f;
            P[t * GC + i] = scale * r * qq;
        }
    }
    if (tid < GC) {
        gam[tid] = expf(cs[tid]);
        rho[tid] = expf(cs[GC - 1] - cs[tid]);
    }
    __syncthreads();
    // Forward substitution, one column of [W | U] per thread: x_t = rhs_t − Σ_{i<t} L[t][i] x_i,
    // rhs_t = β_t γ_t k_t (W) or β_t v_t (U).
    for (int col = tid; col < DK + DV; col += blockDim.x) {
        float x[GC];
#pragma unroll
        for (int t = 0; t < GC; t++) {
            float rhs;
            if (col < DK) {
                rhs = bs[t] * expf(cs[t]) * Ks[t * KS + col];
            } else {
                rhs = t < n ? bs[t] * conv[(size_t)(t0 + t) * CH + 2 * HK * DK + h * DV + col - DK] : 0.0f;
            }
            const float* lt = Ls + t * GC;
            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
            for (int i = 0; i + 1 < t; i += 2) {
                s0 += lt[i] * x[i];
                s1 += lt[i + 1] * x[i + 1];
            }
            if (t & 1) s0 += lt[t - 1] * x[t - 1];
            x[t] = rhs - (s0 + s1);
        }
        float* dst = col < DK ? W + col : U + col - DK;
        const int ld = col < DK ? DK : DV;
#pragma unroll
        for (int t = 0; t < GC; t++) dst[(size_t)t * ld] = x[t];
    }
}

// grid (HV, DV / 32), block 256: warp w of block (h, by) computes, per chunk, Δ and the outputs
// of tokens 8w .. 8w+7 for value columns 32·by + lane, then the state's key rows
// 16w .. 16w+15 of those columns. The block's state slice stays in shared memory across the
// chunks. S: two buffers of [HV][DK][DV] (ssm_read); o: [ntok][HV*DV].
ENTRY __global__ void __launch_bounds__(256)
gdn_chunk_scan(const float* __restrict__ chunks, int nchunks, const float* __restrict__ qk, int ntok,
               const u32* __restrict__ pos, float* __restrict__ S, float* __restrict__ o) {
    __shared__ float Ss[DK][32];
    __shared__ float Ds[GC][32];
    const int h = blockIdx.x, kh = h % HK, c = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int j = blockIdx.y * 32 + c;
    const u32 p = *pos;
    const float* Sh = ssm_read(S, p) + (size_t)h * DK * DV;
    // Only this kernel writes the state, once per pass (see gdn_step).
    for (int k = w; k < DK; k += 8) Ss[k][c] = Sh[(size_t)k * DV + j];
    PDL_ENTRY();
    __syncthreads();
    for (int ch = 0; ch < nchunks; ch++) {
        const float* W = chunks + ((size_t)h * nchunks + ch) * GDN_CHUNK_FLOATS;
        const float* U = W + GC * DK;
        const float* P = U + GC * DV;
        const float* gam = P + GC * GC;
        const float* rho = gam + GC;
        const int t0 = ch * GC, n = min(GC, ntok - t0);
        // Δ = U − W S0 and γ (Q S0) for this warp's tokens.
        float dl[8], oq[8];
#pragma unroll
        for (int r = 0; r < 8; r++) {
            dl[r] = U[(size_t)(8 * w + r) * DV + j];
            oq[r] = 0.0f;
        }
        for (int k = 0; k < DK; k += 4) {
            const float s0 = Ss[k][c], s1 = Ss[k + 1][c], s2 = Ss[k + 2][c], s3 = Ss[k + 3][c];
#pragma unroll
            for (int r = 0; r < 8; r++) {
                const int t = 8 * w + r;
                const float4 wv = __ldg((const float4*)(W + (size_t)t * DK + k));
                dl[r] -= (wv.x * s0 + wv.y * s1) + (wv.z * s2 + wv.w * s3);
                if (t < n) {
                    const float4 qv = __ldg((const float4*)(qk + (size_t)(t0 + t) * 2 * HK * DK + kh * DK + k));
                    oq[r] += (qv.x * s0 + qv.y * s1) + (qv.z * s2 + qv.w * s3);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 8; r++) Ds[8 * w + r][c] = dl[r];
        // Every warp's Δ is written, and every read of S0 is done.
        __syncthreads();
        const float scale = 1.0f / sqrtf((float)DK);
#pragma unroll
        for (int r = 0; r < 8; r++) {
            const int t = 8 * w + r;
            float acc = scale * __ldg(gam + t) * oq[r];
            const float* pt = P + (size_t)t * GC;
            for (int i = 0; i <= t; i++) acc += __ldg(pt + i) * Ds[i][c];
            if (t < n) o[(size_t)(t0 + t) * HV * DV + h * DV + j] = acc;
        }
        // S ← γ_end S0 + Σ_t e^{c_end − c_t} k_t δ_tᵀ for key rows 16w .. 16w+15.
        const float gend = __ldg(gam + GC - 1);
        float acc[16];
#pragma unroll
        for (int m = 0; m < 16; m++) acc[m] = gend * Ss[16 * w + m][c];
        for (int t = 0; t < n; t++) {
            const float d = __ldg(rho + t) * Ds[t][c];
            const float4* kr = (const float4*)(qk + (size_t)(t0 + t) * 2 * HK * DK + HK * DK + kh * DK + 16 * w);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const float4 kv = __ldg(kr + q);
                acc[4 * q] += kv.x * d;
                acc[4 * q + 1] += kv.y * d;
                acc[4 * q + 2] += kv.z * d;
                acc[4 * q + 3] += kv.w * d;
            }
        }
#pragma unroll
        for (int m = 0; m < 16; m++) Ss[16 * w + m][c] = acc[m];
        // The new state is complete before the next chunk reads it, and Δ is read.
        __syncthreads();
    }
    float* Sw = ssm_write(S, p, ntok) + (size_t)h * DK * DV;
    for (int k = w; k < DK; k += 8) Sw[(size_t)k * DV + j] = Ss[k][c];
}
