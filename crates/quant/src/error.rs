use crate::Format;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    #[error("ggml type id {id} is not a format niwaki can decode (known: F32, F16, BF16, Q8_0, Q4_1, Q1_0, Q2_0, PQ2_0, PTQ1_0)")]
    UnknownType { id: u32 },
    #[error(
        "type id {id}: {bytes} bytes do not hold {elements} values in any layout of that type"
    )]
    SizeMismatch { id: u32, elements: u64, bytes: u64 },
    #[error("{format}: {len} values is not a whole number of {block}-value blocks")]
    PartialBlock {
        format: Format,
        len: usize,
        block: usize,
    },
    #[error("{format}: {len} values overflow the address space")]
    TooLarge { format: Format, len: usize },
    #[error("{format}: {values} values take {expected} bytes, but {got} bytes were given")]
    ByteLength {
        format: Format,
        values: usize,
        expected: usize,
        got: usize,
    },
}
