//! A bounds-checked reader over the header bytes: every read says what it was reading, so a
//! truncated file reports where it ends.

use crate::error::{GgufError, Result};
use crate::value::{Value, ValueType};

/// Nested arrays deeper than this are refused: no real file uses them, and unbounded recursion
/// on untrusted input is a stack overflow waiting to happen.
const MAX_ARRAY_DEPTH: usize = 4;

pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    pub fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                len: self.bytes.len() as u64,
            });
        }
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let b = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    pub fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    pub fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| GgufError::Invalid(format!("{} is not valid UTF-8", what())))
    }

    /// A count of items each at least `min_len` bytes long, refused if the rest of the file could
    /// not hold them (so that a corrupt count never turns into a huge allocation).
    pub fn count(&mut self, min_len: u64, what: &dyn Fn() -> String) -> Result<u64> {
        let n = self.u64(what)?;
        if n.saturating_mul(min_len) > self.remaining() {
            return Err(GgufError::Truncated {
                what: format!("{} ({n} items)", what()),
                offset: self.pos as u64,
                needed: n.saturating_mul(min_len),
                len: self.bytes.len() as u64,
            });
        }
        Ok(n)
    }

    pub fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
        let what = || format!("the value of metadata key {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(&what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => match self.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(GgufError::BadMetadata {
                        key: key.to_string(),
                        reason: format!("bool byte is {b}, must be 0 or 1"),
                    })
                }
            },
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::BadMetadata {
                        key: key.to_string(),
                        reason: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    });
                }
                let id = self.u32(&what)?;
                let elem = ValueType::from_id(id).ok_or_else(|| GgufError::BadMetadata {
                    key: key.to_string(),
                    reason: format!("unknown array element type id {id}"),
                })?;
                let n = self.count(elem.min_encoded_len(), &what)?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array { elem, items }
            }
        })
    }
}
