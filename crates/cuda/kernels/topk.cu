// The k most likely next tokens of a logits row, for sampling with a top-k limit on the GPU: only
// k (value, id) keys come back to the host instead of the vocabulary's row, and the host draws
// from them exactly as from the whole row (the candidates and their scaled logits are the same
// bits). A pass sorts chunks of TOPK_CHUNK keys in shared memory, one block each, and keeps each
// chunk's best k; passes repeat (plan::topk_passes) until one chunk is left.
//
// Key of logit v with temperature t: the bits of x = v / t (IEEE division, as the host's) mapped
// so that unsigned order is value order, above the complement of the id, so that equal values
// rank the lower id first; the larger key is the better candidate. Non-finite logits get key 0,
// below every real key: the sampler skips them. Whether one is ±∞ comes back after the k keys
// (the host then samples from the whole row, whose rule for an infinite logit differs).

#define TOPK_CHUNK 2048
#define TOPK_THREADS 1024

__device__ __forceinline__ u64 topk_key(float v, float t, u32 id) {
    if (!isfinite(v)) return 0;
    u32 b = __float_as_uint(__fdiv_rn(v, t));
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)b << 32) | (u64)(~id);
}

// Sorts TOPK_CHUNK keys in `s` into descending order (bitonic network; every thread of a block
// of TOPK_THREADS takes one compare-exchange per step).
__device__ __forceinline__ void topk_sort(u64* s) {
    const int tid = threadIdx.x;
    for (int size = 2; size <= TOPK_CHUNK; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            const int lo = 2 * tid - (tid & (stride - 1));
            const int hi = lo + stride;
            const bool desc = (lo & size) == 0;
            const u64 a = s[lo], b = s[hi];
            if ((a < b) == desc) {
                s[lo] = b;
                s[hi] = a;
            }
        }
    }
    __syncthreads();
}

// The chunk's best k keys to out[blockIdx.x · k ..], best first (0 where the chunk has fewer).
__device__ __forceinline__ void topk_keep(const u64* s, int k, u64* __restrict__ out) {
    for (int i = threadIdx.x; i < k; i += TOPK_THREADS) out[(size_t)blockIdx.x * k + i] = s[i];
}

// Inputs that earlier kernels write are not `const __restrict__` here: loads through such a
// pointer take the non-coherent path, whose contract is data that does not change while the
// kernel runs, and a predecessor still running under programmatic launch breaks it. (The first
// run of the weight sums launched that way read the previous selection's best key, although the
// PTX loads it after the wait; the host now launches these kernels plainly stream-ordered too.)

// First pass, over the logits row. Its one block, when it is the only pass, writes whether the
// row holds ±∞ after the k keys; otherwise each block that saw one sets `flag`, which the last
// pass reports and clears (it is zero between selections).
ENTRY __global__ void __launch_bounds__(TOPK_THREADS) topk_logits(const float* logits, int n,
                                                                       float t, int k, u64* __restrict__ out,
                                                                       u32* __restrict__ flag) {
    __shared__ u64 s[TOPK_CHUNK];
    PDL_ENTRY();
    const int base = blockIdx.x * TOPK_CHUNK;
    bool inf = false;
    for (int i = threadIdx.x; i < TOPK_CHUNK; i += TOPK_THREADS) {
        const int id = base + i;
        u64 key = 0;
        if (id < n) {
            const float v = logits[id];
            inf |= isinf(v);
            key = topk_key(v, t, (u32)id);
        }
        s[i] = key;
    }
    inf = __syncthreads_or(inf);
    if (threadIdx.x == 0) {
        if (gridDim.x == 1) out[k] = inf;
        else if (inf) atomicOr(flag, 1u);
    }
    topk_sort(s);
    topk_keep(s, k, out);
}

// Later passes, over the previous pass's kept keys; the last (one block) reports the flag.
ENTRY __global__ void __launch_bounds__(TOPK_THREADS) topk_keys(const u64* in, int n, int k,
                                                                     u64* __restrict__ out, u32* __restrict__ flag) {
    __shared__ u64 s[TOPK_CHUNK];
    PDL_ENTRY();
    const int base = blockIdx.x * TOPK_CHUNK;
    for (int i = threadIdx.x; i < TOPK_CHUNK; i += TOPK_THREADS) s[i] = base + i < n ? in[base + i] : 0;
    if (gridDim.x == 1 && threadIdx.x == 0) {
        out[k] = *flag;
        *flag = 0;
    }
    topk_sort(s);
    topk_keep(s, k, out);
}

// The sampling weight exp(d), d ≤ 0, as model::rank::exp_weight computes it: the same operations
// in the same order, none fused (the intrinsics are never contracted), so the same bits.
__device__ __forceinline__ float exp_weight(float d) {
    const float log2e = __int_as_float(0x3fb8aa3b), ln2_hi = __int_as_float(0x3f317200),
                ln2_lo = __int_as_float(0x35bfbe8e), magic = __int_as_float(0x4b400000);
    const float c6 = __int_as_float(0x3e2aaaab), c24 = __int_as_float(0x3d2aaaab),
                c120 = __int_as_float(0x3c088889), c720 = __int_as_float(0x3ab60b61);
    const float z = __fadd_rn(__fmul_rn(d, log2e), magic);
    const float kf = __fsub_rn(z, magic);
    const int k = __float_as_int(z) - __float_as_int(magic);
    const float r = __fsub_rn(__fsub_rn(d, __fmul_rn(kf, ln2_hi)), __fmul_rn(kf, ln2_lo));
    float p = __fmul_rn(r, c720);
    p = __fmul_rn(r, __fadd_rn(c120, p));
    p = __fmul_rn(r, __fadd_rn(c24, p));
    p = __fmul_rn(r, __fadd_rn(c6, p));
    p = __fmul_rn(r, __fadd_rn(0.5f, p));
    p = __fmul_rn(r, __fadd_rn(1.0f, p));
    p = __fadd_rn(1.0f, p);
    const float scale = __int_as_float((int)((((u32)(k + 127)) & 0xffu) << 23));
    return d > __int_as_float(0xc2ae999a) ? __fmul_rn(p, scale) : 0.0f;
}

#define WEIGHT_LANES 16
#define WEIGHT_CHUNK 1024
#define WEIGHT_CHUNKS_PER_BLOCK 16

// The sums of model::rank::weight_sums, first per chunk of WEIGHT_CHUNK logits: one thread per
// lane and chunk sums its lane in id order, then the chunk's first lane adds the lanes first to
// last. `best` is the selection's best key (the largest scaled logit).
ENTRY __global__ void __launch_bounds__(WEIGHT_LANES * WEIGHT_CHUNKS_PER_BLOCK)
    weight_chunks(const float* logits, int n, float t, float floor, const u64* best, float2* __restrict__ chunk_sums) {
    __shared__ float2 lanes[WEIGHT_CHUNKS_PER_BLOCK][WEIGHT_LANES];
    PDL_ENTRY();
    const u32 b = (u32)(*(const volatile u64*)best >> 32);
    const float max = __int_as_float((int)((b & 0x80000000u) ? (b & 0x7fffffffu) : ~b));
    const int cb = threadIdx.x / WEIGHT_LANES, j = threadIdx.x % WEIGHT_LANES;
    const int c = blockIdx.x * WEIGHT_CHUNKS_PER_BLOCK + cb;
    float lt = 0.0f, lk = 0.0f;
    for (int m = 0; m < WEIGHT_CHUNK / WEIGHT_LANES; m++) {
        const int i = c * WEIGHT_CHUNK + j + m * WEIGHT_LANES;
        if (i < n) {
            const float v = logits[i];
            float w = exp_weight(__fsub_rn(__fdiv_rn(v, t), max));
            w = isfinite(v) ? w : 0.0f;
            lt = __fadd_rn(lt, w);
            lk = __fadd_rn(lk, w >= floor ? w : 0.0f);
        }
    }
    lanes[cb][j] = make_float2(lt, lk);
    __syncthreads();
    if (j == 0 && c * WEIGHT_CHUNK < n) {
        float2 s = make_float2(0.0f, 0.0f);
        for (int l = 0; l < WEIGHT_LANES; l++) {
            s.x = __fadd_rn(s.x, lanes[cb][l].x);
            s.y = __fadd_rn(s.y, lanes[cb][l].y);
        }
        chunk_sums[c] = s;
    }
}

// Then the chunks' sums, first to last, by one thread, into `out` (total, kept).
ENTRY __global__ void weight_total(const float2* chunk_sums, int chunks, float2* __restrict__ out) {
    PDL_ENTRY();
    if (threadIdx.x != 0) return;
    float2 s = make_float2(0.0f, 0.0f);
    for (int c = 0; c < chunks; c++) {
        s.x = __fadd_rn(s.x, chunk_sums[c].x);
        s.y = __fadd_rn(s.y, chunk_sums[c].y);
    }
    *out = s;
}
