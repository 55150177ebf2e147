//! The compiled program's parts loaded into the context: from NVRTC's device code where asked
//! (`NIWAKI_CUDA_CUBIN`, [`crate::compile::LOAD_CUBIN`]), which the driver takes as it is,
//! else from the PTX, which the driver compiles to the device's code first (unless its own
//! cache holds it).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::compile::{self, Compiled};
use crate::error::{Context, Result};

/// The loaded parts and their kernels.
pub(super) struct Loaded {
    pub modules: Vec<Arc<CudaModule>>,
    pub funcs: HashMap<&'static str, CudaFunction>,
    /// Parts loaded from device code (the rest from PTX).
    pub from_device_code: usize,
}

/// Loads `parts` (a program's, [`compile::nvrtc_compile`]) and finds each of
/// [`compile::KERNELS`] in the one part that emits it. With `device_code`, a part's device
/// code where it has some; a part whose device code the driver refuses is loaded from its PTX
/// instead, with a warning (the same kernels, compiled by the driver).
pub(super) fn load_parts(
    ctx: &Arc<CudaContext>,
    parts: Vec<Compiled>,
    device_code: bool,
) -> Result<Loaded> {
    let owner = compile::kernel_parts(&parts.iter().map(|p| p.ptx.as_str()).collect::<Vec<_>>())?;
    let mut loaded = Loaded {
        modules: Vec::new(),
        funcs: HashMap::new(),
        from_device_code: 0,
    };
    for (i, part) in parts.into_iter().enumerate() {
        let module = match part.cubin.filter(|_| device_code) {
            Some(bin) => match ctx.load_module(Ptx::from_binary(bin)) {
                Ok(m) => {
                    loaded.from_device_code += 1;
                    m
                }
                Err(e) => {
                    eprintln!(
                        "warning: the driver refused part {i}'s device code ({e}); loading its PTX"
                    );
                    load_ptx(ctx, part.ptx)?
                }
            },
            None => load_ptx(ctx, part.ptx)?,
        };
        for (&k, _) in compile::KERNELS.iter().zip(&owner).filter(|(_, &p)| p == i) {
            loaded.funcs.insert(
                k,
                module
                    .load_function(k)
                    .ctx(|| format!("finding kernel {k}"))?,
            );
        }
        loaded.modules.push(module);
    }
    Ok(loaded)
}

fn load_ptx(ctx: &Arc<CudaContext>, ptx: String) -> Result<Arc<CudaModule>> {
    ctx.load_module(Ptx::from_src(ptx))
        .ctx(|| "loading the kernels' PTX".into())
}
