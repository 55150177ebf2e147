//! The table of weight formats: what a block is for each type, and the ggml type ids they carry.

use crate::QuantError;

/// Every weight layout niwaki can decode.
///
/// `Q2_0G128` is the legacy PrismML layout that reuses ggml id 42 with 128-value groups; it is told
/// apart from `Q2_0` (g64) only by a tensor's byte size, see [`Format::resolve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_1,
    Q1_0,
    /// Mainline Q2_0: groups of 64.
    Q2_0,
    /// Legacy PrismML Q2_0: id 42, groups of 128.
    Q2_0G128,
    PQ2_0,
    PTQ1_0,
}

impl Format {
    pub const ALL: [Format; 10] = [
        Format::F32,
        Format::F16,
        Format::BF16,
        Format::Q8_0,
        Format::Q4_1,
        Format::Q1_0,
        Format::Q2_0,
        Format::Q2_0G128,
        Format::PQ2_0,
        Format::PTQ1_0,
    ];

    /// The ggml type id written in a GGUF tensor header.
    pub const fn ggml_id(self) -> u32 {
        match self {
            Format::F32 => 0,
            Format::F16 => 1,
            Format::Q4_1 => 3,
            Format::Q8_0 => 8,
            Format::BF16 => 30,
            Format::Q1_0 => 41,
            Format::Q2_0 | Format::Q2_0G128 => 42,
            Format::PQ2_0 => 142,
            Format::PTQ1_0 => 143,
        }
    }

    /// Values per block.
    pub const fn block_len(self) -> usize {
        match self {
            Format::F32 | Format::F16 | Format::BF16 => 1,
            Format::Q8_0 | Format::Q4_1 => 32,
            Format::Q2_0 => 64,
            Format::Q1_0 | Format::Q2_0G128 | Format::PQ2_0 | Format::PTQ1_0 => 128,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Format::F32 => 4,
            Format::F16 | Format::BF16 => 2,
            Format::Q8_0 => 34,
            Format::Q4_1 => 20,
            Format::Q1_0 => 18,
            Format::Q2_0 => 18,
            Format::Q2_0G128 | Format::PQ2_0 => 34,
            Format::PTQ1_0 => 28,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Format::F32 => "F32",
            Format::F16 => "F16",
            Format::BF16 => "BF16",
            Format::Q8_0 => "Q8_0",
            Format::Q4_1 => "Q4_1",
            Format::Q1_0 => "Q1_0",
            Format::Q2_0 => "Q2_0",
            Format::Q2_0G128 => "Q2_0_g128",
            Format::PQ2_0 => "PQ2_0",
            Format::PTQ1_0 => "PTQ1_0",
        }
    }

    /// Parses a name as printed by [`Format::name`] (case-insensitive).
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(name))
    }

    /// Formats whose codes are ternary {-1, 0, +1} (code 3 is legal in the container but never
    /// produced by a ternary quantizer).
    pub const fn is_ternary_2bit(self) -> bool {
        matches!(self, Format::Q2_0 | Format::Q2_0G128 | Format::PQ2_0)
    }

    /// Bytes needed for `n` values, or an error when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Result<usize, QuantError> {
        let bl = self.block_len();
        if !n.is_multiple_of(bl) {
            return Err(QuantError::PartialBlock {
                format: self,
                len: n,
                block: bl,
            });
        }
        (n / bl)
            .checked_mul(self.block_bytes())
            .ok_or(QuantError::TooLarge {
                format: self,
                len: n,
            })
    }

    /// The formats a ggml type id can mean: one for every id but 42, which is both the g64 and the
    /// legacy g128 layout.
    pub fn candidates(id: u32) -> Result<&'static [Format], QuantError> {
        Ok(match id {
            0 => &[Format::F32],
            1 => &[Format::F16],
            3 => &[Format::Q4_1],
            8 => &[Format::Q8_0],
            30 => &[Format::BF16],
            41 => &[Format::Q1_0],
            42 => &[Format::Q2_0, Format::Q2_0G128],
            142 => &[Format::PQ2_0],
            143 => &[Format::PTQ1_0],
            _ => return Err(QuantError::UnknownType { id }),
        })
    }

    /// Picks the format for a ggml type id, given the tensor's element count and its byte size as
    /// found in the file. Id 42 is ambiguous (g64 vs legacy g128) and is resolved by byte size; for
    /// every other id the byte size must be exactly what the format implies.
    pub fn resolve(id: u32, elements: u64, bytes: u64) -> Result<Format, QuantError> {
        for &f in Format::candidates(id)? {
            if f.tensor_bytes(elements) == Some(bytes) {
                return Ok(f);
            }
        }
        Err(QuantError::SizeMismatch {
            id,
            elements,
            bytes,
        })
    }

    /// Expected byte size of a tensor of this format with `elements` values.
    pub fn tensor_bytes(self, elements: u64) -> Option<u64> {
        let bl = self.block_len() as u64;
        if !elements.is_multiple_of(bl) {
            return None;
        }
        (elements / bl).checked_mul(self.block_bytes() as u64)
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_42_is_resolved_by_byte_size() {
        assert_eq!(Format::resolve(42, 256, 4 * 18).unwrap(), Format::Q2_0);
        assert_eq!(Format::resolve(42, 256, 2 * 34).unwrap(), Format::Q2_0G128);
        assert!(Format::resolve(42, 256, 100).is_err());
    }

    #[test]
    fn unknown_ids_are_refused() {
        assert!(matches!(
            Format::resolve(2, 32, 18),
            Err(QuantError::UnknownType { id: 2 })
        ));
    }

    #[test]
    fn every_format_is_a_candidate_for_its_own_id() {
        for f in Format::ALL {
            assert!(Format::candidates(f.ggml_id()).unwrap().contains(&f), "{f}");
        }
    }

    #[test]
    fn names_round_trip() {
        for f in Format::ALL {
            assert_eq!(Format::from_name(f.name()), Some(f));
        }
    }
}
