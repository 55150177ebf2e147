use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use model::{Config, LayerKind};

use crate::load;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Context length for the memory estimate (default: the model's).
    #[arg(long)]
    pub ctx: Option<usize>,
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

pub fn main(a: Args) -> Result<ExitCode> {
    let file = load::open_gguf(&a.model)?;
    let md = file.metadata();
    println!("file:          {}", a.model.display());
    println!(
        "GGUF version:  {} ({} metadata keys, {} tensors)",
        file.version(),
        md.len(),
        file.tensors().len()
    );
    println!("architecture:  {}", md.architecture()?);
    if let Some(name) = md.get_str("general.name")? {
        println!("name:          {name}");
    }
    let mut by_format: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
    for t in file.tensors() {
        let e = by_format.entry(t.format.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.elements();
        e.2 += t.size;
    }
    let weight_bytes: u64 = file.tensors().iter().map(|t| t.size).sum();
    println!("tensors by type:");
    for (f, (n, elems, bytes)) in &by_format {
        println!(
            "  {f:<10} {n:>5} tensors {:>16} values {:>12}  {:.3} bits/value",
            elems,
            gib(*bytes),
            *bytes as f64 * 8.0 / *elems as f64
        );
    }
    let vocab = file
        .tensor("token_embd.weight")
        .map(|t| t.info.rows() as usize);
    match vocab.map(|v| Config::from_metadata(md, v)) {
        Some(Ok(c)) => print_config(&c, weight_bytes, a.ctx),
        Some(Err(e)) => println!("hyperparameters: not a runnable qwen35 model: {e}"),
        None => println!("hyperparameters: no token_embd.weight (vocabulary-only file?)"),
    }
    if md.get("prism.hadamard.version").is_some() {
        println!("hadamard:      yes (prism.hadamard.* rotation folded into the weights)");
    }
    if let Ok(spec) = load::tokenizer_spec(&file) {
        println!(
            "tokenizer:     {} / {} with {} tokens, {} merges, chat template: {}",
            spec.model,
            spec.pre.as_deref().unwrap_or("-"),
            spec.tokens.len(),
            spec.merges.len(),
            if spec.chat_template.is_some() {
                "yes"
            } else {
                "no (built-in Qwen3.5 ChatML is used)"
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_config(c: &Config, weight_bytes: u64, ctx: Option<usize>) {
    let n_attn = c
        .layers
        .iter()
        .filter(|&&k| k == LayerKind::Attention)
        .count();
    println!(
        "layers:        {} ({} gated delta net, {} gated attention)",
        c.n_layers,
        c.n_layers - n_attn,
        n_attn
    );
    println!("hidden / ffn:  {} / {}", c.hidden, c.ffn);
    println!("vocab:         {}", c.vocab);
    println!("context:       {}", c.context_length);
    println!(
        "attention:     {} q heads, {} kv heads, head dim {}, rope dims {} base {}",
        c.n_head, c.n_head_kv, c.head_dim, c.rope_dims, c.rope_base
    );
    println!(
        "delta net:     {} key heads x {}, {} value heads x {}, conv kernel {}",
        c.gdn_key_heads, c.gdn_key_dim, c.gdn_value_heads, c.gdn_value_dim, c.conv_kernel
    );
    println!("rms eps:       {:e}", c.rms_eps);
    let ctx = ctx.unwrap_or(c.context_length);
    let state = c.recurrent_state_bytes() as u64;
    let kv = (c.kv_bytes_per_token() * ctx) as u64;
    println!("memory at context {ctx}:");
    println!("  weights (mapped)  {}", gib(weight_bytes));
    println!("  recurrent state   {}", gib(state));
    println!("  KV cache (f32)    {}", gib(kv));
    println!("  total             {}", gib(weight_bytes + state + kv));
}
