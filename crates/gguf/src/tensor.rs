//! Tensor descriptions and zero-copy views into the data section.

use quant::Format;

/// At most four dimensions, as in ggml.
pub const MAX_DIMS: usize = 4;

/// One tensor as described by the header, already validated against the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (input) dimension.
    pub dims: Vec<u64>,
    pub format: Format,
    /// Offset from the start of the file.
    pub offset: u64,
    pub size: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Values in one row (the contiguous dimension).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of every dimension but the first.
    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// A tensor's bytes borrowed from the file.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
    pub fn name(&self) -> &'a str {
        &self.info.name
    }

    pub fn format(&self) -> Format {
        self.info.format
    }

    pub fn dims(&self) -> &'a [u64] {
        &self.info.dims
    }

    /// Decodes the whole tensor to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>, quant::QuantError> {
        let n = usize::try_from(self.info.elements()).map_err(|_| quant::QuantError::TooLarge {
            format: self.info.format,
            len: usize::MAX,
        })?;
        let mut out = vec![0f32; n];
        quant::dequantize(self.info.format, self.data, &mut out)?;
        Ok(out)
    }
}
