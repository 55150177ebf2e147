//! One NVRTC compilation: the PTX and, for a real architecture (`sm_90a`, not `compute_90a`),
//! the device code NVRTC's own assembler made of it in the same call.

use std::ffi::{c_char, CStr, CString};

use cudarc::nvrtc::{result, sys};

use crate::error::{CudaError, Result};

/// A compiled program (or part of one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    /// The PTX: which kernels the program emits are read from it, and the driver compiles it
    /// to the device's code where no device code is loaded.
    pub ptx: String,
    /// The device code (an ELF image) for the architecture compiled for, which the driver
    /// loads without compiling anything; `None` for a virtual architecture, or from a cache
    /// written before it was kept.
    pub cubin: Option<Vec<u8>>,
}

/// Whether `bytes` look like device code: an ELF image.
pub fn is_cubin(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x7fELF")
}

/// Whether NVRTC gives device code for `arch`: a real architecture (`sm_90a`), not a virtual
/// one (`compute_90a`).
pub fn gives_device_code(arch: &str) -> bool {
    arch.starts_with("sm_")
}

/// Compiles `src` for `arch` with `opts`.
pub fn compile(arch: &str, src: &str, opts: &[String]) -> Result<Compiled> {
    // SAFETY: only checks whether the shared library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoNvrtc("libnvrtc.so not found".into()));
    }
    let failed = |what: &str, e: result::NvrtcError| CudaError::Compile {
        arch: arch.to_string(),
        log: format!("{what}: {e:?}"),
    };
    let src = CString::new(src).map_err(|_| CudaError::Compile {
        arch: arch.to_string(),
        log: "the kernel source holds a NUL byte".into(),
    })?;
    let name = c"niwaki.cu";
    let prog = Program(
        result::create_program(&src, Some(name)).map_err(|e| failed("creating the program", e))?,
    );
    // SAFETY: `prog` was created above and is destroyed only by `Program`'s drop, after these
    // calls; `src` and `name` outlive it.
    unsafe {
        if let Err(e) = result::compile_program(prog.0, opts) {
            let log = result::get_program_log(prog.0)
                .map(|l| c_text(&l))
                .unwrap_or_else(|_| format!("{e:?} (no log)"));
            return Err(CudaError::Compile {
                arch: arch.to_string(),
                log,
            });
        }
        let ptx = c_text(&result::get_ptx(prog.0).map_err(|e| failed("reading the PTX", e))?);
        let cubin = if gives_device_code(arch) {
            let bin = get_cubin(prog.0).map_err(|e| failed("reading the device code", e))?;
            Some(bin).filter(|b| is_cubin(b))
        } else {
            None
        };
        Ok(Compiled { ptx, cubin })
    }
}

/// The program handle, destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program` and destroyed only here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// NVRTC's device code for `prog` (empty where it made none).
///
/// # Safety
///
/// `prog` must be a compiled program not yet destroyed.
unsafe fn get_cubin(prog: sys::nvrtcProgram) -> std::result::Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
    let mut bin = vec![0u8; size];
    if size > 0 {
        sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast::<c_char>()).result()?;
    }
    Ok(bin)
}

/// A NUL-terminated buffer from NVRTC as text.
fn c_text(buf: &[c_char]) -> String {
    // SAFETY: c_char and u8 have the same size and alignment.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len()) };
    CStr::from_bytes_until_nul(bytes)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(bytes).into_owned())
}
