// The read-bandwidth test of `niwaki bench --device cuda`: the floor a decode step is held
// against is the time to read its bytes once, so the test reads a buffer far larger than the L2
// cache once, with as little else as the reads allow.
//
// Every thread keeps four 16-byte streaming loads in flight at once (grid-stride, so that the
// blocks of a wave read neighbouring lines), folds them into one word and the warp's words
// meet in one atomic: the loads cannot be dropped and nothing but them touches memory.
ENTRY __global__ void __launch_bounds__(512, 4) read_sum(const uint4* __restrict__ p, u64 n, u32* __restrict__ out) {
    PDL_ENTRY();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u32 acc = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride);
        const uint4 c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        const uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicXor(out, acc);
}
