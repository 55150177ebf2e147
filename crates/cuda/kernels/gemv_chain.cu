// A probe for a persistent decode step: several one-token GEMVs in one launch, every block
// resident for the whole launch. The producer warp streams the tiles of one GEMV after the
// other into a ring of shared memory, running on into the next GEMV's weights (which depend on
// nothing) while the consumers still multiply the current one; the consumers cross a grid-wide
// barrier between GEMVs, as a decode step's dependences would make them (each GEMV's input
// comes from the previous one's output through a norm or the recurrence). Launched once per
// GEMV, the same kernel is the kernel-per-GEMV baseline: the harness times both on a decode
// step's matrices to measure what the launch boundaries cost.
//
// One row per consumer warp (W rows a tile: CH_WARPS, or 8 for the kernels of several blocks a
// multiprocessor), lanes over the row's chunks as gemv_body (the same bits as gemv_t1). Both
// formats have a scale per chunk.
//
// The barrier count must be zero at the launch (the harness zeroes it in the same graph). Tiles
// differ in size from one GEMV to the next, so the ring is a byte buffer (ByteRing).

// CH_WARPS and CH_SLOTS come from the host (plan::CHAIN_WARPS, plan::CHAIN_SLOTS).
#if !defined(CH_WARPS) || !defined(CH_SLOTS)
#error "CH_WARPS and CH_SLOTS must be defined by the host"
#endif

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

template <int W>
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(W * 32) : "memory");
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

template <int FMT, bool DOT, int W>
__device__ __forceinline__ void chain_body(const ChainGemv* __restrict__ gs, int ng, int x_bytes,
                                           int ring_bytes, u32* __restrict__ count) {
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
            mbar_init(smem_addr(&empty[s]), W);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // The weights depend on nothing: the producer streams them before the previous kernel ends.
    pdl_launch();

    if (warp == W) {
        if (lane != 0) return;
        ByteRing<CH_SLOTS> r;
        int k = 0;
        for (int g = 0; g < ng; g++) {
            const ChainGemv m = gs[g];
            const int chunks = m.cols / CV;
            const u32 code_bytes = (u32)W * chunks * 16, scale_bytes = (u32)W * chunks * 2;
            const u32 bytes = (code_bytes + scale_bytes + 127) & ~127u;
            const int ntiles = (m.rows + W - 1) / W;
            for (int t = blockIdx.x; t < ntiles; t += gridDim.x, k++) {
                const int s = k % CH_SLOTS;
                const u32 off = r.claim(k, bytes, (u32)ring_bytes, empty);
                slot_off[s] = off;
                const u32 bar = smem_addr(&full[s]);
                const u32 dst = smem_addr(ring + off);
                mbar_expect_tx(bar, code_bytes + scale_bytes);
                bulk_g2s(dst, m.codes + (size_t)t * code_bytes, code_bytes, bar);
                bulk_g2s(dst + code_bytes, m.scales + (size_t)t * scale_bytes, scale_bytes, bar);
            }
        }
        return;
    }

    pdl_wait();
    int k = 0;
    for (int g = 0; g < ng; g++) {
        const ChainGemv m = gs[g];
        const int chunks = m.cols / CV, groups = m.cols / 64;
        const u32 code_bytes = (u32)W * chunks * 16;
        if (g > 0) {
            // Every block done with the previous GEMV (whose output this one's input would be).
            consumers_sync<W>();
            if (tid == 0) grid_arrive_wait(count, gridDim.x * (u32)g);
            consumers_sync<W>();
        }
        float2* ssm = (float2*)(smem + m.cols);
        to_piece_major<P>(xsm, m.xq, chunks, tid, W * 32);
        for (int i = tid; i < groups; i += W * 32) ssm[i] = m.xs[i];
        consumers_sync<W>();
        const int ntiles = (m.rows + W - 1) / W;
        for (int t = blockIdx.x; t < ntiles; t += gridDim.x, k++) {
            const int s = k % CH_SLOTS;
            mbar_wait(smem_addr(&full[s]), (u32)(k / CH_SLOTS) & 1u);
            const unsigned char* st = ring + slot_off[s];
            const uint4* wc = (const uint4*)st + (size_t)warp * chunks;
            const u16* ws = (const u16*)(st + code_bytes) + warp * chunks;
            float acc = 0.0f;
            if (DOT) {
                for (int c = lane; c < chunks; c += 32) acc += smem_row_dot<FMT>(xsm, ssm, chunks, c, wc[c], h2f(ws[c]));
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
            acc = warp_sum(acc);
            const int row = t * W + warp;
            if (lane == 0 && row < m.rows) m.out[row] = m.accumulate ? acc + m.out[row] : acc;
        }
    }
}
#define CHAIN_CALL(FMT, DOT, W) chain_body<FMT, DOT, W>(gs, ng, x_bytes, ring_bytes, count)
#else
#define CHAIN_CALL(FMT, DOT, W) __trap()
#endif

// MINB: the blocks a multiprocessor is meant to hold (their registers must fit beside).
#define CHAIN_KERNEL(name, FMT, DOT, W, MINB)                                                     \
    ENTRY __global__ void __launch_bounds__(32 * (W + 1), MINB)                                  \
        name(const ChainGemv* __restrict__ gs, int ng, int x_bytes, int ring_bytes,               \
             u32* __restrict__ count) {                                                            \
        CHAIN_CALL(FMT, DOT, W);                                                                   \
    }

CHAIN_KERNEL(gemv_chain_q1, FMT_Q1, true, CH_WARPS, 1)
CHAIN_KERNEL(gemv_chain_q2g64, FMT_Q2G64, true, CH_WARPS, 1)
CHAIN_KERNEL(gemv_chain_q1_nodot, FMT_Q1, false, CH_WARPS, 1)
CHAIN_KERNEL(gemv_chain_q2g64_nodot, FMT_Q2G64, false, CH_WARPS, 1)
CHAIN_KERNEL(gemv_chain_q1_w8, FMT_Q1, true, 8, 4)
CHAIN_KERNEL(gemv_chain_q2g64_w8, FMT_Q2G64, true, 8, 4)
CHAIN_KERNEL(gemv_chain_q1_nodot_w8, FMT_Q1, false, 8, 4)
CHAIN_KERNEL(gemv_chain_q2g64_nodot_w8, FMT_Q2G64, false, 8, 4)
