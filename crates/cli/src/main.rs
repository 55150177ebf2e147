//! `niwaki`: the command-line front door.

mod cmd;
mod load;
mod progress;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "niwaki",
    version,
    about = "Inference engine for PrismML's Bonsai 27B models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streamed to stdout.
    Run(cmd::run::Args),
    /// Chat interactively, with the model's chat template.
    Chat(cmd::chat::Args),
    /// Show architecture, hyperparameters, tensor types and a memory estimate.
    Info(cmd::info::Args),
    /// Scan a file completely: types, sizes, ternary code 3, non-finite scales.
    Validate(cmd::validate::Args),
    /// Write a Bonsai-shaped GGUF with random weights.
    Synth(cmd::synth::Args),
    /// Re-pack every weight matrix of a model in another format.
    Quantize(cmd::quantize::Args),
    /// Print the token ids of a text as a JSON array.
    Tokenize(cmd::tokenize::Args),
    /// Save the logits of every position of a token sequence as .npy.
    Logits(cmd::logits::Args),
    /// Compile the CUDA kernels for a model and a GPU architecture into the kernel cache, ahead
    /// of the GPU host's first start (no GPU needed; NVRTC is).
    Kernels(cmd::kernels::Args),
    /// Measure prefill and decode speed, memory bandwidth and the fraction of the decode floor.
    Bench(cmd::bench::Args),
    /// Serve the model over an OpenAI-compatible HTTP API, with a web chat page.
    Serve(cmd::serve::Args),
    /// Perplexity over a text, and KL divergence / top-1 agreement against saved logits.
    Perplexity(cmd::perplexity::Args),
    /// Download a GGUF from the Hugging Face Hub (resumable); prints the path for --model.
    Pull(cmd::pull::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // A bad cap on the kernels' instruction set is refused before any work, not ignored.
    if let Err(e) = quant::simd::cap_from_env() {
        eprintln!("error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Run(a) => cmd::run::main(a),
        Command::Chat(a) => cmd::chat::main(a),
        Command::Info(a) => cmd::info::main(a),
        Command::Validate(a) => cmd::validate::main(a),
        Command::Synth(a) => cmd::synth::main(a),
        Command::Quantize(a) => cmd::quantize::main(a),
        Command::Tokenize(a) => cmd::tokenize::main(a),
        Command::Logits(a) => cmd::logits::main(a),
        Command::Perplexity(a) => cmd::perplexity::main(a),
        Command::Bench(a) => cmd::bench::main(a),
        Command::Kernels(a) => cmd::kernels::main(a),
        Command::Serve(a) => cmd::serve::main(a),
        Command::Pull(a) => cmd::pull::main(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
