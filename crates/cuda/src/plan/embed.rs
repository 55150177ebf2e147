//! Which embedding tables a one-token pass looks up on the device (`embed_row`,
//! kernels/embed.cu), so that a decode step can follow the previous step's pick without the host.

use quant::Format;

use super::ROT_BLOCK;

/// The table layouts `embed_row` decodes; the values are its `fmt` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedFormat {
    Q1_0 = 1,
    /// Q2_0 in groups of 64.
    Q2g64 = 2,
    /// The 2-bit layout in groups of 128: legacy Q2_0 g128 and PQ2_0.
    Q2g128 = 3,
    Ptq1_0 = 4,
}

impl EmbedFormat {
    /// The layout of a table in `format`, or `None` where the kernel does not decode it (the
    /// host then embeds every pass, as for prefill).
    pub fn of(format: Format) -> Option<EmbedFormat> {
        match format {
            Format::Q1_0 => Some(EmbedFormat::Q1_0),
            Format::Q2_0 => Some(EmbedFormat::Q2g64),
            Format::Q2_0G128 | Format::PQ2_0 => Some(EmbedFormat::Q2g128),
            Format::PTQ1_0 => Some(EmbedFormat::Ptq1_0),
            Format::F32 | Format::F16 | Format::BF16 | Format::Q8_0 | Format::Q4_1 => None,
        }
    }

    /// The `fmt` argument of `embed_row`.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// How one-token passes embed a table of `format` with rows of `hidden` values, `rotated_block`
/// being the Hadamard block of an embedding stored rotated: on the device where `embed_row`
/// decodes the format and un-rotates the row (blocks of [`ROT_BLOCK`], whole blocks only).
pub fn device_embedding(
    format: Format,
    hidden: usize,
    rotated_block: Option<usize>,
) -> Option<EmbedFormat> {
    let whole_blocks = match rotated_block {
        None => true,
        Some(b) => b == ROT_BLOCK && hidden.is_multiple_of(ROT_BLOCK),
    };
    EmbedFormat::of(format).filter(|_| whole_blocks && hidden.is_multiple_of(4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bonsai_weight_format_is_embedded_on_the_device_and_the_others_on_the_host() {
        for f in Format::ALL {
            let want = matches!(
                f,
                Format::Q1_0 | Format::Q2_0 | Format::Q2_0G128 | Format::PQ2_0 | Format::PTQ1_0
            );
            assert_eq!(EmbedFormat::of(f).is_some(), want, "{f:?}");
        }
        // Legacy g128 and PQ2_0 share one layout.
        assert_eq!(
            EmbedFormat::of(Format::Q2_0G128),
            EmbedFormat::of(Format::PQ2_0)
        );
    }

    #[test]
    fn the_layout_codes_are_the_kernels() {
        let src = crate::compile::source();
        for (name, f) in [
            ("EMBED_Q1_0", EmbedFormat::Q1_0),
            ("EMBED_Q2_64", EmbedFormat::Q2g64),
            ("EMBED_Q2_128", EmbedFormat::Q2g128),
            ("EMBED_PTQ1_0", EmbedFormat::Ptq1_0),
        ] {
            let line = format!("#define {name} {}\n", f.code());
            assert!(
                src.contains(&line),
                "kernels/embed.cu lacks `{}`",
                line.trim()
            );
        }
    }

    #[test]
    fn a_rotated_embedding_is_looked_up_on_the_device_only_in_whole_kernel_blocks() {
        let q2 = Format::Q2_0;
        assert_eq!(device_embedding(q2, 5120, None), Some(EmbedFormat::Q2g64));
        assert_eq!(
            device_embedding(Format::PTQ1_0, 5120, Some(ROT_BLOCK)),
            Some(EmbedFormat::Ptq1_0)
        );
        assert_eq!(device_embedding(q2, 5120, Some(512)), None);
        assert_eq!(device_embedding(q2, 1536, Some(ROT_BLOCK)), None);
        assert_eq!(device_embedding(q2, 1536, None), Some(EmbedFormat::Q2g64));
        assert_eq!(device_embedding(Format::F16, 5120, None), None);
    }
}
