// Multi-token GEMM on f16 tensor cores with warpgroup MMA (wgmma, sm_90a), for prefill.
//
// The int8 GEMM (gemm.cu) must scale every 64-value group's integer dot by a weight scale and
// an activation scale in float: three FFMAs per output and group, six per mma, half of its
// instructions. Here both scales travel inside the operands instead: the activations arrive as
// f16 (the quantization kernels write them beside the int8 ones, quant.cu), and each thread
// turns its packed weight codes into f16 values (code − 1)·d, or (2·bit − 1)·d, exactly (every
// such product is an f16), so the tensor cores produce the finished sum. (With mma.sync that
// was no faster: f16 mma.sync runs at half the int8 rate. wgmma runs f16 at the full rate and
// takes a 64×128×16 tile per instruction.)
//
// Dequantizing without shifts: a code field masked in place and ORed into the bits of 2^e,
// with e chosen so that the field's lowest bit is worth 1, is the f16 value 2^e + code; one
// f16x2 subtraction leaves the code and one f16x2 FMA the weight. The k order inside each
// 64-value block is permuted so that a thread's fragment pairs are the fields one mask selects:
// thread t of a quad, at mma step j of the block, holds values 16t + 4j + {0, 2} in its first
// pair and 16t + 4j + {1, 3} in its second (for 2-bit codes: word t, field j, bytes 0/2 and
// 1/3). The quantization kernels store f16 activations in that order (hgemm_slot, quant.cu);
// the sum over k does not care.
//
// Tiles: WG warpgroups (3 or 4: plan/gemm.rs picks, per matrix, the one whose grid fills the
// multiprocessors' waves best); warpgroup w owns rows 64w .. 64w+63 of the block's 64·WG, for
// all HG_BN tokens (one m64nHG_BNk16 wgmma per 16 values of k); each of its warps holds the A
// fragments (registers) of 16 of those rows, and issues its MMAs two k steps per commit group.
// K advances 128 values per stage through a ring of HG_STAGES cp.async stages: the rows' codes
// (two 16-byte chunk slots per row, swapped on rows 4-7 of every 8 so that a warp's code loads
// hit 32 distinct banks), the f16 activations, stored as wgmma's 8×8 core matrices without
// swizzle (each 128 contiguous bytes: 8 tokens × 8 values; K-adjacent ones HG_LBO bytes apart,
// token-adjacent ones 128), and each thread's weight scales (loaded into registers a stage
// before they are stored there). Stages are loaded HG_STAGES − 2 ahead, so that the buffer a
// load overwrites was last read two stages back, by MMAs already waited for: the tensor cores
// never drain at a stage boundary. Rows must be whole stages (columns a multiple of 128). A
// grid's z index splits K (gemm_reduce adds the partial sums).
#if !defined(HG_STAGES) || !defined(HG_STAGE_FIXED) || !defined(HG_STAGE_PER_WG) || !defined(HG_BN)
#error "HG_STAGES, HG_STAGE_FIXED, HG_STAGE_PER_WG and HG_BN must be defined by the host"
#endif
#define HG_KC 128
#define HG_LBO ((HG_BN / 8) * 128)
static_assert(HG_STAGES >= 3 && HG_BN == 128, "hgemm tile shape");

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

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Shared-memory matrix descriptor: no swizzle, start address, K-direction (lbo) and
// token-direction (sbo) strides between core matrices, all in 16-byte units.
__device__ __forceinline__ u64 wg_desc(u32 saddr, u32 lbo, u32 sbo) {
    return (u64)((saddr & 0x3FFFFu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// d (64×128 f32, this thread's 64) += A (64×16 f16, registers) · B (16×128 f16, shared memory).
__device__ __forceinline__ void wgmma_64x128x16(float* d, const u32* a, u64 desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

// Keeps the compiler from moving accesses of an accumulator across the asynchronous MMAs.
__device__ __forceinline__ void wg_reg_fence(float& x) { asm volatile("" : "+f"(x)::"memory"); }

template <int FMT, int WG>
__device__ __forceinline__ void hgemm_body(const unsigned char* __restrict__ codes, const u16* __restrict__ scales,
                                           int rows, int cols, const u16* __restrict__ xh, int ntok,
                                           float* __restrict__ out, int out_stride, int accumulate,
                                           long long zstride) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int CV = FMT == FMT_Q1 ? 128 : 64;       // values per 16-byte chunk
    constexpr int CPS = HG_KC / CV;                     // chunks of a row per stage (1 or 2)
    constexpr int SV = FMT == FMT_Q2G64 ? 64 : 128;     // values per weight scale
    constexpr int SPS = HG_KC / SV;                     // scales of a row per stage (1 or 2)
    constexpr int BM = WG * 64;
    constexpr int NTH = WG * 128;
    constexpr int W_BYTES = BM * 32;                    // two 16-byte chunk slots per row
    constexpr int S_OFF = W_BYTES + HG_BN * HG_KC * 2;
    constexpr int STAGE = S_OFF + NTH * 8;              // + 4 scales per thread
    constexpr int D = HG_STAGES - 2;                    // stages loaded ahead
    static_assert(STAGE == HG_STAGE_FIXED + WG * HG_STAGE_PER_WG, "the host sizes the stages as laid out here");
    static_assert(HG_KC == 128, "two 64-value blocks per stage");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    // This thread's rows in the block tile: rbase and rbase + 8. Rows 4-7 of every 8 keep their
    // chunks in swapped slots, so that a warp's code loads hit 32 distinct banks.
    const int rbase = (warp >> 2) * 64 + (warp & 3) * 16 + g;
    const int swz = (g >> 2) & 1;
    const int tok0 = blockIdx.x * HG_BN, row0 = blockIdx.y * BM;
    const int nst = cols / HG_KC;
    const int chunks = cols / CV, spr = cols / SV;
    const int st0 = (int)((long long)nst * blockIdx.z / gridDim.z);
    const int st1 = (int)((long long)nst * (blockIdx.z + 1) / gridDim.z);
    out += blockIdx.z * zstride;
    PDL_ENTRY();

    // This thread's copies of every stage, fixed but for the stage's offset: chunk q of row r
    // (threads below BM·CPS), and activation pieces (8 values) of token tt into core matrix
    // (p, tt / 8), row tt % 8. Rows and tokens past the end repeat the last one.
    constexpr int XN = HG_BN * (HG_KC / 8), XC = (XN + NTH - 1) / NTH;
    static_assert(BM * CPS <= NTH, "a chunk per thread");
    const int wr = tid / CPS, wq = tid % CPS;
    const uint4* wsrc = (const uint4*)codes + (size_t)min(row0 + wr, rows - 1) * chunks + wq;
    const u32 wdst = wr * 32 + ((wq ^ (wr >> 2)) & 1) * 16;
    const u16* xsrc[XC];
    u32 xdst[XC];
#pragma unroll
    for (int c = 0; c < XC; c++) {
        const int e = min(tid + c * NTH, XN - 1), tt = e / (HG_KC / 8), p = e % (HG_KC / 8);
        xsrc[c] = xh + (size_t)min(tok0 + tt, ntok - 1) * cols + p * 8;
        xdst[c] = W_BYTES + (p * (HG_BN / 8) + (tt >> 3)) * 128 + (tt & 7) * 16;
    }
    auto load_stage = [&](int s) {
        unsigned char* st = smem + (s % HG_STAGES) * STAGE;
        if (BM * CPS == NTH || tid < BM * CPS) cp_async16(st + wdst, wsrc + s * CPS);
#pragma unroll
        for (int c = 0; c < XC; c++)
            if (XN % NTH == 0 || tid + c * NTH < XN) cp_async16(st + xdst[c], xsrc[c] + s * HG_KC);
    };
    // This thread's weight scales of stage s (raw f16 bits), [h][j] for rows rbase + 8h.
    auto load_scales = [&](int s, u32* d) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = min(row0 + rbase + h * 8, rows - 1);
#pragma unroll
            for (int j = 0; j < SPS; j++) d[h * SPS + j] = (u32)__ldg(scales + (size_t)row * spr + s * SPS + j);
        }
    };
    // Each thread's scales of a stage wait in its own slot of the stage (only it reads them).
    auto scale_slot = [&](int s) { return (u16*)(smem + (s % HG_STAGES) * STAGE + S_OFF) + tid * 4; };
    auto store_scales = [&](int s, const u32* d) {
        u16* p = scale_slot(s);
#pragma unroll
        for (int e = 0; e < 2 * SPS; e++) p[e] = (u16)d[e];
    };

    float acc[64];
#pragma unroll
    for (int e = 0; e < 64; e++) acc[e] = 0.0f;

#pragma unroll
    for (int s = 0; s < D; s++) {
        if (st0 + s < st1) load_stage(st0 + s);
        cp_async_commit();
    }
#pragma unroll
    for (int s = 0; s < D; s++)
        if (st0 + s < st1) {
            u32 d[2 * SPS];
            load_scales(st0 + s, d);
            store_scales(st0 + s, d);
        }
    for (int s = st0; s < st1; s++) {
        cp_async_wait<D - 1>();
        // This thread's copies of stage s are visible to the asynchronous proxy (wgmma)...
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        // ...and, past the barrier, everyone's. Every warpgroup is also done with stage s-2
        // (each waited for all but its newest MMAs during stage s-1): its buffer takes stage
        // s+D.
        __syncthreads();
        const bool more = s + D < st1;
        if (more) load_stage(s + D);
        cp_async_commit();
        // Stage s+D's scales: requested now, stored at the end of this stage.
        u32 sp[2 * SPS];
        if (more) load_scales(s + D, sp);
        const unsigned char* st = smem + (s % HG_STAGES) * STAGE;
        const u32 xbase = smem_addr(st + W_BYTES);
        u32 dsc[2 * SPS];
        {
            const u16* p = scale_slot(s);
#pragma unroll
            for (int e = 0; e < 2 * SPS; e++) dsc[e] = p[e];
        }
        u32 mul[2], neg[2], wd[2];
        u32 a[2][2][4]; // [buffer][step of the pair][fragment]: untouched while their MMAs run
#pragma unroll
        for (int pair = 0; pair < HG_KC / 32; pair++) {
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int step = 2 * pair + k, i = step >> 2, j = step & 3;
                if (j == 0) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        // Per row: d (both halves), 2d for 1-bit codes, −d; and the code word
                        // of 64-value block i: 2-bit, word t of chunk i; 1-bit, word 2i + t/2.
                        const u32 d16 = dsc[h * SPS + (SPS == 2 ? i : 0)];
                        const u32 dd = d16 | (d16 << 16);
                        mul[h] = FMT == FMT_Q1 ? hadd2(dd, dd) : dd;
                        neg[h] = dd ^ 0x80008000u;
                        const u32* rw = (const u32*)(st + (rbase + h * 8) * 32);
                        wd[h] = FMT == FMT_Q1 ? rw[swz * 4 + 2 * i + (t >> 1)] : rw[((i ^ swz) & 1) * 4 + t];
                    }
                }
                const int field = FMT == FMT_Q1 ? 4 * (t & 1) + j : 2 * j;
                const u32 mask = (FMT == FMT_Q1 ? 0x00010001u : 0x00030003u) << field;
                const u32 magic = (u32)(25 - field) * 0x04000400u;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    // 2-bit: c·d − d; 1-bit: b·2d − d.
                    a[pair & 1][k][h] = hfma2(hsub2((wd[h] & mask) | magic, magic), mul[h], neg[h]);
                    a[pair & 1][k][2 + h] = hfma2(hsub2(((wd[h] >> 8) & mask) | magic, magic), mul[h], neg[h]);
                }
            }
            wg_fence();
#pragma unroll
            for (int k = 0; k < 2; k++)
                wgmma_64x128x16(acc, a[pair & 1][k], wg_desc(xbase + (2 * pair + k) * 2 * HG_LBO, HG_LBO, 128));
            wg_commit();
            // The previous pair's MMAs are done: its fragment buffer may be rewritten.
            wg_wait<1>();
        }
        if (more) store_scales(s + D, sp);
    }
    wg_wait<0>();
    cp_async_wait<0>();
#pragma unroll
    for (int e = 0; e < 64; e++) wg_reg_fence(acc[e]);

    // Accumulator e: row rbase (+8 for e % 4 ≥ 2), token 8·(e / 4) + 2t + e % 2.
#pragma unroll
    for (int e = 0; e < 64; e++) {
        const int row = row0 + rbase + ((e >> 1) & 1) * 8;
        const int tok = tok0 + (e >> 2) * 8 + 2 * t + (e & 1);
        if (row < rows && tok < ntok) {
            float* o = out + (size_t)tok * out_stride + row;
            *o = accumulate ? acc[e] + *o : acc[e];
        }
    }
}
#define HGEMM_CALL(FMT, WG) hgemm_body<FMT, WG>(codes, scales, rows, cols, xh, ntok, out, out_stride, accumulate, zstride)
#else
#define HGEMM_CALL(FMT, WG) __trap()
#endif

// grid (ceil(ntok / HG_BN), ceil(rows / (64·WG)), K splits), block 128·WG, dynamic shared
// memory HG_STAGES stages (plan/gemm.rs: GemmKernel::smem_bytes); one block per multiprocessor
// (its registers).
#define HGEMM_KERNEL(name, FMT, WG)                                                                \
    extern "C" __global__ void __launch_bounds__(WG * 128, 1)                                      \
        name(const unsigned char* __restrict__ codes, const u16* __restrict__ scales, int rows,     \
             int cols, const u16* __restrict__ xh, int ntok, float* __restrict__ out, int out_stride, \
             int accumulate, long long zstride) {                                                  \
        HGEMM_CALL(FMT, WG);                                                                       \
    }

HGEMM_KERNEL(hgemm_q1_w3, FMT_Q1, 3)
HGEMM_KERNEL(hgemm_q1_w4, FMT_Q1, 4)
HGEMM_KERNEL(hgemm_q2g64_w3, FMT_Q2G64, 3)
HGEMM_KERNEL(hgemm_q2g64_w4, FMT_Q2G64, 4)
HGEMM_KERNEL(hgemm_q2g128_w3, FMT_Q2G128, 3)
HGEMM_KERNEL(hgemm_q2g128_w4, FMT_Q2G128, 4)
