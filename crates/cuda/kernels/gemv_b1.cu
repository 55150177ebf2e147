// Decode GEMV (one token) of 1-bit rows on the binary tensor cores, sm_90; 2-bit rows by the
// same ring and producer with their own consumer (b2_consume).
//
// A 1-bit weight is ±d, so a row's dot with int8 activations q (scale s) over a 64-value group
// is d·s·(2·Σ_{bit=1} q − Σ q). The selected sum is what a binary MMA with AND and popcount
// gives when the activations enter as their eight bit planes: column p of B is plane p of the
// chunk's 128 values, so one m16n8k128 instruction counts, for 16 rows at once, the set bits of
// every plane under each row's ones, and plane p weighs 2^p (the sign plane −128). Against the
// dp4a kernel (gemv1_q1_*), whose every lane re-reads 128 activation bytes from shared memory
// per 16 weight bytes, the planes of a warp's chunks sit in registers for the whole launch and
// each instruction covers 256 weight bytes.
//
// Tiles are 16 rows (32 with two MMA row groups, RG), laid out in a stage as boxes of 128
// bytes × the tile's rows with the 128-byte swizzle (16-byte unit u of row r lands at unit
// u ^ (r & 7)), so that the lanes of a fragment (row g and g + 8, word t of chunk c) hit 32
// different banks. The tensor-map copy brings a tile a box at a time; the 2-bit `_i` kernels bring
// it by one bulk copy from a tile image already in that layout (tile_image.cu, made at upload). A
// tile's row scales follow by bulk copy. Warp w of GEMV1_WARPS multiplies chunks w, w + 8, … of
// every tile, leaves its partial sums in shared memory and frees the stage; the producer warp,
// once every consumer has freed it, adds the partial sums in warp order, writes the rows and
// refills the stage (b1_produce). Results are deterministic (though not the dp4a kernel's bits:
// the float sums run in another order). Per 16 rows × 128 values a consumer issues about 33
// instructions (two MMAs, five shared loads, the counts' scaling) where the dp4a kernel's lanes
// issue about 54 per as many weight bytes: on matrices of many tiles the binary kernel is ~22%
// faster, and since its start waits for one round trip to L2 per six chunks rather than one per
// chunk, it takes every 1-bit matrix (plan::prefers_b1).
//
// Fragments (PTX ISA, mma .b1 m16n8k128): lane (g = lane / 4, t = lane % 4) holds A's rows g
// and g + 8 and B's column g over k = 32t … 32t + 31, and gets C's rows g, g + 8 at columns 2t,
// 2t + 1. Inside a chunk, word t holds values 32t + 4k + b at bit 8b + k (repack.rs), and the
// plane words are built in that same order. The two 64-value activation groups of a chunk
// have their own scales, so each chunk takes two MMAs, B masked to one group's lanes (or, with
// B1_GROUP_COLS, each MMA four planes of both groups: b1_mma_words).

//
// ABLATE_PLANES, ABLATE_MMA, ABLATE_MMAOP, ABLATE_FP (`NIWAKI_CUDA_ABLATE`, a measurement only:
// the outputs are wrong) take one part of the consumers' work out, so that a decode step's time
// without it says what it costs: the plane words' bit gathering; a tile's arithmetic (its loads,
// MMAs and scaling); the MMAs alone (replaced by as many plain ALU operations on the same
// words); the counts' scaling alone.

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void bmma_and_popc(int* c, u32 a0, u32 a1, u32 b) {
    asm("mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

// Plane p of the 32 activation bytes `lo`, `hi` (values 32t … 32t + 31 of a chunk) in the
// chunk's bit order: bit 8b + k is plane p of value 4k + b, i.e. of byte b of word k
// (quant.cu's plane_word).
__device__ __forceinline__ u32 plane_word(const uint4& lo, const uint4& hi, int p) {
    const u32 x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    return plane_word(x, p);
}

// c += A·B, as bmma_and_popc.
__device__ __forceinline__ void bmma_and_popc_acc(int* c, u32 a0, u32 a1, u32 b) {
    asm("mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
}

// C = A·B over k = 256 as two k = 128 halves side by side: a0, a1 the rows g and g + 8 of the
// first half (as bmma_and_popc's), a2, a3 those of the second, b0 and b1 the halves of B; so
// one MMA counts what two bmma_and_popc count on (a0, a1, b0) and (a2, a3, b1), summed.
__device__ __forceinline__ void bmma256_and_popc(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// With B1_GROUP_COLS (b1_mma_words), lane g, t's two sources: whether its values lie in its
// column's group, and the lane whose word is its first MMA's (the second's is 16 lanes on).
__device__ __forceinline__ bool b1_col_group(int g, int t) { return (t < 2) == (g < 4); }
__device__ __forceinline__ int b1_col_src(int g, int t) { return 4 * (g & 3) + t; }

// The B words of a 1-bit chunk's two MMAs from `b`, plane g of values 32t … 32t + 31 (lane
// g, t's word as the planes' layout gives it). By default the first MMA counts the chunk's
// first activation group and the second its other: `lo` is b where the lane's values lie in
// the first group, else 0, and `hi` the reverse; each MMA gives a lane two planes of one
// group for its rows, four counts to convert and scale per group. With B1_GROUP_COLS, B's
// columns 0-3 are planes 0-3 of the first group and 4-7 those of the second in the first MMA
// (`lo`), planes 4-7 of each in the second (`hi`): column g takes plane g mod 4 (+ 4) of
// group g / 4, which lane g, t supplies where its values lie in that group (t / 2 = g / 4)
// and which it takes from lanes 4·(g mod 4) + t and 16 + 4·(g mod 4) + t. Then C's columns
// 2t, 2t + 1 of both MMAs are four planes of one group, which a lane adds in integers: one
// conversion and one scaling per row where the groups apart take two of each. Warp-uniform
// (every lane shuffles).
__device__ __forceinline__ void b1_mma_words(u32 b, int g, int t, u32& lo, u32& hi) {
#ifdef B1_GROUP_COLS
    const int src = b1_col_src(g, t);
    const u32 low = __shfl_sync(0xffffffffu, b, src), high = __shfl_sync(0xffffffffu, b, src + 16);
    const bool mine = b1_col_group(g, t);
    lo = mine ? low : 0u;
    hi = mine ? high : 0u;
#else
    lo = t < 2 ? b : 0u;
    hi = t < 2 ? 0u : b;
#endif
}

// Word x rotated right by s (mod 32): bit q lands at q − s (mod 32), one funnel shift.
__device__ __forceinline__ u32 rotr(u32 x, int s) { return __funnelshift_r(x, x, (u32)s); }

// Plane p of the 16 activation bytes `x` (values 16t … 16t + 15 of a 2-bit chunk) in the bit
// order of the chunk's word t, twice: the code of value 16t + 4k + b sits at bits 8b + 2k (its
// 1) and 8b + 2k + 1 (its 2), and both get plane p of that value. Word k rotated right by
// p − 2k puts bit p of each byte at bit 2k of the same byte: a rotation and a masked merge (one
// LOP3) a word where a shift, a mask and a shifted merge took three, the rotations' amounts
// depending on the lane's plane alone. The same bits; Q2_0 decode 1.0% faster on the H200.
__device__ __forceinline__ u32 plane_word2(const uint4& x, int p) {
    const u32 w[4] = {x.x, x.y, x.z, x.w};
    u32 r = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) r |= rotr(w[k], p - 2 * k) & (0x01010101u << (2 * k));
    return r | (r << 1);
}

// The norm folded into the binary GEMV (NORM kernels), done by the consumer warps alone: warp
// w's chunks c = w + 8j are the values 4·tid + 1024·j that thread tid = 32w + lane of quant_rms
// holds, so each consumer thread loads exactly those (one round trip to L2, the norm's weights
// having been loaded before the wait), sums their squares in quant_rms's order and the eight
// warps' sums are added as block_sum adds them: the same scale. Each chunk is then quantized
// in registers by quant128's arithmetic (the same codes and pairs as quant_rms writes), and a
// lane gathers its plane word's eight code words from the lanes holding them. Against the
// kernel reading quant_rms's output, no separate launch, no second read of the row, and no block
// barrier beyond the one the sum needs, which the producer warp does not join.
template <int J, bool EXACT>
__device__ __forceinline__ void b1_norm_planes(const float* __restrict__ row, int cols, const float4 (&gw)[J],
                                               float eps, float2* ssm, float* red, u32 (&blo)[J], u32 (&bhi)[J]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int chunks = cols / 128, i0 = 4 * (int)threadIdx.x;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 v[J];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) {
        v[j] = EXACT || warp + GEMV1_WARPS * j < chunks ? *(const float4*)(row + i0 + 1024 * j) : zero;
        ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    }
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    asm volatile("bar.sync 1, %0;" ::"n"(32 * GEMV1_WARPS) : "memory");
    float tot = 0.0f;
#pragma unroll
    for (int w = 0; w < GEMV1_WARPS; w++) tot += red[w];
    const float scale = 1.0f / sqrtf(tot / (float)cols + eps);
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int c = warp + GEMV1_WARPS * j;
        u32 b = 0u;
        // Warp-uniform: the shuffles below see every lane.
        if (EXACT || c < chunks) {
            float4 u = v[j];
            const float4 gk = gw[j];
            u.x = u.x * scale * gk.x; u.y = u.y * scale * gk.y; u.z = u.z * scale * gk.z; u.w = u.w * scale * gk.w;
            float2 pair;
            const u32 packed = quant128_regs(u, pair);
            if ((lane & 15) == 0) ssm[2 * c + (lane >> 4)] = pair;
            // Word k of the lane's 32 values (32t … 32t + 31) is lane 8t + k's.
            u32 x[8];
#pragma unroll
            for (int k = 0; k < 8; k++) x[k] = __shfl_sync(0xffffffffu, packed, 8 * t + k);
            b = plane_word(x, g);
        }
        b1_mma_words(b, g, t, blo[j], bhi[j]);
    }
}

// The norm's fold gathered in a cluster (the `_c` kernels, launched as clusters of eight
// blocks, each with exactly one 16-row tile: block 8c + r holds rows 16r.. of piece c). Rather
// than an arrival counter in global memory and the piece read back from L2 by the last block
// to arrive (fold_arrive: two round trips after the last tile), each block's producer leaves
// its 16 outputs in its shared memory, and after one cluster barrier the cluster's first block
// reads the piece from its seven neighbours' shared memory and folds it as fold_arrive does (the
// same values, the same arithmetic: the same bits). A second barrier keeps the neighbours'
// memory alive until it has been read. Threads that have exited (the consumer warps) do not
// hold either barrier up. `v`: lane r's output, row r of the block's tile (r < 16).
__device__ __forceinline__ void fold_cluster(const FoldOut& f, float v) {
    __shared__ __align__(16) float tile_out[16];
    const int lane = threadIdx.x & 31;
    u32 rank;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const int piece = (int)blockIdx.x >> 3, base = piece * 128 + 4 * lane;
    // The norm's weights are constant: loaded while the neighbours finish.
    const float4 g = rank == 0 ? __ldg((const float4*)(f.w + base)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (lane < 16) tile_out[lane] = v;
    __syncwarp();
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (rank == 0) {
        // Values 4·lane.. of the piece: rows (4·lane) mod 16.. of block lane / 4's tile.
        u32 remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                     : "=r"(remote)
                     : "r"(smem_addr(&tile_out[(4 * lane) & 15])), "r"((u32)(lane >> 2)));
        asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
                     : "r"(remote)
                     : "memory");
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (rank == 0) fold_piece_regs(x, g, piece * 128, f.xq, f.xs, f.ss, f.xp);
}

// The producer warp of the binary GEMV: lane 0 keeps the ring full, as ring_produce does, and
// the warp adds each tile's partial sums once every consumer warp has arrived on the tile's
// `empty` barrier (lane r: row r, the warps in order, so the sums are deterministic), writes
// the rows and then refills the stage. The consumers thus end a tile with no fence, counter or
// reduction of their own.
template <int TR, bool CL, int FB, class Issue>
__device__ __forceinline__ void b1_produce(u64* bars, u64* empty, float (*part)[GEMV1_WARPS][TR], int stages,
                                           int mine, int rows, Issue issue,
                                           float* __restrict__ out,
                                           int accumulate, u64* __restrict__ amax,
                                           const unsigned char* pf_codes, int pf_code_bytes,
                                           const unsigned char* pf_scales, int pf_scale_bytes,
                                           float oscale, const FoldOut& fold) {
    const int lane = threadIdx.x & 31;
    auto prefetch_next = [&]() {
        prefetch_l2_share(pf_codes, pf_code_bytes);
        prefetch_l2_share(pf_scales, pf_scale_bytes);
    };
    // The copies are all issued once tile mine − 1 − stages is freed, or at once where the ring
    // holds every tile: then the L2 cache may take the next GEMV's first bytes.
    const int last_issue = mine - 1 - stages;
    if (last_issue < 0 && lane == 0) prefetch_next();
    u64 best = 0;
    // The row this lane wrote last (CL: the block's one tile).
    float last = 0.0f;
    // Stage s of tile i and the parity of its use, counted rather than divided.
    for (int i = 0, s = 0, ph = 0; i < mine; i++) {
        const int tile = (int)blockIdx.x + i * (int)gridDim.x;
        const int row = tile * TR + lane;
        // The row's earlier value, where the product adds to it, is requested before the wait
        // for the consumers: its round trip to L2 overlaps their tile instead of following it.
        const float prior = accumulate && lane < TR && row < rows ? out[row] : 0.0f;
        mbar_wait(smem_addr(&empty[s]), (u32)ph);
        if (lane < TR) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < GEMV1_WARPS; w++) v += part[s][w][lane];
            if (row < rows) {
                v = accumulate ? v * oscale + prior : v * oscale;
                out[row] = v;
                last = v;
                best = max(best, argmax_key(v, (u32)row));
            }
        }
        // Every lane has read stage s's partial sums before the next tile of the stage is
        // issued: its consumers, who wait for that copy, then write them again.
        __syncwarp();
        if (lane == 0) {
            if (i + stages < mine) issue(i + stages);
            if (i == last_issue) prefetch_next();
        }
        if (++s == stages) {
            s = 0;
            ph ^= 1;
        }
    }
    // Every row of the block written: one arrival per tile on its 128-row piece, or (CL) the
    // piece gathered from the cluster's blocks.
    if (lane == 0) TRACE_MARK_FIRST(2);
    if constexpr (CL) fold_cluster(fold, last);
    else if (fold.cnt) fold_arrive<FB>(fold, out, mine, TR, 128u / TR);
    if (amax && best) atomicMax(amax, best);
}

// The consumer warps of the 2-bit kernels (FMT_Q2G64, FMT_Q2G128), tiles of 16 rows. A 2-bit
// chunk is 64 values, one activation group: lane (g, t) takes word t of rows g and g + 8, whose
// code bits 1 and 2 of each value face the same activation bit (plane_word2). The counts of
// the words masked to their 2s and of the whole words, added, give Σ code·bit for every plane:
// 2·(2s) + (1s and 2s). By default (B2_K256, plan::B2_K256) one MMA of k = 256 takes both, the
// code words twice and the activations' plane word masked to the 2s in its first half, whole in
// its second (one MMA's latency where two chained take two's, and one mask where there were
// two); without it, one MMA of k = 128 on the masked words, then one of the whole words
// accumulating onto it. Per 256 weight bytes (16 rows × 64 values) a warp issues its MMAs, the
// masks, its loads and the counts' scaling: about 25 instructions in the PTX, against about 35
// for the dp4a kernel's warps (whose lanes each spend ~70 on a 16-byte chunk, 512 bytes a
// warp). J: chunks per warp (at most, unless EXACT).
template <int FMT, int J, bool EXACT>
__device__ __forceinline__ void b2_consume(const unsigned char* stage0, u32 stage_bytes, u32 code_bytes, u64* bars,
                                           u64* empty, float (*part)[GEMV1_WARPS][16], float2* ssm, int mine,
                                           int stages, int chunks, int scols,
                                           const uint4* __restrict__ xq, const float2* __restrict__ xs) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // A warp's chunks' group pairs, copied by its lanes (chunk j by lane j % 32), their loads in
    // flight with the activations' below.
    constexpr int PJ = (J + 31) / 32;
    float2 pairs[PJ];
#pragma unroll
    for (int i = 0; i < PJ; i++) {
        const int j = lane + 32 * i, c = warp + GEMV1_WARPS * j;
        pairs[i] = j < J && c < chunks ? xs[c] : make_float2(0.0f, 0.0f);
    }
    // The warp's chunks as plane words, kept for every tile; the loads of BATCH chunks issued
    // before the first word is formed (as the 1-bit kernels).
    u32 bw[J];
    constexpr int BATCH = 6;
#pragma unroll
    for (int j0 = 0; j0 < J; j0 += BATCH) {
        uint4 x[BATCH];
#pragma unroll
        for (int j = j0; j < j0 + BATCH && j < J; j++) {
            const int c = warp + GEMV1_WARPS * j;
            x[j - j0] = xq[(EXACT ? c : min(c, chunks - 1)) * 4 + t];
        }
#pragma unroll
        for (int j = j0; j < j0 + BATCH && j < J; j++) {
            const int c = warp + GEMV1_WARPS * j;
#ifdef ABLATE_PLANES
            bw[j] = x[j - j0].x ^ (u32)g;
#else
            bw[j] = EXACT || c < chunks ? plane_word2(x[j - j0], g) : 0u;
#endif
        }
    }
#pragma unroll
    for (int i = 0; i < PJ; i++) {
        const int j = lane + 32 * i, c = warp + GEMV1_WARPS * j;
#ifdef LANE_PAIRS
        // Each lane's own pair of the chunk: (4^t·s, s·Σq where t = 0, else 0·s·Σq), the
        // products the tile loop would form, formed once.
        if (j < J && c < chunks) {
            const float2 p = pairs[i];
            float4* d = (float4*)(ssm + 4 * c);
            d[0] = make_float4(p.x, p.y, 4.0f * p.x, 0.0f * p.y);
            d[1] = make_float4(16.0f * p.x, 0.0f * p.y, 64.0f * p.x, 0.0f * p.y);
        }
#else
        if (j < J && c < chunks) ssm[c] = pairs[i];
#endif
    }
    __syncwarp();
    if (threadIdx.x == 0) TRACE_MARK_FIRST(0);
    // C's columns of this lane are planes 2t and 2t + 1, of weights 2^2t and 2^(2t+1) (the sign
    // plane −128): a row's Σ code·q over the chunk is 2^2t·(c0 + sgn·c1), the power of two exact
    // in float. Σ q enters a row's sum once: through lane t = 0.
    const int sgn = t == 3 ? -2 : 2;
#ifndef LANE_PAIRS
    const float k1 = (float)(1 << (2 * t));
    const float ysel = t == 0 ? 1.0f : 0.0f;
#endif
    const int nj = EXACT ? J : (chunks - warp + GEMV1_WARPS - 1) / GEMV1_WARPS;
    const int aoff = g * 128 + ((warp ^ g) << 4) + 4 * t;
    // Row g's scale of chunk warp + 8j: one per chunk (g64) or per two (g128).
    constexpr int SSTEP = FMT == FMT_Q2G128 ? GEMV1_WARPS / 2 : GEMV1_WARPS;
    const int soff = g * scols + (FMT == FMT_Q2G128 ? warp >> 1 : warp);

    for (int i = 0, s = 0, ph = 0; i < mine; i++) {
        const unsigned char* st = stage0 + (size_t)s * stage_bytes;
        mbar_wait(smem_addr(&bars[s]), (u32)ph);
        if (threadIdx.x == 0) TRACE_MARK_FIRST(1);
        const unsigned char* a = st + aoff;
        const u16* dp = (const u16*)(st + code_bytes) + soff;
        float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
        for (int j = 0; j < J; j++) {
#ifdef ABLATE_MMA
            if (false) {
#else
            if (EXACT || j < nj) {
#endif
#ifdef LANE_PAIRS
                const float2 sc = ssm[4 * (warp + GEMV1_WARPS * j) + t];
#else
                const float2 sc = ssm[warp + GEMV1_WARPS * j];
#endif
                const u32 a0 = *(const u32*)(a + j * 2048), a1 = *(const u32*)(a + j * 2048 + 1024);
                int c[4];
#ifdef B2_K256
                // The 2s' mask on the activations' word (a chunk's, the same for every tile)
                // rather than on the tile's two: a & (w & M) = (a & M) & w.
                bmma256_and_popc(c, a0, a1, a0, a1, bw[j] & 0xAAAAAAAAu, bw[j]);
#else
                bmma_and_popc(c, a0 & 0xAAAAAAAAu, a1 & 0xAAAAAAAAu, bw[j]);
                bmma_and_popc_acc(c, a0, a1, bw[j]);
#endif
                // k1·s·n (s the activation scale) as (k1·s)·n: the same bits, k1 being a power of
                // two.
#ifdef LANE_PAIRS
                const float ks = sc.x, y = sc.y;
#else
                const float ks = k1 * sc.x, y = ysel * sc.y;
#endif
                acc0 += h2f(dp[j * SSTEP]) * (ks * (float)(c[0] + sgn * c[1]) - y);
                acc1 += h2f(dp[8 * scols + j * SSTEP]) * (ks * (float)(c[2] + sgn * c[3]) - y);
            }
        }
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
        acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
        acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
        if (t == 0) {
            part[s][warp][g] = acc0;
            part[s][warp][g + 8] = acc1;
        }
        // As the 1-bit consumers: done with stage s, partial sums written, then the arrival.
        __syncwarp();
#ifndef ABLATE_WATCH
        if (threadIdx.x == 0 && i == mine - 1) TRACE_MARK_FIRST(3);
#endif
        if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
        if (++s == stages) {
            s = 0;
            ph ^= 1;
        }
    }
}

// J: chunks per warp and tile (EXACT: every warp has exactly J, so no chunk is guarded; else at
// most J). RG: MMA row groups of 16 per tile (tiles of 16·RG rows): with two, each plane word
// and activation scale a warp loads serves twice the rows, and the tile's own work (its wait,
// shuffles and arrival) is shared by them. FMT: FMT_Q1, or a 2-bit layout (b2_consume; tiles of
// 16 rows, the norm apart).
//
// IMG: the tiles come from an image of the stage's layout (`cimg`, kernels/tile_image.cu), one
// bulk copy a tile rather than a tensor-map copy per 128-byte box.
//
// XSM (1-bit rows, the norm apart): the activations' codes and group pairs come into shared
// memory by two bulk copies issued once the previous kernel has ended, before the ring's other
// tiles, and the consumers form their plane words from there. Their own loads from L2 wait one
// round trip per BATCH chunks of a warp, three in a row for ffn_down's 17 chunks (the batches
// bound the registers the loads hold), and queue behind the ring's copies; the bulk copies
// wait one, ahead of those copies. (The 2-bit rows' 10 or 12 chunks, two round trips, measured
// level staged, the forty-fourth session.)
//
// XP (1-bit rows, the norm apart): `xq` holds the activations' plane words, as quant128 stores
// them with its `xp_tok`, rather than their codes (the same bytes, in the consumers' order): a
// lane loads its word of each chunk, one load a chunk where the codes take two and the bit
// gathering about 24 instructions, and every warp of every block does that at its start, in
// the kernel's critical path. The same words, so the same bits.
template <int FMT, int J, bool EXACT, int RG, bool NORM, bool CL, bool IMG, bool XSM, bool XP>
__device__ __forceinline__ void gemv_b1_body(const TmaMap& cmap, const unsigned char* __restrict__ scales,
                                             int rows, int cols, const uint4* __restrict__ xq,
                                             const float2* __restrict__ xs, float* __restrict__ out,
                                             int accumulate, u64* __restrict__ amax, int stages,
                                             const float* __restrict__ xres, int tok0,
                                             const float* __restrict__ nw, float eps,
                                             const unsigned char* __restrict__ pf_codes, int pf_code_bytes,
                                             const unsigned char* __restrict__ pf_scales, int pf_scale_bytes,
                                             int early, const float* __restrict__ rms_in, float rms_eps,
                                             const FoldOut& fold,
                                             const unsigned char* __restrict__ cimg) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) u64 bars[GEMV1_MAX_STAGES];
    __shared__ __align__(8) u64 empty[GEMV1_MAX_STAGES];
    __shared__ float red[32];
    __shared__ __align__(8) u64 xbar;
#if defined(ABLATE_WATCH) && defined(NIWAKI_TRACE)
    const u64 watch_start = global_ns();
#endif
    constexpr int TR = 16 * RG;
    static_assert(!XSM || (FMT == FMT_Q1 && !NORM), "staged activations: 1-bit rows, the norm apart");
    static_assert(!XP || (FMT == FMT_Q1 && !NORM), "plane words: 1-bit rows, the norm apart");
    static_assert(FMT == FMT_Q1 || (RG == 1 && !NORM), "2-bit rows: tiles of 16, the norm apart");
    static_assert(!CL || RG == 1, "a cluster's eight blocks hold a 128-row piece in tiles of 16");
    // Tiles of 32 rows keep at most half the stages (plan::gemv_b1_launch), so the partial sums
    // take the same static memory.
    __shared__ float part[GEMV1_MAX_STAGES / RG][GEMV1_WARPS][TR];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
#ifdef B1_CONST_CHUNKS
    // The 5120-wide 32-row tiles' exact kernels know their width (8·J chunks): their tile
    // loop's scale addresses fold into immediates (the other kernels' loops grew so, and are
    // left as they were).
    constexpr bool CONST_CHUNKS = EXACT && RG == 2 && J == 5;
#else
    constexpr bool CONST_CHUNKS = false;
#endif
    const int chunks = CONST_CHUNKS ? GEMV1_WARPS * J : cols / (FMT == FMT_Q1 ? 128 : 64), groups = cols / 64;
    // The group pairs' bytes a group of 64 values: with LANE_PAIRS, a 2-bit chunk's (one group)
    // four lanes' own pairs (b2_consume; plan::lane_paired sizes the same).
#ifdef LANE_PAIRS
    constexpr int PAIR_BYTES = FMT == FMT_Q1 ? 8 : 32;
#else
    constexpr int PAIR_BYTES = 8;
#endif
    // Scales per row: one a chunk, or one per two (g128).
    const int scols = FMT == FMT_Q2G128 ? chunks / 2 : chunks;
    const int slabs = (chunks * 16 + 127) / 128;
    const u32 code_bytes = (u32)slabs * 2048 * RG, scale_bytes = (u32)TR * scols * 2;
    const u32 stage_bytes = (code_bytes + scale_bytes + 1023) & ~1023u;
    const int ntiles = (rows + TR - 1) / TR;
    const int mine = (int)blockIdx.x < ntiles ? (ntiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    // The dynamic block starts after the static one: rounded up here to the 1024 bytes the
    // swizzle's boxes need (the host adds them to the launch).
    unsigned char* base = smem + ((1024u - (smem_addr(smem) & 1023u)) & 1023u);
    float2* ssm = (float2*)base;
    // XSM: the row's codes between the pairs and the ring (plan::x_staged counts them).
    unsigned char* sx = base + ((((PAIR_BYTES * groups + 127) & ~127) + 1023) & ~1023);
    unsigned char* stage0 = sx + (XSM ? (cols + 1023) & ~1023 : 0);

    // Fill i of the ring: the block's tile i.
    auto issue = [&](int i) {
        const int s = i % stages;
        const int tile = (int)blockIdx.x + i * (int)gridDim.x;
        const u32 bar = smem_addr(&bars[s]);
        const u32 dst = smem_addr(stage0 + (size_t)s * stage_bytes);
        mbar_expect_tx(bar, code_bytes + scale_bytes);
        if constexpr (IMG) weights_g2s(dst, cimg + (size_t)tile * code_bytes, code_bytes, bar);
        else
            for (int sl = 0; sl < slabs; sl++) weights_tma_2d(dst + sl * 2048 * RG, cmap, sl * 128, tile * TR, bar);
        weights_g2s(dst + code_bytes, scales + (size_t)tile * scale_bytes, scale_bytes, bar);
    };

    if (tid == 0) {
        if (XSM) mbar_init(smem_addr(&xbar), 1);
        ring_init(bars, empty, stages);
    }
    __syncthreads();
    // The ring's first tiles: `early` of them requested before the wait for the previous kernel
    // (weights depend on nothing), the rest once it has ended, or with 1-bit rows (RING_LATE_Q1)
    // once consumer warp 0 holds its plane words (ring_rest), so that the activations' loads do
    // not queue behind those copies (plan::RING_LATE_Q1).
    constexpr bool late = FMT == FMT_Q1 && RING_LATE_Q1;
    const int first = min(stages, mine), before = min(first, early);
#if defined(ABLATE_WATCH) && defined(NIWAKI_TRACE)
    const u64 watch_issued = global_ns();
#endif
    if (tid == 0)
        for (int i = 0; i < before; i++) issue(i);
    // The norm's weights are constant: a consumer's share is read before the wait.
    float4 gw[NORM ? J : 1];
    if (NORM && warp < GEMV1_WARPS) {
#pragma unroll
        for (int j = 0; j < J; j++)
            gw[j] = EXACT || warp + GEMV1_WARPS * j < chunks ? *(const float4*)(nw + 4 * tid + 1024 * j)
                                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (!CL && warp == 1) fold_prefetch(fold, mine, TR);
#if defined(ABLATE_WATCH) && defined(NIWAKI_TRACE)
    // A measurement of when the ring's first tile, requested before the wait, arrives: the
    // producer warp watches its barrier before its own wait, where the consumers see it only
    // after the wait and their activations; the next kernel is let launch first, as without
    // the watch. The whole warp: a lane that watched while the others of its warp waited for
    // the previous kernel saw the tile only once that wait had ended. Marks 3, 4 and 5 (set
    // after the wait: TRACE_ENTRY clears the marks): the tile seen, the block's start and the
    // tile's request (the consumers' mark 3 is left out).
    u64 watch_seen = 0;
    if (warp == GEMV1_WARPS && before > 0) {
        pdl_launch();
        mbar_wait(smem_addr(&bars[0]), 0u);
        if (lane == 0) watch_seen = global_ns();
    }
#endif
    TRACE_ENTRY();
#if defined(ABLATE_WATCH) && defined(NIWAKI_TRACE)
    if (watch_seen) {
        niwaki_trace_mk[3] = watch_seen;
        niwaki_trace_mk[4] = watch_start;
    }
    if (tid == 0 && before > 0) niwaki_trace_mk[5] = watch_issued;
#endif
    if (XSM && tid == 0) {
        // Before the ring's other tiles: the consumers' first wait.
        const u32 xb = smem_addr(&xbar);
        mbar_expect_tx(xb, (u32)cols + 8u * groups);
        bulk_g2s(smem_addr(sx), xq, (u32)cols, xb);
        bulk_g2s(smem_addr(ssm), xs, 8u * groups, xb);
    }
    if (tid == 0 && !late)
        for (int i = before; i < first; i++) issue(i);
    auto ring_rest = [&]() {
        if (tid == 0 && late)
            for (int i = before; i < first; i++) issue(i);
    };

    if (warp == GEMV1_WARPS) {
        // Activations left unscaled by a folded norm: the rows take its 1/rms.
        const float oscale = rms_in ? rms_scale(rms_in, cols, rms_eps) : 1.0f;
        // ffn_down's blocks (J 17) have two tiles, and the registers for both folds' reads.
        b1_produce<TR, CL, J >= 17 ? 2 : 1>(bars, empty, part, stages, mine, rows, issue, out, accumulate, amax, pf_codes, pf_code_bytes,
                   pf_scales, pf_scale_bytes, oscale, fold);
        // The producer writes the block's last rows.
        if (lane == 0) TRACE_EXIT(TRACE_GEMV_B1, scales);
        return;
    }

    // The consumers' planes and tile arithmetic stay written out here: moved into functions
    // (same float operations, other address arithmetic in the PTX) they cost 2.9% of Q2_0's
    // and 1.0% of Q1_0's decode on the H200 (b0d8a25, measured against a621f36).
    static_assert(GEMV1_WARPS == 8, "warp w takes chunks w + 8j: slab j, unit w of each row");
    if constexpr (FMT != FMT_Q1) {
        b2_consume<FMT, J, EXACT>(stage0, stage_bytes, code_bytes, bars, empty, part, ssm, mine, stages,
                                  chunks, scols, xq, xs);
    } else {
        static_assert(J <= 32, "a lane per chunk copies the group pairs");
        u32 blo[J], bhi[J];
        if constexpr (NORM) {
            b1_norm_planes<J, EXACT>(xres + (size_t)tok0 * cols, cols, gw, eps, ssm, red, blo, bhi);
        } else {
            // A consumer warp reads only its own chunks' group pairs (chunk c's two at float4 c of
            // `ssm`): it copies them itself, their loads in flight with its activations' below, so that
            // no block barrier and no second round trip to L2 stand between the previous kernel's end
            // and the first tile. Lane j copies chunk j's, so a warp has at most 32 chunks.
            const int pc = warp + GEMV1_WARPS * lane;
            float2 pair0 = make_float2(0.0f, 0.0f), pair1 = pair0;
            // XSM: the pairs are already in `ssm`, the codes in `sx`.
            if (XSM) mbar_wait(smem_addr(&xbar), 0u);
            const uint4* xsrc = XSM ? (const uint4*)sx : xq;
            if (!XSM && lane < J && pc < chunks) {
                pair0 = xs[2 * pc];
                pair1 = xs[2 * pc + 1];
            }
            // This warp's chunks as plane words, kept for every tile: a lane's 32 values lie in one of
            // the chunk's two activation groups, so its word goes to that group's MMA and a zero to
            // the other's.
            //
            // The loads of up to BATCH chunks are issued before the first of their plane words is
            // formed: one round trip to L2 per six chunks. (An earlier form guarded each chunk's loads
            // with its own branch, so a warp waited for them chunk after chunk: five round trips in a row
            // for the 5120-wide rows, seventeen for ffn_down's, Nsight Compute's largest share of the
            // kernel's stalls.) Unguarded kernels may read past a warp's last chunk: they read the row's
            // last chunk instead (the plan's widths are whole multiples of 8 chunks, so there is one) and
            // drop it.
            constexpr int BATCH = 6;
            if constexpr (XP) {
                // One word a chunk, all in flight at once.
                const u32* words = (const u32*)xsrc;
#ifdef B1_GROUP_COLS
                // The two words b1_mma_words would shuffle in, loaded where they lie (lanes
                // 4·(g mod 4) + t and 16 + …'s of the chunk): two loads in flight a chunk
                // rather than one, and no shuffle between their arrival and the first tile.
                const bool mine = b1_col_group(g, t);
                const u32* wp = words + b1_col_src(g, t);
#pragma unroll
                for (int j = 0; j < J; j++) {
                    const int c = warp + GEMV1_WARPS * j;
                    const bool ok = mine && (EXACT || c < chunks);
                    blo[j] = ok ? wp[c * 32] : 0u;
                    bhi[j] = ok ? wp[c * 32 + 16] : 0u;
                }
#else
                u32 w[J];
#pragma unroll
                for (int j = 0; j < J; j++) {
                    const int c = warp + GEMV1_WARPS * j;
                    w[j] = words[(EXACT ? c : min(c, chunks - 1)) * 32 + lane];
                }
#pragma unroll
                for (int j = 0; j < J; j++) {
                    const u32 b = EXACT || warp + GEMV1_WARPS * j < chunks ? w[j] : 0u;
                    b1_mma_words(b, g, t, blo[j], bhi[j]);
                }
#endif
            } else {
        #pragma unroll
            for (int j0 = 0; j0 < J; j0 += BATCH) {
                uint4 x0[BATCH], x1[BATCH];
        #pragma unroll
                for (int j = j0; j < j0 + BATCH && j < J; j++) {
                    const int c = warp + GEMV1_WARPS * j;
                    const int cc = EXACT ? c : min(c, chunks - 1);
                    x0[j - j0] = xsrc[cc * 8 + 2 * t];
                    x1[j - j0] = xsrc[cc * 8 + 2 * t + 1];
                }
        #pragma unroll
                for (int j = j0; j < j0 + BATCH && j < J; j++) {
                    const int c = warp + GEMV1_WARPS * j;
#ifdef ABLATE_PLANES
                    const u32 b = x0[j - j0].x ^ x1[j - j0].y ^ (u32)g;
#else
                    const u32 b = EXACT || c < chunks ? plane_word(x0[j - j0], x1[j - j0], g) : 0u;
#endif
                    b1_mma_words(b, g, t, blo[j], bhi[j]);
                }
            }
            }
            if (!XSM && lane < J && pc < chunks) {
                ssm[2 * pc] = pair0;
                ssm[2 * pc + 1] = pair1;
            }
        }
        __syncwarp();
        if (threadIdx.x == 0) TRACE_MARK_FIRST(0);
        ring_rest();
#ifdef B1_GROUP_COLS
        // The lane's planes are 2u, 2u + 1 (u = t mod 2) of its first MMA and 2u + 4, 2u + 5
        // of its second, all of group t / 2: a row's count over the group is 4^u·(c0 + 2·c1 +
        // 16·c0' ± 32·c1'), the sign plane −128 = 4·16·(−2). The 4^u, exact in float, and the
        // 2 of 2·Σ − Σq go with the group's scale, once a chunk.
        // Σ q of the group enters a row's sum once: through lanes t = 0 and 2. A lane reads its
        // group's pair alone (chunk c's group h at float2 2c + h of `ssm`).
        const int m16 = (t & 1) ? -32 : 32;
        const float kg = (float)(2 << (2 * (t & 1)));
        const float ysel = (t & 1) ? 0.0f : 1.0f;
        const float2* sc2 = (const float2*)ssm + 2 * warp + (t >> 1);
#else
        // C's columns of this lane are planes 2t and 2t + 1, of weights 2^2t and 2^(2t+1) (the
        // sign plane −128): a row's count over a group is 2^2t·(c0 + sgn·c1), the power of two
        // exact in float, so it is applied with the group's 2 of 2·Σ − Σq.
        const int sgn = t == 3 ? -2 : 2;
        const float k2 = (float)(2 << (2 * t));
        // Σ q of both groups enters a row's sum once: through lane t = 0.
        const float ysel = t == 0 ? 1.0f : 0.0f;
#endif
        const int nj = EXACT ? J : (chunks - warp + GEMV1_WARPS - 1) / GEMV1_WARPS;
        // Row g's word t of unit `warp` (swizzled) in slab 0; row g + 8q is 1024·q bytes on (the
        // swizzle repeats every 8 rows).
        const int aoff = g * 128 + ((warp ^ g) << 4) + 4 * t;
#ifndef B1_GROUP_COLS
        const float4* sc4 = (const float4*)ssm + warp;
#endif

        for (int i = 0, s = 0, ph = 0; i < mine; i++) {
            const unsigned char* st = stage0 + (size_t)s * stage_bytes;
            mbar_wait(smem_addr(&bars[s]), (u32)ph);
            if (threadIdx.x == 0) TRACE_MARK_FIRST(1);
            const unsigned char* a = st + aoff;
            const u16* dp = (const u16*)(st + code_bytes) + g * chunks + warp;
            float acc[2 * RG];
#pragma unroll
            for (int r = 0; r < 2 * RG; r++) acc[r] = 0.0f;
#pragma unroll
            for (int j = 0; j < J; j++) {
#ifdef ABLATE_MMA
                if (false) {
#else
                if (EXACT || j < nj) {
#endif
#ifdef B1_GROUP_COLS
                    const float2 sc = sc2[2 * j * GEMV1_WARPS];
                    const float ks = kg * sc.x, y = ysel * sc.y;
#else
                    const float4 sc = sc4[j * GEMV1_WARPS];
                    const float y = ysel * (sc.y + sc.w);
#endif
#pragma unroll
                    for (int q = 0; q < RG; q++) {
                        const unsigned char* aq = a + j * 2048 * RG + q * 2048;
                        const u32 a0 = *(const u32*)aq, a1 = *(const u32*)(aq + 1024);
                        int lo[4], hi[4];
#ifdef ABLATE_MMAOP
                        lo[0] = (int)(a0 ^ blo[j]); lo[1] = (int)(a1 ^ blo[j]); lo[2] = (int)(a0 & blo[j]); lo[3] = (int)(a1 | blo[j]);
                        hi[0] = (int)(a0 ^ bhi[j]); hi[1] = (int)(a1 ^ bhi[j]); hi[2] = (int)(a0 & bhi[j]); hi[3] = (int)(a1 | bhi[j]);
#else
                        bmma_and_popc(lo, a0, a1, blo[j]);
                        bmma_and_popc(hi, a0, a1, bhi[j]);
#endif
#ifdef ABLATE_FP
                        acc[2 * q] += __int_as_float(lo[0] + lo[1] + hi[0] + hi[1]);
                        acc[2 * q + 1] += __int_as_float(lo[2] + lo[3] + hi[2] + hi[3]);
                        (void)sc; (void)y;
#else
#ifdef B1_GROUP_COLS
                        const int v0 = lo[0] + 2 * lo[1] + 16 * hi[0] + m16 * hi[1];
                        const int v1 = lo[2] + 2 * lo[3] + 16 * hi[2] + m16 * hi[3];
                        acc[2 * q] += h2f(dp[(16 * q) * chunks + j * GEMV1_WARPS]) * (ks * (float)v0 - y);
                        acc[2 * q + 1] += h2f(dp[(16 * q + 8) * chunks + j * GEMV1_WARPS]) * (ks * (float)v1 - y);
#else
                        const float f0 = sc.x * (float)(lo[0] + sgn * lo[1]) + sc.z * (float)(hi[0] + sgn * hi[1]);
                        const float f1 = sc.x * (float)(lo[2] + sgn * lo[3]) + sc.z * (float)(hi[2] + sgn * hi[3]);
                        acc[2 * q] += h2f(dp[(16 * q) * chunks + j * GEMV1_WARPS]) * (k2 * f0 - y);
                        acc[2 * q + 1] += h2f(dp[(16 * q + 8) * chunks + j * GEMV1_WARPS]) * (k2 * f1 - y);
#endif
#endif
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < 2 * RG; r++) {
                acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 1);
                acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 2);
            }
            if (t == 0) {
#pragma unroll
                for (int r = 0; r < 2 * RG; r++) part[s][warp][g + 8 * r] = acc[r];
            }
            // Every lane is done with stage s, and its partial sums are written, before the warp
            // arrives (a release the producer's wait acquires).
            __syncwarp();
#ifndef ABLATE_WATCH
            if (threadIdx.x == 0 && i == mine - 1) TRACE_MARK_FIRST(3);
#endif
            if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
            if (++s == stages) {
                s = 0;
                ph ^= 1;
            }
        }
    }
}
#endif

// A fold writes plane words from the 1-bit kernels alone (FOLD_XP_PARAM, gemv.cu).
#if __CUDA_ARCH__ >= 900
#define GEMV_BIN_CALL(FMT, J, EXACT, RG, NORM, CL, IMG, CIMG, XSM, XP)                                     \
    gemv_b1_body<FMT, J, EXACT, RG, NORM, CL, IMG, XSM, XP>(cmap, scales, rows, cols, xq, xs, out, accumulate, amax, stages, xres, tok0, nw, eps, \
                    pf_codes, pf_code_bytes, pf_scales, pf_scale_bytes, early, rms_in, rms_eps,              \
                    FoldOut{fold_cnt, nw, fold_xq, fold_xs, fold_ss, fold_ffn, FOLD_XP_ARG(FMT)}, CIMG)
#else
#define GEMV_BIN_CALL(FMT, J, EXACT, RG, NORM, CL, IMG, CIMG, XSM, XP) __trap()
#endif

// J: chunks per warp and tile (EXACT) or at most (else), so 8·J chunks of 128 (1-bit) or 64
// (2-bit) columns. The exact kernels take the 27B's widths with no guard: 5120, 6144 and 17408
// columns are 5, 6 and 17 1-bit chunks per warp, 5120 and 6144 are 10 and 12 2-bit ones.
#define GEMV_BIN_KERNEL(name, FMT, J, EXACT, RG, NORM, MINB) \
    GEMV_BIN_KERNEL_AS(name, FMT, J, EXACT, RG, NORM, MINB, false, , false, , nullptr, false, false)
// The tiles from their images (IMG): the launch adds the image's address.
#define GEMV_BIN_IMG_KERNEL(name, FMT, J, EXACT, MINB)                                     \
    GEMV_BIN_KERNEL_AS(name, FMT, J, EXACT, 1, false, MINB, false, , true,                 \
                       MACRO_COMMA const unsigned char* __restrict__ cimg, cimg, false, false)
// The norm's fold gathered in clusters of eight blocks (fold_cluster). Clusters exist from
// sm_90 on; compiled for earlier devices the kernels keep no cluster shape (and trap).
#if __CUDA_ARCH__ >= 900
#define FOLD_CLUSTER_DIMS __cluster_dims__(8, 1, 1)
#else
#define FOLD_CLUSTER_DIMS
#endif
#define GEMV_BIN_CLUSTER_KERNEL(name, FMT, J, EXACT, MINB) \
    GEMV_BIN_KERNEL_AS(name, FMT, J, EXACT, 1, false, MINB, true, FOLD_CLUSTER_DIMS, false, , nullptr, false, false)
#define MACRO_COMMA ,
#define GEMV_BIN_KERNEL_AS(name, FMT, J, EXACT, RG, NORM, MINB, CL, DIMS, IMG, IMG_PARAM, CIMG, XSM, XP) \
    ENTRY __global__ void DIMS __launch_bounds__(32 * (GEMV1_WARPS + 1), MINB)              \
        name(const __grid_constant__ TmaMap cmap, const unsigned char* __restrict__ scales,       \
             int rows, int cols, const uint4* __restrict__ xq, const float2* __restrict__ xs,     \
             float* __restrict__ out, int accumulate, u64* __restrict__ amax, int stages,         \
             const float* __restrict__ xres, int tok0, const float* __restrict__ nw, float eps,   \
             const unsigned char* __restrict__ pf_codes, int pf_code_bytes,                       \
             const unsigned char* __restrict__ pf_scales, int pf_scale_bytes, int early,          \
             const float* __restrict__ rms_in, float rms_eps, u32* __restrict__ fold_cnt,         \
             int* __restrict__ fold_xq, float2* __restrict__ fold_xs, float* __restrict__ fold_ss, \
             int fold_ffn FOLD_XP_PARAM(FMT) IMG_PARAM) {                                         \
        GEMV_BIN_CALL(FMT, J, EXACT, RG, NORM, CL, IMG, CIMG, XSM, XP);                                        \
    }

GEMV_BIN_KERNEL(gemv_b1_j5x, FMT_Q1, 5, true, 1, false, 4)
GEMV_BIN_KERNEL(gemv_b1_j6x, FMT_Q1, 6, true, 1, false, 4)
GEMV_BIN_KERNEL(gemv_b1_j6, FMT_Q1, 6, false, 1, false, 4)
GEMV_BIN_KERNEL(gemv_b1_j17x, FMT_Q1, 17, true, 1, false, 2)
GEMV_BIN_KERNEL(gemv_b1_j17, FMT_Q1, 17, false, 1, false, 2)
// The same with the activations staged in shared memory (XSM; plan::x_staged).
#define GEMV_BIN_XSM_KERNEL(name, J, EXACT) \
    GEMV_BIN_KERNEL_AS(name, FMT_Q1, J, EXACT, 1, false, 2, false, , false, , nullptr, true, false)
GEMV_BIN_XSM_KERNEL(gemv_b1_j17x_xs, 17, true)
GEMV_BIN_XSM_KERNEL(gemv_b1_j17_xs, 17, false)
// Tiles of 32 rows (row counts a multiple of 32: plan::gemv_b1_launch).
GEMV_BIN_KERNEL(gemv_b1_j5x_r32, FMT_Q1, 5, true, 2, false, 3)
GEMV_BIN_KERNEL(gemv_b1_j6x_r32, FMT_Q1, 6, true, 2, false, 3)
// The norm folded in (up to six chunks a warp: the row's values and the norm's weights stay in
// registers, so three blocks a multiprocessor rather than four bound their registers).
GEMV_BIN_KERNEL(gemv_b1_j5x_n, FMT_Q1, 5, true, 1, true, 3)
GEMV_BIN_KERNEL(gemv_b1_j6x_n, FMT_Q1, 6, true, 1, true, 3)
GEMV_BIN_KERNEL(gemv_b1_j6_n, FMT_Q1, 6, false, 1, true, 3)
GEMV_BIN_KERNEL(gemv_b1_j5x_r32_n, FMT_Q1, 5, true, 2, true, 3)
GEMV_BIN_KERNEL(gemv_b1_j6x_r32_n, FMT_Q1, 6, true, 2, true, 3)
// 2-bit rows (g64: Q2_0; g128: Q2_0_g128, PQ2_0, widened PTQ1_0), up to 12 chunks a warp (6144
// columns), tiles of 16 rows, three blocks a multiprocessor (72 registers, no spills in ptxas
// for sm_90a; bounded for four, 56, they measured slower, the forty-fourth session).
// K(name, FMT, J, EXACT, MINB) for each, the name followed by SFX.
#define GEMV_B2_KERNELS(K, SFX)                     \
    K(gemv_b2g64_j10x##SFX, FMT_Q2G64, 10, true, 3)   \
    K(gemv_b2g64_j12x##SFX, FMT_Q2G64, 12, true, 3)   \
    K(gemv_b2g64_j12##SFX, FMT_Q2G64, 12, false, 3)   \
    K(gemv_b2g128_j10x##SFX, FMT_Q2G128, 10, true, 3) \
    K(gemv_b2g128_j12x##SFX, FMT_Q2G128, 12, true, 3) \
    K(gemv_b2g128_j12##SFX, FMT_Q2G128, 12, false, 3)
#define GEMV_B2_KERNEL(name, FMT, J, EXACT, MINB) GEMV_BIN_KERNEL(name, FMT, J, EXACT, 1, false, MINB)
GEMV_B2_KERNELS(GEMV_B2_KERNEL, )
// The same from tile images (gpu/tile_image.rs).
GEMV_B2_KERNELS(GEMV_BIN_IMG_KERNEL, _i)
// The residual GEMVs with the norm's fold gathered in a cluster (plan::cluster_fold; by default
// for Q2_0 g64 rows, plan::ClusterFold): the kernels those GEMVs take on the 27B where every tile's
// block is resident at once (6144 1-bit and 2-bit columns; not ffn_down's 17408, two blocks a
// multiprocessor) and the guarded ones of the harness's smaller models.
GEMV_BIN_CLUSTER_KERNEL(gemv_b1_j6x_c, FMT_Q1, 6, true, 4)
GEMV_BIN_CLUSTER_KERNEL(gemv_b1_j6_c, FMT_Q1, 6, false, 4)
GEMV_BIN_CLUSTER_KERNEL(gemv_b2g64_j12x_c, FMT_Q2G64, 12, true, 3)
GEMV_BIN_CLUSTER_KERNEL(gemv_b2g64_j12_c, FMT_Q2G64, 12, false, 3)
GEMV_BIN_CLUSTER_KERNEL(gemv_b2g128_j12x_c, FMT_Q2G128, 12, true, 3)
GEMV_BIN_CLUSTER_KERNEL(gemv_b2g128_j12_c, FMT_Q2G128, 12, false, 3)
// The 1-bit kernels that take the norm apart, reading plane words (XP; plan::planes_kernel):
// the same shapes, the name followed by _p.
#define GEMV_BIN_P_KERNEL(name, J, EXACT, RG, MINB, CL, DIMS, XSM) \
    GEMV_BIN_KERNEL_AS(name, FMT_Q1, J, EXACT, RG, false, MINB, CL, DIMS, false, , nullptr, XSM, true)
GEMV_BIN_P_KERNEL(gemv_b1_j5x_p, 5, true, 1, 4, false, , false)
GEMV_BIN_P_KERNEL(gemv_b1_j6x_p, 6, true, 1, 4, false, , false)
GEMV_BIN_P_KERNEL(gemv_b1_j6_p, 6, false, 1, 4, false, , false)
GEMV_BIN_P_KERNEL(gemv_b1_j17x_p, 17, true, 1, 2, false, , false)
GEMV_BIN_P_KERNEL(gemv_b1_j17_p, 17, false, 1, 2, false, , false)
GEMV_BIN_P_KERNEL(gemv_b1_j17x_xs_p, 17, true, 1, 2, false, , true)
GEMV_BIN_P_KERNEL(gemv_b1_j17_xs_p, 17, false, 1, 2, false, , true)
GEMV_BIN_P_KERNEL(gemv_b1_j5x_r32_p, 5, true, 2, 3, false, , false)
GEMV_BIN_P_KERNEL(gemv_b1_j6x_r32_p, 6, true, 2, 3, false, , false)
GEMV_BIN_P_KERNEL(gemv_b1_j6x_c_p, 6, true, 1, 4, true, FOLD_CLUSTER_DIMS, false)
GEMV_BIN_P_KERNEL(gemv_b1_j6_c_p, 6, false, 1, 4, true, FOLD_CLUSTER_DIMS, false)
