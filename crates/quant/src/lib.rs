//! Block formats of the Bonsai weight types.
//!
//! Each format has a plain decoder, a reference quantizer and a dot product against f32
//! activations; the CPU kernels of later layers are tested against these.

mod error;
mod format;

pub use error::QuantError;
pub use format::Format;
