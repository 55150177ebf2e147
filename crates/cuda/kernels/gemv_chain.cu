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
// alone. Where `stats` is not null each block leaves CH_STATS counters there, saying where its
// warps waited; without it the clocks are not read.
//
// Forms measured and removed (bench/results/cuda-h200.md, the fifty-first to fifty-third
// sessions; their code is at commit 4f239cd): each GEMV's input taken by segments as the
// previous GEMV's tiles are counted done, in place of the grid barrier, and the consumers
// multiplying with the decode kernels' binary MMAs. Both were right and slower than the grid
// barrier, which was itself slower than the decode GEMVs launched one by one.

// CH_WARPS, CH_SLOTS and CH_STATS come from the host (plan::CHAIN_WARPS, plan::CHAIN_SLOTS,
// plan::CHAIN_STATS).
#if !defined(CH_WARPS) || !defined(CH_SLOTS) || !defined(CH_STATS)
#error "CH_WARPS, CH_SLOTS and CH_STATS must be defined by the host"
#endif

#define CHAIN_DOT 0
#define CHAIN_SYNCED 1
#define CHAIN_FREE 2
// stats[block * CH_STATS + i]: [0] cycles the producer waited for room in the ring, [1] the
// tiles it issued (a count), [2] cycles thread 0 (consumer warp 0) spent between GEMVs in the
// consumers' block barriers and the grid barrier, [3] in staging the activations, [4] waiting
// for tiles, [5] the block's ns by the global timer and [6] its cycles, start to end.

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
    int pad;
};

__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(CH_WARPS * 32) : "memory");
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
                                           int ring_bytes, u32* __restrict__ count, u64* __restrict__ stats) {
    const bool on = stats != nullptr;
    const u64 c_start = clk(on), t_start = on ? global_ns() : 0;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) u64 full[CH_SLOTS];
    __shared__ __align__(8) u64 empty[CH_SLOTS];
    __shared__ u32 slot_off[CH_SLOTS];
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

    pdl_wait();
    int k = 0;
    u64 in_barrier = 0, in_staging = 0, in_wait = 0;
    for (int g = 0; g < ng; g++) {
        const ChainGemv m = gs[g];
        const int chunks = m.cols / CV, groups = m.cols / 64;
        const u32 code_bytes = (u32)CH_WARPS * chunks * 16;
        const u64 c0 = clk(on);
        if (g > 0 && MODE != CHAIN_FREE) {
            // Every block done with the previous GEMV (whose output this one's input would be).
            consumers_sync();
            if (tid == 0) grid_arrive_wait(count, gridDim.x * (u32)g);
            consumers_sync();
        }
        const u64 c1 = clk(on);
        float2* ssm = (float2*)(smem + m.cols);
        if (MODE != CHAIN_FREE) {
            to_piece_major<P>(xsm, m.xq, chunks, tid, CH_WARPS * 32);
            for (int i = tid; i < groups; i += CH_WARPS * 32) ssm[i] = m.xs[i];
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
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
            acc = warp_sum(acc);
            const int row = t * CH_WARPS + warp;
            if (lane == 0 && row < m.rows) m.out[row] = m.accumulate ? acc + m.out[row] : acc;
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
#define CHAIN_CALL(FMT, MODE) chain_body<FMT, MODE>(gs, ng, x_bytes, ring_bytes, count, stats)
#else
#define CHAIN_CALL(FMT, MODE) __trap()
#endif

#define CHAIN_KERNEL(name, FMT, MODE)                                                               \
    ENTRY __global__ void __launch_bounds__(32 * (CH_WARPS + 1), 1)                           \
        name(const ChainGemv* __restrict__ gs, int ng, int x_bytes, int ring_bytes,               \
             u32* __restrict__ count, u64* __restrict__ stats) {                                   \
        CHAIN_CALL(FMT, MODE);                                                                     \
    }

CHAIN_KERNEL(gemv_chain_q1, FMT_Q1, CHAIN_DOT)
CHAIN_KERNEL(gemv_chain_q2g64, FMT_Q2G64, CHAIN_DOT)
CHAIN_KERNEL(gemv_chain_q1_synced, FMT_Q1, CHAIN_SYNCED)
CHAIN_KERNEL(gemv_chain_q2g64_synced, FMT_Q2G64, CHAIN_SYNCED)
CHAIN_KERNEL(gemv_chain_q1_free, FMT_Q1, CHAIN_FREE)
CHAIN_KERNEL(gemv_chain_q2g64_free, FMT_Q2G64, CHAIN_FREE)
