//! Opening models and tokenizers, and the options every generating command shares.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use gguf::Gguf;
use model::Model;
use tokenizer::{ChatTemplate, Tokenizer, TokenizerSpec};

/// Sets the worker-thread count (default: every core).
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if n == 0 {
        anyhow::bail!("--threads must be at least 1");
    }
    model::pool::init(n);
    Ok(())
}

pub fn open_gguf(path: &Path) -> Result<Arc<Gguf>> {
    Ok(Arc::new(
        Gguf::open(path).with_context(|| format!("opening {}", path.display()))?,
    ))
}

/// Opens a model for generation: the context limited to `ctx` tokens when given (never above
/// what it was trained for) and the chosen dot kernels.
pub fn open_model(path: &Path, ctx: Option<usize>, kernels: KernelsArg) -> Result<Model> {
    open_model_checked(path, ctx, kernels, |_| Ok(()))
}

/// [`open_model`], refusing the model by `check` before its weights are re-tiled (which takes
/// seconds on a 27B file).
pub fn open_model_checked(
    path: &Path,
    ctx: Option<usize>,
    kernels: KernelsArg,
    check: impl FnOnce(&Model) -> Result<()>,
) -> Result<Model> {
    let t = Instant::now();
    let file = open_gguf(path)?;
    let mut m = Model::from_gguf(file).with_context(|| format!("loading {}", path.display()))?;
    eprintln!(
        "loaded {} in {:.2} s",
        path.display(),
        t.elapsed().as_secs_f64()
    );
    if let Some(n) = ctx {
        m.limit_context(n);
    }
    check(&m)?;
    let t = Instant::now();
    let mut bar = None;
    m.set_ternary(kernels.ternary());
    m.set_kernels_with_progress(kernels.into(), &mut |done, total| {
        bar.get_or_insert_with(|| crate::progress::bytes(total, "re-tiling weights"))
            .set_position(done);
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
        eprintln!(
            "re-tiled the weights for the int8 kernels in {:.2} s",
            t.elapsed().as_secs_f64()
        );
    }
    Ok(m)
}

/// The tokenizer described by a file's `tokenizer.*` metadata.
pub fn tokenizer_spec(file: &Gguf) -> Result<TokenizerSpec> {
    tokenizer::spec_from_metadata(file.metadata()).context("reading the file's tokenizer metadata")
}

pub fn tokenizer(file: &Gguf) -> Result<Tokenizer> {
    Tokenizer::new(&tokenizer_spec(file)?)
        .context("building the tokenizer from the file's metadata")
}

/// The file's chat template, or the built-in Qwen3.5 one when it has none.
pub fn chat_template(tok: &Tokenizer) -> Result<ChatTemplate> {
    match tok.chat_template() {
        Some(src) => ChatTemplate::new(src).context("compiling the file's chat template"),
        None => Ok(ChatTemplate::builtin_qwen35()),
    }
}

/// Parses "1,2,3" into token ids.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u32>()
                .with_context(|| format!("{p:?} is not a token id"))
        })
        .collect()
}

/// The dot kernels, as chosen on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelsArg {
    /// Packed weights against f32 activations: the exact answer for lossless files, slow.
    Exact,
    /// int8 activations (groups of 16, f32 scales) with SIMD integer dot products: the default,
    /// several times faster, and closer to the exact answer than llama.cpp in KL and top-1.
    #[default]
    Int8,
    /// As int8, with PTQ1_0 weights widened to 2-bit codes at load: the same results, faster
    /// PTQ1_0 files (27B, 2 AVX-512 cores: decode 2.0–2.1 → 2.2–2.6 tok/s, prefill 3.2–3.6 →
    /// 5.8–6.1 tok/s), 1.2 GB more memory (23% more for those weights). Other formats as int8.
    /// CPUs with AVX2 and without AVX-512 hold PTQ1_0 widened with `int8` too.
    #[value(name = "int8-wide")]
    Int8Wide,
}

impl From<KernelsArg> for model::Kernels {
    fn from(k: KernelsArg) -> Self {
        match k {
            KernelsArg::Exact => model::Kernels::Exact,
            KernelsArg::Int8 | KernelsArg::Int8Wide => model::Kernels::Int8,
        }
    }
}

impl KernelsArg {
    /// How the int8 kernels hold PTQ1_0 rows.
    pub fn ternary(self) -> quant::Ternary {
        match self {
            KernelsArg::Int8Wide => quant::Ternary::Wide,
            // Widened anyway where only the AVX2 kernels run: they have no base-3 decode.
            KernelsArg::Int8 => quant::Ternary::preferred(),
            KernelsArg::Exact => quant::Ternary::Packed,
        }
    }
}

/// Where the model runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceArg {
    #[default]
    Cpu,
    /// The CUDA backend (binaries built with `--features cuda`).
    Cuda,
}

/// Where and how the model runs: the flags `run`, `chat`, `serve` and `bench` share.
#[derive(clap::Args, Clone, Debug)]
pub struct Placement {
    /// Dot kernels (CPU only: the GPU has its own).
    #[arg(long, value_enum, default_value_t)]
    pub kernels: KernelsArg,
    /// Where to run (cuda needs a binary built with `--features cuda`).
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceArg,
    /// KV-cache format: f32 (the CPU's default) or f16 on the CPU; f16 (the GPU's default) or
    /// q8_0 on the GPU.
    #[arg(long, value_enum)]
    pub kv_cache: Option<KvCacheArg>,
}

impl Placement {
    /// The CPU kernels to load the model with: the GPU uploads its weights from the file, so
    /// there re-tiling a CPU copy would only cost time and memory.
    pub fn load_kernels(&self) -> KernelsArg {
        match self.device {
            DeviceArg::Cpu => self.kernels,
            DeviceArg::Cuda => KernelsArg::Exact,
        }
    }

    /// The KV-cache format asked for or the device's default; refuses one the device lacks.
    pub fn kv(&self) -> Result<KvCacheArg> {
        kv_cache(self.device, self.kv_cache)
    }

    /// Opens a model as [`open_model`] does, with this placement's kernels, its CPU states
    /// caching keys and values as `kv` says ([`Placement::kv`], asked for before anything is
    /// loaded).
    pub fn open(&self, path: &Path, ctx: Option<usize>, kv: KvCacheArg) -> Result<Model> {
        self.open_checked(path, ctx, kv, |_| Ok(()))
    }

    /// [`Placement::open`], refusing the model by `check` before its weights are re-tiled.
    pub fn open_checked(
        &self,
        path: &Path,
        ctx: Option<usize>,
        kv: KvCacheArg,
        check: impl FnOnce(&Model) -> Result<()>,
    ) -> Result<Model> {
        let mut model = open_model_checked(path, ctx, self.load_kernels(), check)?;
        if let Some(f) = kv.cpu() {
            model.set_kv_format(f);
        }
        Ok(model)
    }
}

/// How the attention layers' KV cache holds keys and values (`--kv-cache`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvCacheArg {
    /// f32 values, exactly as computed: the CPU's default (4 bytes a value; the CPU only).
    F32,
    /// f16 values (2 bytes a value): the GPU's default; on the CPU half the memory of f32 and
    /// half the bytes a decode step reads at depth, slightly less exact.
    F16,
    /// llama.cpp's q8_0 blocks (int8 values, one f16 scale per 32: 34 bytes per 32 elements),
    /// so about half the memory and half the bytes of f16 at depth, slightly less exact again
    /// (the GPU only).
    #[value(name = "q8_0")]
    Q8_0,
}

impl KvCacheArg {
    pub fn as_str(self) -> &'static str {
        match self {
            KvCacheArg::F32 => "f32",
            KvCacheArg::F16 => "f16",
            KvCacheArg::Q8_0 => "q8_0",
        }
    }

    /// Bytes the cache holds per 32 key or value elements.
    pub fn bytes_per_32(self) -> usize {
        match self {
            KvCacheArg::F32 => 128,
            KvCacheArg::F16 => 64,
            KvCacheArg::Q8_0 => 34,
        }
    }

    /// Bytes a model's KV cache of `positions` positions holds in this format.
    pub fn bytes(self, c: &model::Config, positions: usize) -> u64 {
        // kv_bytes_per_token counts f32 values: 128 bytes per 32 (multiplied first, so that no
        // remainder is lost).
        (c.kv_bytes_per_token() * positions * self.bytes_per_32() / 128) as u64
    }

    /// The CPU's format for it (`None`: a format the CPU does not have).
    pub fn cpu(self) -> Option<model::KvFormat> {
        match self {
            KvCacheArg::F32 => Some(model::KvFormat::F32),
            KvCacheArg::F16 => Some(model::KvFormat::F16),
            KvCacheArg::Q8_0 => None,
        }
    }
}

/// The KV-cache format for `device`: `asked`, or the device's default (the CPU f32, the GPU
/// f16); refuses a format the device does not have.
pub fn kv_cache(device: DeviceArg, asked: Option<KvCacheArg>) -> Result<KvCacheArg> {
    match (device, asked) {
        (DeviceArg::Cpu, None) => Ok(KvCacheArg::F32),
        (DeviceArg::Cuda, None) => Ok(KvCacheArg::F16),
        (DeviceArg::Cpu, Some(KvCacheArg::Q8_0)) => anyhow::bail!(
            "--kv-cache q8_0 is a GPU option (the CPU caches keys and values in f32 or f16): add \
             --device cuda"
        ),
        (DeviceArg::Cuda, Some(KvCacheArg::F32)) => anyhow::bail!(
            "--kv-cache f32 is a CPU option (the GPU caches keys and values in f16 or q8_0)"
        ),
        (_, Some(kv)) => Ok(kv),
    }
}

/// Uploads the model to the GPU, or says why it cannot.
#[cfg(feature = "cuda")]
pub fn cuda_model(model: &Model, kv: KvCacheArg) -> Result<niwaki_cuda::CudaModel> {
    let info = niwaki_cuda::available().context("no usable CUDA device")?;
    eprintln!("device: {info:?}");
    let t = std::time::Instant::now();
    let mut gpu = niwaki_cuda::CudaModel::load(model).context("loading the model onto the GPU")?;
    gpu.kv_cache = match kv {
        KvCacheArg::F16 => niwaki_cuda::KvCache::F16,
        KvCacheArg::Q8_0 => niwaki_cuda::KvCache::Q8_0,
        KvCacheArg::F32 => anyhow::bail!("the GPU has no f32 KV cache: use f16 or q8_0"),
    };
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    let images = match gpu.tile_image_bytes() {
        0 => String::new(),
        b => format!(
            " and {:.2} GiB of 2-bit tile images (NIWAKI_CUDA_B1_IMAGE=0 goes without)",
            gib(b)
        ),
    };
    let staged = match gpu.stage_scale_bytes() {
        0 => String::new(),
        b => format!(" and {:.2} GiB of scales in stage order", gib(b)),
    };
    let device_code = match gpu.kernel_device_code_parts() {
        0 => String::new(),
        n => format!(", {n} parts as device code"),
    };
    eprintln!(
        "uploaded to the GPU in {:.2} s ({:.2} GiB of weights{images}{staged}; {} KV cache; kernels {}, loaded by the driver in {:.2} s{device_code})",
        t.elapsed().as_secs_f64(),
        gib(gpu.weight_bytes()),
        kv.as_str(),
        if gpu.kernels_from_cache() {
            "from the cache".to_string()
        } else {
            format!("compiled in {:.2} s", gpu.compile_secs())
        },
        gpu.kernel_load_secs()
    );
    Ok(gpu)
}

/// The error for `--device cuda` in a binary built without the backend.
#[cfg(not(feature = "cuda"))]
pub fn no_cuda() -> anyhow::Error {
    anyhow::anyhow!("this niwaki was built without the cuda feature: rebuild with `cargo build --release --features cuda`, or use --device cpu")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_device_gets_its_default_kv_cache_and_refuses_the_others_formats() {
        assert_eq!(kv_cache(DeviceArg::Cpu, None).ok(), Some(KvCacheArg::F32));
        assert_eq!(kv_cache(DeviceArg::Cuda, None).ok(), Some(KvCacheArg::F16));
        let e = kv_cache(DeviceArg::Cpu, Some(KvCacheArg::Q8_0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--device cuda"), "{e}");
        let e = kv_cache(DeviceArg::Cuda, Some(KvCacheArg::F32))
            .unwrap_err()
            .to_string();
        assert!(e.contains("CPU option"), "{e}");
        assert_eq!(
            kv_cache(DeviceArg::Cpu, Some(KvCacheArg::F16)).ok(),
            Some(KvCacheArg::F16)
        );
        assert_eq!(
            kv_cache(DeviceArg::Cuda, Some(KvCacheArg::Q8_0)).ok(),
            Some(KvCacheArg::Q8_0)
        );
        assert_eq!(KvCacheArg::F16.cpu(), Some(model::KvFormat::F16));
        assert_eq!(KvCacheArg::Q8_0.cpu(), None);
    }

    #[test]
    fn a_kv_cache_holds_its_formats_bytes_for_every_position() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/oracle/tiny-f32.gguf");
        let m = open_model(&path, None, KernelsArg::Exact).expect("the tiny fixture");
        let c = &m.config;
        // Keys and values of every kv head of every attention layer, a position.
        let values = 2 * c.n_head_kv * c.head_dim * c.n_attention_layers();
        assert!(values > 0);
        for (kv, per_32) in [
            (KvCacheArg::F32, 128),
            (KvCacheArg::F16, 64),
            (KvCacheArg::Q8_0, 34),
        ] {
            for positions in [0, 1, 7, 1000] {
                let want = (values * positions * per_32 / 32) as u64;
                assert_eq!(kv.bytes(c, positions), want, "{kv:?} {positions}");
            }
        }
    }
}
