//! `rla-pipe model inspect` and `rla-pipe model generate`: pretrained Hugging Face models.

use crate::error::Error;
use anyhow::Result;

use std::path::PathBuf;

use clap::Subcommand;

use super::args::{DeviceArg, TextOrJson};
use crate::model::Device;
use crate::model::hf::{self, generate_text};

#[derive(Subcommand, Debug)]
pub(super) enum ModelCommand {
    /// Architecture, parameters, dtypes, vocabulary and weights digest of a model directory
    /// (config.json + model.safetensors[.index.json] + tokenizer.json); every tensor is checked
    /// against config.json, none is loaded.
    Inspect {
        /// The model directory.
        dir: PathBuf,
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
    },
    /// Continue a prompt: greedy at --temperature 0, else sampled (top-p) with --seed. Stops at
    /// the tokenizer's EOS or --max-tokens.
    Generate {
        /// The model directory.
        dir: PathBuf,
        /// The prompt; repeat it to generate several prompts as one batch (with the KV cache:
        /// one forward per token for all of them).
        #[arg(long, required = true)]
        prompt: Vec<String>,
        /// Apply the tokenizer's chat template (the prompt is the user message).
        #[arg(long)]
        chat: bool,
        /// A system message (with --chat).
        #[arg(long, requires = "chat")]
        system: Option<String>,
        #[arg(long, default_value_t = 128)]
        max_tokens: usize,
        #[arg(long, default_value_t = 0.0)]
        temperature: f64,
        #[arg(long, default_value_t = 1.0)]
        top_p: f64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where the model runs.
        #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
        device: DeviceArg,
        /// json: an object with prompt_ids, generated_ids and text (and the digest, timings);
        /// an array of them for several prompts.
        #[arg(long, value_enum, default_value_t = TextOrJson::Text)]
        format: TextOrJson,
    },
}

pub(super) fn model(command: ModelCommand) -> Result<()> {
    match command {
        ModelCommand::Inspect { dir, format } => {
            let i = hf::inspect(&dir)?;
            match format {
                TextOrJson::Json => println!("{}", serde_json::to_string_pretty(&i)?),
                TextOrJson::Text => {
                    let dtypes: Vec<String> =
                        i.dtypes.iter().map(|(d, n)| format!("{d} ×{n}")).collect();
                    println!("model         {}", i.dir);
                    println!("architecture  {}", i.architecture);
                    println!(
                        "parameters    {} ({:.1} M)",
                        i.parameters,
                        i.parameters as f64 / 1e6
                    );
                    println!("dtype         {}", dtypes.join(", "));
                    println!(
                        "shape         {} layers, hidden {}, {} query / {} key-value heads of {}, mlp {}",
                        i.layers, i.hidden, i.heads, i.kv_heads, i.head_dim, i.intermediate
                    );
                    println!(
                        "vocabulary    {} (tokenizer {}), tied embeddings: {}",
                        i.vocab, i.tokenizer_vocab, i.tied_embeddings
                    );
                    if let Some(p) = i.max_positions {
                        println!("context       {p} positions");
                    }
                    println!(
                        "chat template {}, EOS ids {:?}",
                        if i.chat_template { "yes" } else { "no" },
                        i.eos_ids
                    );
                    println!(
                        "weights       {} ({:.1} MB)",
                        i.weight_files.join(", "),
                        i.weight_bytes as f64 / 1e6
                    );
                    println!("digest        blake3:{}", i.digest);
                }
            }
        }
        ModelCommand::Generate {
            dir,
            prompt,
            chat,
            system,
            max_tokens,
            temperature,
            top_p,
            seed,
            device,
            format,
        } => {
            if !(0.0..=1.0).contains(&top_p) || top_p == 0.0 || temperature < 0.0 {
                return Err(Error::usage("--top-p must be in (0, 1] and --temperature ≥ 0").into());
            }
            let request = hf::GenerateRequest {
                prompts: prompt,
                chat,
                system,
                sampling: hf::Sampling {
                    temperature,
                    top_p,
                    max_tokens,
                    seed,
                },
            };
            let device = Device::from(device);
            let replies = crate::on_backend!(device, infer, generate_text(&dir, &request))?;
            match format {
                TextOrJson::Json if replies.len() == 1 => {
                    println!("{}", serde_json::to_string_pretty(&replies[0])?)
                }
                TextOrJson::Json => println!("{}", serde_json::to_string_pretty(&replies)?),
                TextOrJson::Text => {
                    for (i, g) in replies.iter().enumerate() {
                        if replies.len() > 1 {
                            println!("--- prompt {}", i + 1);
                        }
                        println!("{}", g.text);
                    }
                    let g = &replies[0];
                    let prompt: usize = replies.iter().map(|g| g.prompt_ids.len()).sum();
                    let generated: usize = replies.iter().map(|g| g.generated_ids.len()).sum();
                    eprintln!(
                        "({} prompt + {} generated tokens, {:.1} tokens/s, loaded in {:.1} s)",
                        prompt, generated, g.tokens_per_second, g.load_seconds
                    );
                }
            }
        }
    }
    Ok(())
}
