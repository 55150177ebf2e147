//! `niwaki kernels`: the CUDA kernels compiled ahead for a model and a GPU architecture.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// The GPU architecture as the backend names it at start (`device:` line): sm_90a for the
    /// H100 and H200, sm_80 for the A100, sm_89 for Ada cards.
    #[arg(long, default_value = "sm_90a")]
    pub arch: String,
    /// Shared memory a block may take on that device, in KiB (default: the architecture's).
    #[arg(long)]
    pub smem_kib: Option<usize>,
}

#[cfg(feature = "cuda")]
pub fn main(a: Args) -> Result<ExitCode> {
    use anyhow::Context;
    let file = crate::load::open_gguf(&a.model)?;
    let vocab = file
        .tensor("token_embd.weight")
        .map(|t| t.info.rows() as usize)
        .context("the file has no token_embd.weight: not a model")?;
    let config = model::Config::from_metadata(file.metadata(), vocab)
        .context("reading the model's hyperparameters")?;
    let dims = niwaki_cuda::plan::Dims::from_config(&config)
        .context("the CUDA backend does not take this model")?;
    let smem = match a.smem_kib {
        Some(kib) => kib << 10,
        None => niwaki_cuda::compile::smem_limit_of(&a.arch).with_context(|| {
            format!(
                "no shared-memory size known for {}: give --smem-kib",
                a.arch
            )
        })?,
    };
    eprintln!(
        "compiling the kernels for {} ({} KiB a block)…",
        a.arch,
        smem >> 10
    );
    let t = std::time::Instant::now();
    let done = niwaki_cuda::compile::precompile(&dims, &a.arch, smem)
        .context("compiling the CUDA kernels")?;
    println!(
        "{} parts {} in {:.1} s, {} with device code (loaded as it is; NIWAKI_CUDA_CUBIN=0 loads the PTX), in {} (NIWAKI_CUDA_CACHE there too on the GPU host)",
        done.parts,
        if done.cached {
            "already cached"
        } else {
            "compiled"
        },
        t.elapsed().as_secs_f64(),
        done.device_code,
        done.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "cuda"))]
pub fn main(_: Args) -> Result<ExitCode> {
    anyhow::bail!(
        "this niwaki was built without the cuda feature, which has the kernels: rebuild with \
         `cargo build --release --features cuda`"
    )
}
