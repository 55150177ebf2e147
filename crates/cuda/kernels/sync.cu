// Grid-wide barriers, for kernels whose blocks are all resident at once (a persistent decode
// step would cross its layers' dependences with these instead of kernel boundaries). `count`
// only grows: barrier r of a grid of n blocks is passed once it reaches n·(r + 1), so it needs
// no reset within a launch.
//
// One count added to `*count` after the thread's earlier stores (release, GPU scope).
__device__ __forceinline__ void count_release(u32* count) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
}

// `*count`, read before the thread's later loads (acquire, GPU scope).
__device__ __forceinline__ u32 count_acquire(const u32* count) {
    u32 seen;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
    return seen;
}

// One thread's part: its block's arrival, then the wait for `target` arrivals (the block's
// threads synchronized around it by the caller).
__device__ __forceinline__ void grid_arrive_wait(u32* count, u32 target) {
    count_release(count);
    while (count_acquire(count) < target) {
    }
}

__device__ __forceinline__ void grid_barrier(u32* count, u32 target) {
    __syncthreads();
    if (threadIdx.x == 0) grid_arrive_wait(count, target);
    __syncthreads();
}

// `rounds` grid barriers back to back (the harness times them; `count` zeroed first). Every
// block must be resident: launched with at most a few small blocks per multiprocessor.
ENTRY __global__ void __launch_bounds__(256) grid_barrier_rounds(u32* count, int rounds) {
    for (int r = 0; r < rounds; r++) grid_barrier(count, gridDim.x * (u32)(r + 1));
}
