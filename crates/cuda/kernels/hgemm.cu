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
// Dequantizing 2-bit codes without shifts: a code field masked in place and ORed into the bits
// of 2^e, with e chosen so that the field's lowest bit is worth 1, is the f16 value 2^e + code;
// one f16x2 subtraction leaves the code and one f16x2 FMA the weight. A 1-bit pair is two
// instructions: its bits shifted into the halves' sign bits, masked, and XORed into −d's (the
// magic-number form took three: a short pass's narrow tiles spend their time issuing their
// warps' instructions, about 300 a stage, not on their MMAs or their bytes). The k order
// inside each 64-value block is permuted so that a thread's fragment pairs are the fields one
// mask selects:
// thread t of a quad, at mma step j of the block, holds values 16t + 4j + {0, 2} in its first
// pair and 16t + 4j + {1, 3} in its second (for 2-bit codes: word t, field j, bytes 0/2 and
// 1/3). The quantization kernels store f16 activations in that order (hgemm_slot, quant.cu);
// the sum over k does not care.
//
// Tiles: WG warpgroups (3 or 4: plan/gemm.rs picks, per matrix, the one whose grid fills the
// multiprocessors' waves best); warpgroup w owns rows 64w .. 64w+63 of the block's 64·WG, for
// all BN tokens (one m64nBNk16 wgmma per 16 values of k); each of its warps holds the A
// fragments (registers) of 16 of those rows, and issues its MMAs two k steps per commit group.
// K advances 128 values per stage through a ring of HG_STAGES stages, loaded HG_STAGES − 2
// ahead (the buffer a load overwrites was last read two stages back, by MMAs already waited
// for: the tensor cores never drain at a stage boundary). Each stage's copies are made by the
// tensor memory accelerator (TMA): one thread issues its four boxes — the rows' codes (16 or
// 32 bytes a row; 2-bit rows in the 32-byte swizzle, which puts rows 4-7 of every 8 in swapped
// 16-byte slots, so that a warp's code loads hit 32 distinct banks), for 64-value blocks the
// rows' weight scales (one bulk copy from the matrix's scales in stage order, where the
// stage's two of the block's rows lie together: stage_scales.rs) and the activations as two
// boxes of 128 tokens × 64 values in the 128-byte swizzle wgmma reads directly — against the
// stage's `full` barrier; each warp arrives on the stage's `empty` barrier once its MMAs on it
// are done, and the issuing thread waits for that before reusing the buffer. (Copies made by
// every thread with cp.async, and a block barrier per stage, took twice as long: MIO throttle
// and barrier stalls.) With 128-value blocks every thread loads its own weight scales
// HG_STAGES − 2 stages ahead into its own slot.
// Rows must be whole stages (columns a multiple of 128, plan::hgemm_takes); tokens and rows
// past the ends arrive as zeros (the stage-ordered scales' rows are padded to every block's
// end: staged_rows, plan::hgemm_stage_scale_rows). A grid's z index splits K (gemm_reduce adds
// the partial sums).
#if !defined(HG_STAGES) || !defined(HG_STAGE_PER_WG) || !defined(HG_TMA_EXTRA)
#error "HG_STAGES, HG_STAGE_PER_WG and HG_TMA_EXTRA must be defined by the host"
#endif
#define HG_KC 128
static_assert(HG_STAGES >= 3, "hgemm pipeline depth");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d (64×N f32, this thread's N/2) += A (64×16 f16, registers) · B (16×N f16, shared memory).
template <int N>
__device__ __forceinline__ void wgmma_64xNx16(float* d, const u32* a, u64 desc);
template <>
__device__ __forceinline__ void wgmma_64xNx16<16>(float* d, const u32* a, u64 desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
template <>
__device__ __forceinline__ void wgmma_64xNx16<32>(float* d, const u32* a, u64 desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
template <>
__device__ __forceinline__ void wgmma_64xNx16<64>(float* d, const u32* a, u64 desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
template <>
__device__ __forceinline__ void wgmma_64xNx16<128>(float* d, const u32* a, u64 desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

// This thread's weight scales of a stage (raw f16 bits), [h][j]: its first row's at p, its
// second row's r8 further.
template <int SPS>
__device__ __forceinline__ void hg_load_scales(const u16* p, int r8, u32* d) {
#pragma unroll
    for (int j = 0; j < SPS; j++) {
        d[j] = (u32)__ldg(p + j);
        d[SPS + j] = (u32)__ldg(p + r8 + j);
    }
}

// The MMAs of one stage for this thread's warpgroup: the code words of rows rbase and
// rbase + 8 of the stage's 64-value blocks i = 0, 1 at wst + wo[i] and 8·ROWB further (see
// hgemm_body), shifted down by `sh` (1-bit: this thread's fields), the activations (two boxes
// of 64 values, 128-byte swizzle) whose first MMA's descriptor is desc0, the weight scales
// dsc (stage order, [h][j]), the 2-bit fields' magic numbers (magics). `first_done` runs once
// the previous stage's MMAs are known complete.
template <int FMT, int BN, class Done>
__device__ __forceinline__ void hg_stage_mmas(float* acc, const unsigned char* wst, const int* wo, int sh,
                                              const u32* dsc, const u32* magics, u64 desc0, Done first_done) {
    constexpr int SPS = HG_KC / (FMT == FMT_Q2G64 ? 64 : 128);
    // Descriptors differ from the stage's first by the boxes' offsets in 16-byte units (shared
    // addresses stay below the field's 2^18 bytes): one add each, not a rebuild.
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
                    // Per row: d (both halves), −d; and the code word of 64-value block i:
                    // 2-bit, word t of chunk i; 1-bit, word 2i + t/2 shifted down to this
                    // thread's fields (4(t & 1) + j; bit j of each half's low byte, below).
                    const u32 d16 = dsc[h * SPS + (SPS == 2 ? i : 0)];
                    const u32 dd = d16 | (d16 << 16);
                    neg[h] = dd ^ 0x80008000u;
                    constexpr int ROWB = FMT == FMT_Q1 ? 16 : 32;
                    const u32 word = *(const u32*)(wst + wo[i] + h * 8 * ROWB);
                    if (FMT == FMT_Q1) {
                        wd[h] = word >> sh;
                    } else {
                        mul[h] = dd;
                        wd[h] = word;
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (FMT == FMT_Q1) {
                    // Bit b of a pair gives (2b − 1)·d: −d with its sign flipped where b is 1
                    // (bits j and 16 + j of the low bytes moved to 15 and 31; of the high
                    // bytes, 8 + j and 24 + j).
                    a[pair & 1][k][h] = ((wd[h] << (15 - j)) & 0x80008000u) ^ neg[h];
                    a[pair & 1][k][2 + h] = ((wd[h] << (7 - j)) & 0x80008000u) ^ neg[h];
                } else {
                    // c·d − d, the code field masked in place into the bits of a magic number.
                    const int field = 2 * j;
                    const u32 mask = 0x00030003u << field;
                    const u32 magic = magics[j];
                    a[pair & 1][k][h] = hfma2(hsub2((wd[h] & mask) | magic, magic), mul[h], neg[h]);
                    a[pair & 1][k][2 + h] = hfma2(hsub2(((wd[h] >> 8) & mask) | magic, magic), mul[h], neg[h]);
                }
            }
        }
        wg_fence();
#pragma unroll
        for (int k = 0; k < 2; k++) {
            // k step j of 64-value block i starts 32·j bytes into box i.
            const int step = 2 * pair + k;
            const u32 off = (step >> 2) * (BN * 64 * 2) + (step & 3) * 32;
            wgmma_64xNx16<BN>(acc, a[pair & 1][k], desc0 + (off >> 4));
        }
        wg_commit();
        // The previous pair's MMAs are done: its fragment buffer may be rewritten (after the
        // first pair: the previous stage's last MMAs are done too).
        wg_wait<1>();
        if (pair == 0) first_done();
    }
}

// Accumulator e (of BN / 2): row rbase (+8 for e % 4 ≥ 2), token 8·(e / 4) + 2t + e % 2.
template <int BN>
__device__ __forceinline__ void hg_store(float* acc, int row0, int rbase, int tok0, int t, int rows, int ntok,
                                         float* __restrict__ out, int out_stride, int accumulate) {
    wg_wait<0>();
#pragma unroll
    for (int e = 0; e < BN / 2; e++) wg_reg_fence(acc[e]);
#pragma unroll
    for (int e = 0; e < BN / 2; e++) {
        const int row = row0 + rbase + ((e >> 1) & 1) * 8;
        const int tok = tok0 + (e >> 2) * 8 + 2 * t + (e & 1);
        if (row < rows && tok < ntok) {
            float* o = out + (size_t)tok * out_stride + row;
            *o = accumulate ? acc[e] + *o : acc[e];
        }
    }
}

template <int FMT, int WG, int BN>
__device__ __forceinline__ void hgemm_body(const TmaMap& wmap, const u16* __restrict__ scales,
                                           const u16* __restrict__ staged, int staged_rows, int rows, int cols,
                                               const TmaMap& xmap, int ntok, float* __restrict__ out, int out_stride,
                                               int accumulate, long long zstride) {
    extern __shared__ __align__(1024) unsigned char smem[];
    constexpr int SV = FMT == FMT_Q2G64 ? 64 : 128;
    constexpr int SPS = HG_KC / SV;
    constexpr int BM = WG * 64;
    constexpr int NTH = WG * 128;
    constexpr int ROWB = FMT == FMT_Q1 ? 16 : 32;       // code bytes of a row per stage
    constexpr int X_BYTES = BN * HG_KC * 2;             // two boxes of activations (BN × 64)
    constexpr int W_OFF = X_BYTES;
    constexpr int S_OFF = W_OFF + BM * 32;
    constexpr int STAGE = S_OFF + BM * 16;              // + the stage's scales, or NTH scale slots
    // Two scales a row and stage (64-value blocks): the block's rows' come with the stage's
    // codes, one bulk copy from the scales in stage order. One (128-value blocks): every thread
    // loads its own rows' into its slot, D stages ahead (without any scale those formats'
    // passes were no faster). The host decides the same: plan::hgemm_stage_scales.
#ifdef ABLATE_HGSCALES
    // A measurement only (`NIWAKI_CUDA_ABLATE=hgscales`): no scale copied or loaded, every one 1.
    constexpr bool NO_SCALES = true;
#else
    constexpr bool NO_SCALES = false;
#endif
#ifdef ABLATE_HGCODES
    // A measurement only (`NIWAKI_CUDA_ABLATE=hgcodes`): no code copied, the MMAs on stale bytes.
    constexpr bool NO_CODES = true;
#else
    constexpr bool NO_CODES = false;
#endif
    constexpr bool STAGED = SPS == 2 && !NO_SCALES;
    constexpr bool LOAD_SCALES = SPS == 1 && !NO_SCALES;
    static_assert(BM * 16 == NTH * 8 && BM * SPS * 2 <= BM * 16, "a stage's scales and its threads' slots share bytes");
    constexpr int D = HG_STAGES - 2;
    static_assert(BN % 16 == 0 && STAGE == X_BYTES + WG * HG_STAGE_PER_WG && STAGE % 1024 == 0,
                  "the host sizes the stages as laid out here");
    static_assert(HG_TMA_EXTRA >= 1024 + 16 * HG_STAGES, "room to align the stages and for the barriers");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int rbase = (warp >> 2) * 64 + (warp & 3) * 16 + g;
    // This thread's code words in a stage, by 64-value block: 1-bit, word 2i + t/2 of its row,
    // shifted down to its fields (4(t & 1) + j; bit j of each half's low byte, hg_stage_mmas);
    // 2-bit, word t of chunk i, whose chunks rows 4-7 of every 8 have in swapped slots (the
    // 32-byte swizzle). Computed once: in the stage, ptxas rebuilt them every time.
    const int swz = FMT == FMT_Q1 ? 0 : (g >> 2) & 1;
    const int wrow = W_OFF + rbase * ROWB;
    int wo[2] = {FMT == FMT_Q1 ? wrow + 4 * (t >> 1) : wrow + 16 * swz + 4 * t,
                 FMT == FMT_Q1 ? wrow + 8 + 4 * (t >> 1) : wrow + 16 * (swz ^ 1) + 4 * t};
    int sh = FMT == FMT_Q1 ? 4 * (t & 1) : 0;
    // Opaque to the compiler, which otherwise rebuilt them from the thread's index every stage.
    asm volatile("" : "+r"(wo[0]), "+r"(wo[1]), "+r"(sh));
    const int tok0 = blockIdx.x * BN, row0 = blockIdx.y * BM;
    const int nst = cols / HG_KC, spr = cols / SV;
    const int st0 = (int)((long long)nst * blockIdx.z / gridDim.z);
    const int st1 = (int)((long long)nst * (blockIdx.z + 1) / gridDim.z);
    out += blockIdx.z * zstride;
    // The 128-byte swizzle repeats every 1024 bytes of shared address: stages start on one.
    const u32 raw = smem_addr(smem), base = (raw + 1023u) & ~1023u;
    unsigned char* sm = smem + (base - raw);
    const u32 bars = base + HG_STAGES * STAGE; // full[b] at bars + 8b, empty[b] at bars + 8(S + b)
    {
        u32 dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (bars + 16 * HG_STAGES - raw > dyn) __trap();
    }
    auto full = [&](int b) { return bars + 8 * b; };
    auto empty = [&](int b) { return bars + 8 * (HG_STAGES + b); };
    if (tid == 0) {
        for (int b = 0; b < HG_STAGES; b++) {
            mbar_init(full(b), 1);
            mbar_init(empty(b), WG * 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    // The 2-bit fields' magic numbers, 2^(10 − 2j) in both halves for field 2j, by way of shared
    // memory: as immediates (with the mask's), ptxas split each masking into two instructions,
    // where a register operand makes it one. (In constant memory, they slowed the decode's
    // kernels, compiled from the same source, by 4%.)
    __shared__ u32 magic_sm[4];
    if (tid < 4) magic_sm[tid] = (u32)(25 - 2 * tid) * 0x04000400u;
    __syncthreads();
    u32 magics[4];
#pragma unroll
    for (int j = 0; j < 4; j++) magics[j] = magic_sm[j];
    pdl_launch();
    // Stage s (of this block's split) into buffer b: its codes, and its rows' scales, which
    // lie together in the stage-ordered copy (its staged_rows rows reach past every block's
    // last).
    auto issue_weights = [&](int s, int b) {
        mbar_expect_tx(full(b), X_BYTES + (NO_CODES ? 0 : BM * ROWB) + (STAGED ? BM * SPS * 2 : 0));
        if (!NO_CODES) tma_2d(base + b * STAGE + W_OFF, wmap, s * ROWB, row0, full(b));
        if (STAGED)
            bulk_g2s(base + b * STAGE + S_OFF, staged + ((size_t)s * staged_rows + row0) * SPS, BM * SPS * 2, full(b));
    };
    auto issue_acts = [&](int s, int b) {
        const u32 dst = base + b * STAGE;
        tma_2d(dst, xmap, s * HG_KC, tok0, full(b));
        tma_2d(dst + X_BYTES / 2, xmap, s * HG_KC + 64, tok0, full(b));
    };
    // This thread's scales in a stage: its first row's in the block's stage-ordered run, or
    // its slot.
    int so = STAGED ? S_OFF + rbase * SPS * 2 : S_OFF + tid * 8;
    asm volatile("" : "+r"(so));
    auto store_scales = [&](int b, const u32* d) {
        u16* p = (u16*)(sm + b * STAGE + so);
#pragma unroll
        for (int e = 0; e < 2 * SPS; e++) p[e] = (u16)d[e];
    };
    // This thread's two rows' scales where it loads them (the last row again past the
    // matrix's end): one pointer, advanced a stage at a time, and the second row's offset from
    // it (as two row pointers ptxas rebuilt both from the row numbers every stage).
    const int r0 = min(row0 + rbase, rows - 1);
    const int r8 = (min(row0 + rbase + 8, rows - 1) - r0) * spr;
    const u16* snext = scales + (size_t)r0 * spr + st0 * SPS;
    // Weights are constant: their first stages are requested before waiting for the kernel
    // that writes the activations.
    if (tid == 0)
        for (int s = st0; s < min(st0 + D, st1); s++) issue_weights(s, s - st0);
    if (LOAD_SCALES) {
#pragma unroll
        for (int s = 0; s < D; s++)
            if (st0 + s < st1) {
                u32 d[2 * SPS];
                hg_load_scales<SPS>(snext, r8, d);
                store_scales(s, d);
                snext += SPS;
            }
    }
    pdl_wait();
    if (tid == 0)
        for (int s = st0; s < min(st0 + D, st1); s++) issue_acts(s, s - st0);

    float acc[BN / 2];
#pragma unroll
    for (int e = 0; e < BN / 2; e++) acc[e] = 0.0f;

    // The ring unrolled by its length: stage u0 + k uses buffer k, and every barrier parity
    // is the round's (ph) or its complement.
    const u64 desc_base = wg_desc_sw128(base);
    u32 ph = 0;
    for (int u0 = 0; st0 + u0 < st1; u0 += HG_STAGES) {
#pragma unroll
        for (int k = 0; k < HG_STAGES; k++) {
            const int u = u0 + k, s = st0 + u;
            if (s >= st1) break;
            const int vb = (k + D) % HG_STAGES, pb = (k + HG_STAGES - 1) % HG_STAGES;
            // Stage u + D's buffer was last used by stage u + D − S, in this round if k + D ≥ S.
            const u32 vph = (k + D >= HG_STAGES) ? ph : ph ^ 1u;
            const bool more = s + D < st1;
            if (tid == 0 && more) {
                if (u + D >= HG_STAGES) mbar_wait(empty(vb), vph);
                issue_weights(s + D, vb);
                issue_acts(s + D, vb);
            }
            __syncwarp();
            u32 sp[2 * SPS], dsc[2 * SPS];
            if (NO_SCALES) {
#pragma unroll
                for (int e = 0; e < 2 * SPS; e++) dsc[e] = 0x3C00u;
            }
            if (LOAD_SCALES) {
                if (more) {
                    hg_load_scales<SPS>(snext, r8, sp);
                    snext += SPS;
                }
                const u16* p = (const u16*)(sm + k * STAGE + so);
#pragma unroll
                for (int e = 0; e < 2 * SPS; e++) dsc[e] = p[e];
            }
            mbar_wait(full(k), ph);
            const unsigned char* st = sm + k * STAGE;
            if (STAGED) {
                // The second row's 8 rows on.
                const u16* sl = (const u16*)(st + so);
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int j = 0; j < SPS; j++) dsc[h * SPS + j] = sl[h * 8 * SPS + j];
            }
            // Buffer k's descriptor: the first buffer's plus its offset in 16-byte units (no
            // carry: shared addresses stay below 2^18).
            hg_stage_mmas<FMT, BN>(acc, st, wo, sh, dsc, magics, desc_base + (u64)((k * STAGE) >> 4), [&] {
                if (u > 0 && lane == 0) mbar_arrive(empty(pb));
            });
            if (LOAD_SCALES && more) store_scales(vb, sp);
        }
        ph ^= 1u;
    }
    hg_store<BN>(acc, row0, rbase, tok0, t, rows, ntok, out, out_stride, accumulate);
}
#define HGEMM_CALL(FMT, WG, BN) \
    hgemm_body<FMT, WG, BN>(wmap, scales, staged, staged_rows, rows, cols, xmap, ntok, out, out_stride, accumulate, \
                            zstride)
#else
#define HGEMM_CALL(FMT, WG, BN) __trap()
#endif

// grid (ceil(ntok / BN), ceil(rows / (64·WG)), K splits), block 128·WG; the codes and the
// activations as tensor maps (plan/gemm.rs: hgemm_weight_tile, hgemm_act_tile); dynamic shared
// memory HG_STAGES stages + HG_TMA_EXTRA (GemmKernel::smem_bytes). 16-token tiles are bound to
// registers for two blocks a multiprocessor (plan::F16_TWO_BLOCK_TOKENS), wider ones hold one
// (their registers). A variant per format, warpgroups and tokens a block (BN: 128 for long
// passes, fewer for short ones, whose MMAs on tokens past the pass's end would be wasted).
#define HGEMM_KERNEL(name, FMT, WG, BN)                                                              \
    ENTRY __global__ void __launch_bounds__(WG * 128, BN == 16 ? 2 : 1)                              \
        name(const __grid_constant__ TmaMap wmap, const u16* __restrict__ scales,                         \
             const u16* __restrict__ staged, int staged_rows, int rows, int cols,                         \
             const __grid_constant__ TmaMap xmap, int ntok, float* __restrict__ out, int out_stride,      \
             int accumulate, long long zstride) {                                                        \
        HGEMM_CALL(FMT, WG, BN);                                                                     \
    }
HGEMM_KERNEL(hgemm_q1_w3_n16, FMT_Q1, 3, 16)
HGEMM_KERNEL(hgemm_q1_w3_n32, FMT_Q1, 3, 32)
HGEMM_KERNEL(hgemm_q1_w3_n64, FMT_Q1, 3, 64)
HGEMM_KERNEL(hgemm_q1_w3_n128, FMT_Q1, 3, 128)
HGEMM_KERNEL(hgemm_q1_w4_n16, FMT_Q1, 4, 16)
HGEMM_KERNEL(hgemm_q1_w4_n32, FMT_Q1, 4, 32)
HGEMM_KERNEL(hgemm_q1_w4_n64, FMT_Q1, 4, 64)
HGEMM_KERNEL(hgemm_q1_w4_n128, FMT_Q1, 4, 128)
HGEMM_KERNEL(hgemm_q2g64_w3_n16, FMT_Q2G64, 3, 16)
HGEMM_KERNEL(hgemm_q2g64_w3_n32, FMT_Q2G64, 3, 32)
HGEMM_KERNEL(hgemm_q2g64_w3_n64, FMT_Q2G64, 3, 64)
HGEMM_KERNEL(hgemm_q2g64_w3_n128, FMT_Q2G64, 3, 128)
HGEMM_KERNEL(hgemm_q2g64_w4_n16, FMT_Q2G64, 4, 16)
HGEMM_KERNEL(hgemm_q2g64_w4_n32, FMT_Q2G64, 4, 32)
HGEMM_KERNEL(hgemm_q2g64_w4_n64, FMT_Q2G64, 4, 64)
HGEMM_KERNEL(hgemm_q2g64_w4_n128, FMT_Q2G64, 4, 128)
HGEMM_KERNEL(hgemm_q2g128_w3_n16, FMT_Q2G128, 3, 16)
HGEMM_KERNEL(hgemm_q2g128_w3_n32, FMT_Q2G128, 3, 32)
HGEMM_KERNEL(hgemm_q2g128_w3_n64, FMT_Q2G128, 3, 64)
HGEMM_KERNEL(hgemm_q2g128_w3_n128, FMT_Q2G128, 3, 128)
HGEMM_KERNEL(hgemm_q2g128_w4_n16, FMT_Q2G128, 4, 16)
HGEMM_KERNEL(hgemm_q2g128_w4_n32, FMT_Q2G128, 4, 32)
HGEMM_KERNEL(hgemm_q2g128_w4_n64, FMT_Q2G128, 4, 64)
HGEMM_KERNEL(hgemm_q2g128_w4_n128, FMT_Q2G128, 4, 128)
