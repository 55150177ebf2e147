// Grid-wide barriers, for kernels whose blocks are all resident at once (a persistent decode
// step would cross its layers' dependences with these instead of kernel boundaries). `count`
// only grows: barrier r of a grid of n blocks is passed once it reaches n·(r + 1), so it needs
// no reset within a launch.
//
// One thread's part: its block's arrival, then the wait for `target` arrivals (the block's
// threads synchronized around it by the caller).
__device__ __forceinline__ void grid_arrive_wait(u32* count, u32 target) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
    u32 seen;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
    } while (seen < target);
}

__device__ __forceinline__ void grid_barrier(u32* count, u32 target) {
    __syncthreads();
    if (threadIdx.x == 0) grid_arrive_wait(count, target);
    __syncthreads();
}

// `rounds` grid barriers back to back (the harness times them; `count` zeroed first). Every
// block must be resident: launched with at most a few small blocks per multiprocessor.
extern "C" __global__ void __launch_bounds__(256) grid_barrier_rounds(u32* count, int rounds) {
    for (int r = 0; r < rounds; r++) grid_barrier(count, gridDim.x * (u32)(r + 1));
}

// A grid-wide barrier that leaves its words as it found them, for kernels launched again and
// again (a decode step's graph) with no reset between: `sync[0]` counts arrivals and goes back
// to 0 once all `n` blocks are in; `sync[1]`, the generation, then grows by one, which is what
// the others wait for. One thread a block (the block's threads synchronized around it by the
// caller); every block resident.
__device__ __forceinline__ void grid_sync_reusable(u32* sync, u32 n) {
    u32 gen, old;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(sync + 1) : "memory");
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(sync) : "memory");
    if (old == n - 1) {
        asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(sync) : "memory");
        asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(sync + 1), "r"(gen + 1) : "memory");
        return;
    }
    u32 now;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(sync + 1) : "memory");
    } while (now == gen);
}
