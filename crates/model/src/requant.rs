//! Re-packing a model's weight matrices in another format (the reference quantizer, per row).

use gguf::{Gguf, GgufWriter};
use quant::Format;

use crate::error::{ModelError, Result};

/// Whether a tensor is a weight matrix that quantized files pack: 2-D projections and
/// embeddings, not the convolution taps, norms or biases.
pub fn is_packed_matrix(name: &str, dims: &[u64]) -> bool {
    dims.len() == 2 && dims[1] > 1 && name.ends_with(".weight") && !name.contains("ssm_conv1d")
}

/// A writer holding `file` with every weight matrix re-quantized to `format`; other tensors
/// and all metadata are copied unchanged. Matrices are converted lazily, while writing.
pub fn requantize(file: std::sync::Arc<Gguf>, format: Format) -> Result<GgufWriter> {
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata().iter() {
        w.set(k, v.clone());
    }
    for (i, t) in file.tensors().iter().enumerate() {
        let dec = |source| ModelError::Decode {
            name: t.name.clone(),
            source,
        };
        if is_packed_matrix(&t.name, &t.dims) && t.format != format {
            format.row_bytes(t.dims[0] as usize).map_err(dec)?;
            let f = file.clone();
            w.add_tensor_lazy(
                &t.name,
                &t.dims,
                format,
                Box::new(move || {
                    let info = &f.tensors()[i];
                    // Shapes were checked above and formats at open; decoding cannot fail here.
                    let values = f.view(info).to_f32().unwrap_or_default();
                    quant::quantize(format, &values).unwrap_or_default()
                }),
            )?;
        } else {
            w.add_tensor(&t.name, &t.dims, t.format, file.view(t).data.to_vec())?;
        }
    }
    Ok(w)
}
