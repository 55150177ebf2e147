//! The bytes of a tiled matrix: anonymous memory, on huge pages where the kernel allows.
//!
//! A decode token streams every weight once; on 4 KiB pages that is a TLB miss every 4 KiB, on
//! 2 MiB pages one per 2 MiB. Linux only backs a mapping with transparent huge pages when asked
//! (`madvise` mode, the common default), so the buffer asks; where it cannot, it is ordinary
//! memory with the same contents.

use std::ops::{Deref, DerefMut};

pub(crate) struct Buffer {
    map: Option<memmap2::MmapMut>,
}

impl Buffer {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> std::io::Result<Buffer> {
        if len == 0 {
            return Ok(Buffer { map: None });
        }
        let map = memmap2::MmapMut::map_anon(len)?;
        #[cfg(target_os = "linux")]
        {
            // Advice only: without huge pages the memory works the same.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        Ok(Buffer { map: Some(map) })
    }
}

impl Clone for Buffer {
    fn clone(&self) -> Buffer {
        let mut b = Buffer::zeroed(self.len())
            .unwrap_or_else(|e| panic!("copying {} bytes of tiled weights: {e}", self.len()));
        b.copy_from_slice(self);
        b
    }
}

impl Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or(&mut [])
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes)", self.len())
    }
}
