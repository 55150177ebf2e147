// Activation quantization: int8 per value, (d, d*sum(q)) per group of 64. One warp quantizes
// 128 values (two groups: lanes 0-15 and 16-31, four consecutive values per lane). The CPU twin
// (repack::quantize_x) performs the same IEEE operations, so the outputs are bit-identical.
// Passes that multiply on the f16 tensor cores (hgemm.cu) also get the values as f16 (`xh`,
// when not null), each 64-value block in the order that GEMM reads.

// The position of value v of a 64-value block in the f16 GEMM's order: value 16t + 4j + r goes
// where thread t of a quad finds it at mma step j (r = 0, 2: its first fragment pair; 1, 3: its
// second), see hgemm.cu. plan::hgemm_slot is the host's copy.
__device__ __forceinline__ int hgemm_slot(int v) {
    const int t = (v >> 4) & 3, j = (v >> 2) & 3, r = v & 3;
    return 16 * j + 8 * (r & 1) + 2 * t + (r >> 1);
}

// f16 bits of x, finite values beyond the f16 range clamped to its largest (NaN stays NaN).
__device__ __forceinline__ u32 f16_sat(float x) {
    return f2h(fabsf(x) > 65504.0f ? copysignf(65504.0f, x) : x);
}

__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int half_warp_isum(int v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The arithmetic of one 128-value piece, held four values a lane (lanes 0-15: the first group
// of 64, 16-31: the second): this lane's four codes packed in a word, and its group's pair
// (d, d·Σq). Every quantization of the kernels goes through it, so a piece gets the same bits
// wherever it is quantized.
__device__ __forceinline__ u32 quant128_regs(float4 v, float2& pair) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    amax = half_warp_max(amax);
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    const int q0 = __float2int_rn(__fmul_rn(v.x, id));
    const int q1 = __float2int_rn(__fmul_rn(v.y, id));
    const int q2 = __float2int_rn(__fmul_rn(v.z, id));
    const int q3 = __float2int_rn(__fmul_rn(v.w, id));
    const int s = half_warp_isum(q0 + q1 + q2 + q3);
    pair = make_float2(d, __fmul_rn(d, (float)s));
    return (q0 & 0xff) | ((q1 & 0xff) << 8) | ((q2 & 0xff) << 16) | ((u32)(q3 & 0xff) << 24);
}

// Plane p of 32 activation codes held four a word (value 4k + b at byte b of word k), in the bit
// order of the binary GEMV's MMAs (kernels/gemv_b1.cu): bit 8b + k is plane p of value 4k + b.
// (Formed by rotations as the 2-bit words are, the same bits, the 1-bit decode was 0.5% slower.)
__device__ __forceinline__ u32 plane_word(const u32 (&x)[8], int p) {
    u32 r = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) r |= ((x[k] >> p) & 0x01010101u) << k;
    return r;
}

// Quantizes the 128 values [base, base+128) of a token; `v` holds this lane's 4 values. With
// `xh_tok`, also stores them as f16 in the f16 GEMM's order. With `xp_tok` (null or not for the
// whole warp), also stores them as the plane words the 1-bit binary GEMV's lanes take
// (kernels/gemv_b1.cu, XP): word 32c + 4g + t, c = base / 128, is plane g of the piece's values
// 32t … 32t + 31, formed once here from the codes of lanes 8t … 8t + 7 rather than again by
// every block of the GEMV that reads them.
__device__ __forceinline__ void quant128(float4 v, int base, int* xq_tok, float2* xs_tok, u16* xh_tok,
                                         u32* xp_tok = nullptr) {
    const int lane = threadIdx.x & 31;
    if (xh_tok) {
        u16* o = xh_tok + base + 64 * (lane >> 4);
        const int v0 = 4 * (lane & 15);
        *(u32*)(o + hgemm_slot(v0)) = f16_sat(v.x) | (f16_sat(v.z) << 16);
        *(u32*)(o + hgemm_slot(v0 + 1)) = f16_sat(v.y) | (f16_sat(v.w) << 16);
    }
    float2 pair;
    const u32 packed = quant128_regs(v, pair);
    xq_tok[base / 4 + lane] = packed;
    if ((lane & 15) == 0) xs_tok[base / 64 + (lane >> 4)] = pair;
    if (xp_tok) {
        const int t = lane & 3;
        u32 x[8];
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = __shfl_sync(0xffffffffu, packed, 8 * t + k);
        xp_tok[base / 4 + lane] = plane_word(x, lane >> 2);
    }
}

// silu(gate)·up of a lane's four values: quant_swiglu's products, and a folded SwiGLU's.
__device__ __forceinline__ float4 swiglu4(float4 a, float4 u) {
    return make_float4(siluf_(a.x) * u.x, siluf_(a.y) * u.y, siluf_(a.z) * u.z, siluf_(a.w) * u.w);
}

// The unnormalized fast Walsh-Hadamard transform, in natural order, of the 1024 values a block
// of 256 threads holds (warp w, lane l: values 128w + 4l .. +3). Every stage forms a + b for the
// lower element and a - b for the upper, in the order of model::hadamard::fwht: the same bits as
// the CPU. Every thread of the block must call it (it synchronizes).
__device__ __forceinline__ float4 fwht1024(float4 v, float* sm) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    // Distances 1 and 2 inside the thread.
    const float a = v.x + v.y, b = v.x - v.y, c = v.z + v.w, d = v.z - v.w;
    v = make_float4(a + c, b + d, a - c, b - d);
    // Distances 4..64: the partner is lane l ^ m, same slot.
    auto mix = [](float4 mine, float4 p, bool upper) {
        return upper ? make_float4(p.x - mine.x, p.y - mine.y, p.z - mine.z, p.w - mine.w)
                     : make_float4(mine.x + p.x, mine.y + p.y, mine.z + p.z, mine.w + p.w);
    };
#pragma unroll
    for (int m = 1; m <= 16; m <<= 1) {
        float4 p;
        p.x = __shfl_xor_sync(0xffffffffu, v.x, m);
        p.y = __shfl_xor_sync(0xffffffffu, v.y, m);
        p.z = __shfl_xor_sync(0xffffffffu, v.z, m);
        p.w = __shfl_xor_sync(0xffffffffu, v.w, m);
        v = mix(v, p, l & m);
    }
    // Distances 128..512: the partner is warp w ^ m.
    float4* s4 = (float4*)sm;
#pragma unroll
    for (int m = 1; m <= 4; m <<= 1) {
        __syncthreads();
        s4[threadIdx.x] = v;
        __syncthreads();
        v = mix(v, s4[(w ^ m) * 32 + l], w & m);
    }
    return v;
}

// This thread's four values of the block's share `signs` of a sign vector.
__device__ __forceinline__ float4 signs1024(const float* __restrict__ signs) {
    return *(const float4*)(signs + 4 * threadIdx.x);
}

// Hadamard rotation R·v = H·(signs ⊙ v)/32 of a block's 1024 values, for Ternary-Bonsai-2's
// folded matrices; the scale is exact.
__device__ __forceinline__ float4 rot1024(float4 v, const float* __restrict__ signs, float* sm) {
    const float4 s = signs1024(signs);
    v = fwht1024(make_float4(v.x * s.x, v.y * s.y, v.z * s.z, v.w * s.w), sm);
    const float n = 0.03125f;
    return make_float4(v.x * n, v.y * n, v.z * n, v.w * n);
}

// Its inverse Rᵀ·z = signs ⊙ (H·z/32), model::hadamard::unrotate_embedding's order of operations.
__device__ __forceinline__ float4 unrot1024(float4 v, const float* __restrict__ signs, float* sm) {
    v = fwht1024(v, sm);
    const float n = 0.03125f;
    const float4 s = signs1024(signs);
    return make_float4(v.x * n * s.x, v.y * n * s.y, v.z * n * s.z, v.w * n * s.w);
}

// A norm folded into the residual GEMV before it. RMSNorm(x)·w = (x·w) / rms(x), and int8 codes
// per group do not change when a group is scaled, so the pieces of x·w are quantized unscaled as
// soon as the GEMV has written them, with each 128-value piece's Σx² beside them; the GEMV that
// reads them multiplies its outputs by 1/rms from those sums (rms_scale). No kernel stands
// between the two GEMVs, and no block reads the whole row.

// One piece: this lane's four values `v` of the residual and of the norm's weights `g`, at
// value `base` of the row.
// `xp`: where the plane words go too (or null).
__device__ __forceinline__ void fold_piece_regs(float4 v, float4 g, int base, int* xq, float2* xs, float* piece_ss,
                                                u32* xp) {
    const float ss = warp_sum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
    quant128(make_float4(v.x * g.x, v.y * g.y, v.z * g.z, v.w * g.w), base, xq, xs, nullptr, xp);
    if ((threadIdx.x & 31) == 0) piece_ss[base >> 7] = ss;
}

// 1/rms of a row of `cols` values (at most 64 pieces) from its pieces' sums of squares, added in
// one fixed order by every warp that asks: the same scale in every block. In two halves, so that
// a kernel can have the loads in flight while it waits for something else.
__device__ __forceinline__ float rms_part(const float* __restrict__ piece_ss, int cols) {
    const int lane = threadIdx.x & 31, n = cols >> 7;
    return (lane < n ? piece_ss[lane] : 0.0f) + (lane + 32 < n ? piece_ss[lane + 32] : 0.0f);
}

__device__ __forceinline__ float rms_finish(float part, int cols, float eps) {
    return 1.0f / sqrtf(warp_sum(part) / (float)cols + eps);
}

__device__ __forceinline__ float rms_scale(const float* __restrict__ piece_ss, int cols, float eps) {
    return rms_finish(rms_part(piece_ss, cols), cols, eps);
}

// Where a residual GEMV leaves the next norm's input: per-piece arrival counters (never reset:
// a piece is complete when its count reaches a multiple of its arrivals, a power of two), the
// norm's weights, and the codes, pairs and sums of squares it writes.
struct FoldOut {
    u32* cnt;
    const float* w;
    int* xq;
    float2* xs;
    float* ss;
    // Nonzero: the GEMV is a gate | up projection of `ffn` rows each (no norm weights nor sums),
    // and a piece's fold is silu(gate)·up quantized, quant_swiglu's arithmetic: a piece of the
    // product is complete once its gate rows and its up rows are.
    int ffn;
    // Where the codes' plane words go too (or null: quant128's `xp_tok`).
    u32* xp;
};

__device__ __forceinline__ u32 atom_add_acq_rel(u32* p, u32 v) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// The norm's weights of the pieces a block's first eight tiles fall in (tiles blockIdx.x +
// i·gridDim.x of `tr` rows), asked of the L2 cache by one warp before the block's wait: they are
// constant and read once a token, so nothing keeps them in the cache, and a fold asked for them
// only after its arrivals (a lane a 128-byte line, four a piece).
__device__ __forceinline__ void fold_prefetch(const FoldOut& f, int mine, int tr) {
    if (!f.cnt || f.ffn) return;
    const int lane = threadIdx.x & 31, k = lane >> 2;
    if (k < mine) {
        const int row = (int)(blockIdx.x + (u32)k * gridDim.x) * tr;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(f.w + (row >> 7) * 128 + 32 * (lane & 3)));
    }
}

// A whole warp, once it has written its rows of the `mine` tiles of `tr` rows its block had
// (tiles blockIdx.x + i·gridDim.x): counts one arrival per tile on the tile's 128-row piece,
// `arrivals` completing a piece (twice as many with a SwiGLU, whose gate and up rows of a piece
// count on one counter), and folds each piece it completed. The arrivals of up to 32
// tiles go out together, one lane each, so the warp waits for one round trip, not one a tile;
// so do the reads of up to FB pieces it completed (a block ending last may complete one piece
// a tile: read one after another, they took a round trip each, up to 5 µs where the rest of
// the launch had ended; FB is what the kernel's registers allow, 1 where its blocks have one
// tile). The reads of a piece go past the L1 cache, which may hold lines of the row from
// before the other blocks' writes.
template <int FB>
__device__ __forceinline__ void fold_arrive(const FoldOut& f, const float* x, int mine, int tr, u32 arrivals) {
    __syncwarp();
#ifdef ABLATE_FOLD
    // A measurement only (`NIWAKI_CUDA_ABLATE=fold`): no arrival and no fold, the next
    // GEMV reading stale inputs; the step's time without what the fold costs.
    return;
#endif
    const int lane = threadIdx.x & 31;
    if (f.ffn) arrivals *= 2u;
    for (int i0 = 0; i0 < mine; i0 += 32) {
        const int i = i0 + lane;
        int row = i < mine ? (int)(blockIdx.x + (u32)i * gridDim.x) * tr : 0;
        if (f.ffn) row %= f.ffn;
        const int piece = row >> 7;
        const bool last =
            i < mine && ((atom_add_acq_rel(f.cnt + piece, 1u) + 1u) & (arrivals - 1u)) == 0u;
        for (u32 done = __ballot_sync(0xffffffffu, last); done;) {
            // Up to FB completed pieces (n, warp-uniform), their reads all in flight.
            int p[FB];
            int n = 0;
#pragma unroll
            for (int k = 0; k < FB; k++) {
                p[k] = 0;
                if (done) {
                    p[k] = __shfl_sync(0xffffffffu, piece, __ffs(done) - 1);
                    done &= done - 1;
                    n = k + 1;
                }
            }
            float4 a[FB], b[FB];
#pragma unroll
            for (int k = 0; k < FB; k++) {
                if (k < n) {
                    const int v = p[k] * 128 + 4 * lane;
                    a[k] = __ldcg((const float4*)(x + v));
                    b[k] = f.ffn ? __ldcg((const float4*)(x + f.ffn + v)) : __ldg((const float4*)(f.w + v));
                }
            }
#pragma unroll
            for (int k = 0; k < FB; k++) {
                if (k < n) {
                    if (f.ffn) quant128(swiglu4(a[k], b[k]), p[k] * 128, f.xq, f.xs, nullptr, f.xp);
                    else fold_piece_regs(a[k], b[k], p[k] * 128, f.xq, f.xs, f.ss, f.xp);
                }
            }
        }
    }
}

// RMS norm of residual rows tok0.. then quantize, block 256, grid (B, ntok): each of a token's
// B blocks sums the squares of the whole row, then quantizes the 1024-value shares k ≡ b (mod B).
// Thread i's values (4 at 4i + 1024k) stay in registers from the sum to the quantization (up to
// RMS_REGS·1024 values; a longer row's rest is read twice), so a block reads its share once:
// B = 5 for 5120 values in a decode step (a block per share: 1.8 µs per launch; one block
// quantizing all five measured 3.0 µs), B = 1 for multi-token passes (256 tokens: 6.6 µs
// against 7.9 with five blocks each reading the row twice). Every 128-value piece is
// quantized on its own by quant128, from the same products as gemv1_body's fused norm: the
// same bits, whichever warp quantizes which piece.
//
// With `piece_ss` (one token, no rotation) the row is left unscaled: each piece x·w is quantized
// as it stands and its Σx² goes to piece_ss[piece], the GEMV after it applying 1/rms to its
// outputs (rms_scale). The arithmetic is fold_piece's, so this is the twin of a residual GEMV
// that folds the norm into its last writes (and the fallback where none does).
__device__ __forceinline__ void quant_rms_body(const float* __restrict__ x, int cols, int tok0,
        const float* __restrict__ w, float eps, int* __restrict__ xq, float2* __restrict__ xs,
        u16* __restrict__ xh, const float* __restrict__ signs, float* __restrict__ piece_ss,
        u32* __restrict__ xp) {
    __shared__ float red[32];
    __shared__ float4 rot[256];
    const int t = blockIdx.y, i0 = threadIdx.x * 4, b = blockIdx.x, nb = gridDim.x;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    auto mine = [&](int k) { return k % nb == b && i0 + 1024 * k < cols; };
    // The norm's weights are constant: this block's are read before waiting for the previous
    // kernel.
    constexpr int RMS_REGS = 8;
    float4 g[RMS_REGS], v[RMS_REGS];
#pragma unroll
    for (int k = 0; k < RMS_REGS; k++) g[k] = mine(k) ? *(const float4*)(w + i0 + 1024 * k) : zero;
    TRACE_ENTRY();
    const float* row = x + (size_t)(tok0 + t) * cols;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_REGS; k++) {
        v[k] = i0 + 1024 * k < cols ? *(const float4*)(row + i0 + 1024 * k) : zero;
        ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
    for (int i = i0 + 1024 * RMS_REGS; i < cols; i += 1024) {
        const float4 u = *(const float4*)(row + i);
        ss += u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w;
    }
    ss = block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / (float)cols + eps);
    int* xq_t = xq + (size_t)t * cols / 4;
    float2* xs_t = xs + (size_t)t * cols / 64;
    u16* xh_t = xh ? xh + (size_t)t * cols : nullptr;
    u32* xp_t = xp ? xp + (size_t)t * cols / 4 : nullptr;
    const int warp_base = (threadIdx.x >> 5) * 128;
    auto put = [&](int k, float4 u, float4 gk) {
        if (piece_ss) {
            fold_piece_regs(u, gk, warp_base + 1024 * k, xq_t, xs_t, piece_ss, xp_t);
            return;
        }
        u.x = u.x * scale * gk.x; u.y = u.y * scale * gk.y; u.z = u.z * scale * gk.z; u.w = u.w * scale * gk.w;
        // Rotated rows are whole 1024-value shares (their widths are multiples of 1024), so
        // every thread of the block takes part.
        if (signs) u = rot1024(u, signs + 1024 * k, (float*)rot);
        quant128(u, warp_base + 1024 * k, xq_t, xs_t, xh_t, xp_t);
    };
    // Whole warps of 128 values: cols is a multiple of 128.
#pragma unroll
    for (int k = 0; k < RMS_REGS; k++)
        if (mine(k)) put(k, v[k], g[k]);
    for (int k = RMS_REGS; warp_base + 1024 * k < cols; k++)
        if (k % nb == b) put(k, *(const float4*)(row + i0 + 1024 * k), *(const float4*)(w + i0 + 1024 * k));
    if (threadIdx.x == 0) TRACE_EXIT(TRACE_NORM, w);
}

// Without plane words, and with them (`_p`: quant128's `xp_tok`, for 1-bit models): the first is
// the kernel the 2-bit models run, the null pointer compiling the words out.
ENTRY __global__ void __launch_bounds__(256) quant_rms(const float* __restrict__ x, int cols, int tok0,
        const float* __restrict__ w, float eps, int* __restrict__ xq, float2* __restrict__ xs,
        u16* __restrict__ xh, const float* __restrict__ signs, float* __restrict__ piece_ss) {
    quant_rms_body(x, cols, tok0, w, eps, xq, xs, xh, signs, piece_ss, nullptr);
}
ENTRY __global__ void __launch_bounds__(256) quant_rms_p(const float* __restrict__ x, int cols, int tok0,
        const float* __restrict__ w, float eps, int* __restrict__ xq, float2* __restrict__ xs,
        u16* __restrict__ xh, const float* __restrict__ signs, float* __restrict__ piece_ss,
        u32* __restrict__ xp) { quant_rms_body(x, cols, tok0, w, eps, xq, xs, xh, signs, piece_ss, xp); }

// silu(gate) * up from the stacked gate|up projection: grid (ceil(ffn / (128 * warps)), ntok),
// blocks of any whole number of warps, 128 values a warp (plan::swiglu_launch). With `signs`
// (ffn a multiple of 1024, blocks of 8 warps), each block's 1024 values are Hadamard-rotated first.
__device__ __forceinline__ void quant_swiglu_body(const float* __restrict__ gu, int stride, int ffn,
        int* __restrict__ xq, float2* __restrict__ xs, u16* __restrict__ xh, const float* __restrict__ signs,
        u32* __restrict__ xp) {
    __shared__ float4 rot[256];
    TRACE_ENTRY();
    const int t = blockIdx.y;
    const int base = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * 128;
    if (base >= ffn) return;
    const int i = base + (threadIdx.x & 31) * 4;
    const float* g = gu + (size_t)t * stride;
    float4 v = swiglu4(*(const float4*)(g + i), *(const float4*)(g + ffn + i));
    if (signs) v = rot1024(v, signs + 1024 * blockIdx.x, (float*)rot);
    quant128(v, base, xq + (size_t)t * ffn / 4, xs + (size_t)t * ffn / 64, xh ? xh + (size_t)t * ffn : nullptr,
             xp ? xp + (size_t)t * ffn / 4 : nullptr);
    // Warp 0 of every block has values (the grid is the values' 1024-value blocks).
    if (threadIdx.x == 0) TRACE_EXIT(TRACE_SWIGLU, 0);
}

// Without plane words, and with them (`_p`: quant128's `xp_tok`, for 1-bit models): the first is
// the kernel the 2-bit models run, the null pointer compiling the words out.
ENTRY __global__ void quant_swiglu(const float* __restrict__ gu, int stride, int ffn, int* __restrict__ xq,
        float2* __restrict__ xs, u16* __restrict__ xh, const float* __restrict__ signs) {
    quant_swiglu_body(gu, stride, ffn, xq, xs, xh, signs, nullptr);
}
ENTRY __global__ void quant_swiglu_p(const float* __restrict__ gu, int stride, int ffn, int* __restrict__ xq,
        float2* __restrict__ xs, u16* __restrict__ xh, const float* __restrict__ signs, u32* __restrict__ xp) {
    quant_swiglu_body(gu, stride, ffn, xq, xs, xh, signs, xp);
}

// One 128-wide head of the gated delta net's output, four values per lane of a warp: RMS norm
// over the head, times the norm's weights g and silu(z).
__device__ __forceinline__ float4 gated_norm(float4 v, float4 z, float4 g, float eps) {
    const float ss = warp_sum(v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
    const float scale = 1.0f / sqrtf(ss / (float)DV + eps);
    v.x = v.x * scale * g.x * siluf_(z.x);
    v.y = v.y * scale * g.y * siluf_(z.y);
    v.z = v.z * scale * g.z * siluf_(z.z);
    v.w = v.w * scale * g.w * siluf_(z.w);
    return v;
}

// Gated delta net output: per-head RMS norm * ssm_norm * silu(z), one warp per 128-wide head.
// grid (ceil(HV/8), ntok), block 256. With `signs` (HV·DV a multiple of 1024), each block's 1024
// values are Hadamard-rotated first, and with `grouped` the heads are first put in grouped order
// (output head r + (HV/HK)·k is value head k + HK·r).
__device__ __forceinline__ void quant_gated_body(const float* __restrict__ o, const float* __restrict__ proj,
        int stride, int zoff, const float* __restrict__ w, float eps, int* __restrict__ xq,
        float2* __restrict__ xs, u16* __restrict__ xh, const float* __restrict__ signs, int grouped,
        u32* __restrict__ xp) {
    __shared__ float4 rot[256];
    const int lane = threadIdx.x & 31;
    // The norm's weights are constant: read before waiting for the previous kernel.
    const float4 g = *(const float4*)(w + lane * 4);
    PDL_ENTRY();
    const int t = blockIdx.y;
    const int head = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (head >= HV) return;
    constexpr int PER_KEY = HV / HK;
    const int src = grouped ? head / PER_KEY + HK * (head % PER_KEY) : head;
    const int base = head * DV;
    const int i = src * DV + lane * 4;
    float4 v = gated_norm(*(const float4*)(o + (size_t)t * HV * DV + i),
                          *(const float4*)(proj + (size_t)t * stride + zoff + i), g, eps);
    if (signs) v = rot1024(v, signs + 1024 * blockIdx.x, (float*)rot);
    quant128(v, base, xq + (size_t)t * HV * DV / 4, xs + (size_t)t * HV * DV / 64,
             xh ? xh + (size_t)t * HV * DV : nullptr, xp ? xp + (size_t)t * HV * DV / 4 : nullptr);
}

// Without plane words, and with them (`_p`: quant128's `xp_tok`, for 1-bit models): the first is
// the kernel the 2-bit models run, the null pointer compiling the words out.
ENTRY __global__ void quant_gated(const float* __restrict__ o, const float* __restrict__ proj, int stride,
        int zoff, const float* __restrict__ w, float eps, int* __restrict__ xq, float2* __restrict__ xs,
        u16* __restrict__ xh, const float* __restrict__ signs, int grouped) {
    quant_gated_body(o, proj, stride, zoff, w, eps, xq, xs, xh, signs, grouped, nullptr);
}
ENTRY __global__ void quant_gated_p(const float* __restrict__ o, const float* __restrict__ proj, int stride,
        int zoff, const float* __restrict__ w, float eps, int* __restrict__ xq, float2* __restrict__ xs,
        u16* __restrict__ xh, const float* __restrict__ signs, int grouped, u32* __restrict__ xp) {
    quant_gated_body(o, proj, stride, zoff, w, eps, xq, xs, xh, signs, grouped, xp);
}

// Plain quantization (harness use). grid (ceil(cols/1024), ntok), block 256.
// With `signs` (cols a multiple of 1024), each block's 1024 values are Hadamard-rotated first.
__device__ __forceinline__ void quant_plain_body(const float* __restrict__ x, int cols, int* __restrict__ xq,
        float2* __restrict__ xs, u16* __restrict__ xh, const float* __restrict__ signs, u32* __restrict__ xp) {
    __shared__ float4 rot[256];
    PDL_ENTRY();
    const int t = blockIdx.y;
    const int base = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * 128;
    if (base >= cols) return;
    float4 v = *(const float4*)(x + (size_t)t * cols + base + (threadIdx.x & 31) * 4);
    if (signs) v = rot1024(v, signs + 1024 * blockIdx.x, (float*)rot);
    quant128(v, base, xq + (size_t)t * cols / 4, xs + (size_t)t * cols / 64, xh ? xh + (size_t)t * cols : nullptr,
             xp ? xp + (size_t)t * cols / 4 : nullptr);
}

// Without plane words, and with them (`_p`: quant128's `xp_tok`, for 1-bit models): the first is
// the kernel the 2-bit models run, the null pointer compiling the words out.
ENTRY __global__ void quant_plain(const float* __restrict__ x, int cols, int* __restrict__ xq,
        float2* __restrict__ xs, u16* __restrict__ xh, const float* __restrict__ signs) {
    quant_plain_body(x, cols, xq, xs, xh, signs, nullptr);
}
ENTRY __global__ void quant_plain_p(const float* __restrict__ x, int cols, int* __restrict__ xq,
        float2* __restrict__ xs, u16* __restrict__ xh, const float* __restrict__ signs, u32* __restrict__ xp) {
    quant_plain_body(x, cols, xq, xs, xh, signs, xp);
}

ENTRY __global__ void fill_u64(u64* p, int n, u64 v) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}
