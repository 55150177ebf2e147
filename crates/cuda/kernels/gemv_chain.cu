// A probe for a persistent decode step: several one-token GEMVs in one launch, every block
// resident for the whole launch. The producer warp streams the tiles of one GEMV after the
// other into a ring of shared memory, running on into the next GEMV's weights (which depend on
// nothing) while the consumers still multiply the current one; the consumers cross a grid-wide
// barrier between GEMVs, as a decode step's dependences would make them (each GEMV's input
// comes from the previous one's output through a norm or the recurrence). Launched once per
// GEMV, the same kernel is the kernel-per-GEMV baseline: the harness times both on a decode
// step's matrices to measure what the launch boundaries cost.
//
// One row per consumer warp (CH_WARPS rows a tile), lanes over the row's chunks as gemv_body
// (the same bits as gemv_t1), but in CHAIN_BIN (below). Both formats have a scale per chunk.
//
// The barrier count must be zero at the launch (the harness zeroes it in the same graph). Tiles
// differ in size from one GEMV to the next, so the ring is a byte buffer (ByteRing).
//
// MODE: CHAIN_DOT multiplies; CHAIN_SYNCED releases each tile unread but keeps the barriers and
// the activations' staging; CHAIN_FREE releases tiles without either, the ring's streaming
// alone; CHAIN_FLOW multiplies with no grid barrier: each GEMV's input is taken in segments of
// 32 chunks (one chunk a lane: a segment of fewer chunks idles lanes, which a first form of 8
// segments a row measured four times slower), segment s staged once the previous GEMV's tiles
// that would produce it (the same share of its tiles, as if output row r fed input value r)
// have been counted done, so that a block starts a GEMV's first segments while other blocks
// still finish the previous GEMV's last tiles; CHAIN_FLOW_SYNCED takes its input the same way
// and releases each tile unread, so that it measures the dataflow's waits without the
// arithmetic. A lane sums its chunks in the same order as in CHAIN_DOT, so the outputs are the
// same bits.
//
// Counting a tile done takes a GPU-scope release after its rows' stores. A form in which every
// consumer warp released its own row and counted it on a counter a tile (fifty-first session)
// was slower than the grid barriers even launched once per GEMV, where nothing waits: each
// release stalled its warp, and a waiting warp read its tiles' counters one acquire at a time.
// So a warp of its own (the signaller) counts the block's tiles: each consumer warp publishes
// how many tiles it has finished in shared memory (a CTA-scope release after its row's store),
// and the signaller, seeing every warp past some tiles, makes one GPU-scope fence for all of
// them and stores how many of the GEMV's tiles its block has finished; a waiting warp reads
// every block's count at once (relaxed) and reads them with acquire once they suffice. The
// causality runs store -> CTA release -> signaller's fence -> its count -> the waiter's
// acquire -> its block barrier. No consumer waits on a fence. Measured (fifty-second session,
// bench/results/cuda-h200.md): still slower than the grid barriers in every form, even launched
// once per GEMV and without the signaller's fences: a GEMV's segments each add round trips to
// L2 (the counts' look, their acquire, the staging) to its first tile, where the barrier form
// pays one barrier a GEMV.

// CHAIN_BIN multiplies as the decode's binary GEMVs (gemv_b1.cu) do, so that
// the chain is measured with the decode kernels' arithmetic rather than the row-a-warp dp4a
// sums: warp w takes chunks w, w + CH_WARPS, … of every row of a tile by binary MMAs against
// the activations' plane words (built once a GEMV from the input, kept in registers), leaves
// its partial sums of the tile's 16 rows in shared memory, and after a barrier of the consumers
// warp 0 adds the warps' sums in order and writes the rows. The sums run in another order than
// the decode kernel's (16 warps where it has 8), so the LM head is compared with it within a
// tolerance rather than bit for bit. A tile's rows are copied one by one, each padded by 16
// bytes, so that a fragment's lanes (row g, word t) fall in 32 different banks.
//
// ABLATE_FENCE (`NIWAKI_CUDA_ABLATE=fence`, a measurement only) leaves the signaller's fence
// out, so that the time says what the fences cost.
//
// Where `stats` is not null each block leaves CH_STATS counters there, saying where its warps
// waited; without it the clocks are not read.

// CH_WARPS, CH_SLOTS and CH_STATS come from the host (plan::CHAIN_WARPS, plan::CHAIN_SLOTS,
// plan::CHAIN_STATS).
#if !defined(CH_WARPS) || !defined(CH_SLOTS) || !defined(CH_STATS)
#error "CH_WARPS, CH_SLOTS and CH_STATS must be defined by the host"
#endif

#define CHAIN_DOT 0
#define CHAIN_SYNCED 1
#define CHAIN_FREE 2
#define CHAIN_FLOW 3
#define CHAIN_FLOW_SYNCED 4
#define CHAIN_BIN 5
// stats[block * CH_STATS + i]: [0] cycles the producer waited for room in the ring, [1] the
// tiles it issued (a count), [2] cycles thread 0 (consumer warp 0) spent between GEMVs in the
// consumers' block barriers and the grid barrier, [3] in staging the activations, [4] waiting
// for tiles, [5] the block's ns by the global timer and [6] its cycles, start to end, [7] the
// signaller's fences (CHAIN_FLOW modes: tiles / fences is how many tiles a fence counted).

// The multiprocessor's cycle counter where `on`, else 0 (no read in the timed launches).
__device__ __forceinline__ u64 clk(bool on) {
    u64 c = 0;
    if (on) asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
    return c;
}

struct ChainGemv {
    const unsigned char* codes;
    const unsigned char* scales;
    const uint4* xq;
    const float2* xs;
    float* out;
    int rows;
    int cols;
    int accumulate;
};

// The flow modes' counts: done[g * gridDim.x + b] is epoch << DONE_SHIFT | the tiles of GEMV g
// block b has finished, stored by b's signaller (a block's tiles of a GEMV: t = b, b + grid, ...,
// so at most 4095 of them, and 2^20 launches before the epoch wraps).
#define DONE_SHIFT 12

// One warp's wait until every block has finished its tiles below `hi` of the GEMV whose counts
// are `done`: relaxed loads of every block's count at once, a pause between looks, then each
// count read again with acquire (which orders the block's later loads without waiting, as a
// fence would, for the warp's own stores still in flight). A count that never comes stops the
// kernel rather than hanging it.
__device__ __forceinline__ void wait_done(const u32* done, int hi, u32 epoch, int lane) {
    const int grid = (int)gridDim.x;
    u32 spins = 0;
    for (;;) {
        bool ok = true;
        for (int b = lane; b < grid; b += 32) {
            const u32 need = hi > b ? (u32)((hi - b + grid - 1) / grid) : 0u;
            u32 seen;
            asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(done + b) : "memory");
            if (need != 0 && seen < (epoch << DONE_SHIFT | need)) ok = false;
        }
        if (__all_sync(0xffffffffu, ok)) break;
        if (++spins == (1u << 26)) __trap();
        __nanosleep(64);
    }
    for (int b = lane; b < grid; b += 32)
        if (hi > b) (void)count_acquire(done + b);
    __syncwarp();
}

// Chunks [c_lo, c_hi) of a GEMV's activations (`chunks` in all) into shared memory, piece-major
// as to_piece_major puts them (unless CODES is false: CHAIN_BIN takes its plane words from the
// codes in global memory), with their groups' (d, d*sum q) pairs; the consumer threads share
// the copy.
template <int CV, int P, bool CODES = true>
__device__ __forceinline__ void stage_chunks(uint4* xsm, float2* ssm, const ChainGemv& m, int chunks, int c_lo,
                                             int c_hi, int tid) {
    if (CODES)
        for (int idx = c_lo * P + tid; idx < c_hi * P; idx += CH_WARPS * 32)
            xsm[piece_major_slot<P>(idx, chunks)] = m.xq[idx];
    for (int i = c_lo * CV / 64 + tid; i < c_hi * CV / 64; i += CH_WARPS * 32) ssm[i] = m.xs[i];
}

__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(CH_WARPS * 32) : "memory");
}

// A consumer warp's count of finished tiles, after its row's store (the same thread's).
__device__ __forceinline__ void publish_done(u32* progress, u32 tiles) {
    asm volatile("st.release.cta.shared.u32 [%0], %1;" ::"r"(smem_addr(progress)), "r"(tiles) : "memory");
}

// The fewest tiles any consumer warp has finished (the signaller's single thread; a relaxed
// read, which the GPU-scope fence after it makes an acquire).
__device__ __forceinline__ u32 tiles_done(const u32* progress) {
    u32 least = 0xffffffffu;
#pragma unroll
    for (int w = 0; w < CH_WARPS; w++) {
        u32 v;
        asm volatile("ld.relaxed.cta.shared.u32 %0, [%1];" : "=r"(v) : "r"(smem_addr(progress + w)) : "memory");
        least = min(least, v);
    }
    return least;
}

#if __CUDA_ARCH__ >= 900
// CHAIN_BIN's bytes from one row of a tile to the next in shared memory.
__device__ __forceinline__ u32 bin_row_stride(int chunks) { return (u32)chunks * 16 + 16; }

// CHAIN_BIN's arithmetic, the decode's binary GEMVs' a chunk (gemv_b1.cu): `fetch` loads a
// lane's activation codes of a chunk and `set` makes them the chunk's plane words (bin_load,
// once a GEMV), `chunk` forms a chunk's terms of rows g and g + 8 against them before the rows'
// scales (the activations' pairs (d, d·Σq) in `ssm`); bin_tile sums them over the warp's chunks.
template <int FMT>
struct BinChain;

// A tile is one MMA row group (rows g and g + 8 of a quad's lanes), a row a consumer warp in
// warp 0's sums.
static_assert(CH_WARPS == 16, "CHAIN_BIN's tiles are 16 rows");

// A lane's view of a CHAIN_BIN tile in shared memory: word t of rows g and g + 8 of each chunk
// and their scales, and the lane's part of the planes' weights as the decode kernels take it
// (planes 2t and 2t + 1 weigh 2^2t and 2^(2t+1), the sign plane −128; Σq enters a row's sum
// once, through lane t = 0).
struct BinTile {
    const unsigned char* a;
    const u16* dp;
    u32 rs;
    int chunks, t, sgn;
    float ysel;

    __device__ __forceinline__ BinTile(const unsigned char* st, int chunks_, int lane)
        : rs(bin_row_stride(chunks_)), chunks(chunks_), t(lane & 3) {
        const int g = lane >> 2;
        a = st + g * rs + 4 * t;
        dp = (const u16*)(st + CH_WARPS * rs) + g * chunks;
        sgn = t == 3 ? -2 : 2;
        ysel = t == 0 ? 1.0f : 0.0f;
    }

    // Chunk c's words of rows g and g + 8.
    __device__ __forceinline__ void words(int c, u32& a0, u32& a1) const {
        a0 = *(const u32*)(a + c * 16);
        a1 = *(const u32*)(a + 8 * rs + c * 16);
    }

    // Chunk c's scales of rows g and g + 8.
    __device__ __forceinline__ float2 scales(int c) const {
        return make_float2(h2f(dp[c]), h2f(dp[8 * chunks + c]));
    }
};

// Both rows' sums over a quad's four lanes.
__device__ __forceinline__ float2 quad_sums(float acc0, float acc1) {
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
    return make_float2(acc0, acc1);
}

template <>
struct BinChain<FMT_Q1> {
    // ffn_down's 17408 columns are 136 1-bit chunks: 9 a warp at most.
    static constexpr int J = 9;
    // Plane g of the lane's 32 values, in the MMA of the chunk's group that holds them (lanes
    // t < 2: the first 64 values), a zero in the other's.
    u32 blo[J], bhi[J];

    // The lane's 32 activation bytes of chunk c (values 32t … 32t + 31).
    struct Input {
        uint4 lo, hi;
    };
    __device__ __forceinline__ static Input fetch(const uint4* __restrict__ xq, int c, int t) {
        return Input{xq[c * 8 + 2 * t], xq[c * 8 + 2 * t + 1]};
    }
    __device__ __forceinline__ void set(int j, const Input& x, bool valid, int g, int t) {
        const u32 b = valid ? plane_word(x.lo, x.hi, g) : 0u;
        blo[j] = t < 2 ? b : 0u;
        bhi[j] = t < 2 ? 0u : b;
    }

    // Chunk j's (c's) terms of rows g and g + 8 before their scales, as gemv_b1's consumers
    // form them (the group's 2 of 2·Σ − Σq in k2).
    __device__ __forceinline__ float2 chunk(const BinTile& v, const float2* ssm, int c, int j) const {
        const float4 sc = ((const float4*)ssm)[c];
        const float y = v.ysel * (sc.y + sc.w);
        const float k2 = (float)(2 << (2 * v.t));
        u32 a0, a1;
        v.words(c, a0, a1);
        int lo[4], hi[4];
        bmma_and_popc(lo, a0, a1, blo[j]);
        bmma_and_popc(hi, a0, a1, bhi[j]);
        const float f0 = sc.x * (float)(lo[0] + v.sgn * lo[1]) + sc.z * (float)(hi[0] + v.sgn * hi[1]);
        const float f1 = sc.x * (float)(lo[2] + v.sgn * lo[3]) + sc.z * (float)(hi[2] + v.sgn * hi[3]);
        return make_float2(k2 * f0 - y, k2 * f1 - y);
    }
};

template <>
struct BinChain<FMT_Q2G64> {
    // ffn_down's 17408 columns are 272 2-bit chunks: 17 a warp at most.
    static constexpr int J = 17;
    // Plane g of the lane's 16 values, each twice (plane_word2).
    u32 bw[J];

    // The lane's 16 activation bytes of chunk c (values 16t … 16t + 15).
    using Input = uint4;
    __device__ __forceinline__ static Input fetch(const uint4* __restrict__ xq, int c, int t) { return xq[c * 4 + t]; }
    __device__ __forceinline__ void set(int j, const Input& x, bool valid, int g, int t) {
        bw[j] = valid ? plane_word2(x, g) : 0u;
    }

    // Chunk j's (c's) terms of rows g and g + 8 before their scales, as b2_consume's default
    // (one MMA of k = 256 a chunk) forms them.
    __device__ __forceinline__ float2 chunk(const BinTile& v, const float2* ssm, int c, int j) const {
        const float2 sc = ssm[c];
        const float ks = (float)(1 << (2 * v.t)) * sc.x, y = v.ysel * sc.y;
        u32 a0, a1;
        v.words(c, a0, a1);
        int n[4];
        bmma256_and_popc(n, a0, a1, a0, a1, bw[j] & 0xAAAAAAAAu, bw[j]);
        return make_float2(ks * (float)(n[0] + v.sgn * n[1]) - y, ks * (float)(n[2] + v.sgn * n[3]) - y);
    }
};

// Warp `warp`'s plane words of the input `xq`, built once a GEMV, the loads of three chunks in
// flight at once.
template <int FMT>
__device__ __forceinline__ void bin_load(BinChain<FMT>& bin, const uint4* __restrict__ xq, int chunks, int warp,
                                         int lane) {
    constexpr int J = BinChain<FMT>::J, BATCH = 3;
    // A wider row would lose its last chunks: stop rather than multiply part of it.
    if (chunks > CH_WARPS * J) __trap();
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j0 = 0; j0 < J; j0 += BATCH) {
        typename BinChain<FMT>::Input x[BATCH];
#pragma unroll
        for (int j = j0; j < j0 + BATCH && j < J; j++)
            x[j - j0] = BinChain<FMT>::fetch(xq, min(warp + CH_WARPS * j, chunks - 1), t);
#pragma unroll
        for (int j = j0; j < j0 + BATCH && j < J; j++) bin.set(j, x[j - j0], warp + CH_WARPS * j < chunks, g, t);
    }
}

// Warp `warp`'s sums of its chunks of a tile's rows g and g + 8 (lane g·4 + t holds them after
// the quad's sums), each chunk's terms weighed by its row scales as the decode kernels do.
template <int FMT>
__device__ __forceinline__ float2 bin_tile(const BinChain<FMT>& bin, const unsigned char* st, const float2* ssm,
                                           int chunks, int warp, int lane) {
    const BinTile v(st, chunks, lane);
    float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll
    for (int j = 0; j < BinChain<FMT>::J; j++) {
        const int c = warp + CH_WARPS * j;
        if (c < chunks) {
            const float2 f = bin.chunk(v, ssm, c, j);
            const float2 d = v.scales(c);
            acc0 += d.x * f.x;
            acc1 += d.y * f.y;
        }
    }
    return quad_sums(acc0, acc1);
}

// The producer's side of a byte ring of tiles of differing sizes, `SLOTS` tiles at most:
// positions only grow, and tile k takes the next `bytes` of the ring (skipping its end where
// they do not fit), once the tiles it overwrites are consumed (each tile's `empty` barrier, in
// the order the consumers take them).
template <int SLOTS>
struct ByteRing {
    u32 head = 0, freed = 0;
    u32 ends[SLOTS];
    int oldest = 0;

    // Where tile k goes (an offset into the ring), waiting for the room.
    __device__ __forceinline__ u32 claim(int k, u32 bytes, u32 ring_bytes, u64* empty) {
        u32 start = head;
        if (start % ring_bytes + bytes > ring_bytes) start += ring_bytes - start % ring_bytes;
        while (oldest <= k - SLOTS || (oldest < k && start + bytes - freed > ring_bytes)) {
            mbar_wait(smem_addr(&empty[oldest % SLOTS]), (u32)(oldest / SLOTS) & 1u);
            freed = ends[oldest % SLOTS];
            oldest++;
        }
        ends[k % SLOTS] = start + bytes;
        head = start + bytes;
        return start % ring_bytes;
    }
};

template <int FMT, int MODE>
__device__ __forceinline__ void chain_body(const ChainGemv* __restrict__ gs, int ng, int x_bytes,
                                           int ring_bytes, u32* __restrict__ count, u64* __restrict__ stats,
                                           u32* __restrict__ done, const u32* __restrict__ epoch) {
    const bool on = stats != nullptr;
    const u64 c_start = clk(on), t_start = on ? global_ns() : 0;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) u64 full[CH_SLOTS];
    __shared__ __align__(8) u64 empty[CH_SLOTS];
    __shared__ u32 slot_off[CH_SLOTS];
    // Tiles each consumer warp has finished, its row stored (the CHAIN_FLOW modes).
    __shared__ u32 progress[CH_WARPS];
    constexpr bool FLOW = MODE == CHAIN_FLOW || MODE == CHAIN_FLOW_SYNCED;
    constexpr int CV = FMT == FMT_Q1 ? 128 : 64;
    constexpr int P = CV / 16;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    uint4* xsm = (uint4*)smem;
    unsigned char* ring = smem + x_bytes;

    if (tid == 0) {
        for (int s = 0; s < CH_SLOTS; s++) {
            mbar_init(smem_addr(&full[s]), 1);
            mbar_init(smem_addr(&empty[s]), CH_WARPS);
        }
        for (int w = 0; w < CH_WARPS; w++) progress[w] = 0;
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // The weights depend on nothing: the producer streams them before the previous kernel ends.
    pdl_launch();

    if (warp == CH_WARPS) {
        if (lane != 0) return;
        ByteRing<CH_SLOTS> r;
        int k = 0;
        u64 waited = 0;
        for (int g = 0; g < ng; g++) {
            const ChainGemv m = gs[g];
            const int chunks = m.cols / CV;
            const u32 code_bytes = (u32)CH_WARPS * chunks * 16, scale_bytes = (u32)CH_WARPS * chunks * 2;
            // CHAIN_BIN pads each row (bin_row_stride).
            const u32 row_bytes = (u32)chunks * 16;
            const u32 code_room = MODE == CHAIN_BIN ? (u32)CH_WARPS * bin_row_stride(chunks) : code_bytes;
            const u32 bytes = (code_room + scale_bytes + 127) & ~127u;
            const int ntiles = (m.rows + CH_WARPS - 1) / CH_WARPS;
            for (int t = blockIdx.x; t < ntiles; t += gridDim.x, k++) {
                const int s = k % CH_SLOTS;
                const u64 c0 = clk(on);
                const u32 off = r.claim(k, bytes, (u32)ring_bytes, empty);
                waited += clk(on) - c0;
                slot_off[s] = off;
                const u32 bar = smem_addr(&full[s]);
                const u32 dst = smem_addr(ring + off);
                mbar_expect_tx(bar, code_bytes + scale_bytes);
                const unsigned char* src = m.codes + (size_t)t * code_bytes;
                if (MODE == CHAIN_BIN) {
                    for (int r = 0; r < CH_WARPS; r++)
                        bulk_g2s(dst + r * bin_row_stride(chunks), src + r * row_bytes, row_bytes, bar);
                } else {
                    bulk_g2s(dst, src, code_bytes, bar);
                }
                bulk_g2s(dst + code_room, m.scales + (size_t)t * scale_bytes, scale_bytes, bar);
            }
        }
        if (stats) {
            stats[blockIdx.x * CH_STATS + 0] = waited;
            stats[blockIdx.x * CH_STATS + 1] = (u64)k;
        }
        return;
    }

    if (warp == CH_WARPS + 1) {
        // The signaller: the block's tiles in the consumers' order, each counted once every
        // consumer warp is past it, one fence for all that a look finds done.
        if (lane != 0) return;
        if (!FLOW) {
            if (stats) stats[blockIdx.x * CH_STATS + 7] = 0;
            return;
        }
        pdl_wait();
        const u32 tag = *epoch << DONE_SHIFT;
        u32 seen = 0, k = 0;
        u64 fences = 0;
        for (int g = 0; g < ng; g++) {
            const ChainGemv m = gs[g];
            const int ntiles = (m.rows + CH_WARPS - 1) / CH_WARPS;
            u32 in_gemv = 0;
            for (int t = blockIdx.x; t < ntiles; t += gridDim.x, k++) {
                if (k >= seen) {
                    u32 spins = 0;
                    while ((seen = tiles_done(progress)) <= k) {
                        if (++spins == (1u << 26)) __trap();
                        __nanosleep(20);
                    }
#ifndef ABLATE_FENCE
                    asm volatile("fence.acq_rel.gpu;" ::: "memory");
#endif
                    fences++;
                }
                in_gemv++;
                asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(done + g * gridDim.x + blockIdx.x),
                             "r"(tag | in_gemv)
                             : "memory");
            }
        }
        if (stats) stats[blockIdx.x * CH_STATS + 7] = fences;
        return;
    }

    pdl_wait();
    int k = 0;
    u64 in_barrier = 0, in_staging = 0, in_wait = 0;
    // This launch's epoch (raised before it), which its counts carry.
    const u32 epoch_now = FLOW ? *epoch : 0u;
    // CHAIN_BIN: the warp's plane words of the current GEMV, and the warps' partial sums of a
    // tile's rows (two tiles' worth, so that one barrier a tile keeps the writes of the next
    // from the reads of this one), after the ring.
    BinChain<FMT> bin;
    float(*part)[CH_WARPS][16] = (float(*)[CH_WARPS][16])(ring + ring_bytes);
    for (int g = 0; g < ng; g++) {
        const ChainGemv m = gs[g];
        const int chunks = m.cols / CV;
        const u32 code_bytes = (u32)CH_WARPS * chunks * 16;
        const u64 c0 = clk(on);
        if (g > 0 && MODE != CHAIN_FREE && !FLOW) {
            // Every block done with the previous GEMV (whose output this one's input would be).
            consumers_sync();
            if (tid == 0) grid_arrive_wait(count, gridDim.x * (u32)g);
            consumers_sync();
        }
        const u64 c1 = clk(on);
        float2* ssm = (float2*)(smem + m.cols);
        // CHAIN_FLOW's segments staged so far in this GEMV (the others stage before the tiles).
        int staged = 0;
        if (MODE == CHAIN_DOT || MODE == CHAIN_SYNCED || MODE == CHAIN_BIN) {
            stage_chunks<CV, P, MODE != CHAIN_BIN>(xsm, ssm, m, chunks, 0, chunks, tid);
            if (MODE == CHAIN_BIN) bin_load(bin, m.xq, chunks, warp, lane);
            consumers_sync();
        }
        in_barrier += c1 - c0;
        in_staging += clk(on) - c1;
        const int ntiles = (m.rows + CH_WARPS - 1) / CH_WARPS;
        for (int t = blockIdx.x; t < ntiles; t += gridDim.x, k++) {
            const int s = k % CH_SLOTS;
            const u64 w0 = clk(on);
            mbar_wait(smem_addr(&full[s]), (u32)(k / CH_SLOTS) & 1u);
            in_wait += clk(on) - w0;
            const unsigned char* st = ring + slot_off[s];
            if constexpr (MODE == CHAIN_BIN) {
                const int row = t * CH_WARPS + lane;
                const bool writes = warp == 0 && lane < CH_WARPS && row < m.rows;
                // The row's earlier value, where the product adds to it, asked for before the
                // tile's arithmetic, so that its round trip to L2 overlaps it (as b1_produce).
                const float prior = writes && m.accumulate ? m.out[row] : 0.0f;
                const float2 r = bin_tile(bin, st, ssm, chunks, warp, lane);
                __syncwarp();
                if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
                if ((lane & 3) == 0) {
                    part[k & 1][warp][lane >> 2] = r.x;
                    part[k & 1][warp][(lane >> 2) + 8] = r.y;
                }
                consumers_sync();
                if (writes) {
                    float v = 0.0f;
#pragma unroll
                    for (int w = 0; w < CH_WARPS; w++) v += part[k & 1][w][lane];
                    m.out[row] = m.accumulate ? v + prior : v;
                }
                continue;
            }
            const uint4* wc = (const uint4*)st + (size_t)warp * chunks;
            const u16* ws = (const u16*)(st + code_bytes) + warp * chunks;
            float acc = 0.0f;
            if (MODE == CHAIN_DOT) {
                for (int c = lane; c < chunks; c += 32) acc += smem_row_dot<FMT>(xsm, ssm, chunks, c, wc[c], h2f(ws[c]));
            } else if (FLOW) {
                const int prev_tiles = g > 0 ? (gs[g - 1].rows + CH_WARPS - 1) / CH_WARPS : 0;
                for (int sg = 0; sg * 32 < chunks; sg++) {
                    const int c_lo = sg * 32, c_hi = min(chunks, c_lo + 32);
                    if (sg == staged) {
                        // The block's first tile of this GEMV: the segment's input, once its
                        // producers are counted (every consumer warp is past the previous
                        // GEMV when the first barrier lets them on).
                        const u64 b0 = clk(on);
                        if (g > 0 && warp == 0)
                            wait_done(done + (g - 1) * gridDim.x, (c_hi * prev_tiles + chunks - 1) / chunks,
                                      epoch_now, lane);
                        consumers_sync();
                        const u64 b1 = clk(on);
                        stage_chunks<CV, P>(xsm, ssm, m, chunks, c_lo, c_hi, tid);
                        consumers_sync();
                        staged++;
                        in_barrier += b1 - b0;
                        in_staging += clk(on) - b1;
                    }
                    // The lane's chunk of the segment, in CHAIN_DOT's order.
                    const int c = c_lo + lane;
                    if (MODE == CHAIN_FLOW && c < c_hi) acc += smem_row_dot<FMT>(xsm, ssm, chunks, c, wc[c], h2f(ws[c]));
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
            acc = warp_sum(acc);
            const int row = t * CH_WARPS + warp;
            if (lane == 0 && row < m.rows) m.out[row] = m.accumulate ? acc + m.out[row] : acc;
            if (FLOW && lane == 0) publish_done(&progress[warp], (u32)k + 1);
        }
    }
    if (stats && tid == 0) {
        u64* b = stats + blockIdx.x * CH_STATS;
        b[2] = in_barrier;
        b[3] = in_staging;
        b[4] = in_wait;
        b[5] = global_ns() - t_start;
        b[6] = clk(on) - c_start;
    }
}
#define CHAIN_CALL(FMT, MODE) chain_body<FMT, MODE>(gs, ng, x_bytes, ring_bytes, count, stats, done, epoch)
#else
#define CHAIN_CALL(FMT, MODE) __trap()
#endif

#define CHAIN_KERNEL(name, FMT, MODE)                                                               \
    ENTRY __global__ void __launch_bounds__(32 * (CH_WARPS + 2), 1)                           \
        name(const ChainGemv* __restrict__ gs, int ng, int x_bytes, int ring_bytes,               \
             u32* __restrict__ count, u64* __restrict__ stats, u32* __restrict__ done,              \
             const u32* __restrict__ epoch) {                                                      \
        CHAIN_CALL(FMT, MODE);                                                                     \
    }

CHAIN_KERNEL(gemv_chain_q1, FMT_Q1, CHAIN_DOT)
CHAIN_KERNEL(gemv_chain_q2g64, FMT_Q2G64, CHAIN_DOT)
CHAIN_KERNEL(gemv_chain_q1_synced, FMT_Q1, CHAIN_SYNCED)
CHAIN_KERNEL(gemv_chain_q2g64_synced, FMT_Q2G64, CHAIN_SYNCED)
CHAIN_KERNEL(gemv_chain_q1_free, FMT_Q1, CHAIN_FREE)
CHAIN_KERNEL(gemv_chain_q2g64_free, FMT_Q2G64, CHAIN_FREE)
CHAIN_KERNEL(gemv_chain_q1_flow, FMT_Q1, CHAIN_FLOW)
CHAIN_KERNEL(gemv_chain_q2g64_flow, FMT_Q2G64, CHAIN_FLOW)
CHAIN_KERNEL(gemv_chain_q1_flow_synced, FMT_Q1, CHAIN_FLOW_SYNCED)
CHAIN_KERNEL(gemv_chain_q2g64_flow_synced, FMT_Q2G64, CHAIN_FLOW_SYNCED)
CHAIN_KERNEL(gemv_chain_q1_bin, FMT_Q1, CHAIN_BIN)
CHAIN_KERNEL(gemv_chain_q2g64_bin, FMT_Q2G64, CHAIN_BIN)

// A launch of CHAIN_FLOW's chain (or of each of its GEMVs) first raises the epoch by one, once
// the launch before has ended (its blocks read the epoch at their start).
ENTRY __global__ void gemv_chain_epoch(u32* epoch) {
    PDL_ENTRY();
    if (threadIdx.x == 0) *epoch += 1;
}
