//! The program NVRTC compiles: the kernel sources in order, the kernels the backend launches,
//! and the parts in which it is compiled.

/// The kernel sources in the order they are concatenated, each with the part of the program
/// whose compilation emits its kernels ([`PARTS`]).
pub const SOURCES: [(&str, &str, usize); 19] = [
    ("common.cuh", include_str!("../../kernels/common.cuh"), 0),
    ("quant.cu", include_str!("../../kernels/quant.cu"), 0),
    // After quant.cu (the inverse rotation).
    ("embed.cu", include_str!("../../kernels/embed.cu"), 0),
    ("gemv.cu", include_str!("../../kernels/gemv.cu"), 1),
    // After gemv.cu (the fused norm, the L2 prefetch).
    ("gemv_b1.cu", include_str!("../../kernels/gemv_b1.cu"), 2),
    ("gemm.cu", include_str!("../../kernels/gemm.cu"), 3),
    ("hgemm.cu", include_str!("../../kernels/hgemm.cu"), 3),
    ("gdn.cu", include_str!("../../kernels/gdn.cu"), 0),
    (
        "gdn_chunk.cu",
        include_str!("../../kernels/gdn_chunk.cu"),
        4,
    ),
    ("sync.cu", include_str!("../../kernels/sync.cu"), 0),
    (
        "tile_image.cu",
        include_str!("../../kernels/tile_image.cu"),
        0,
    ),
    ("topk.cu", include_str!("../../kernels/topk.cu"), 0),
    (
        "bandwidth.cu",
        include_str!("../../kernels/bandwidth.cu"),
        0,
    ),
    (
        "pdl_probe.cu",
        include_str!("../../kernels/pdl_probe.cu"),
        0,
    ),
    // After gemv.cu (its chunk dot and staging) and sync.cu (the grid barrier).
    (
        "gemv_chain.cu",
        include_str!("../../kernels/gemv_chain.cu"),
        1,
    ),
    (
        "attention.cu",
        include_str!("../../kernels/attention.cu"),
        0,
    ),
    (
        "attention_mma.cu",
        include_str!("../../kernels/attention_mma.cu"),
        0,
    ),
    // After attention_mma.cu (the f16 pairs, ldmatrix.trans) and gemm.cu (ldmatrix).
    (
        "attention_prefill.cu",
        include_str!("../../kernels/attention_prefill.cu"),
        0,
    ),
    // After attention_prefill.cu (the f16 pairs, the tile softmax); beside gdn_chunk.cu, the
    // smallest part.
    (
        "attention_prefill_wg.cu",
        include_str!("../../kernels/attention_prefill_wg.cu"),
        4,
    ),
];

/// Parts in which the program is compiled, one NVRTC call each, side by side on threads of
/// their own. Every part parses the whole program, so that each file's helpers stay where they
/// are, but emits only the kernels of its own files: the others' entries (`ENTRY`) are function
/// templates never instantiated. For the 27B's shapes NVRTC took 26.1 s for the whole program on
/// one core of a development machine, and for the parts alone 3.6 s (the rest), 6.2 (gemv.cu
/// and the probe), 6.2 (gemv_b1.cu), 3.8 (the GEMMs) and 4.0 (the chunked recurrence): 13.0 s
/// side by side on its two cores.
pub const PARTS: usize = 5;

/// Every kernel the backend launches.
pub const KERNELS: [&str; 156] = [
    "read_sum",
    "pdl_spin",
    "pdl_copy",
    "quant_rms",
    "quant_swiglu",
    "quant_gated",
    "quant_plain",
    "fill_u64",
    "gemv_q1_t1",
    "gemv_q1_t8",
    "gemv_q2g64_t1",
    "gemv_q2g64_t8",
    "gemv_q2g128_t1",
    "gemv_q2g128_t8",
    "gemv1_q1_r1",
    "gemv1_q1_r2",
    "gemv1_q2g64_r1",
    "gemv1_q2g64_r2",
    "gemv1_q2g128_r1",
    "gemv1_q2g128_r2",
    "gemv1_q1_r1_x",
    "gemv1_q1_r2_x",
    "gemv1_q2g64_r1_x",
    "gemv1_q2g64_r2_x",
    "gemv1_q2g128_r1_x",
    "gemv1_q2g128_r2_x",
    "gemv1_q1_r1_nodot",
    "gemv1_q1_r2_nodot",
    "gemv1_q2g64_r1_nodot",
    "gemv1_q2g64_r2_nodot",
    "gemv1_q1_r2s",
    "gemv1_q2g64_r2s",
    "gemv1_q2g128_r2s",
    "gemv1_q1_r2s_x",
    "gemv1_q2g64_r2s_x",
    "gemv1_q2g128_r2s_x",
    "gemv_b1_j5x",
    "gemv_b1_j6x",
    "gemv_b1_j6",
    "gemv_b1_j17x",
    "gemv_b1_j17",
    "gemv_b1_j17x_xs",
    "gemv_b1_j17_xs",
    "gemv_b1_j5x_r32",
    "gemv_b1_j6x_r32",
    "gemv_b1_j5x_n",
    "gemv_b1_j6x_n",
    "gemv_b1_j6_n",
    "gemv_b1_j5x_r32_n",
    "gemv_b1_j6x_r32_n",
    "gemv_b2g64_j10x",
    "gemv_b2g64_j12x",
    "gemv_b2g64_j12",
    "gemv_b2g128_j10x",
    "gemv_b2g128_j12x",
    "gemv_b2g128_j12",
    "gemv_b2g64_j10x_i",
    "gemv_b2g64_j12x_i",
    "gemv_b2g64_j12_i",
    "gemv_b2g128_j10x_i",
    "gemv_b2g128_j12x_i",
    "gemv_b2g128_j12_i",
    "gemv_b1_j6x_c",
    "gemv_b1_j6_c",
    "gemv_b2g64_j12x_c",
    "gemv_b2g64_j12_c",
    "gemv_b2g128_j12x_c",
    "gemv_b2g128_j12_c",
    "gemv_b1_j5x_p",
    "gemv_b1_j6x_p",
    "gemv_b1_j6_p",
    "gemv_b1_j17x_p",
    "gemv_b1_j17_p",
    "gemv_b1_j17x_xs_p",
    "gemv_b1_j17_xs_p",
    "gemv_b1_j5x_r32_p",
    "gemv_b1_j6x_r32_p",
    "gemv_b1_j6x_c_p",
    "gemv_b1_j6_c_p",
    "quant_rms_p",
    "quant_swiglu_p",
    "quant_gated_p",
    "quant_plain_p",
    "gdn_decode_p",
    "attn_combine_quant_p",
    "attn_short_p",
    "attn_short_q8_p",
    "gemv_chain_q1",
    "gemv_chain_q2g64",
    "gemv_chain_q1_synced",
    "gemv_chain_q2g64_synced",
    "gemv_chain_q1_free",
    "gemv_chain_q2g64_free",
    "b1_tile_image",
    "gemm_q1_m1",
    "gemm_q1_m2",
    "gemm_q2g64_m1",
    "gemm_q2g64_m2",
    "gemm_q2g128_m1",
    "gemm_q2g128_m2",
    "gemm_reduce",
    "hgemm_q1_w3_n16",
    "hgemm_q1_w3_n32",
    "hgemm_q1_w3_n64",
    "hgemm_q1_w3_n128",
    "hgemm_q1_w4_n16",
    "hgemm_q1_w4_n32",
    "hgemm_q1_w4_n64",
    "hgemm_q1_w4_n128",
    "hgemm_q2g64_w3_n16",
    "hgemm_q2g64_w3_n32",
    "hgemm_q2g64_w3_n64",
    "hgemm_q2g64_w3_n128",
    "hgemm_q2g64_w4_n16",
    "hgemm_q2g64_w4_n32",
    "hgemm_q2g64_w4_n64",
    "hgemm_q2g64_w4_n128",
    "hgemm_q2g128_w3_n16",
    "hgemm_q2g128_w3_n32",
    "hgemm_q2g128_w3_n64",
    "hgemm_q2g128_w3_n128",
    "hgemm_q2g128_w4_n16",
    "hgemm_q2g128_w4_n32",
    "hgemm_q2g128_w4_n64",
    "hgemm_q2g128_w4_n128",
    "embed_row",
    "gdn_conv",
    "gdn_prep",
    "gdn_chunk_prep",
    "gdn_chunk_scan",
    "gdn_step_r32",
    "gdn_step_r16",
    "gdn_step_r8",
    "gdn_decode",
    "grid_barrier_rounds",
    "topk_logits",
    "topk_keys",
    "weight_chunks",
    "weight_total",
    "attn_prep",
    "attn_prep_q8",
    "attn_split_t4",
    "attn_split_q8_t4",
    "attn_split_t8",
    "attn_split_q8_t8",
    "attn_split_mma",
    "attn_split_q8_mma",
    "attn_prefill_mma",
    "attn_prefill_q8_mma",
    "attn_prefill_wg",
    "attn_prefill_wg_wide",
    "attn_combine",
    "attn_combine_quant",
    "attn_combine_rows",
    "attn_short",
    "attn_short_q8",
];

/// The whole program as one translation unit, every kernel emitted.
pub fn source() -> String {
    assemble(None)
}

/// The program with only the kernels of part `part`'s files emitted.
pub fn source_part(part: usize) -> String {
    assemble(Some(part))
}

/// Each file after the definition of its kernels' entry: `extern "C"` where they are emitted, a
/// template parameter list (parsed, never instantiated) where they are not.
fn assemble(part: Option<usize>) -> String {
    let mut s = String::new();
    for (name, text, p) in SOURCES {
        let entry = if part.is_none_or(|k| k == p) {
            "extern \"C\""
        } else {
            "template <int>"
        };
        s.push_str(&format!(
            "// ---- {name}\n#undef ENTRY\n#define ENTRY {entry}\n"
        ));
        s.push_str(text);
        s.push('\n');
    }
    s
}
