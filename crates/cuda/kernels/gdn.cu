// Gated delta net: the causal depthwise conv and the recurrent step.
#define CH (2 * HK * DK + HV * DV)

// The recurrent state is double-buffered by the parity of the position, as the conv state is:
// a pass of ntok tokens reads the layer's [HV][DK][DV] at the parity of `pos` and writes the
// buffer of pos + ntok. A decode step run ahead of the host (CudaModel::forward_greedy) that is
// then not kept so leaves the state it read where the next pass looks for it.
#define SSM_FLOATS ((size_t)HV * DK * DV)
__device__ __forceinline__ const float* ssm_read(const float* S, u32 p) { return S + (size_t)(p & 1u) * SSM_FLOATS; }
__device__ __forceinline__ float* ssm_write(float* S, u32 p, int ntok) {
    return S + (size_t)((p + (u32)ntok) & 1u) * SSM_FLOATS;
}

// block (32, Y ≤ 8), grid ceil(CH / 32): thread (x, y) computes channel 32·bx + x for tokens y,
// y + Y, ... (each output reads its KERN inputs directly: the earliest come from the state),
// then one thread per channel writes the shifted state, after every read of the old one.
// state: two buffers of [KERN-1][CH], the current one at the parity of the position `pos`
// (see gdn_decode); the new state goes to the parity of pos + ntok. taps: [CH][KERN].
ENTRY __global__ void __launch_bounds__(256) gdn_conv(const float* __restrict__ proj, int stride, int ntok,
                                                           const u32* __restrict__ pos,
                                                           float* __restrict__ states,
                                                           const float* __restrict__ taps,
                                                           float* __restrict__ out) {
    const int c = blockIdx.x * 32 + threadIdx.x;
    const bool live = c < CH;
    const u32 p = *pos;
    const float* state = states + (size_t)(p & 1u) * (KERN - 1) * CH;
    float* fresh = states + (size_t)((p + (u32)ntok) & 1u) * (KERN - 1) * CH;
    float s[KERN - 1], w[KERN];
#pragma unroll
    for (int j = 0; j < KERN - 1; j++) s[j] = live ? state[j * CH + c] : 0.0f;
#pragma unroll
    for (int j = 0; j < KERN; j++) w[j] = live ? taps[c * KERN + j] : 0.0f;
    // The taps are constant, the position is the host's, and the conv state is written only by
    // this layer's conv (this kernel or gdn_decode), once per pass (as the recurrent state: see
    // gdn_step), so all are read before waiting for the previous kernel. With an even ntok the
    // new state goes to the buffer read here: safe, since a channel's readers and its writer
    // are this block's threads, on either side of the barrier below.
    PDL_ENTRY();
    for (int t = threadIdx.y; live && t < ntok; t += blockDim.y) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < KERN - 1; j++) {
            const int u = t - (KERN - 1) + j;
            acc += w[j] * (u < 0 ? s[u + KERN - 1] : proj[(size_t)u * stride + c]);
        }
        acc += w[KERN - 1] * proj[(size_t)t * stride + c];
        out[(size_t)t * CH + c] = siluf_(acc);
    }
    __syncthreads();
    if (live && threadIdx.y == 0) {
#pragma unroll
        for (int j = 0; j < KERN - 1; j++) {
            const int u = ntok - (KERN - 1) + j;
            fresh[j * CH + c] = u < 0 ? s[u + KERN - 1] : proj[(size_t)u * stride + c];
        }
    }
}

// The log of value head h's decay for one token (an = −exp(A_log), a its input).
__device__ __forceinline__ float gdn_log_gate(float a, float an, float dtb) { return an * softplusf_(a + dtb); }

// The decay and the update strength of value head h for one token.
__device__ __forceinline__ float2 gdn_gates(float a, float b, float an, float dtb) {
    return make_float2(expf(gdn_log_gate(a, an, dtb)), sigmoidf_(b));
}

// Sum of squares of a q or k vector held as lane + 32m (m < 4), reduced over the warp: the
// order gdn_step uses, so both places produce the same bits.
__device__ __forceinline__ float gdn_rnorm(const float* v) {
    float s = 0.0f;
#pragma unroll
    for (int m = 0; m < 4; m++) s += v[m] * v[m];
    return 1.0f / sqrtf(warp_sum(s) + 1e-6f);
}

// The parts of a multi-token pass's recurrence that do not depend on the state, for all its
// tokens at once: q and k L2-normalized per key head, and the gates of each value head.
// grid (HK, ntok), block (32, 2): warp 0 normalizes q, warp 1 k; lanes of warp 0 compute the
// gates of value heads kh, kh + HK, ... qk: [ntok][2][HK][DK]; gb: [ntok][HV] (g, beta).
ENTRY __global__ void __launch_bounds__(64)
gdn_prep(const float* __restrict__ conv, const float* __restrict__ proj, int stride, int aoff,
         int boff, const float* __restrict__ a_neg, const float* __restrict__ dt_bias,
         float* __restrict__ qk, float2* __restrict__ gb) {
    PDL_ENTRY();
    static_assert(DK == 128, "gdn_prep: four values per lane");
    const int kh = blockIdx.x, t = blockIdx.y, lane = threadIdx.x, w = threadIdx.y;
    const float* x = conv + (size_t)t * CH + w * HK * DK + kh * DK;
    float v[4];
#pragma unroll
    for (int m = 0; m < 4; m++) v[m] = x[32 * m + lane];
    const float rn = gdn_rnorm(v);
    float* o = qk + (((size_t)t * 2 + w) * HK + kh) * DK;
#pragma unroll
    for (int m = 0; m < 4; m++) o[32 * m + lane] = v[m] * rn;
    for (int h = kh + HK * lane; w == 0 && h < HV; h += 32 * HK) {
        const float a = proj[(size_t)t * stride + aoff + h];
        const float b = proj[(size_t)t * stride + boff + h];
        gb[(size_t)t * HV + h] = gdn_gates(a, b, a_neg[h], dt_bias[h]);
    }
}

// Puts one token's q and k (L2-normalized here unless `prepped`) where the warp's lanes read
// them (qs, ks: DK floats each) and returns the token's gates (decay, update strength). `cur`:
// q and k elements lane + 32m, the value, the gate inputs (or the gates when prepped).
__device__ __forceinline__ float2 gdn_stage(const float* cur, bool prepped, float an, float dtb,
                                           float* qs, float* ks) {
    const int lane = threadIdx.x & 31;
    // The previous token's reads of qs and ks are done.
    __syncwarp();
    float2 gates;
    if (prepped) {
#pragma unroll
        for (int m = 0; m < 4; m++) {
            qs[32 * m + lane] = cur[m];
            ks[32 * m + lane] = cur[4 + m];
        }
        gates = make_float2(cur[9], cur[10]);
    } else {
        const float rq = gdn_rnorm(cur), rk = gdn_rnorm(cur + 4);
#pragma unroll
        for (int m = 0; m < 4; m++) {
            qs[32 * m + lane] = cur[m] * rq;
            ks[32 * m + lane] = cur[4 + m] * rk;
        }
        gates = gdn_gates(cur[9], cur[10], an, dtb);
    }
    __syncwarp();
    return gates;
}

// (a + b) + (c + d): the order every sum of four in the step takes (a lane's partial sums, and
// the row groups' shares as gdn_token's shuffles add them), one place so that the decode
// kernel's sums through shared memory keep the same bits.
__device__ __forceinline__ float sum4(float a, float b, float c, float d) { return (a + b) + (c + d); }

// One token of the delta rule for one lane's RPL key rows `s` of a value column (row group r
// of R = DK / RPL), in two halves around each reduction over the row groups: the decay and the
// lane's share of k·S (gdn_kpart), then the update by β·(v − k·S) and the lane's share of the
// output q·S / sqrt(DK) (gdn_opart). `kr`: the lane's rows of k, loaded by the first.
template <int RPL>
__device__ __forceinline__ float gdn_kpart(float (&s)[RPL], float (&kr)[RPL], const float* ks, float decay, int r) {
    static_assert(RPL % 4 == 0, "gdn_step: whole row groups of float4s");
    const float4* k4 = (const float4*)(ks + RPL * r);
#pragma unroll
    for (int i = 0; i < RPL / 4; i++) {
        const float4 v4 = k4[i];
        kr[4 * i] = v4.x; kr[4 * i + 1] = v4.y; kr[4 * i + 2] = v4.z; kr[4 * i + 3] = v4.w;
    }
    // Four partial sums: a chain of 32 dependent FMAs per token was the step's latency.
    float kp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < RPL; i++) {
        s[i] *= decay;
        kp[i & 3] += s[i] * kr[i];
    }
    return sum4(kp[0], kp[1], kp[2], kp[3]);
}

template <int RPL>
__device__ __forceinline__ float gdn_opart(float (&s)[RPL], const float (&kr)[RPL], const float* qs, float delta, int r) {
    const float scale = 1.0f / sqrtf((float)DK);
    const float4* q4 = (const float4*)(qs + RPL * r);
    float op[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < RPL / 4; i++) {
        const float4 q = q4[i];
        const float qv[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int u = 0; u < 4; u++) {
            s[4 * i + u] += kr[4 * i + u] * delta;
            op[u] += s[4 * i + u] * (qv[u] * scale);
        }
    }
    return sum4(op[0], op[1], op[2], op[3]);
}

// The token with the row groups of a column in one warp (C columns of R row groups), reduced
// by shuffles: every lane of the column gets the output.
template <int RPL>
__device__ __forceinline__ float gdn_token(float (&s)[RPL], const float* qs, const float* ks, float v,
                                           float2 gates, int r) {
    constexpr int R = DK / RPL, C = 32 / R;
    static_assert(R * C == 32, "gdn_step: whole row groups in a warp");
    float kr[RPL];
    float km = gdn_kpart<RPL>(s, kr, ks, gates.x, r);
#pragma unroll
    for (int m = C; m < 32; m <<= 1) km += __shfl_xor_sync(0xffffffffu, km, m);
    float oo = gdn_opart<RPL>(s, kr, qs, (v - km) * gates.y, r);
#pragma unroll
    for (int m = C; m < 32; m <<= 1) oo += __shfl_xor_sync(0xffffffffu, oo, m);
    return oo;
}

// The recurrent step, RPL key rows of a value column per lane (a variant per RPL: 32, 16, 8).
// grid (HV, DV / (4·C)), block (32, 4), with R = DK / RPL row groups and C = 32 / R columns per
// warp: warp w of block (h, by) owns value columns 4C·by + Cw .. +C−1 of head h; lane (r, c) =
// (lane / C, lane % C) keeps the state of column 4C·by + Cw + c for key rows RPL·r .. +RPL−1
// in registers across the tokens. Every reduction over the key rows stays inside a warp
// (log2 R shuffles), and each warp normalizes q and k itself, so a token needs no block
// barrier: the tokens of a prefill pass are a chain, and barriers were most of each link.
// Fewer rows per lane make more warps (768 at RPL 32 for 48 heads of 128×128): more of each
// link's latency hidden, for more shuffles per token. The next token's inputs are loaded while
// the current one is processed. With
// `qk` and `gb` (from gdn_prep, multi-token passes) the normalized q, k and the gates are read
// rather than computed, which takes the norms' reductions and the gates' exponentials out of
// the chain from token to token (same values, same bits).
// S: two buffers of [HV][DK][DV] (ssm_read); o: [ntok][HV*DV].
static_assert(DK == 128 && DV % 32 == 0, "gdn_step: 128 key rows, blocks of up to 32 columns");
template <int RPL>
__device__ __forceinline__ void gdn_step_body(const float* __restrict__ conv, const float* __restrict__ proj,
                                              int stride, int aoff, int boff, int ntok,
                                              const float* __restrict__ a_neg, const float* __restrict__ dt_bias,
                                              const float* __restrict__ qk, const float2* __restrict__ gb,
                                              const u32* __restrict__ pos, float* __restrict__ S,
                                              float* __restrict__ o) {
    constexpr int R = DK / RPL, C = 32 / R;
    // Per warp: normalized q and k. A quarter-warp's lanes read 16 bytes at row groups RPL·4
    // bytes apart (≥ 32): distinct banks, or one broadcast address per group.
    __shared__ __align__(16) float qks[4][2][DK];
    const int h = blockIdx.x, kh = h % HK;
    const int lane = threadIdx.x, w = threadIdx.y;
    const int r = lane / C;
    const int j = blockIdx.y * 4 * C + w * C + lane % C;
    float* qs = qks[w][0];
    float* ks = qks[w][1];
    const u32 p = *pos;
    const float* Sh = ssm_read(S, p) + (size_t)h * DK * DV;
    float s[RPL];
#pragma unroll
    for (int i = 0; i < RPL; i++) s[i] = Sh[(size_t)(r * RPL + i) * DV + j];
    // The state (and the position) are read before waiting for the previous kernel, so their
    // latency overlaps that kernel's tail: only this layer's step (this kernel or gdn_decode)
    // writes the state, once per pass, and a pass starts after the previous one has finished
    // (passes follow each other on one stream, each a graph or launched without programmatic
    // dependent launch).
    PDL_ENTRY();
    const float an = a_neg[h], dtb = dt_bias[h];
    // q and k elements lane + 32m (normalized when prepared), the value of column j, the gate
    // inputs (or the gates).
    const bool prepped = qk != nullptr;
    auto load = [&](int t, float* in) {
        const float* x = conv + (size_t)t * CH;
        const float* src = prepped ? qk + (size_t)t * 2 * HK * DK : x;
#pragma unroll
        for (int m = 0; m < 4; m++) {
            in[m] = src[kh * DK + 32 * m + lane];
            in[4 + m] = src[HK * DK + kh * DK + 32 * m + lane];
        }
        in[8] = x[2 * HK * DK + h * DV + j];
        if (prepped) {
            const float2 e = gb[(size_t)t * HV + h];
            in[9] = e.x;
            in[10] = e.y;
        } else {
            in[9] = proj[(size_t)t * stride + aoff + h];
            in[10] = proj[(size_t)t * stride + boff + h];
        }
    };
    float next[11];
    if (ntok > 0) load(0, next);
    for (int t = 0; t < ntok; t++) {
        float cur[11];
#pragma unroll
        for (int e = 0; e < 11; e++) cur[e] = next[e];
        if (t + 1 < ntok) load(t + 1, next);
        const float2 gates = gdn_stage(cur, prepped, an, dtb, qs, ks);
        const float oo = gdn_token<RPL>(s, qs, ks, cur[8], gates, r);
        if (r == 0) o[(size_t)t * HV * DV + h * DV + j] = oo;
    }
    float* Sw = ssm_write(S, p, ntok) + (size_t)h * DK * DV;
#pragma unroll
    for (int i = 0; i < RPL; i++) Sw[(size_t)(r * RPL + i) * DV + j] = s[i];
}

#define GDN_STEP_KERNEL(name, RPL)                                                                         \
    ENTRY __global__ void __launch_bounds__(128)                                                       \
        name(const float* __restrict__ conv, const float* __restrict__ proj, int stride, int aoff, int boff, \
             int ntok, const float* __restrict__ a_neg, const float* __restrict__ dt_bias,                   \
             const float* __restrict__ qk, const float2* __restrict__ gb, const u32* __restrict__ pos,        \
             float* __restrict__ S, float* __restrict__ o) {                                                 \
        gdn_step_body<RPL>(conv, proj, stride, aoff, boff, ntok, a_neg, dt_bias, qk, gb, pos, S, o);        \
    }

GDN_STEP_KERNEL(gdn_step_r32, 32)
GDN_STEP_KERNEL(gdn_step_r16, 16)
GDN_STEP_KERNEL(gdn_step_r8, 8)

// A decode step's whole recurrence of value head h in one block: the causal conv of the head's
// q, k and v channels (gdn_conv's arithmetic), the step (gdn_step_r32's arithmetic, each of 16
// warps holding 32 key rows of 32 columns, the sums over the four row groups taken through
// shared memory), then quant_gated's norm, gate and quantization of the head — the three
// kernels' bits in one launch (each launch of a decode token's chain of dependent kernels costs
// microseconds). grid HV, block (32, 16).
// The conv state is double-buffered by the parity of the position (`pos`): the HV / HK value
// heads of a key head, in different blocks, all read its q and k state, which one of them
// rewrites, so a one-token pass reads buffer pos & 1 and writes the other (gdn_conv reads
// buffer pos & 1 and writes buffer (pos + ntok) & 1).
// The step keeps 32 key rows per lane, as gdn_step_r32, the one-token passes' step without
// this kernel (plan::GDN_STEP_DECODE_ROWS, asserted there): the two paths give the same bits.
static_assert(DV == 128 && DK == 128, "gdn_decode: 16 warps of 32 columns' 32 rows cover a head");
__device__ __forceinline__ void gdn_decode_body(const float* __restrict__ proj, int aoff, int boff, int zoff,
        const u32* __restrict__ pos, float* __restrict__ conv_state, const float* __restrict__ taps,
        const float* __restrict__ a_neg, const float* __restrict__ dt_bias, float* __restrict__ S,
        const float* __restrict__ nw, float eps, int* __restrict__ xq, float2* __restrict__ xs,
        u16* __restrict__ xh, u32* __restrict__ xp) {
    constexpr int RPL = 32, R = DK / RPL;
    __shared__ __align__(16) float qks[16][2][DK];
    // The conv's outputs: q and k of key head kh, then v of head h.
    __shared__ __align__(16) float xin[2 * DK + DV];
    // Each row group's share of k·S and of the output, per column.
    __shared__ __align__(16) float kred[R][DV], ored[R][DV];
    const int h = blockIdx.x, kh = h % HK;
    const int lane = threadIdx.x, w = threadIdx.y, tid = 32 * w + lane;
    // Warp w holds rows 32·(w / 4).. of columns 32·(w % 4).. (a lane a column), so that each of
    // its state loads and stores is one whole 128-byte line, where a warp of 8 columns' 4 row
    // groups wrote four lines a store: Q2_0 decode 335.5 → 337.9 tok/s, Q1_0 level (460.0
    // against 458.5 with both changes; one H200 call).
    const int r = w / (DV / 32), j = 32 * (w % (DV / 32)) + lane;
    const u32 p = *pos;
    const float* Sh = ssm_read(S, p) + (size_t)h * DK * DV;
    float s[RPL];
#pragma unroll
    for (int i = 0; i < RPL; i++) s[i] = Sh[(size_t)(r * RPL + i) * DV + j];
    // This thread's conv channel: q, k of key head kh, v of value head h.
    const bool conv_live = tid < 2 * DK + DV;
    const int c = tid < DK ? kh * DK + tid
                  : tid < 2 * DK ? HK * DK + kh * DK + tid - DK
                                 : 2 * HK * DK + h * DV + tid - 2 * DK;
    const float* old = conv_state + (size_t)(p & 1u) * (KERN - 1) * CH;
    float* fresh = conv_state + (size_t)((p + 1u) & 1u) * (KERN - 1) * CH;
    float cs[KERN - 1], cw[KERN];
#pragma unroll
    for (int i = 0; i < KERN - 1; i++) cs[i] = conv_live ? old[i * CH + c] : 0.0f;
#pragma unroll
    for (int i = 0; i < KERN; i++) cw[i] = conv_live ? taps[c * KERN + i] : 0.0f;
    const float an = a_neg[h], dtb = dt_bias[h];
    const float4 g = w == 0 ? *(const float4*)(nw + lane * 4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // The state, the conv state and the position are written by this layer's previous pass
    // (or the host, before the pass): read before waiting for the previous kernel.
    TRACE_ENTRY();
    // Everything this block reads of the projection, requested at once: the gate inputs and z
    // wait in registers through the conv and the step.
    const float ga = proj[aoff + h], gb = proj[boff + h];
    const float4 z = w == 0 ? *(const float4*)(proj + zoff + h * DV + lane * 4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (conv_live) {
        const float x = proj[c];
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < KERN - 1; i++) acc += cw[i] * cs[i];
        acc += cw[KERN - 1] * x;
        xin[tid] = siluf_(acc);
        // Every value head of a key head computes its q and k from the same state; one writer
        // per channel (the first of them) keeps the new state's bytes single-sourced.
        if (tid >= 2 * DK || h < HK) {
#pragma unroll
            for (int i = 0; i < KERN - 1; i++) fresh[i * CH + c] = i + 1 < KERN - 1 ? cs[i + 1] : x;
        }
    }
    __syncthreads();
    if (tid == 0) TRACE_MARK_FIRST(0);
#ifdef NIWAKI_TRACE
    {
        // When the last warp holds its state (requested before the wait), past the conv's
        // barrier: mark 5, a use of every register's value standing for the step's first. The
        // comparison keeps the sum; its store, never taken in practice, goes to mark 4, which
        // is set only after two more barriers, where one to mark 5 could undo another warp's.
        float any = 0.0f;
#pragma unroll
        for (int i = 0; i < RPL; i++) any += s[i];
        if (any == 1.25e-37f) niwaki_trace_mk[4] = 1;
        TRACE_MARK_LAST(5);
    }
#endif
    float cur[11];
#pragma unroll
    for (int m = 0; m < 4; m++) {
        cur[m] = xin[32 * m + lane];
        cur[4 + m] = xin[DK + 32 * m + lane];
    }
    cur[8] = xin[2 * DK + j];
    cur[9] = ga;
    cur[10] = gb;
    const float2 gates = gdn_stage(cur, false, an, dtb, qks[w][0], qks[w][1]);
    // gdn_token's arithmetic with its reductions over the row groups through shared memory:
    // the same sums in the same order (sum4).
    float kr[RPL];
    kred[r][j] = gdn_kpart<RPL>(s, kr, qks[w][1], gates.x, r);
    __syncthreads();
    const float km = sum4(kred[0][j], kred[1][j], kred[2][j], kred[3][j]);
    ored[r][j] = gdn_opart<RPL>(s, kr, qks[w][0], (cur[8] - km) * gates.y, r);
    TRACE_MARK_LAST(3);
    __syncthreads();
    if (tid == 0) TRACE_MARK_FIRST(1);
    // The head's output first, its new state after: the other fifteen warps store their state
    // while warp 0 norms and quantizes the output (1.2 µs, traced on the H200), and warp 0 stores
    // its own after, where the output waited for every store to issue (1.1 µs in the earlier
    // layout of four lines a store). Q2_0 decode 332.6 → 335.5 tok/s for the order alone.
    if (w == 0) {
        const int base = h * DV;
        float4 o[R];
#pragma unroll
        for (int q = 0; q < R; q++) o[q] = *(const float4*)(&ored[q][lane * 4]);
        const float4 oo = make_float4(sum4(o[0].x, o[1].x, o[2].x, o[3].x), sum4(o[0].y, o[1].y, o[2].y, o[3].y),
                                      sum4(o[0].z, o[1].z, o[2].z, o[3].z), sum4(o[0].w, o[1].w, o[2].w, o[3].w));
        const float4 v = gated_norm(oo, z, g, eps);
        quant128(v, base, xq, xs, xh, xp);
        TRACE_MARK_LAST(2);
    }
    float* Sw = ssm_write(S, p, 1) + (size_t)h * DK * DV;
#pragma unroll
    for (int i = 0; i < RPL; i++) Sw[(size_t)(r * RPL + i) * DV + j] = s[i];
    TRACE_MARK_LAST(4);
#ifdef NIWAKI_TRACE
    // The record's end is the block's: every warp's stores issued.
    __syncthreads();
    if (tid == 0) TRACE_EXIT(TRACE_GDN, S);
#endif
}

// Without plane words, and with them (`_p`: quant128's `xp_tok`, for 1-bit models): the first is
// the kernel the 2-bit models run, the null pointer compiling the words out.
ENTRY __global__ void __launch_bounds__(512) gdn_decode(const float* __restrict__ proj, int aoff, int boff,
        int zoff, const u32* __restrict__ pos, float* __restrict__ conv_state, const float* __restrict__ taps,
        const float* __restrict__ a_neg, const float* __restrict__ dt_bias, float* __restrict__ S,
        const float* __restrict__ nw, float eps, int* __restrict__ xq, float2* __restrict__ xs,
        u16* __restrict__ xh) {
    gdn_decode_body(proj, aoff, boff, zoff, pos, conv_state, taps, a_neg, dt_bias, S, nw, eps, xq, xs, xh, nullptr);
}
ENTRY __global__ void __launch_bounds__(512) gdn_decode_p(const float* __restrict__ proj, int aoff, int boff,
        int zoff, const u32* __restrict__ pos, float* __restrict__ conv_state, const float* __restrict__ taps,
        const float* __restrict__ a_neg, const float* __restrict__ dt_bias, float* __restrict__ S,
        const float* __restrict__ nw, float eps, int* __restrict__ xq, float2* __restrict__ xs,
        u16* __restrict__ xh, u32* __restrict__ xp) {
    gdn_decode_body(proj, aoff, boff, zoff, pos, conv_state, taps, a_neg, dt_bias, S, nw, eps, xq, xs, xh, xp);
}
