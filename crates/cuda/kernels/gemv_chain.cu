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
// (the same bits as gemv_t1). Both formats have a scale per chunk.
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
// as to_piece_major puts them, with their groups' (d, d*sum q) pairs; the consumer threads share
// the copy.
template <int CV, int P>
__device__ __forceinline__ void stage_chunks(uint4* xsm, float2* ssm, const ChainGemv& m, int chunks, int c_lo,
                                             int c_hi, int tid) {
    for (int idx = c_lo * P + tid; idx < c_hi * P; idx += CH_WARPS * 32) xsm[piece_major_slot<P>(idx, chunks)] = m.xq[idx];
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
            const u32 bytes = (code_bytes + scale_bytes + 127) & ~127u;
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
                bulk_g2s(dst, m.codes + (size_t)t * code_bytes, code_bytes, bar);
                bulk_g2s(dst + code_bytes, m.scales + (size_t)t * scale_bytes, scale_bytes, bar);
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
        if (MODE == CHAIN_DOT || MODE == CHAIN_SYNCED) {
            stage_chunks<CV, P>(xsm, ssm, m, chunks, 0, chunks, tid);
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

// A launch of CHAIN_FLOW's chain (or of each of its GEMVs) first raises the epoch by one, once
// the launch before has ended (its blocks read the epoch at their start).
ENTRY __global__ void gemv_chain_epoch(u32* epoch) {
    PDL_ENTRY();
    if (threadIdx.x == 0) *epoch += 1;
}
