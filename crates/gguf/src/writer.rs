//! Writing GGUF v3 files: used by `synth`, by the quantizer and by tests.

use std::io::Write;
use std::path::Path;

use quant::Format;

use crate::error::{GgufError, Result};
use crate::metadata::Metadata;
use crate::reader::{DEFAULT_ALIGNMENT, MAGIC};
use crate::tensor::MAX_DIMS;
use crate::value::Value;

/// A generator for a tensor's bytes, called once when the file is written, so that a writer for
/// a 27B file never holds more than one tensor in memory.
pub type LazyData = Box<dyn Fn() -> Vec<u8> + Send + Sync>;

enum Data {
    Bytes(Vec<u8>),
    Lazy(LazyData),
}

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    format: Format,
    size: u64,
    data: Data,
}

/// Collects metadata and tensors, then writes them in one pass.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Metadata,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&mut self, key: &str, value: Value) -> &mut Self {
        self.metadata.set(key, value);
        self
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Adds a tensor; its byte size must match its shape and format.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        format: Format,
        data: Vec<u8>,
    ) -> Result<()> {
        let size = self.check_tensor(name, dims, format)?;
        if size != data.len() as u64 {
            return Err(GgufError::BadTensor {
                name: name.to_string(),
                reason: format!("{} bytes given, {format} {dims:?} needs {size}", data.len()),
            });
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            format,
            size,
            data: Data::Bytes(data),
        });
        Ok(())
    }

    /// Adds a tensor whose bytes are produced when the file is written.
    pub fn add_tensor_lazy(
        &mut self,
        name: &str,
        dims: &[u64],
        format: Format,
        data: LazyData,
    ) -> Result<()> {
        let size = self.check_tensor(name, dims, format)?;
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            format,
            size,
            data: Data::Lazy(data),
        });
        Ok(())
    }

    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Bytes of tensor data the file will hold.
    pub fn data_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.size).sum()
    }

    fn check_tensor(&self, name: &str, dims: &[u64], format: Format) -> Result<u64> {
        let bad = |reason: String| GgufError::BadTensor {
            name: name.to_string(),
            reason,
        };
        if dims.is_empty() || dims.len() > MAX_DIMS || dims.contains(&0) {
            return Err(bad(format!(
                "shape {dims:?} is not 1..={MAX_DIMS} non-zero dimensions"
            )));
        }
        if !dims[0].is_multiple_of(format.block_len() as u64) {
            return Err(bad(format!(
                "row length {} is not a multiple of the {format} block",
                dims[0]
            )));
        }
        let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let size = elements
            .and_then(|e| format.tensor_bytes(e))
            .ok_or_else(|| bad(format!("shape {dims:?} overflows")))?;
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor(name.to_string()));
        }
        Ok(size)
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Serialises the whole file.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_into(&mut out, &mut |_, _| {})
            .map_err(|source| GgufError::Io {
                path: "<memory>".into(),
                source,
            })?;
        Ok(out)
    }

    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        self.write_file_with_progress(path, |_, _| {})
    }

    /// Writes the file, calling `progress(bytes_done, bytes_total)` after each tensor.
    pub fn write_file_with_progress(
        &self,
        path: impl AsRef<Path>,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<()> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
        self.write_into(&mut w, &mut progress).map_err(io)?;
        w.flush().map_err(io)
    }

    fn write_into(
        &self,
        w: &mut impl Write,
        progress: &mut dyn FnMut(u64, u64),
    ) -> std::io::Result<()> {
        let align = self.alignment();
        let mut header = Vec::new();
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&3u32.to_le_bytes());
        header.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        header.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in self.metadata.iter() {
            put_string(&mut header, key);
            header.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            put_value(&mut header, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_string(&mut header, &t.name);
            header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                header.extend_from_slice(&d.to_le_bytes());
            }
            header.extend_from_slice(&t.format.ggml_id().to_le_bytes());
            header.extend_from_slice(&offset.to_le_bytes());
            offset += padded(t.size, align);
        }
        let zeros = vec![0u8; align as usize];
        w.write_all(&header)?;
        w.write_all(&zeros[..(padded(header.len() as u64, align) - header.len() as u64) as usize])?;
        let total = self.data_bytes();
        let mut done = 0;
        for t in &self.tensors {
            let generated;
            let data = match &t.data {
                Data::Bytes(b) => b,
                Data::Lazy(f) => {
                    generated = f();
                    &generated
                }
            };
            if data.len() as u64 != t.size {
                return Err(std::io::Error::other(format!(
                    "tensor {:?}: generator produced {} bytes, expected {}",
                    t.name,
                    data.len(),
                    t.size
                )));
            }
            w.write_all(data)?;
            w.write_all(&zeros[..(padded(t.size, align) - t.size) as usize])?;
            done += t.size;
            progress(done, total);
        }
        Ok(())
    }
}

fn padded(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::Array { elem, items } => {
            out.extend_from_slice(&(*elem as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                debug_assert_eq!(item.value_type(), *elem, "array elements share one type");
                put_value(out, item);
            }
        }
    }
}
