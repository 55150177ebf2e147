// The persistent-step probe with the binary decode GEMVs' consumers (gemv_b1.cu): a decode
// step's GEMVs in one launch, one block a multiprocessor, every block resident for the whole
// launch. What it measures is whether the weight stream and the binary tensor cores' arithmetic
// overlap once the launch boundaries are gone (gemv_chain.cu's consumers, a row a warp, were
// slower than the decode GEMVs').
//
// Warps of a block, each with one job, as the twenty-fifth session's measurements ask (a warp
// that issues the copies does nothing else):
// - the producer (warp 0, lane 0) streams the tiles of one GEMV after the other into a byte
//   ring of shared memory (ByteRing), running on into the next GEMV's weights (which depend on
//   nothing) while the others still work on the current one;
// - the reducer (warp 1) adds each tile's partial sums in warp order (the decode kernels' order:
//   the same bits), writes the rows, frees the tile's bytes, and after the block's last tile of
//   a GEMV arrives on a grid-wide counter;
// - G groups of GEMV1_WARPS consumer warps (warps 2..) take the block's tiles in turn (tile k
//   to group k mod G), each warp multiplying a tile by the plane words of its chunks (b1_tile,
//   b2_tile: the decode kernels' arithmetic) and leaving its partial sums. The decode kernels
//   keep three or four blocks of eight consumer warps on a multiprocessor: more groups keep as
//   much arithmetic in flight.
// The consumers wait for that counter (every block's rows of the previous GEMV written) before
// reading a GEMV's input, as a decode step's dependences would make them.
//
// Tiles are the decode kernels': 16 rows, the codes in boxes of 128 bytes by the tensor map's
// 128-byte swizzle, then the rows' scales. The maps are in global memory, one per GEMV, written
// by the host before the launch; a GEMV's descriptor (gemv_chain.cu's ChainGemv) holds its
// map's address where the codes' would be. The counter must be zero at the launch.

// CB1_SLOTS comes from the host (plan::CHAIN_B1_SLOTS).
#if !defined(CB1_SLOTS)
#error "CB1_SLOTS must be defined by the host"
#endif


// Most activation groups of a GEMV's input (17408 values).
#define CB1_MAX_GROUPS 272

#if __CUDA_ARCH__ >= 900
// A GEMV's tile: its codes' slabs (2048 bytes each) and its scales, in whole 1024-byte units.
template <int FMT>
__device__ __forceinline__ void cb1_tile_bytes(int cols, u32& code_bytes, u32& scale_bytes, u32& bytes) {
    const int chunks = cols / (FMT == FMT_Q1 ? 128 : 64);
    const int scols = FMT == FMT_Q2G128 ? chunks / 2 : chunks;
    code_bytes = (u32)(chunks * 16 + 127) / 128 * 2048;
    scale_bytes = 16u * scols * 2;
    bytes = (code_bytes + scale_bytes + 1023) & ~1023u;
}

// Consumer warp w of group q's share of one GEMV: its plane words (its group pairs in the
// group's `ssm`), then the group's tiles among the block's (k counts all of them).
template <int FMT, int J, int G>
__device__ __forceinline__ void cb1_consume(const ChainGemv& m, int w, int q, const unsigned char* ring,
                                            const u32* slot_off, u64* full, u64* done,
                                            float (*part)[GEMV1_WARPS][16], float2* ssm, int& k, bool dot) {
    const int lane = threadIdx.x & 31;
    const int chunks = m.cols / (FMT == FMT_Q1 ? 128 : 64);
    const int scols = FMT == FMT_Q2G128 ? chunks / 2 : chunks;
    u32 code_bytes, scale_bytes, bytes;
    cb1_tile_bytes<FMT>(m.cols, code_bytes, scale_bytes, bytes);
    const int ntiles = (m.rows + 15) / 16;
    const int mine = (int)blockIdx.x < ntiles ? (ntiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    // The group's first tile of this GEMV (k + i, i ≡ q − k mod G); none: nothing to stage.
    const int i0 = ((q - k) % G + G) % G;
    if (i0 >= mine) {
        k += mine;
        return;
    }
    u32 blo[J], bhi[FMT == FMT_Q1 ? J : 1];
    if constexpr (FMT == FMT_Q1) b1_planes<J, true>(w, m.xq, m.xs, chunks, ssm, blo, bhi);
    else b2_planes<J, true>(w, m.xq, m.xs, chunks, ssm, blo);
    __syncwarp();
    const int k0 = k;
    k += mine;
    for (int i = i0; i < mine; i += G) {
        const int kk = k0 + i;
        const int s = kk % CB1_SLOTS;
        mbar_wait(smem_addr(&full[s]), (u32)(kk / CB1_SLOTS) & 1u);
        const unsigned char* st = ring + slot_off[s];
        float acc[2] = {0.0f, 0.0f};
        if (!dot) {
            // Streaming without multiplying (a probe of the copies alone).
        } else if constexpr (FMT == FMT_Q1) {
            b1_tile<J, true, 1>(w, st, code_bytes, chunks, ssm, blo, bhi, acc);
        } else {
            b2_tile<FMT, J, true>(w, st, code_bytes, chunks, scols, ssm, blo, acc);
        }
        tile_part<2>(acc, part[s][w]);
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_addr(&done[s]));
    }
}

template <int FMT, int G>
__device__ __forceinline__ void chain_b1_body(const ChainGemv* __restrict__ gs, int ng, int ring_bytes,
                                              u32* __restrict__ count, bool dot) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) u64 full[CB1_SLOTS];
    __shared__ __align__(8) u64 done[CB1_SLOTS];
    __shared__ __align__(8) u64 empty[CB1_SLOTS];
    __shared__ u32 slot_off[CB1_SLOTS];
    __shared__ float part[CB1_SLOTS][GEMV1_WARPS][16];
    __shared__ __align__(16) float2 ssm[G][CB1_MAX_GROUPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // The dynamic block rounded up to the 1024 bytes the swizzle's boxes need (the host adds
    // them to the launch).
    unsigned char* ring = smem + ((1024u - (smem_addr(smem) & 1023u)) & 1023u);

    if (tid == 0) {
        for (int s = 0; s < CB1_SLOTS; s++) {
            mbar_init(smem_addr(&full[s]), 1);
            mbar_init(smem_addr(&done[s]), GEMV1_WARPS);
            mbar_init(smem_addr(&empty[s]), 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // The weights depend on nothing: the producer streams them before the previous kernel ends;
    // the others wait for it (the counter's zeroing, the inputs).
    pdl_launch();

    if (warp == 0) {
        if (lane != 0) return;
        ByteRing<CB1_SLOTS> r;
        int k = 0;
        for (int g = 0; g < ng; g++) {
            const ChainGemv m = gs[g];
            u32 code_bytes, scale_bytes, bytes;
            cb1_tile_bytes<FMT>(m.cols, code_bytes, scale_bytes, bytes);
            const int slabs = (int)(code_bytes / 2048);
            const int ntiles = (m.rows + 15) / 16;
            // The descriptor's codes are the codes' tensor map, written by the host through the
            // generic proxy: made visible to the tensor-map proxy before its first use.
            const TmaMap* map = (const TmaMap*)m.codes;
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(map) : "memory");
            for (int t = blockIdx.x; t < ntiles; t += gridDim.x, k++) {
                const int s = k % CB1_SLOTS;
                // Whole 1024-byte units of a ring aligned to 1024: the swizzle's alignment.
                const u32 off = r.claim(k, bytes, (u32)ring_bytes, empty);
                slot_off[s] = off;
                const u32 bar = smem_addr(&full[s]);
                const u32 dst = smem_addr(ring + off);
                mbar_expect_tx(bar, code_bytes + scale_bytes);
                for (int sl = 0; sl < slabs; sl++) weights_tma_2d(dst + sl * 2048, *map, sl * 128, t * 16, bar);
                weights_g2s(dst + code_bytes, m.scales + (size_t)t * scale_bytes, scale_bytes, bar);
            }
        }
        return;
    }

    pdl_wait();
    if (warp == 1) {
        int k = 0;
        for (int g = 0; g < ng; g++) {
            const ChainGemv m = gs[g];
            const int ntiles = (m.rows + 15) / 16;
            for (int t = blockIdx.x; t < ntiles; t += gridDim.x, k++) {
                const int s = k % CB1_SLOTS;
                const int row = t * 16 + lane;
                // The row's earlier value requested before the wait, as the decode kernels do.
                const float prior = m.accumulate && lane < 16 && row < m.rows ? m.out[row] : 0.0f;
                mbar_wait(smem_addr(&done[s]), (u32)(k / CB1_SLOTS) & 1u);
                if (lane < 16) {
                    float v = 0.0f;
#pragma unroll
                    for (int w = 0; w < GEMV1_WARPS; w++) v += part[s][w][lane];
                    if (row < m.rows) m.out[row] = m.accumulate ? v + prior : v;
                }
                // Every lane has read the partial sums before the stage is refilled.
                __syncwarp();
                if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
            }
            // This block's rows of GEMV g written (visible at the GPU's scope before the arrival).
            __syncwarp();
            if (lane == 0) {
                __threadfence();
                asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
            }
        }
        return;
    }

    // Consumer warp w of group q.
    const int w = (warp - 2) % GEMV1_WARPS, q = (warp - 2) / GEMV1_WARPS;
    float2* gssm = ssm[q];
    int k = 0;
    for (int g = 0; g < ng; g++) {
        const ChainGemv m = gs[g];
        if (g > 0) {
            // Every block's rows of the previous GEMV written (whose output this one's input
            // would be).
            const u32 target = gridDim.x * (u32)g;
            u32 seen;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
            } while (seen < target);
        }
        const int chunks = m.cols / (FMT == FMT_Q1 ? 128 : 64);
        const int j = chunks / GEMV1_WARPS;
#define CB1_TAKE(J) cb1_consume<FMT, J, G>(m, w, q, ring, slot_off, full, done, part, gssm, k, dot)
        // The 27B's widths, each whole multiples of GEMV1_WARPS chunks (the host checks).
        if constexpr (FMT == FMT_Q1) {
            if (j == 5) CB1_TAKE(5);
            else if (j == 6) CB1_TAKE(6);
            else if (j == 17) CB1_TAKE(17);
            else __trap();
        } else {
            if (j == 10) CB1_TAKE(10);
            else if (j == 12) CB1_TAKE(12);
            else if (j == 34) CB1_TAKE(34);
            else __trap();
        }
#undef CB1_TAKE
    }
}
#define CHAIN_B1_CALL(FMT, G) chain_b1_body<FMT, G>(gs, ng, ring_bytes, count, dot != 0)
#else
#define CHAIN_B1_CALL(FMT, G) __trap()
#endif

// G groups of consumer warps, and the producer and reducer.
#define CHAIN_B1_KERNEL(name, FMT, G)                                                              \
    ENTRY __global__ void __launch_bounds__(32 * (GEMV1_WARPS * G + 2), 1)                        \
        name(const ChainGemv* __restrict__ gs, int ng, int ring_bytes, int dot,                   \
             u32* __restrict__ count) {                                                            \
        CHAIN_B1_CALL(FMT, G);                                                                     \
    }

CHAIN_B1_KERNEL(gemv_chain_b1_q1, FMT_Q1, 1)
CHAIN_B1_KERNEL(gemv_chain_b1_q2g64, FMT_Q2G64, 1)
CHAIN_B1_KERNEL(gemv_chain_b1_q2g128, FMT_Q2G128, 1)
CHAIN_B1_KERNEL(gemv_chain_b1_q1_g2, FMT_Q1, 2)
CHAIN_B1_KERNEL(gemv_chain_b1_q2g64_g2, FMT_Q2G64, 2)
CHAIN_B1_KERNEL(gemv_chain_b1_q2g128_g2, FMT_Q2G128, 2)
