//! Opening a GGUF file: parse the header, validate every tensor against the file, and hand out
//! zero-copy views of the memory-mapped data.

use std::collections::HashMap;
use std::path::Path;

use quant::Format;

use crate::cursor::Cursor;
use crate::error::{GgufError, Result};
use crate::metadata::Metadata;
use crate::tensor::{TensorInfo, TensorView, MAX_DIMS};
use crate::value::ValueType;

pub const MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;

enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A validated GGUF file. Tensor data stays in the file mapping until a caller copies it.
pub struct Gguf {
    storage: Storage,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// A tensor header before its layout has been matched against the data section.
struct RawTensor {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    rel_offset: u64,
}

impl Gguf {
    /// Maps and validates a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only and private to this process; niwaki never writes to a
        // model file while it is open. Another process truncating it underneath us is outside what
        // any mmap-based reader can defend against.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Storage::Mapped(map))
    }

    /// Validates an in-memory file (tests, and files produced by the writer).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<Gguf> {
        let bytes = storage.bytes();
        let file_len = bytes.len() as u64;
        let mut c = Cursor::new(bytes);
        let magic: [u8; 4] = match c.take(4, &|| "the magic".into()) {
            Ok(m) => [m[0], m[1], m[2], m[3]],
            Err(e) => return Err(e),
        };
        if magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = c.u32(&|| "the version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        // A tensor header takes at least 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 + 8 bytes.
        let n_tensors = c.u64(&|| "the tensor count".into())?;
        let n_kv = c.count(8 + 4, &|| "the metadata count".into())?;
        if n_tensors.saturating_mul(32) > c.remaining() {
            return Err(GgufError::Truncated {
                what: format!("{n_tensors} tensor headers"),
                offset: c.pos() as u64,
                needed: n_tensors.saturating_mul(32),
                len: file_len,
            });
        }

        let mut metadata = Metadata::default();
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata key #{i}"))?;
            let id = c.u32(&|| format!("the type of metadata key {key:?}"))?;
            let ty = ValueType::from_id(id).ok_or_else(|| GgufError::BadMetadata {
                key: key.clone(),
                reason: format!("unknown value type id {id}"),
            })?;
            let value = c.value(ty, &key, 0)?;
            metadata.insert(key, value)?;
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(GgufError::BadMetadata {
                        key: "general.alignment".into(),
                        reason: format!("must be a power of two, found {v:?}"),
                    })
                }
            },
        };

        let mut raw = Vec::new();
        for i in 0..n_tensors {
            raw.push(read_tensor_header(&mut c, i)?);
        }
        let data_offset = align_up(c.pos() as u64, alignment)
            .filter(|&o| o <= file_len)
            .ok_or_else(|| GgufError::Truncated {
                what: "the padding before the data section".into(),
                offset: c.pos() as u64,
                needed: alignment,
                len: file_len,
            })?;

        let tensors = lay_out(raw, data_offset, file_len, alignment)?;
        let mut by_name = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if by_name.insert(t.name.clone(), i).is_some() {
                return Err(GgufError::DuplicateTensor(t.name.clone()));
            }
        }
        Ok(Gguf {
            storage,
            version,
            alignment,
            data_offset,
            metadata,
            tensors,
            by_name,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn file_len(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensors in header order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let info = &self.tensors[*self.by_name.get(name)?];
        Some(self.view(info))
    }

    /// Drops the whole pages of a tensor's data from this process's resident memory, for a caller
    /// that has copied the tensor elsewhere: a later read of the data maps them back from the
    /// file, so this changes memory use, never contents. A no-op for in-memory files.
    pub fn release(&self, info: &TensorInfo) {
        #[cfg(unix)]
        if let Storage::Mapped(map) = &self.storage {
            const PAGE: u64 = 4096;
            let start = info.offset.div_ceil(PAGE) * PAGE;
            let end = (info.offset + info.size) / PAGE * PAGE;
            if end > start {
                // SAFETY: the range lies inside the mapping (offsets were checked in `lay_out`).
                // The mapping is read-only, so MADV_DONTNEED discards nothing that cannot be read
                // back from the file: no reference into it is invalidated, only re-faulted.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start as usize,
                        (end - start) as usize,
                    )
                };
            }
        }
    }

    pub fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        // Offsets and sizes were checked against the file length in `lay_out`.
        let data = &self.storage.bytes()[info.offset as usize..(info.offset + info.size) as usize];
        TensorView { info, data }
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

fn read_tensor_header(c: &mut Cursor<'_>, i: u64) -> Result<RawTensor> {
    let name = c.string(&|| format!("the name of tensor #{i}"))?;
    let bad = |reason: String| GgufError::BadTensor {
        name: name.clone(),
        reason,
    };
    let n_dims = c.u32(&|| format!("the dimension count of tensor {name:?}"))?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(bad(format!("{n_dims} dimensions (must be 1..={MAX_DIMS})")));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        let v = c.u64(&|| format!("dimension {d} of tensor {name:?}"))?;
        if v == 0 {
            return Err(bad(format!("dimension {d} is zero")));
        }
        dims.push(v);
    }
    let type_id = c.u32(&|| format!("the type of tensor {name:?}"))?;
    let rel_offset = c.u64(&|| format!("the offset of tensor {name:?}"))?;
    Ok(RawTensor {
        name,
        dims,
        type_id,
        rel_offset,
    })
}

/// Matches each tensor to a format and a byte range, refusing anything outside the file,
/// misaligned, overlapping, or whose shape does not fit the format's blocks.
fn lay_out(
    raw: Vec<RawTensor>,
    data_offset: u64,
    file_len: u64,
    alignment: u64,
) -> Result<Vec<TensorInfo>> {
    let data_len = file_len - data_offset;
    // Where each tensor's room ends: the next tensor's start, or the end of the file. Type 42 is
    // ambiguous between two layouts and is told apart by how much room the tensor has.
    let mut starts: Vec<u64> = raw.iter().map(|t| t.rel_offset).collect();
    starts.sort_unstable();
    let room_end = |off: u64| -> u64 {
        let i = starts.partition_point(|&s| s <= off);
        starts.get(i).copied().unwrap_or(data_len)
    };

    let mut out = Vec::with_capacity(raw.len());
    let mut ambiguous = Vec::new();
    for t in raw {
        let bad = |reason: String| GgufError::BadTensor {
            name: t.name.clone(),
            reason,
        };
        let elements = t
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(format!("shape {:?} overflows", t.dims)))?;
        if t.rel_offset % alignment != 0 {
            return Err(bad(format!(
                "offset {} is not a multiple of the alignment {alignment}",
                t.rel_offset
            )));
        }
        if t.rel_offset > data_len {
            return Err(bad(format!(
                "offset {} is past the end of the data section ({data_len} bytes): the file is truncated or corrupt",
                t.rel_offset
            )));
        }
        let room = room_end(t.rel_offset) - t.rel_offset;
        let candidates =
            Format::candidates(t.type_id).map_err(|source| GgufError::UnsupportedType {
                name: t.name.clone(),
                id: t.type_id,
                source,
            })?;
        let row = t.dims[0];
        let shaped: Vec<(Format, u64)> = candidates
            .iter()
            .filter(|f| row % f.block_len() as u64 == 0)
            .filter_map(|&f| f.tensor_bytes(elements).map(|b| (f, b)))
            .collect();
        if shaped.is_empty() {
            return Err(bad(format!(
                "row length {row} is not a multiple of the {} block size {}",
                candidates[0],
                candidates[0].block_len()
            )));
        }
        // Padding after a tensor is less than one alignment unit.
        let fitting: Vec<(Format, u64)> = shaped
            .iter()
            .copied()
            .filter(|&(_, b)| b <= room && room - b < alignment)
            .collect();
        let fitting = if fitting.is_empty() {
            // The last tensor of a file may be followed by more than padding (some writers append);
            // accept any layout that fits, but only if it is unambiguous.
            shaped.iter().copied().filter(|&(_, b)| b <= room).collect()
        } else {
            fitting
        };
        let (format, size) = match fitting.as_slice() {
            [] => {
                let (f, b) = shaped[0];
                return Err(bad(format!(
                    "{f} data of {b} bytes at offset {} does not fit: only {room} bytes before the next tensor or the end of the file (truncated or corrupt)",
                    t.rel_offset
                )));
            }
            [one] => *one,
            [first, ..] => {
                ambiguous.push(out.len());
                *first
            }
        };
        out.push(TensorInfo {
            name: t.name,
            dims: t.dims,
            format,
            offset: data_offset + t.rel_offset,
            size,
        });
    }
    resolve_ambiguous(&mut out, &ambiguous)?;
    check_overlaps(&out)?;
    Ok(out)
}

/// A tensor of type 42 too small to tell g64 from g128 by its room takes the layout the file's
/// other type-42 tensors have; a file with none that tell defaults to mainline g64.
fn resolve_ambiguous(tensors: &mut [TensorInfo], ambiguous: &[usize]) -> Result<()> {
    if ambiguous.is_empty() {
        return Ok(());
    }
    let decided: Vec<Format> = tensors
        .iter()
        .enumerate()
        .filter(|(i, t)| t.format.ggml_id() == 42 && !ambiguous.contains(i))
        .map(|(_, t)| t.format)
        .collect();
    if decided.windows(2).any(|w| w[0] != w[1]) {
        return Err(GgufError::Invalid(
            "type-42 tensors mix the g64 and legacy g128 layouts in one file".into(),
        ));
    }
    let Some(&format) = decided.first() else {
        return Ok(());
    };
    for &i in ambiguous {
        let t = &mut tensors[i];
        t.format = format;
        t.size = format.tensor_bytes(t.elements()).unwrap_or(t.size);
    }
    Ok(())
}

fn check_overlaps(tensors: &[TensorInfo]) -> Result<()> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        if w[0].offset + w[0].size > w[1].offset {
            return Err(GgufError::Overlap {
                first: w[0].name.clone(),
                second: w[1].name.clone(),
            });
        }
    }
    Ok(())
}
