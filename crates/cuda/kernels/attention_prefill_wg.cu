// Attention of a multi-token pass over an f16 cache on warpgroup MMA (wgmma, sm_90a), the
// default there (NIWAKI_CUDA_ATTN_PREFILL_WG=0 for the other; plan/attention_prefill.rs). The
// mma.sync form (attention_prefill.cu) runs six warps a multiprocessor, one per query head:
// four schedulers then hold two warps on two of them and one on the others, and its lone warps
// wait at every tile's barrier for the paired ones (19% of its stall samples, Nsight Compute on
// an H100), with its 255 registers and 99 KB of queries leaving no room for more warps of that
// form. This form took a 27B chunk at depth in 17% less time (fifty-seventh session).
//
// Here a block is two warpgroups of 64 query rows each, a row a (token, query head) pair of one
// kv head, heads fastest: rows r0 .. r0 + 127 of the pass's ntok · GQA. Eight warps, two a
// scheduler. Per tile of AW_TILE positions a warpgroup computes
//   S (64 rows × AW_TILE) = Q_hi · K^T + Q_lo · K^T   (wgmma m64n32k16, A and B in shared
//                                                      memory, HD / 16 steps each)
//   O (64 rows × HD)     += P_hi · V + P_lo · V       (wgmma m64n256k16, A in registers from S's
//                                                      accumulators, B the value rows)
// the queries and weights as f16 pairs hi + lo as in the mma.sync form, the online softmax on
// S's accumulators (whose layout is mma.sync's: a thread holds rows gid and gid + 8 of its warp's
// 16), partial rows and splits as attn_split's and attn_prefill_mma's (the merge is
// attn_combine_rows with the split length). The default entry, attn_prefill_wg_wide, takes
// tiles of 64 positions (m64n64k16 scores) in the same shared memory: see attn_prefill_wg_body.
//
// Shared memory (1024-byte aligned; plan/attention_prefill.rs sizes it): the queries hi, then lo
// ([warpgroup][HD / 64 boxes][64 rows][128 bytes]), then AW_STAGES stages of keys then values
// ([HD / 64 boxes][AW_TILE rows][128 bytes]). Every box is 128-byte rows in the 128-byte swizzle
// (the 16-byte piece c of row r at c ^ (r % 8)), which wgmma reads as K-major for the queries and
// keys, and as the transposed (N-major) form for the values: rows are positions (the K of
// O += P · V), 64 head values a box, boxes AW_TILE · 128 bytes apart.
#ifndef AW_TILE
#error "AW_TILE and AW_STAGES must be defined by the host (plan/attention_prefill.rs)"
#endif
#define AW_ROWS 128
#if HD % 128 == 0
static_assert(AW_TILE == 32 && AW_STAGES >= 2, "S is one m64n32k16 a k16 step; heads of 128 or 256 columns");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d (64×32 f32, this thread's 16) (+)= A (64×16 f16) · B (16×32 f16), both from shared memory
// (K-major, the 128-byte swizzle); `acc` 0 overwrites d.
__device__ __forceinline__ void wgmma_64x32x16_ss(float* d, u64 adesc, u64 bdesc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(adesc), "l"(bdesc), "r"(acc));
}

// The same with 64 columns (this thread's 32): the wide entry's scores.
__device__ __forceinline__ void wgmma_64x64x16_ss(float* d, u64 adesc, u64 bdesc, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(adesc), "l"(bdesc), "r"(acc));
}

// d (64×256 f32, this thread's 128) += A (64×16 f16, registers) · B (16×256 f16, shared memory,
// its 256 columns contiguous: the transposed form, in the 128-byte swizzle).
__device__ __forceinline__ void wgmma_64x256x16_rs_t(float* d, const u32* a, u64 bdesc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
}
// The same for 128 columns (this thread's 64).
__device__ __forceinline__ void wgmma_64x128x16_rs_t(float* d, const u32* a, u64 bdesc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
}

// O's MMAs a head value range at a time: all 256 columns an instruction, or 128 for heads of 128.
#if HD % 256 == 0
#define AW_N 256
#define wgmma_pv wgmma_64x256x16_rs_t
#else
#define AW_N 128
#define wgmma_pv wgmma_64x128x16_rs_t
#endif

// Descriptor of the transposed (N-major) operand in the 128-byte swizzle: 8-row groups 1024
// bytes apart, boxes of 64 columns `box` bytes apart.
__device__ __forceinline__ u64 wg_desc_sw128_t(u32 saddr, u32 box) {
    return (u64)((saddr & 0x3FFFFu) >> 4) | ((u64)((box >> 4) & 0x3FFFu) << 16) | ((u64)(1024 >> 4) << 32) |
           ((u64)1 << 62);
}

// Byte offset of value i (a multiple of 4 below 8, or of 8) of row r in a swizzled box.
__device__ __forceinline__ int aw_swz(int r, int i) {
    return r * 128 + ((((i & 63) >> 3) ^ (r & 7)) << 4) + (i & 7) * 2;
}

__device__ __forceinline__ void aw_fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// This thread's copies but the last N groups landed, visible to the tensor cores' reads, and
// every thread of the block there: what a tile's barrier waits for.
template <int N>
__device__ __forceinline__ void aw_landed() {
    cp_async_wait<N>();
    aw_fence_async();
    __syncthreads();
}
#endif

// grid (ceil(ntok · GQA / 128), NKV, nsplit), 256 threads. Split sp covers positions
// [sp·len, (sp + 1)·len) (len a multiple of AW_TILE); rows whose token's context ends before
// sp·len are not written. part: as attn_split's.
//
// TILE: 64 positions a tile (attn_prefill_wg_wide, the default), whose scores are m64n64k16
// MMAs: each k16 step reads a warpgroup's 64 query rows (hi and lo, 4 KiB) from shared memory
// once for 64 positions where AW_TILE-position tiles (attn_prefill_wg, opt-in:
// NIWAKI_CUDA_ATTN_PREFILL_WG_ENTRY=plain) read them for 32, and a tile's softmax rescales the
// outputs once for 64 positions. Its shared memory is the narrow form's: a ring of three
// 64-position halves, keys or values (item 2i: tile i's keys, 2i + 1 its values, in half j % 3),
// each handed out at one of a tile's two barriers (tile i + 1's keys once every warp is done
// with tile i - 1, its values once every warp is done with tile i's keys), a tile ahead of its
// use. A split's length is a multiple of AW_TILE, so its last tile may be half masked.
template <int TILE>
__device__ __forceinline__ void attn_prefill_wg_body(const float* __restrict__ q, const void* __restrict__ kc,
        const void* __restrict__ vc, const u32* __restrict__ pos_ptr, float scale, int ntok, int nsplit,
        int len, float* __restrict__ part) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr bool WIDE = TILE != AW_TILE;
    static_assert(!WIDE || (TILE == 64 && AW_STAGES == 3), "the wide ring: three 64-position halves");
    constexpr int NBOX = HD / 64;
    constexpr int QBOX = 64 * 128;              // a warpgroup's 64 rows of one box
    constexpr int QWG = NBOX * QBOX;            // a warpgroup's queries, hi or lo
    constexpr int KBOX = TILE * 128;            // a stage's rows of one box
    constexpr int KV = NBOX * KBOX;             // a stage's keys (then as many values)
    constexpr int STAGE = 2 * KV;
    static_assert(QBOX % 1024 == 0 && KBOX % 1024 == 0, "boxes on whole swizzle atoms");
    extern __shared__ __align__(1024) unsigned char smem[];
    const u32 raw = smem_addr(smem), base = (raw + 1023u) & ~1023u;
    unsigned char* sb = smem + (base - raw);
    unsigned char* stages = sb + 4 * QWG;
    const u32 qh_at = base, ql_at = base + 2 * QWG, st_at = base + 4 * QWG;
    PDL_ENTRY();
    const int r0 = blockIdx.x * AW_ROWS, kvh = blockIdx.y, sp = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int gid = lane >> 2, tig = lane & 3;
    const int pos = (int)*pos_ptr;
    const int nrows = ntok * GQA;
    // The block's longest context: its last row's token's.
    const int ctx_end = pos + (min(r0 + AW_ROWS, nrows) - 1) / GQA + 1;
    const int p0 = sp * len;
    if (p0 >= ctx_end) return;
    const int p1 = min(ctx_end, p0 + len);
    const int ntiles = (p1 - p0 + TILE - 1) / TILE;
    const unsigned char *kb = (const unsigned char*)kc, *vb = (const unsigned char*)vc;
    // Tile i's keys (h 0) or values (h 1) to `st`. Rows past the split repeat its last position
    // (finite values; their scores are masked).
    auto copy_kv = [&](int i, int h, unsigned char* st) {
        if (i >= ntiles) return;
        const int p = p0 + i * TILE;
        const unsigned char* src = h ? vb : kb;
        each_copy<TILE * HD / 8, 256>(tid, [&](int e) {
            const int r = e / (HD / 8), c = e % (HD / 8);
            const size_t row = ((size_t)min(p + r, p1 - 1) * NKV + kvh) * (2 * HD);
            cp_async16(st + (c >> 3) * KBOX + aw_swz(r, 8 * c), src + row + c * 16);
        });
    };
    // Tile i's keys then values into stage i % AW_STAGES.
    auto copy = [&](int i) {
#pragma unroll
        for (int h = 0; h < 2; h++) copy_kv(i, h, stages + (i % AW_STAGES) * STAGE + h * KV);
    };
    // The wide ring's item j into half j % 3.
    auto copy_half = [&](int j) { copy_kv(j >> 1, j & 1, stages + (j % 3) * KV); };
    if constexpr (WIDE) {
        copy_half(0);
        cp_async_commit();
        copy_half(1);
        cp_async_commit();
    } else {
#pragma unroll
        for (int i = 0; i < AW_STAGES - 1; i++) {
            copy(i);
            cp_async_commit();
        }
    }
    // The queries as f16 pairs, four values a load; rows past the pass repeat its last row
    // (computed, never written).
#pragma unroll 8
    for (int k = 0; k < AW_ROWS * HD / 4 / 256; k++) {
        const int e = 4 * (tid + 256 * k);
        const int r = e / HD, i = e % HD;
        const int pr = min(r0 + r, nrows - 1);
        const int t = pr / GQA, g = pr % GQA;
        const float4 v = *(const float4*)(q + ((size_t)t * NH + kvh * GQA + g) * HD + i);
        u32 h01, l01, h23, l23;
        f16_pairs(v.x, v.y, &h01, &l01);
        f16_pairs(v.z, v.w, &h23, &l23);
        const int at = (r >> 6) * QWG + (i >> 6) * QBOX + aw_swz(r & 63, i);
        *(uint2*)(sb + at) = make_uint2(h01, h23);
        *(uint2*)(sb + 2 * QWG + at) = make_uint2(l01, l23);
    }

    // This thread's rows (of its warpgroup's 64: warp w % 4 holds 16), and their contexts' ends.
    const int row0 = r0 + wg * 64 + (warp & 3) * 16 + gid;
    const int end0 = pos + min(row0, nrows - 1) / GQA + 1;
    const int end1 = pos + min(row0 + 8, nrows - 1) / GQA + 1;
    float o[HD / 2];
#pragma unroll
    for (int j = 0; j < HD / 2; j++) o[j] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const u32 qh_wg = qh_at + wg * QWG, ql_wg = ql_at + wg * QWG;
    // s[4j + c]: rows gid (c < 2) and gid + 8, positions p + 8·j + 2·tig + c % 2 of the tile
    // (each tile's first MMA overwrites it: zeros only so that nothing reads an unset value).
    float s[TILE / 2] = {};
    // S (+)= Q_hi · K^T + Q_lo · K^T of the keys at shared address `kat`, into `d`; committed.
    auto scores = [&](float* d, u32 kat) {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const u32 off = (kk >> 2) * QBOX + (kk & 3) * 32;
            const u64 kd = wg_desc_sw128(kat + (kk >> 2) * KBOX + (kk & 3) * 32);
            if constexpr (WIDE) {
                wgmma_64x64x16_ss(d, wg_desc_sw128(qh_wg + off), kd, kk > 0);
                wgmma_64x64x16_ss(d, wg_desc_sw128(ql_wg + off), kd, 1);
            } else {
                wgmma_64x32x16_ss(d, wg_desc_sw128(qh_wg + off), kd, kk > 0);
                wgmma_64x32x16_ss(d, wg_desc_sw128(ql_wg + off), kd, 1);
            }
        }
        wg_commit();
    };
    // O += P · V of the values at shared address `vat`, P from S's accumulators `e`; committed.
    auto weighted = [&](const float* e, u32 vat) {
        // A k16 step per 16 positions: P's A fragment is S's n8 tiles 2·kp, 2·kp + 1.
        u32 ph[TILE / 16][4], pl[TILE / 16][4];
#pragma unroll
        for (int kp = 0; kp < TILE / 16; kp++) {
            const float* f = e + 8 * kp;
            f16_pairs(f[0], f[1], &ph[kp][0], &pl[kp][0]);
            f16_pairs(f[2], f[3], &ph[kp][1], &pl[kp][1]);
            f16_pairs(f[4], f[5], &ph[kp][2], &pl[kp][2]);
            f16_pairs(f[6], f[7], &ph[kp][3], &pl[kp][3]);
        }
        wg_fence();
#pragma unroll
        for (int kp = 0; kp < TILE / 16; kp++) {
#pragma unroll
            for (int nb = 0; nb < HD / AW_N; nb++) {
                // Positions 16·kp onwards (two 8-row groups), head values AW_N·nb onwards.
                const u64 vd = wg_desc_sw128_t(vat + nb * (AW_N / 64) * KBOX + kp * 2048, KBOX);
                wgmma_pv(o + nb * (AW_N / 2), ph[kp], vd);
                wgmma_pv(o + nb * (AW_N / 2), pl[kp], vd);
            }
        }
        wg_commit();
    };
    if constexpr (WIDE) {
        for (int i = 0; i < ntiles; i++) {
            // Tile i's keys landed for every thread (and the queries, the first time), visible
            // to the tensor cores' reads; every warp is done with tile i - 1, whose values' half
            // takes tile i + 1's keys.
            aw_landed<1>();
            copy_half(2 * i + 2);
            cp_async_commit();
            scores(s, st_at + ((2 * i) % 3) * KV);
            wg_wait<0>();
#pragma unroll
            for (int j = 0; j < TILE / 2; j++) wg_reg_fence(s[j]);
            tile_softmax<TILE / 8, HD / 8>(s, o, p0 + i * TILE, tig, end0, end1, p1, scale, m0, m1, l0, l1);
            // Tile i's values landed; every warp is done with its keys, whose half takes tile
            // i + 1's values.
            aw_landed<1>();
            copy_half(2 * i + 3);
            cp_async_commit();
            weighted(s, st_at + ((2 * i + 1) % 3) * KV);
            wg_wait<0>();
#pragma unroll
            for (int j = 0; j < HD / 2; j++) wg_reg_fence(o[j]);
        }
    } else {
        for (int i = 0; i < ntiles; i++) {
            // Tile i landed for every thread (and the queries, the first time), visible to the
            // tensor cores' reads; every warp is done with tile i - 1.
            aw_landed<AW_STAGES - 2>();
            copy(i + AW_STAGES - 1);
            cp_async_commit();
            const u32 st = st_at + (i % AW_STAGES) * STAGE;
            const int p = p0 + i * TILE;
            scores(s, st);
            wg_wait<0>();
#pragma unroll
            for (int j = 0; j < TILE / 2; j++) wg_reg_fence(s[j]);
            tile_softmax<TILE / 8, HD / 8>(s, o, p, tig, end0, end1, p1, scale, m0, m1, l0, l1);
            weighted(s, st + KV);
            wg_wait<0>();
#pragma unroll
            for (int j = 0; j < HD / 2; j++) wg_reg_fence(o[j]);
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int pr = row0 + 8 * h;
        if (pr >= nrows) continue;
        const int t = pr / GQA, head = kvh * GQA + pr % GQA;
        // Written where the token's context reaches this split: then the row saw a position.
        if (p0 >= pos + t + 1) continue;
        // o's n8 tiles run over every AW_N-value part in turn: the layout store_partial_row reads.
        store_partial_row(part, t, head, nsplit, sp, o, h, tig, h == 0 ? m0 : m1, h == 0 ? l0 : l1);
    }
#else
    __trap();
#endif
}

ENTRY __global__ void __launch_bounds__(256, 1)
    attn_prefill_wg(const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,
                    const u16* __restrict__ ks, const u16* __restrict__ vs, const u32* __restrict__ pos_ptr,
                    float scale, int ntok, int nsplit, int len, float* __restrict__ part) {
    attn_prefill_wg_body<AW_TILE>(q, kc, vc, pos_ptr, scale, ntok, nsplit, len, part);
}
ENTRY __global__ void __launch_bounds__(256, 1)
    attn_prefill_wg_wide(const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,
                         const u16* __restrict__ ks, const u16* __restrict__ vs, const u32* __restrict__ pos_ptr,
                         float scale, int ntok, int nsplit, int len, float* __restrict__ part) {
    attn_prefill_wg_body<64>(q, kc, vc, pos_ptr, scale, ntok, nsplit, len, part);
}
#else
// Heads of whole 128 values only: the host launches them for no other.
ENTRY __global__ void attn_prefill_wg() { __trap(); }
ENTRY __global__ void attn_prefill_wg_wide() { __trap(); }
#endif
