//! The GGUF container: a memory-mapped, fully validated reader and a writer.
//!
//! Nothing here interprets a model: it checks that every tensor lies inside the file, does not
//! overlap another, and has a shape its format can hold, and it hands out typed metadata.

mod cursor;
mod error;
mod metadata;
mod reader;
mod tensor;
mod value;
mod writer;

pub use error::{GgufError, Result};
pub use metadata::Metadata;
pub use reader::{Gguf, DEFAULT_ALIGNMENT};
pub use tensor::{TensorInfo, TensorView, MAX_DIMS};
pub use value::{Value, ValueType};
pub use writer::GgufWriter;
