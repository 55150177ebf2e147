// Shared helpers. No headers: NVRTC compiles this with the model's shapes as -D defines
// (HD, NH, NKV, ROPE, HK, HV, DK, DV, KERN, NSPLIT). Kernels are declared `ENTRY __global__`:
// the program is compiled in parts side by side (src/compile/program.rs), and before each file
// ENTRY is `extern "C"` where the part emits that file's kernels, an uninstantiated template
// where not.
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;
typedef signed char i8;
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// f16x2 arithmetic on packed pairs (the dequantizations' magic-number conversions).
__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ u32 hadd2(u32 a, u32 b) {
    u32 d;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// 16 bytes read once: skip L1.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x * sigmoidf_(x); }
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Sum over a block of up to 1024 threads; every thread gets the result. `red` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

// Ordered key of (value, row) for an atomicMax argmax: larger value wins, then the lower row.
// NaN gets 0, below every number's key (−∞'s included) and equal to the cleared maximum, so it
// is never chosen (as model::ops::argmax skips it); a row of NaNs leaves the maximum cleared.
__device__ __forceinline__ u64 argmax_key(float v, u32 row) {
    if (v != v) return 0;
    u32 b = __float_as_uint(v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)b << 32) | (u64)(~row);
}

// Programmatic dependent launch (sm_90): kernels are launched so that each may start while its
// predecessor is still running. Every kernel calls pdl_wait() before it reads or writes any
// buffer that earlier kernels touch; only reads of constant data (weights), or of state that
// only the reading kernel writes, once per pass (passes are synchronized), may come before it.
// pdl_launch() comes first: the next kernel may then be scheduled as soon as all of this one's
// blocks are resident, so launch latency and the next GEMV's first weight copies overlap with
// this kernel. That is safe transitively: kernel k+1 waits for k to complete, and k cannot
// complete before its own wait for k-1 returned. (A waiting block holds its resources, but
// dependents launch only once every block of their predecessor is resident, so they can never
// starve it.) Without the launch attribute (or before sm_90) both are no-ops. The device
// schedules the next kernel later than that allows while the kernel before has a block on
// every multiprocessor (the harness's `pdl` mode, H200): after 132 blocks that call
// pdl_launch() and then spin 100 µs, the next kernel's blocks started 0.06 µs before their
// end; after 132 streaming memory, 3.3 µs before; after five spinning 20 µs, 17.7 µs before.
// Copies those blocks issue before their wait stream while that kernel runs. (A lane that
// spins on a barrier while the rest of its warp is in pdl_wait() runs only once the wait
// ends: a watch of a copy needs a warp of its own.)
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#define PDL_ENTRY()  \
    do {             \
        pdl_launch(); \
        pdl_wait();  \
    } while (0)

// A timeline of the traced kernels, for measuring only: compiled in where the host defines
// NIWAKI_TRACE (the records' capacity; `NIWAKI_CUDA_TRACE`), else the macros are PDL_ENTRY
// and nothing. One record per block: the kernel's kind (TRACE_* below) and a tag telling its
// launches apart (a pointer argument particular to the layer or matrix), the global timer
// (ns) when the block began and ended its wait for the previous kernel, and at its end.
#define TRACE_NORM 1
#define TRACE_SWIGLU 2
#define TRACE_GEMV_B1 3
#define TRACE_GEMV_DP4A 4
#define TRACE_GDN 5
#define TRACE_ATTN_PREP 6
#define TRACE_ATTN_SPLIT 7
#define TRACE_ATTN_MERGE 8
#define TRACE_ATTN_SHORT 9
// Besides those, a block may mark up to TRACE_MARKS moments of its own (TRACE_MARK_FIRST: the
// global timer the first time a thread passes, kept in the block's shared memory and written
// with its record, 0 where never passed; TRACE_MARK_LAST: when its last warp passed), e.g.
// when its activations were ready, its first tile arrived and its rows were written, before
// its fold. Six keep a record 96 bytes, a multiple of the 16 its stores may assume (with
// three, 72-byte records took a misaligned store).
#define TRACE_MARKS 6
// The global timer (ns), for the records and for the harness's probes.
__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The multiprocessor the block runs on, for the same.
__device__ __forceinline__ u32 sm_id() {
    u32 sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    return sm;
}
#ifdef NIWAKI_TRACE
struct TraceRec {
    u64 tag, wait0, wait1, end;
    u32 kind, block, sm, pad;
    u64 marks[TRACE_MARKS];
};
extern "C" {
__device__ TraceRec niwaki_trace[NIWAKI_TRACE];
__device__ u32 niwaki_trace_n;
}
__shared__ u64 niwaki_trace_mk[TRACE_MARKS];
__device__ __forceinline__ void trace_put(u32 kind, u64 tag, u64 wait0, u64 wait1) {
    const u32 i = atomicAdd(&niwaki_trace_n, 1u);
    if (i >= NIWAKI_TRACE) return;
    const u32 sm = sm_id();
    TraceRec r;
    r.tag = tag;
    r.wait0 = wait0;
    r.wait1 = wait1;
    r.end = global_ns();
    r.kind = kind;
    r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r.sm = sm;
    r.pad = 0;
#pragma unroll
    for (int k = 0; k < TRACE_MARKS; k++) r.marks[k] = niwaki_trace_mk[k];
    niwaki_trace[i] = r;
}
#define TRACE_ENTRY()                                                   \
    if (threadIdx.x == 0)                                               \
        for (int trace_k = 0; trace_k < TRACE_MARKS; trace_k++) niwaki_trace_mk[trace_k] = 0; \
    const u64 trace_w0 = global_ns();                                   \
    PDL_ENTRY();                                                        \
    const u64 trace_w1 = global_ns()
#define TRACE_MARK_FIRST(k)                                                 \
    do {                                                                    \
        if (niwaki_trace_mk[k] == 0) niwaki_trace_mk[k] = global_ns();      \
    } while (0)
// The global timer when the last warp has passed (lane 0 of each once its warp has: one
// shared atomic a warp, where one a thread would queue hundreds on one word), kept likewise.
// Called by whole warps (its __syncwarp takes every lane), in blocks whose warps are whole rows
// of threadIdx.x.
#define TRACE_MARK_LAST(k)                                                                     \
    do {                                                                                       \
        __syncwarp();                                                                          \
        if ((threadIdx.x & 31) == 0)                                                           \
            atomicMax((unsigned long long*)&niwaki_trace_mk[k], (unsigned long long)global_ns()); \
    } while (0)
// Called by one thread of each block, the block's last to finish where it can be told.
#define TRACE_EXIT(kind, tag) trace_put(kind, (u64)(tag), trace_w0, trace_w1)
#else
#define TRACE_ENTRY() PDL_ENTRY()
#define TRACE_EXIT(kind, tag) \
    do {                      \
    } while (0)
#define TRACE_MARK_FIRST(k) \
    do {                    \
    } while (0)
#define TRACE_MARK_LAST(k) \
    do {                   \
    } while (0)
#endif

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

// Asynchronous global → shared copies (sm_80+; plain copies before, where wait is a no-op).
// A thread's copies are visible to it after cp_async_wait, to the others after a barrier.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
#else
    *(uint4*)dst = *(const uint4*)src;
#endif
}

__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
#else
    *(uint2*)dst = *(const uint2*)src;
#endif
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
#else
    *(u32*)dst = *(const u32*)src;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// f(e) for copies e = tid, tid + NTH, ... < N, with a fixed trip count: `e += blockDim` loops
// compiled into generic ones with remainder branches around every copy.
template <int N, int NTH, class F>
__device__ __forceinline__ void each_copy(int tid, F f) {
#pragma unroll
    for (int i = 0; i < (N + NTH - 1) / NTH; i++) {
        const int e = tid + i * NTH;
        if (N % NTH == 0 || e < N) f(e);
    }
}

#if __CUDA_ARCH__ >= 800
// c += A (16×16 f16, row-major) · B (16×8 f16, column-major), f32 accumulators.
__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// Warpgroup MMA (sm_90a): descriptors, fences and waits.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle: rows (tokens)
// of 64 values, 8-row groups 1024 bytes apart, starting at `saddr`.
__device__ __forceinline__ u64 wg_desc_sw128(u32 saddr) {
    return (u64)((saddr & 0x3FFFFu) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accesses of an accumulator across the asynchronous MMAs.
__device__ __forceinline__ void wg_reg_fence(float& x) { asm volatile("" : "+f"(x)::"memory"); }

#endif

// A tensor map (CUtensorMap) as a kernel parameter: opaque, 64-byte aligned.
struct __align__(64) TmaMap {
    u64 v[16];
};

#if __CUDA_ARCH__ >= 900

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// One arrival that also announces `bytes` of bulk-copy traffic the phase must wait for.
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

// One plain arrival (no transaction bytes).
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done = 0;
    while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}

// Global → shared copy by the bulk-copy engine (16-byte aligned, a multiple of 16 bytes),
// completing on `bar`.
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// The decode GEMVs' weight copies: each byte of a matrix is read once a token, ~7 GB between
// two reads of it, so nothing is gained by keeping it in the L2 cache. With WEIGHTS_EVICT_FIRST
// (`NIWAKI_CUDA_WEIGHTS_L2=first`) those copies carry an evict-first policy, so that the stream
// displaces them before the small buffers the step's kernels hand each other (activations,
// the residual, the folded norms' pieces and counters).
#ifdef WEIGHTS_EVICT_FIRST
__device__ __forceinline__ u64 weights_policy() {
    u64 p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
#endif

// bulk_g2s for weights (see weights_policy).
__device__ __forceinline__ void weights_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
#ifdef WEIGHTS_EVICT_FIRST
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(weights_policy())
        : "memory");
#else
    bulk_g2s(dst, src, bytes, bar);
#endif
}

// One box of a 2D tensor map into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_2d(u32 dst, const TmaMap& map, int x, int y, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"((u64)&map), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

// tma_2d for weights (see weights_policy).
__device__ __forceinline__ void weights_tma_2d(u32 dst, const TmaMap& map, int x, int y, u32 bar) {
#ifdef WEIGHTS_EVICT_FIRST
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
        "%3}], [%4], %5;" ::"r"(dst),
        "l"((u64)&map), "r"(x), "r"(y), "r"(bar), "l"(weights_policy())
        : "memory");
#else
    tma_2d(dst, map, x, y, bar);
#endif
}
#endif
