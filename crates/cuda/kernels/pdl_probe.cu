// A probe of programmatic dependent launch (the harness's `pdl` mode, a measurement only): do a
// dependent kernel's bulk copies issued before its griddepcontrol.wait stream while the kernel
// before it still runs? The decode GEMVs request their ring's first tiles there (plan::
// EARLY_TILES); their consumers see those tiles only after their own wait and activations, so
// the probe watches a copy from a warp that does not wait (the GEMVs' own watch is
// NIWAKI_CUDA_ABLATE=watch in traced builds).
//
// pdl_spin: every block lets the dependent launch at once, then spins for `ns` nanoseconds of
// the global timer, so that nothing of its own competes with the copies; first, with `touch`,
// its threads read one word every `step` words of it (`words` in all), which leaves the
// address translations of those pages cached (and a sector of each in L2). Blocks below `quick`
// end at once (no spin, no touch).
ENTRY __global__ void __launch_bounds__(32) pdl_spin(u64 ns, const u32* __restrict__ touch, u64 words, u64 step,
                                                  u32* __restrict__ sink, int quick) {
    pdl_launch();
    pdl_wait();
    if ((int)blockIdx.x < quick) return;
    if (touch) {
        u32 acc = 0;
        for (u64 i = ((u64)blockIdx.x * 32 + threadIdx.x) * step; i < words; i += (u64)gridDim.x * 32 * step)
            acc ^= touch[i];
        // Never true for the harness's zeroed buffer: keeps the loads.
        if (acc == 0x9e3779b9u) *sink = acc;
    }
    const u64 t0 = global_ns();
    while (global_ns() - t0 < ns) {
    }
}

// pdl_copy: block b copies `bytes` (a multiple of 16) from src + b·bytes into its shared memory,
// issued before its wait (`before`) or after it, `how`: 0 by one bulk copy, 1 by the decode
// GEMVs' weights_g2s (their L2 policy), 2 by warp 0's plain loads; and records the global
// timer when it issued the copy, when the copy completed and when its wait ended, and its
// multiprocessor: out[4b .. 4b + 3]. With a bulk copy warp 0 issues and waits, and warp 1
// watches the copy's barrier without waiting for the previous kernel, so that a copy done
// before the wait ends is seen done then (a thread that waited first would see it done only
// after). Blocks of 64 threads or more (the others idle: the harness gives some a decode
// GEMV's threads and shared memory).
ENTRY __global__ void __launch_bounds__(288) pdl_copy(const unsigned char* __restrict__ src, u32 bytes, int before,
                                                  int how, u64* __restrict__ out) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char buf[];
    __shared__ __align__(8) u64 bar;
    const u32 b = smem_addr(&bar);
    if (threadIdx.x == 0) {
        mbar_init(b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    pdl_launch();
    const unsigned char* from = src + (size_t)blockIdx.x * bytes;
    u64* rec = out + 4 * blockIdx.x;
    // Thread 0's part of the record: the request, the wait's end and the multiprocessor.
    auto record = [&](u64 t_issue, u64 t_wait) {
        rec[0] = t_issue;
        rec[2] = t_wait;
        rec[3] = sm_id();
    };
    if (how == 2) {
        // Plain loads (the generic proxy, not the async one): issued and done as the warp sees
        // them.
        if (threadIdx.x >= 32) return;
        auto load = [&]() {
            const uint4* p = (const uint4*)from;
            uint4 acc = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll 8
            for (u32 i = threadIdx.x; i < bytes / 16; i += 32) {
                const uint4 v = p[i];
                acc.x ^= v.x;
                acc.y ^= v.y;
                acc.z ^= v.z;
                acc.w ^= v.w;
            }
            ((uint4*)buf)[threadIdx.x] = acc;
            __syncwarp();
        };
        const u64 t_issue = before ? global_ns() : 0;
        if (before) load();
        const u64 t_done = global_ns();
        pdl_wait();
        const u64 t_wait = global_ns();
        if (!before) load();
        if (threadIdx.x == 0) {
            record(before ? t_issue : t_wait, t_wait);
            rec[1] = before ? t_done : global_ns();
        }
        return;
    }
    auto copy = [&]() {
        const u64 t = global_ns();
        mbar_expect_tx(b, bytes);
        if (how == 1) weights_g2s(smem_addr(buf), from, bytes, b);
        else bulk_g2s(smem_addr(buf), from, bytes, b);
        return t;
    };
    if (threadIdx.x == 0) {
        u64 t_issue = before ? copy() : 0;
        pdl_wait();
        const u64 t_wait = global_ns();
        if (!before) t_issue = copy();
        record(t_issue, t_wait);
    } else if (threadIdx.x == 32) {
        // Touches no buffer of an earlier kernel: `out` is this kernel's alone.
        mbar_wait(b, 0u);
        rec[1] = global_ns();
    }
#else
    // Bulk copies and their barriers are sm_90's.
    __trap();
#endif
}
