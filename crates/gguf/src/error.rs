use quant::QuantError;

/// Everything that can be wrong with a GGUF file. Each variant says where in the file and why, so a
/// user holding a broken download can tell what happened.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("not a GGUF file: the first four bytes are {found:?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("GGUF version {0} is not supported (niwaki reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("file ends early: needed {needed} bytes at offset {offset} while reading {what}, but the file has {len} bytes")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("metadata key {key:?}: {reason}")]
    BadMetadata { key: String, reason: String },
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("tensor {0:?} appears twice")]
    DuplicateTensor(String),
    #[error("tensor {name:?}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("tensor {name:?} has type id {id}: {source}")]
    UnsupportedType {
        name: String,
        id: u32,
        source: QuantError,
    },
    #[error("tensors {first:?} and {second:?} overlap in the data section")]
    Overlap { first: String, second: String },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, GgufError>;
