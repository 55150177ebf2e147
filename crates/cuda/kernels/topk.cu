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

// First pass, over the logits row. Its one block, when it is the only pass, writes whether the
// row holds ±∞ after the k keys; otherwise each block that saw one sets `flag`, which the last
// pass reports and clears (it is zero between selections).
extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_logits(const float* __restrict__ logits, int n,
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
extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_keys(const u64* __restrict__ in, int n, int k,
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
