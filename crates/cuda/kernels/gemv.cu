// Packed-weight GEMV with int8 activations and dp4a, for up to NT tokens per weight read.
//
// Layouts (see repack.rs): a chunk is 16 bytes = 4 words. 1-bit: word w holds values
// 32w+4k+b at bit 8b+k (128 values). 2-bit: word w holds the code of value 16w+4k+b at bits
// 8b+2k (64 values). Activations: int8 (as int words) and (d, d*sum q) per 64 values.

#define GEMV_R 4

#define FMT_Q1 0
#define FMT_Q2G64 1
#define FMT_Q2G128 2

// A decode GEMV's fold writes plane words (FoldOut::xp) in the 1-bit kernels alone, which take
// their address after the fold's other arguments; the 2-bit kernels (whose models read none)
// keep the parameter list they had without it. FOLD_XP_PARAM(FMT): that parameter or nothing;
// FOLD_XP_ARG(FMT): it or a null pointer.
#define FOLD_XP_PARAM(FMT) FOLD_XP_PARAM_I(FMT)
#define FOLD_XP_PARAM_I(FMT) FOLD_XP_PARAM_##FMT
#define FOLD_XP_PARAM_0 , u32* __restrict__ fold_xp
#define FOLD_XP_PARAM_1
#define FOLD_XP_PARAM_2
#define FOLD_XP_ARG(FMT) FOLD_XP_ARG_I(FMT)
#define FOLD_XP_ARG_I(FMT) FOLD_XP_ARG_##FMT
#define FOLD_XP_ARG_0 fold_xp
#define FOLD_XP_ARG_1 nullptr
#define FOLD_XP_ARG_2 nullptr

// dp4a of unsigned weight bytes with signed activation bytes.
__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ u32 word_of(const uint4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

template <int FMT>
__device__ __forceinline__ void load_rows(const uint4* __restrict__ codes, const u16* __restrict__ scales,
                                          int rows, int chunks, int r0, int c, uint4* w, float* d) {
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) {
        const int row = min(r0 + r, rows - 1);
        w[r] = ld_stream(codes + (size_t)row * chunks + c);
        const size_t si = FMT == FMT_Q2G128 ? (size_t)row * (chunks / 2) + c / 2
                                            : (size_t)row * chunks + c;
        d[r] = h2f(__ldg(scales + si));
    }
}

// One row's chunk against the activations of that chunk: the packed codes `w`, the weight
// scale `d`, the activation words `xw` and the (d, d*sum q) pairs of the chunk's 64-value groups.
template <int FMT>
__device__ __forceinline__ float row_dot(const uint4& w, float d, const int* xw, float2 s0, float2 s1) {
    if (FMT == FMT_Q1) {
        // Bit k of each byte masked in place is 2^k times the bit: one accumulator per k, each a
        // multiple of 2^k, shifted back exactly once per chunk (no shift per dp4a).
        int b0[8], b1[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const u32 m = 0x01010101u << k;
            b0[k] = dp4a_us(w.x & m, xw[k], 0);
            b0[k] = dp4a_us(w.y & m, xw[8 + k], b0[k]);
            b1[k] = dp4a_us(w.z & m, xw[16 + k], 0);
            b1[k] = dp4a_us(w.w & m, xw[24 + k], b1[k]);
        }
        int a0 = 0, a1 = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            a0 += b0[k] >> k;
            a1 += b1[k] >> k;
        }
        return d * (2.0f * (s0.x * (float)a0 + s1.x * (float)a1) - (s0.y + s1.y));
    } else {
        // Code field k masked in place is 4^k times the code: one accumulator per k.
        int b[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 wj = word_of(w, j);
#pragma unroll
            for (int k = 0; k < 4; k++) b[k] = dp4a_us(wj & (0x03030303u << (2 * k)), xw[4 * j + k], b[k]);
        }
        const int a = b[0] + (b[1] >> 2) + (b[2] >> 4) + (b[3] >> 6);
        return d * (s0.x * (float)a - s0.y);
    }
}

template <int FMT, int NT>
__device__ __forceinline__ void dot_chunk(const uint4* w, const float* d, int c, const int* __restrict__ xq,
                                          const float2* __restrict__ xs, int xwords, int groups, int ntok,
                                          float (*acc)[NT]) {
    constexpr int P = FMT == FMT_Q1 ? 8 : 4;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < ntok) {
            const int4* xp = (const int4*)(xq + (size_t)t * xwords);
            int xw[4 * P];
#pragma unroll
            for (int i = 0; i < P; i++) {
                int4 v = __ldg(xp + c * P + i);
                xw[4 * i] = v.x; xw[4 * i + 1] = v.y; xw[4 * i + 2] = v.z; xw[4 * i + 3] = v.w;
            }
            const float2 s0 = __ldg(xs + (size_t)t * groups + (FMT == FMT_Q1 ? 2 * c : c));
            const float2 s1 = FMT == FMT_Q1 ? __ldg(xs + (size_t)t * groups + 2 * c + 1) : s0;
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) acc[r][t] += row_dot<FMT>(w[r], d[r], xw, s0, s1);
        }
    }
}

// Each warp owns groups of GEMV_R rows (grid-stride), its lanes take every 32nd chunk, and the
// next chunk's weights are loaded before the current one is multiplied. One warp reduces each
// row, in a fixed order: results are deterministic.
template <int FMT, int NT>
__device__ __forceinline__ void gemv_body(const uint4* __restrict__ codes,
                                          const u16* __restrict__ scales, int rows, int cols,
                                          const int* __restrict__ xq, const float2* __restrict__ xs,
                                          int ntok, float* __restrict__ out, int out_stride,
                                          int accumulate, u64* __restrict__ amax) {
    PDL_ENTRY();
    const int lane = threadIdx.x & 31;
    const int wpb = blockDim.x >> 5;
    const int cv = FMT == FMT_Q1 ? 128 : 64;
    const int chunks = cols / cv;
    const int groups = cols / 64;
    const int xwords = cols / 4;
    const int nrg = (rows + GEMV_R - 1) / GEMV_R;
    u64 best = 0;
    for (int rg = blockIdx.x * wpb + (threadIdx.x >> 5); rg < nrg; rg += gridDim.x * wpb) {
        const int r0 = rg * GEMV_R;
        float acc[GEMV_R][NT];
#pragma unroll
        for (int r = 0; r < GEMV_R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
        uint4 w[GEMV_R];
        float d[GEMV_R];
        int c = lane;
        if (c < chunks) load_rows<FMT>(codes, scales, rows, chunks, r0, c, w, d);
        while (c < chunks) {
            const int cn = c + 32;
            uint4 wn[GEMV_R];
            float dn[GEMV_R];
            if (cn < chunks) load_rows<FMT>(codes, scales, rows, chunks, r0, cn, wn, dn);
            dot_chunk<FMT, NT>(w, d, c, xq, xs, xwords, groups, ntok, acc);
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) { w[r] = wn[r]; d[r] = dn[r]; }
            c = cn;
        }
#pragma unroll
        for (int r = 0; r < GEMV_R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float v0 = warp_sum(acc[r][t]);
                const int row = r0 + r;
                if (lane == 0 && row < rows && t < ntok) {
                    float* o = out + (size_t)t * out_stride + row;
                    const float v = accumulate ? v0 + *o : v0;
                    *o = v;
                    // One token (decode): one atomic per warp at the end, since per-row atomics
                    // on one address serialize. Several tokens (never with an argmax in
                    // practice): per row, to keep the registers the prefill kernels need.
                    if (NT == 1) best = max(best, argmax_key(v, (u32)row));
                    else if (amax) atomicMax(amax + t, argmax_key(v, (u32)row));
                }
            }
    }
    if (NT == 1 && amax && lane == 0 && best) atomicMax(amax, best);
}

#define GEMV_KERNEL(name, FMT, NT)                                                              \
    ENTRY __global__ void __launch_bounds__(256, 2)                                          \
        name(const uint4* __restrict__ codes, const u16* __restrict__ scales, int rows, int cols, \
             const int* __restrict__ xq, const float2* __restrict__ xs, int ntok,              \
             float* __restrict__ out, int out_stride, int accumulate, u64* __restrict__ amax) { \
        gemv_body<FMT, NT>(codes, scales, rows, cols, xq, xs, ntok, out, out_stride, accumulate, \
                           amax);                                                              \
    }

GEMV_KERNEL(gemv_q1_t1, FMT_Q1, 1)
GEMV_KERNEL(gemv_q1_t8, FMT_Q1, 8)
GEMV_KERNEL(gemv_q2g64_t1, FMT_Q2G64, 1)
GEMV_KERNEL(gemv_q2g64_t8, FMT_Q2G64, 8)
GEMV_KERNEL(gemv_q2g128_t1, FMT_Q2G128, 1)
GEMV_KERNEL(gemv_q2g128_t8, FMT_Q2G128, 8)

// Decode GEMV (one token), sm_90. The t1 kernel above keeps only one 16-byte load per row in
// flight per lane, too few bytes to cover memory latency on the 12-50 MB matrices of a decode
// step; its issue loop also stalls on every load. Here the bulk-copy engine streams whole tiles
// of TR = 8·RW consecutive rows (their codes and scales are contiguous in the re-tiled layout)
// into a ring of `stages` shared-memory buffers, so several tiles are in flight while the warps
// multiply the current one. The first tiles are requested before pdl_wait(): weights do not
// depend on the previous kernel, so their latency hides behind it.
//
// Eight consumer warps and one producer warp: consumer warp w owns rows w·RW..w·RW+RW-1 of each
// tile, 32/RW lanes to a row striding over its chunks (a 5120-wide Q2_0 row is 80 chunks: five
// for each of 16 lanes, none idle), reduced over those lanes in a fixed order: results are
// deterministic. A warp done with a stage arrives on that stage's `empty` barrier; the producer
// refills a stage once all eight have, so no warp waits for the others at a block barrier (an
// earlier version synchronised the block after every tile: a third of its stall cycles).
//
// Shared memory: activations (int8), their (d, d*sum q) pairs, then the stages. Matrices are
// uploaded padded to whole tiles, so every copy is a full tile. The activations are staged in one
// of two layouts (SWZ):
// - piece-major (piece p of chunk c at p·chunks + c, so that lanes reading consecutive chunks hit
//   consecutive 16-byte words), by every thread's loads and stores and a block barrier;
// - the chunk-major row with the tensor map's 128-byte swizzle (swz128, from a 1 KiB boundary),
//   by two copies that one thread issues once the previous kernel is done (`xmap`). Reading it
//   costs one more instruction per 16 bytes, and the copy saves the staging's latency, which
//   Nsight Compute put at a fifth to a third of the decode GEMVs' warp samples (mostly waiting
//   on its global loads). So the host takes it where a block has few tiles to amortize the
//   staging over (plan::prefers_x_copy): on the H200, every dp4a GEMV swizzled measured Q1_0
//   (whose dp4a GEMVs are all of 5120 rows) 2-5% faster and Q2_0 3-5% slower; only the 5120-row
//   ones, Q1_0 4% faster and Q2_0 within ±1.3%.
//
// With `xres` set, the block RMS-normalizes row `tok0` of the residual stream and quantizes it
// itself (the same operations in the same order as quant_rms, so the same bits) while its first
// tiles are in flight: a decode step then needs no separate norm kernel before this GEMV. The
// quantized row goes through `lin` (cols bytes, before the stages) on its way to the layout.
// GEMV1_MAX_STAGES and GEMV1_WARPS come from the host's plan (plan/gemv/), which sizes the
// launches with them.
#if !defined(GEMV1_MAX_STAGES) || !defined(GEMV1_WARPS)
#error "GEMV1_MAX_STAGES and GEMV1_WARPS must be defined by the host"
#endif

// Chunk c's row dot given its activation words `xw`, with the (d, d*sum q) pairs of its groups
// from `ssm` (a 1-bit chunk spans two groups, read as one 16-byte load; a 2-bit chunk one).
template <int FMT>
__device__ __forceinline__ void chunk_pairs(const float2* ssm, int c, float2& s0, float2& s1) {
    if (FMT == FMT_Q1) {
        const float4 v = ((const float4*)ssm)[c];
        s0 = make_float2(v.x, v.y);
        s1 = make_float2(v.z, v.w);
    } else {
        s0 = ssm[c];
        s1 = s0;
    }
}

template <int FMT>
__device__ __forceinline__ float staged_dot(const uint4& w, float d, const int* xw, const float2* ssm, int c) {
    float2 s0, s1;
    chunk_pairs<FMT>(ssm, c, s0, s1);
    return row_dot<FMT>(w, d, xw, s0, s1);
}

// Where 16-byte piece `idx` of a chunk-major row (piece idx % P of chunk idx / P) goes in the
// piece-major layout: piece p of chunk c at p·chunks + c, so that lanes reading consecutive chunks
// hit consecutive 16-byte words.
template <int P>
__device__ __forceinline__ int piece_major_slot(int idx, int chunks) {
    const int c = idx / P, i = idx - c * P;
    return i * chunks + c;
}

// A row's int8 activations (`src`, chunk-major) into shared memory piece-major; threads `tid`
// of `nthreads` share the copy.
template <int P>
__device__ __forceinline__ void to_piece_major(uint4* xsm, const uint4* src, int chunks, int tid, int nthreads) {
    for (int idx = tid; idx < chunks * P; idx += nthreads) xsm[piece_major_slot<P>(idx, chunks)] = src[idx];
}

// The decode GEMV's staging: the row piece-major as to_piece_major puts it, and its `groups`
// (d, d*sum q) pairs into `ssm`. A thread's first STAGE_LOADS pieces and its pair are all
// loaded before any is stored: as a loop, the compiler waited for each load in turn (and for
// the pairs after the pieces), two or three round trips to L2 between the previous kernel's end
// and the block's barrier where one does.
template <int P>
__device__ __forceinline__ void stage_row(uint4* xsm, float2* ssm, const uint4* src, const float2* xs, int chunks,
                                          int groups, int tid, int nthreads) {
    constexpr int STAGE_LOADS = 4;
    const int n = chunks * P;
    uint4 v[STAGE_LOADS];
    const float2 pair = tid < groups ? xs[tid] : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < STAGE_LOADS; k++) {
        const int idx = tid + k * nthreads;
        if (idx < n) v[k] = src[idx];
    }
#pragma unroll
    for (int k = 0; k < STAGE_LOADS; k++) {
        const int idx = tid + k * nthreads;
        if (idx < n) xsm[piece_major_slot<P>(idx, chunks)] = v[k];
    }
    for (int idx = tid + STAGE_LOADS * nthreads; idx < n; idx += nthreads)
        xsm[piece_major_slot<P>(idx, chunks)] = src[idx];
    if (tid < groups) ssm[tid] = pair;
    for (int g = tid + nthreads; g < groups; g += nthreads) ssm[g] = xs[g];
}

// Chunk c of a row (codes `w`, scale `d`) against activations staged in shared memory piece-major
// (`xsm`: piece p of chunk c at p·chunks + c) with their group pairs `ssm`.
template <int FMT>
__device__ __forceinline__ void smem_x_words(const uint4* xsm, int chunks, int c, int* xw) {
    constexpr int P = (FMT == FMT_Q1 ? 128 : 64) / 16;
#pragma unroll
    for (int p = 0; p < P; p++) {
        const uint4 v = xsm[p * chunks + c];
        xw[4 * p] = (int)v.x; xw[4 * p + 1] = (int)v.y; xw[4 * p + 2] = (int)v.z; xw[4 * p + 3] = (int)v.w;
    }
}

template <int FMT>
__device__ __forceinline__ float smem_row_dot(const uint4* xsm, const float2* ssm, int chunks, int c,
                                              const uint4& w, float d) {
    int xw[4 * ((FMT == FMT_Q1 ? 128 : 64) / 16)];
    smem_x_words<FMT>(xsm, chunks, c, xw);
    return staged_dot<FMT>(w, d, xw, ssm, c);
}

// The other layout: the chunk-major row cut into 128-byte rows whose 16-byte units are permuted
// as the tensor map's 128-byte swizzle lands them (unit u of row r at u ^ (r & 7), counted from a
// 1 KiB boundary), so that lanes reading the same piece of consecutive chunks still hit distinct
// banks. swz128 maps a byte offset of the row to its place.
__device__ __forceinline__ u32 swz128(u32 o) { return o ^ (((o >> 7) & 7u) << 4); }

// The `pieces` 16-byte pieces of a row (chunk-major, at `src`) into `xb` in that swizzled layout
// (the fused norm's path), threads `tid` of `nthreads` sharing the copy.
__device__ __forceinline__ void to_swizzled(unsigned char* xb, const uint4* src, int pieces, int tid, int nthreads) {
    for (int i = tid; i < pieces; i += nthreads) *(uint4*)(xb + swz128((u32)i << 4)) = src[i];
}

// 16 bytes of shared memory at the 32-bit shared address `a`.
__device__ __forceinline__ uint4 lds128(u32 a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}

// Chunk c of a row (codes `w`, scale `d`) against the activations staged swizzled at shared
// address `xa` (1 KiB-aligned) with their group pairs `ssm`. A chunk's pieces share one 128-byte
// row (1-bit: the whole row; 2-bit: its half), so piece p sits at swz128(first byte) ^ 16p, the
// base adding no carry into those bits: one instruction per piece on top of the load.
template <int FMT>
__device__ __forceinline__ void swz_x_words(u32 xa, int c, int* xw) {
    constexpr int P = (FMT == FMT_Q1 ? 128 : 64) / 16;
    const u32 base = xa + swz128((u32)c * (16 * P));
#pragma unroll
    for (int p = 0; p < P; p++) {
        const uint4 v = lds128(base ^ (u32)(p << 4));
        xw[4 * p] = (int)v.x; xw[4 * p + 1] = (int)v.y; xw[4 * p + 2] = (int)v.z; xw[4 * p + 3] = (int)v.w;
    }
}

template <int FMT>
__device__ __forceinline__ float swz_row_dot(u32 xa, const float2* ssm, int c, const uint4& w, float d) {
    int xw[4 * ((FMT == FMT_Q1 ? 128 : 64) / 16)];
    swz_x_words<FMT>(xa, c, xw);
    return staged_dot<FMT>(w, d, xw, ssm, c);
}

#if __CUDA_ARCH__ >= 900
// The fused norm of the decode GEMVs: RMS-normalizes `row` (weights `nw`) and quantizes it into
// `lin` (int8, linear) and its group pairs `ssm`, with the same operations in the same order as
// quant_rms, so the same bits. The first GEMV1_WARPS warps sum as quant_rms's 256 threads do;
// the producer warp adds a zero last. Every thread of the block calls it.
__device__ __forceinline__ void norm_quant_row(const float* row, int cols, const float* __restrict__ nw,
                                               float eps, int* lin, float2* ssm, float* red) {
    constexpr int CT = GEMV1_WARPS * 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float ss = 0.0f;
    for (int i = tid * 4; tid < CT && i < cols; i += CT * 4) {
        const float4 v = *(const float4*)(row + i);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / (float)cols + eps);
    for (int base = warp * 128; base < cols; base += (blockDim.x >> 5) * 128) {
        const int i = base + lane * 4;
        float4 v = *(const float4*)(row + i);
        const float4 g = *(const float4*)(nw + i);
        v.x = v.x * scale * g.x; v.y = v.y * scale * g.y; v.z = v.z * scale * g.z; v.w = v.w * scale * g.w;
        quant128(v, base, lin, ssm, nullptr);
    }
}

// Asks the L2 cache to fetch this block's share of `bytes` at p (16-byte pieces; a tail under 16
// bytes is left out): the next GEMV's weights arrive while the kernels in between run.
__device__ __forceinline__ void prefetch_l2_share(const unsigned char* p, int bytes) {
    if (bytes <= 0) return;
    const u32 share = (((u32)bytes + gridDim.x - 1) / gridDim.x + 15) & ~15u;
    const u32 off = blockIdx.x * share;
    if (off >= (u32)bytes) return;
    const u32 n = min(share, (u32)bytes - off) & ~15u;
    if (n) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
}

// The copy ring of a decode GEMV: `stages` full barriers (one arrival: the copy's) and empty
// ones (one arrival per consumer warp). Thread 0 calls it before the block's first barrier.
__device__ __forceinline__ void ring_init(u64* full, u64* empty, int stages) {
    for (int s = 0; s < stages; s++) {
        mbar_init(smem_addr(&full[s]), 1);
        mbar_init(smem_addr(&empty[s]), GEMV1_WARPS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The producer (one thread) of that ring: refills each stage once every consumer warp is done
// with it (`issue(i)` copies tile i into stage i % stages), then, behind the block's own
// copies, asks the L2 cache for its share of the next GEMV's first bytes.
template <class Issue>
__device__ __forceinline__ void ring_produce(u64* empty, int stages, int mine, Issue issue,
                                             const unsigned char* pf_codes, int pf_code_bytes,
                                             const unsigned char* pf_scales, int pf_scale_bytes) {
    for (int i = stages; i < mine; i++) {
        const int s = i % stages;
        mbar_wait(smem_addr(&empty[s]), (u32)(i / stages - 1) & 1u);
        issue(i);
    }
    prefetch_l2_share(pf_codes, pf_code_bytes);
    prefetch_l2_share(pf_scales, pf_scale_bytes);
}

// One tile of a SHARE decode GEMV (gemv1_body): the warp's RW rows from `rt` (`row`: the first
// one's index in the matrix), every lane over chunks lane, lane + 32, … of each. Waits for the
// tile on `full` (parity `phase`), releases it on `empty` once the warp has read it, writes the
// rows (the product added to their earlier values where `accumulate`) and keeps the largest
// argmax key in `best`.
template <int FMT, int RW, bool DOT, bool SWZ>
__device__ __forceinline__ void shared_tile(const uint4* wc, const u16* ws, int chunks, int spr, int rt, int lane,
                                            int row, int rows, const uint4* xsm, u32 xa, const float2* ssm,
                                            float* __restrict__ out, int accumulate, float oscale, u32 full,
                                            u32 phase, u32 empty, u64& best) {
    float prev[RW], acc[RW];
#pragma unroll
    for (int r = 0; r < RW; r++) {
        prev[r] = accumulate && lane == 0 && row + r < rows ? out[row + r] : 0.0f;
        acc[r] = 0.0f;
    }
    mbar_wait(full, phase);
    if (threadIdx.x == 0) TRACE_MARK_FIRST(1);
    constexpr int P = (FMT == FMT_Q1 ? 128 : 64) / 16;
    // SHARE_UNROLL chunks a lane at a time in flight: a shared-lanes block is alone on its
    // multiprocessor (two warps a scheduler), so one chunk's shared-memory loads otherwise wait
    // with nothing else to issue. The sums keep their order: the same bits.
#if SHARE_UNROLL > 1
#pragma unroll SHARE_UNROLL
#endif
    for (int c = lane; DOT && c < chunks; c += 32) {
        int xw[4 * P];
        if (SWZ) swz_x_words<FMT>(xa, c, xw);
        else smem_x_words<FMT>(xsm, chunks, c, xw);
        float2 s0, s1;
        chunk_pairs<FMT>(ssm, c, s0, s1);
#pragma unroll
        for (int r = 0; r < RW; r++) {
            const uint4 w = wc[(size_t)(rt + r) * chunks + c];
            const float d = h2f(ws[(rt + r) * spr + (FMT == FMT_Q2G128 ? c >> 1 : c)]);
            acc[r] += row_dot<FMT>(w, d, xw, s0, s1);
        }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty);
#pragma unroll
    for (int r = 0; r < RW; r++) {
        float a = acc[r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0 && row + r < rows) {
            const float v = accumulate ? a * oscale + prev[r] : a * oscale;
            out[row + r] = v;
            best = max(best, argmax_key(v, (u32)(row + r)));
        }
    }
}

// DOT false: the consumers wait for each tile and release it without multiplying (a probe for
// the harness, separating the memory pipeline's time from the arithmetic's). SHARE: every lane
// of a warp takes its chunks of all the warp's RW rows, so that a chunk's activations, loaded
// from shared memory once, serve RW rows (without it, 32 / RW lanes to a row, each lane loading
// them for its one row: four 16-byte loads for a 2-bit chunk's one of weights). Each row's sum
// keeps the one-row order (lane l sums chunks l, l + 32, … and the warp adds its lanes as
// warp_sum does): the same bits.
template <int FMT, int RW, bool DOT, bool SWZ, bool SHARE>
__device__ __forceinline__ void gemv1_body(const unsigned char* __restrict__ codes,
                                           const unsigned char* __restrict__ scales, int rows,
                                           int cols, const uint4* __restrict__ xq,
                                           const float2* __restrict__ xs, float* __restrict__ out,
                                           int accumulate, u64* __restrict__ amax, int stages,
                                           const float* __restrict__ xres, int tok0,
                                           const float* __restrict__ nw, float eps,
                                           const unsigned char* __restrict__ pf_codes, int pf_code_bytes,
                                           const unsigned char* __restrict__ pf_scales, int pf_scale_bytes,
                                           int early, const TmaMap& xmap, const float* __restrict__ rms_in,
                                           float rms_eps, const FoldOut& fold) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) u64 bars[GEMV1_MAX_STAGES];
    __shared__ __align__(8) u64 empty[GEMV1_MAX_STAGES];
    __shared__ __align__(8) u64 xbar;
    __shared__ float red[32];
    constexpr int CV = FMT == FMT_Q1 ? 128 : 64;
    constexpr int SV = FMT == FMT_Q2G64 ? 64 : 128;
    constexpr int P = CV / 16;
    constexpr int L = SHARE ? 32 : 32 / RW;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tr = GEMV1_WARPS * RW;
    const int chunks = cols / CV, spr = cols / SV, groups = cols / 64;
    const u32 code_bytes = (u32)tr * chunks * 16, scale_bytes = (u32)tr * spr * 2;
    const u32 stage_bytes = (code_bytes + scale_bytes + 127) & ~127u;
    const int ntiles = (rows + tr - 1) / tr;
    const int mine = (int)blockIdx.x < ntiles ? (ntiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    // The swizzle counts from a 1 KiB boundary: the host adds the slack (plan::x_bytes).
    unsigned char* xb = SWZ ? smem + ((1024u - (smem_addr(smem) & 1023u)) & 1023u) : smem;
    uint4* xsm = (uint4*)xb;
    const int xrow = (cols + 127) & ~127;
    float2* ssm = (float2*)(xb + xrow);
    int* lin = (int*)(xb + xrow + ((8 * groups + 127) & ~127));
    unsigned char* stage0 = (unsigned char*)lin + (xres ? xrow : 0);

    auto issue = [&](int i) {
        const int s = i % stages;
        const size_t tile = (size_t)blockIdx.x + (size_t)i * gridDim.x;
        const u32 bar = smem_addr(&bars[s]);
        const u32 dst = smem_addr(stage0 + (size_t)s * stage_bytes);
        mbar_expect_tx(bar, code_bytes + scale_bytes);
        weights_g2s(dst, codes + tile * code_bytes, code_bytes, bar);
        weights_g2s(dst + code_bytes, scales + tile * scale_bytes, scale_bytes, bar);
    };

    const bool x_copy = SWZ && !xres;
    if (tid == 0) {
        mbar_init(smem_addr(&xbar), 1);
        ring_init(bars, empty, stages);
    }
    __syncthreads();
    // The ring's first tiles: `early` of them requested before the wait for the previous kernel
    // (weights depend on nothing), the rest once it has ended.
    const int first = min(stages, mine), before = min(first, early);
    if (tid == 0)
        for (int i = 0; i < before; i++) issue(i);
    if (warp == 1) fold_prefetch(fold, mine, tr);
    TRACE_ENTRY();
    if (tid == 0)
        for (int i = before; i < first; i++) issue(i);
    const float ss_part = rms_in ? rms_part(rms_in, cols) : 0.0f;
    if (xres) {
        norm_quant_row(xres + (size_t)tok0 * cols, cols, nw, eps, lin, ssm, red);
        __syncthreads();
        if (SWZ) to_swizzled(xb, (const uint4*)lin, cols / 16, tid, blockDim.x);
        else to_piece_major<P>(xsm, (const uint4*)lin, chunks, tid, blockDim.x);
        __syncthreads();
    } else if (x_copy) {
        if (tid == 0) {
            const u32 bar = smem_addr(&xbar);
            mbar_expect_tx(bar, (u32)(cols + 8 * groups));
            tma_2d(smem_addr(xb), xmap, 0, 0, bar);
            bulk_g2s(smem_addr(ssm), xs, (u32)(8 * groups), bar);
        }
    } else {
        stage_row<P>(xsm, ssm, xq, xs, chunks, groups, tid, blockDim.x);
        __syncthreads();
    }

    if (warp == GEMV1_WARPS) {
        // The producer: refill each stage once every consumer warp is done with it.
        if (lane == 0) ring_produce(empty, stages, mine, issue, pf_codes, pf_code_bytes, pf_scales, pf_scale_bytes);
        return;
    }
    // The lane's (first) row in a tile, and its place among the row's lanes.
    const int rt = SHARE ? warp * RW : warp * RW + lane / L, sub = lane % L;
    const u32 xa = smem_addr(xb);
    if (x_copy) mbar_wait(smem_addr(&xbar), 0);
    // Activations left unscaled by a folded norm: the outputs take its 1/rms (its sums loaded
    // with the activations, above).
    const float oscale = rms_in ? rms_finish(ss_part, cols, rms_eps) : 1.0f;
    if (tid == 0) TRACE_MARK_FIRST(0);
    u64 best = 0;
    for (int i = 0; i < mine; i++) {
        const int s = i % stages;
        const unsigned char* st = stage0 + (size_t)s * stage_bytes;
        const int row = (int)(blockIdx.x + (size_t)i * gridDim.x) * tr + rt;
        if (SHARE) {
            shared_tile<FMT, RW, DOT, SWZ>((const uint4*)st, (const u16*)(st + code_bytes), chunks, spr, rt, lane,
                                           row, rows, xsm, xa, ssm, out, accumulate, oscale,
                                           smem_addr(&bars[s]), (u32)(i / stages) & 1u, smem_addr(&empty[s]),
                                           best);
            continue;
        }
        // The row's earlier value, where the product adds to it, is loaded before the tile's
        // arithmetic rather than after it: its latency hides behind the dot products.
        const float prev = accumulate && sub == 0 && row < rows ? out[row] : 0.0f;
        mbar_wait(smem_addr(&bars[s]), (u32)(i / stages) & 1u);
        if (tid == 0) TRACE_MARK_FIRST(1);
        const uint4* wc = (const uint4*)st;
        const u16* ws = (const u16*)(st + code_bytes);
        // Chunk c of this warp's row against the activations.
        auto chunk_dot = [&](int c) {
            const uint4 w = wc[(size_t)rt * chunks + c];
            const float d = h2f(ws[rt * spr + (FMT == FMT_Q2G128 ? c >> 1 : c)]);
            return SWZ ? swz_row_dot<FMT>(xa, ssm, c, w, d) : smem_row_dot<FMT>(xsm, ssm, chunks, c, w, d);
        };
        // With 16 lanes to a row, lane `sub` sums the chunks that lanes `sub` and `sub + 16` of
        // the one-warp-per-row order (gemv_body's) sum, each in its own accumulator, and the
        // reduction below adds them as warp_sum does: decode and multi-token GEMVs give the
        // same bits.
        float acc = 0.0f, acc_hi = 0.0f;
        if (!DOT) {
        } else if (L == 16) {
            for (int c = sub; c < chunks; c += 32) {
                acc += chunk_dot(c);
                if (c + 16 < chunks) acc_hi += chunk_dot(c + 16);
            }
        } else {
            for (int c = sub; c < chunks; c += L) acc += chunk_dot(c);
        }
        // Every lane of this warp is done reading stage s.
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
        if (L == 16) acc += acc_hi;
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (sub == 0 && row < rows) {
            const float v = accumulate ? acc * oscale + prev : acc * oscale;
            out[row] = v;
            best = max(best, argmax_key(v, (u32)row));
        }
    }
    if (tid == 0) TRACE_MARK_FIRST(3);
    // With a fold, the block's rows all written (the consumer warps meet at a named barrier the
    // producer does not join), warp 0 arrives once per tile: a counter then takes 128 / tr
    // atomics a piece rather than eight times as many.
    if (fold.cnt) {
        asm volatile("bar.sync 1, %0;" ::"n"(32 * GEMV1_WARPS) : "memory");
        if (tid == 0) TRACE_MARK_FIRST(2);
        // Two or three tiles a block with the shared lanes (ffn_down), whose registers allow
        // their folds' reads together.
        if (warp == 0) fold_arrive<SHARE ? 4 : 1>(fold, out, mine, tr, (u32)(128 / tr));
    }
    if (tid == 0) TRACE_MARK_FIRST(2);
    // One atomic per row group: a vocabulary of rows each hitting one address serializes
    // (measured at ~190 µs for the 248k-row LM head).
    if (amax && sub == 0 && best) atomicMax(amax, best);
    // Consumer warps end together, give or take a tile's arithmetic.
    if (tid == 0) TRACE_EXIT(TRACE_GEMV_DP4A, scales);
}
#endif

#if __CUDA_ARCH__ >= 900
#define GEMV1_CALL(FMT, RW, DOT, SWZ, SHARE) \
    gemv1_body<FMT, RW, DOT, SWZ, SHARE>(codes, scales, rows, cols, xq, xs, out, accumulate, amax, stages, xres, tok0, nw, eps, \
                        pf_codes, pf_code_bytes, pf_scales, pf_scale_bytes, early, xmap, rms_in, rms_eps, \
                        FoldOut{fold_cnt, nw, fold_xq, fold_xs, fold_ss, fold_ffn, FOLD_XP_ARG(FMT)})
#else
#define GEMV1_CALL(FMT, RW, DOT, SWZ, SHARE) __trap()
#endif

// MINB: blocks per SM the register budget must allow (plan/gemv/ runs four of the 1-bit
// kernel with two rows per warp, three of the other kernels with two rows per warp and of the
// 1-bit one with one; the shared-lanes kernels, `r2s`, one: their two stages of 16 wide rows
// fill a multiprocessor's shared memory). SWZ: the activations swizzled and copied by `xmap` (the
// `_x` kernels), or piece-major and staged by the threads (`xmap` unread).
#define GEMV1_KERNEL(name, FMT, RW, MINB, DOT, SWZ, SHARE)                                      \
    ENTRY __global__ void __launch_bounds__(32 * (GEMV1_WARPS + 1), MINB)                   \
        name(const unsigned char* __restrict__ codes, const unsigned char* __restrict__ scales,   \
             int rows, int cols, const uint4* __restrict__ xq, const float2* __restrict__ xs,     \
             float* __restrict__ out, int accumulate, u64* __restrict__ amax, int stages,         \
             const float* __restrict__ xres, int tok0, const float* __restrict__ nw, float eps,   \
             const unsigned char* __restrict__ pf_codes, int pf_code_bytes,                       \
             const unsigned char* __restrict__ pf_scales, int pf_scale_bytes, int early,          \
             const float* __restrict__ rms_in, float rms_eps, u32* __restrict__ fold_cnt,         \
             int* __restrict__ fold_xq, float2* __restrict__ fold_xs, float* __restrict__ fold_ss, \
             int fold_ffn FOLD_XP_PARAM(FMT), const __grid_constant__ TmaMap xmap) {              \
        GEMV1_CALL(FMT, RW, DOT, SWZ, SHARE);                                                    \
    }

GEMV1_KERNEL(gemv1_q1_r1, FMT_Q1, 1, 3, true, false, false)
GEMV1_KERNEL(gemv1_q1_r2, FMT_Q1, 2, 4, true, false, false)
GEMV1_KERNEL(gemv1_q2g64_r1, FMT_Q2G64, 1, 2, true, false, false)
GEMV1_KERNEL(gemv1_q2g64_r2, FMT_Q2G64, 2, 3, true, false, false)
GEMV1_KERNEL(gemv1_q2g128_r1, FMT_Q2G128, 1, 2, true, false, false)
GEMV1_KERNEL(gemv1_q2g128_r2, FMT_Q2G128, 2, 3, true, false, false)
GEMV1_KERNEL(gemv1_q1_r1_x, FMT_Q1, 1, 3, true, true, false)
GEMV1_KERNEL(gemv1_q1_r2_x, FMT_Q1, 2, 4, true, true, false)
GEMV1_KERNEL(gemv1_q2g64_r1_x, FMT_Q2G64, 1, 2, true, true, false)
GEMV1_KERNEL(gemv1_q2g64_r2_x, FMT_Q2G64, 2, 3, true, true, false)
GEMV1_KERNEL(gemv1_q2g128_r1_x, FMT_Q2G128, 1, 2, true, true, false)
GEMV1_KERNEL(gemv1_q2g128_r2_x, FMT_Q2G128, 2, 3, true, true, false)
GEMV1_KERNEL(gemv1_q1_r1_nodot, FMT_Q1, 1, 3, false, false, false)
GEMV1_KERNEL(gemv1_q1_r2_nodot, FMT_Q1, 2, 4, false, false, false)
GEMV1_KERNEL(gemv1_q2g64_r1_nodot, FMT_Q2G64, 1, 2, false, false, false)
GEMV1_KERNEL(gemv1_q2g64_r2_nodot, FMT_Q2G64, 2, 3, false, false, false)
GEMV1_KERNEL(gemv1_q1_r2s, FMT_Q1, 2, 1, true, false, true)
GEMV1_KERNEL(gemv1_q2g64_r2s, FMT_Q2G64, 2, 1, true, false, true)
GEMV1_KERNEL(gemv1_q2g128_r2s, FMT_Q2G128, 2, 1, true, false, true)
GEMV1_KERNEL(gemv1_q1_r2s_x, FMT_Q1, 2, 1, true, true, true)
GEMV1_KERNEL(gemv1_q2g64_r2s_x, FMT_Q2G64, 2, 1, true, true, true)
GEMV1_KERNEL(gemv1_q2g128_r2s_x, FMT_Q2G128, 2, 1, true, true, true)
