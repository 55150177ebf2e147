//! One module per subcommand.

pub mod bench;
pub mod chat;
pub mod info;
pub mod kernels;
pub mod logits;
pub mod perplexity;
pub mod pull;
pub mod quantize;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;
pub mod validate;

use engine::{GenerateParams, LookupConfig, SamplerConfig};

/// Why prompt-lookup drafting (`--lookup`) does not run on `device`, if it does not.
pub fn lookup_device_unused(device: &crate::load::DeviceArg) -> Option<&'static str> {
    (!matches!(device, crate::load::DeviceArg::Cpu)).then_some(
        "it drafts on the CPU only, whose several-token passes give one-token passes' logits",
    )
}

/// Sampling and stopping options shared by `run` and `chat`. Defaults follow Qwen's
/// recommendation for thinking models; a fixed seed keeps runs reproducible.
#[derive(clap::Args, Clone, Debug)]
pub struct Sampling {
    /// Maximum tokens to generate.
    #[arg(long, short = 'n', default_value_t = 512)]
    pub max_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.6)]
    pub temperature: f32,
    #[arg(long, default_value_t = 20)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when this text appears (not printed); may be repeated.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Draft tokens by prompt lookup (what followed the last few tokens where they occurred
    /// before) and verify them several a pass: the same output, in fewer passes where it
    /// repeats its context. Greedy decoding (--temperature 0) on the CPU only.
    #[arg(long)]
    pub lookup: bool,
    /// Context limit in tokens (default: the model's).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub place: crate::load::Placement,
}

impl Sampling {
    /// Why `--lookup` will not draft on `device` with these settings, if it will not.
    pub fn lookup_unused(&self, device: &crate::load::DeviceArg) -> Option<&'static str> {
        if !self.lookup {
            None
        } else if !self.params().sampler.is_plain_greedy() {
            Some("it drafts for plain greedy decoding only (--temperature 0, no penalties)")
        } else {
            lookup_device_unused(device)
        }
    }

    pub fn params(&self) -> GenerateParams {
        GenerateParams {
            max_tokens: self.max_tokens,
            sampler: SamplerConfig {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repetition_penalty: self.repeat_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                penalty_window: 0,
                seed: self.seed,
            },
            stop_strings: self.stop.clone(),
            lookup: self.lookup.then(LookupConfig::default),
            ..GenerateParams::default()
        }
    }
}
