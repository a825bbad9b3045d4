//! Pretrained Hugging Face checkpoints: tiny random Llama, Qwen2 and Qwen3 model directories
//! written by the test itself (config.json, safetensors, tokenizer files; no download), their
//! logits against an independent numpy forward (`tests/hf/reference.py`, numpy pip-installed
//! if missing), the KV cache against full recomputation, save → load round trips, and the
//! errors of bad checkpoints through the real binary.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use rla_pipe::determinism::Rng;
use rla_pipe::model::Cpu;
use rla_pipe::model::hf::{self, CausalLm, HfArch, Sampling, weights};
use rla_pipe::model::transformer::{bool_tensor, int_tensor};

use crate::{Fixture, GRIDNAV};

const VOCAB: usize = 64;

/// A tiny config of each architecture: GQA everywhere (4 query / 2 key-value heads), Llama with
/// llama3 RoPE scaling and attention biases, Qwen2 with its q/k/v biases and tied embeddings,
/// Qwen3 with q/k norms and a head_dim that is not hidden / heads.
fn tiny_config(arch: &str) -> serde_json::Value {
    let mut c = serde_json::json!({
        "architectures": [arch],
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 128,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": false,
        "torch_dtype": "float32",
    });
    let o = c.as_object_mut().unwrap();
    match arch {
        "LlamaForCausalLM" => {
            o.insert("model_type".into(), "llama".into());
            o.insert("attention_bias".into(), true.into());
            o.insert(
                "rope_scaling".into(),
                serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
            );
        }
        "Qwen2ForCausalLM" => {
            o.insert("model_type".into(), "qwen2".into());
            o.insert("tie_word_embeddings".into(), true.into());
            o.insert("rope_theta".into(), 1000000.0.into());
        }
        "Qwen3ForCausalLM" => {
            o.insert("model_type".into(), "qwen3".into());
            o.insert("head_dim".into(), 16.into());
            o.insert("rms_norm_eps".into(), 1e-6.into());
        }
        _ => {}
    }
    c
}

/// Random weights for every tensor `config` implies, in `dtype` ("F32", "BF16" or "F16").
fn tiny_weights(config: &serde_json::Value, seed: u64, dtype: &str) -> Vec<u8> {
    let arch = HfArch::from_json(&config.to_string()).unwrap();
    let mut rng = Rng::new(seed);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, shape) in arch.expected_tensors() {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| {
                let u = rng.unit() as f32 * 2.0 - 1.0;
                if name.ends_with("norm.weight") {
                    1.0 + 0.2 * u
                } else {
                    0.3 * u
                }
            })
            .collect();
        let bytes = match dtype {
            "F32" => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            "BF16" => values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
            "F16" => values
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            other => panic!("{other}"),
        };
        tensors.push((name, shape, bytes));
    }
    let dt = match dtype {
        "F32" => safetensors::Dtype::F32,
        "F16" => safetensors::Dtype::F16,
        _ => safetensors::Dtype::BF16,
    };
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(dt, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// A word-level tokenizer over `t0 … t63` (t1 = `<|im_start|>`, t2 = `<|im_end|>` as
/// specials) with a ChatML template.
fn write_tokenizer(dir: &Path) {
    let mut vocab = serde_json::Map::new();
    for i in 0..VOCAB {
        let word = match i {
            1 => "<|im_start|>".to_string(),
            2 => "<|im_end|>".to_string(),
            _ => format!("t{i}"),
        };
        vocab.insert(word, i.into());
    }
    let special = |id: usize, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(1, "<|im_start|>"), special(2, "<|im_end|>")],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let template = "{% for m in messages %}{{ '<|im_start|> ' + m['role'] + ' ' + m['content'] + ' <|im_end|> ' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|> t3 ' }}{% endif %}";
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>",
            "bos_token": "<|im_start|>"})
        .to_string(),
    )
    .unwrap();
}

/// Write a tiny model directory.
pub(crate) fn tiny_model(dir: &Path, arch: &str, dtype: &str) -> serde_json::Value {
    std::fs::create_dir_all(dir).unwrap();
    let config = tiny_config(arch);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.join("model.safetensors"),
        tiny_weights(&config, 17, dtype),
    )
    .unwrap();
    write_tokenizer(dir);
    config
}

pub(crate) fn load(dir: &Path) -> CausalLm<Cpu> {
    load_on(dir)
}

/// A model directory on any backend's default device.
pub(crate) fn load_on<B: burn::tensor::backend::Backend>(dir: &Path) -> CausalLm<B> {
    let arch = HfArch::from_dir(dir).unwrap();
    let files = weights::weight_files(dir).unwrap();
    weights::load::<B>(&arch, &files, &Default::default()).unwrap()
}

fn logits(model: &CausalLm<Cpu>, seqs: &[Vec<u32>]) -> Vec<f32> {
    model
        .forward_full(seqs, &Default::default())
        .into_data()
        .to_vec()
        .unwrap()
}

/// Logits of the numpy reference: `[seq][pos][vocab]`, flattened.
fn reference_logits(dir: &Path, seqs: &[Vec<u32>]) -> Vec<f64> {
    reference_logits_with(dir, seqs, &[])
}

/// [`reference_logits`] with more arguments for the script (`--adapter DIR`).
pub(crate) fn reference_logits_with(dir: &Path, seqs: &[Vec<u32>], extra: &[&str]) -> Vec<f64> {
    crate::python_packages("numpy", &["numpy"]);
    let ids = dir.join("ids.json");
    let out = dir.join("reference.json");
    std::fs::write(&ids, serde_json::to_string(seqs).unwrap()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hf/reference.py");
    let o = Command::new("python3")
        .args([
            script,
            dir.to_str().unwrap(),
            ids.to_str().unwrap(),
            out.to_str().unwrap(),
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s.as_array().unwrap().iter())
        .flat_map(|p| p.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
        .collect()
}

pub(crate) const ARCHS: [&str; 3] = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"];

#[test]
fn logits_match_an_independent_numpy_forward_on_all_three_architectures() {
    let f = Fixture::new();
    let seqs: Vec<Vec<u32>> = vec![
        vec![
            1, 5, 9, 33, 2, 17, 40, 63, 8, 12, 3, 44, 50, 7, 6, 21, 19, 30, 31, 4,
        ],
        vec![
            60, 3, 3, 3, 45, 2, 11, 9, 1, 0, 13, 24, 35, 46, 57, 58, 59, 14, 15, 16,
        ],
    ];
    for arch in ARCHS {
        for dtype in ["F32", "BF16", "F16"] {
            let dir = f.dir.path().join(format!("{arch}-{dtype}"));
            tiny_model(&dir, arch, dtype);
            let ours = logits(&load(&dir), &seqs);
            let reference = reference_logits(&dir, &seqs);
            assert_eq!(ours.len(), reference.len());
            let worst = ours
                .iter()
                .zip(&reference)
                .map(|(a, b)| (*a as f64 - b).abs())
                .fold(0.0, f64::max);
            assert!(worst <= 1e-4, "{arch} {dtype}: max |Δlogit| = {worst}");
            // A test that could not fail would pass with garbage: the logits are not flat.
            let spread = reference.iter().cloned().fold(f64::MIN, f64::max)
                - reference.iter().cloned().fold(f64::MAX, f64::min);
            assert!(spread > 1.0, "{arch}: logits spread {spread}");
        }
    }
}

/// `n` token sequences of `base + step · r` tokens (row `r`), ids in 1..=60.
fn rows_of_tokens(n: u32, base: usize, step: usize, mul: u32) -> Vec<Vec<u32>> {
    (0..n)
        .map(|r| {
            (0..base + step * r as usize)
                .map(|i| (i as u32 * mul + r) % 60 + 1)
                .collect()
        })
        .collect()
}

/// The model of `dir` in f32 and packed for the CPU's bf16 kernel (AMX, AVX512-BF16, or the
/// emulation).
fn f32_and_bf16(dir: &Path) -> Vec<(&'static str, CausalLm<Cpu>)> {
    vec![("f32", load(dir)), ("bf16", load(dir).pack_bf16())]
}

/// CPU inference computes the attention in batch chunks when its scores would be large
/// (`arch::set_attention_chunk_bytes`): one row at a time, three at a time and all at once give
/// the same logits to the bit, with the additive mask (f32) and with the fused masked softmax
/// (bf16 tiles, where the CPU has them), and through a decode with the KV cache. (Chunks are
/// burn's attention's: the fused one, which keeps no scores in memory, is off on this thread
/// for the prompts; the decoding steps run burn's either way.)
#[test]
fn attention_in_batch_chunks_equals_one_call() {
    use rla_pipe::model::hf::arch::set_attention_chunk_bytes;
    rla_pipe::model::hf::attention::set_fused_attention(false);
    let f = Fixture::new();
    let seqs = rows_of_tokens(7, 5, 3, 7);
    let sampling = Sampling {
        temperature: 0.9,
        top_p: 0.95,
        max_tokens: 6,
        seed: 0,
    };
    let seeds: Vec<u64> = (0..7).collect();
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        for (dtype, model) in &f32_and_bf16(&dir) {
            let run = |bytes: usize| {
                set_attention_chunk_bytes(bytes);
                let l = logits(model, &seqs);
                let g =
                    hf::generate::sample(model, &seqs, &seeds, &[], &sampling, &Default::default())
                        .unwrap();
                set_attention_chunk_bytes(16 << 20);
                (l.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), g)
            };
            let whole = run(usize::MAX);
            assert_eq!(run(1), whole, "{arch} {dtype}: one row at a time");
            // Three rows of the padded batch: kv · g · t · keys · 4 bytes a row.
            let a = HfArch::from_dir(&dir).unwrap();
            let t = seqs.iter().map(Vec::len).max().unwrap();
            let row = a.heads * t * t * 4;
            assert_eq!(run(3 * row), whole, "{arch} {dtype}: three rows at a time");
        }
    }
}

/// CPU inference's fused attention (`hf::attention`) against burn's products and softmax:
/// logits within 1e-5 (relative to the largest, f32 sums in other orders), on f32 and bf16
/// weights, and the same greedy tokens with log-probabilities within 1e-5 relative.
#[test]
fn fused_attention_follows_burns() {
    use rla_pipe::model::hf::attention::set_fused_attention;
    let f = Fixture::new();
    let seqs = rows_of_tokens(5, 4, 9, 11);
    let greedy = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        max_tokens: 6,
        seed: 0,
    };
    let seeds: Vec<u64> = (0..5).collect();
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        for (dtype, model) in &f32_and_bf16(&dir) {
            let run = |on: bool| {
                set_fused_attention(on);
                let l = logits(model, &seqs);
                let g =
                    hf::generate::sample(model, &seqs, &seeds, &[], &greedy, &Default::default())
                        .unwrap();
                set_fused_attention(true);
                (l, g)
            };
            let (fused, g_fused) = run(true);
            let (burn, g_burn) = run(false);
            let top = burn.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
            let worst = fused
                .iter()
                .zip(&burn)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= 1e-5 * top,
                "{arch} {dtype}: logits differ by {worst}"
            );
            for ((ids, lp), (ids_b, lp_b)) in g_fused.iter().zip(&g_burn) {
                assert_eq!(ids, ids_b, "{arch} {dtype}: greedy tokens");
                assert!(
                    (lp - lp_b).abs() <= 1e-5 * lp_b.abs().max(1.0),
                    "{arch} {dtype}: {lp} vs {lp_b}"
                );
            }
        }
    }
}

#[test]
fn kv_cache_generation_equals_full_recomputation() {
    let f = Fixture::new();
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        let model = load(&dir);
        // Prompts of different lengths: the right padding must stay invisible.
        let prompts: Vec<Vec<u32>> = vec![
            vec![1, 5, 9, 33],
            vec![7, 8],
            vec![9, 10, 11, 12, 13, 14, 15],
        ];
        let greedy = Sampling {
            temperature: 0.0,
            top_p: 1.0,
            max_tokens: 12,
            seed: 0,
        };
        let cached = hf::generate(&model, &prompts, &[], &greedy, &Default::default()).unwrap();
        for (p, got) in prompts.iter().zip(&cached) {
            let mut seq = p.clone();
            for _ in 0..greedy.max_tokens {
                let l = logits(&model, std::slice::from_ref(&seq));
                let last = &l[(seq.len() - 1) * VOCAB..seq.len() * VOCAB];
                let best = (0..VOCAB).fold(0, |b, i| if last[i] > last[b] { i } else { b });
                seq.push(best as u32);
            }
            assert_eq!(got, &seq[p.len()..].to_vec(), "{arch}: prompt {p:?}");
        }
        // A prompt's sampled reply does not depend on what else is in its batch; its
        // log-probability does, in the last bits: the padding a longer prompt adds changes the
        // rounding of the CPU kernels' sums. (So a pretrained model's stages stay in the
        // coordinator on CPU rather than run as shards on a cluster: `Stage::shard_column`.)
        let sampling = Sampling {
            temperature: 0.9,
            top_p: 0.95,
            max_tokens: 12,
            seed: 0,
        };
        let seeds = [11u64, 12, 13];
        let eos = [2u32];
        let together = hf::generate::sample(
            &model,
            &prompts,
            &seeds,
            &eos,
            &sampling,
            &Default::default(),
        )
        .unwrap();
        for (i, p) in prompts.iter().enumerate() {
            let alone = hf::generate::sample(
                &model,
                std::slice::from_ref(p),
                &seeds[i..=i],
                &eos,
                &sampling,
                &Default::default(),
            )
            .unwrap();
            assert_eq!(
                alone[0].0, together[i].0,
                "{arch}: prompt {p:?} alone vs in the batch"
            );
            let (x, y) = (alone[0].1, together[i].1);
            assert!(
                (x - y).abs() <= 1e-6 * x.abs(),
                "{arch}: prompt {p:?}: {x} vs {y}"
            );
        }
        // And the cached forward's logits equal the full forward's, not only their argmax.
        let arch_cfg = HfArch::from_dir(&dir).unwrap();
        assert_eq!(arch_cfg.vocab, VOCAB);
        let full = logits(&model, &[vec![3, 4, 5, 6]]);
        let mut cache = hf::KvCache::new(Vec::new());
        let d = Default::default();
        let ints = |v: Vec<i64>| {
            let n = v.len();
            int_tensor::<Cpu, 2>(v, [1, n], &d)
        };
        let _ = model.forward(
            ints(vec![3, 4, 5]),
            ints(vec![0, 1, 2]),
            bool_tensor(causal(3, 0), [1, 3, 3], &d),
            Some(&mut cache),
        );
        let step: Vec<f32> = model
            .forward(
                ints(vec![6]),
                ints(vec![3]),
                bool_tensor(vec![false; 4], [1, 1, 4], &d),
                Some(&mut cache),
            )
            .into_data()
            .to_vec()
            .unwrap();
        let worst = step
            .iter()
            .zip(&full[3 * VOCAB..])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst < 1e-5,
            "{arch}: cached vs full logits differ by {worst}"
        );
    }
}

/// Tokens picked on the device (`hf::generate`, the GPU's path), forced on the CPU, against
/// the host's picks from the logits: greedy, each row's first maximum and its log-probability
/// computed there; sampled, each row's leading tokens and softmax sum read (4, 16 or the
/// device's count of the tiny model's 64), the draw made from them, and a row whose draw
/// reaches past them read whole; a reward model's samples (from a word list and from the whole
/// vocabulary, on copied and on shared prompt caches), each row's uniform number sent to the
/// device and the running sums taken there. The same tokens, and log-probabilities within 1e-5
/// relative (f32 sums on the device, f64 on the host), with rows that stop at different steps.
#[test]
fn device_picks_follow_the_hosts() {
    use rla_pipe::model::hf::generate::force_device_picks;
    use rla_pipe::model::hf::{HfArch, HfTokenizer};
    use rla_pipe::model::lm::Lm;
    use rla_pipe::model::reward::{self, Verdicts};
    use rla_pipe::model::tokenizer::Tokenizer;
    let f = Fixture::new();
    let d = Default::default();
    let prompts: Vec<Vec<u32>> = vec![vec![1, 5, 9, 33, 12, 40], vec![7, 8], vec![3, 30, 31]];
    let seeds = [21u64, 22, 23];
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        let model = load(&dir);
        for (temperature, top_p, lead) in [
            (0.0, 1.0, None),
            (0.9, 1.0, None),
            (0.9, 1.0, Some(4)),
            (0.3, 0.8, Some(16)),
        ] {
            let s = Sampling {
                temperature,
                top_p,
                max_tokens: 8,
                seed: 0,
            };
            // Each reply ends at a token it would otherwise emit at step 3, so that rows stop
            // at different steps.
            let free = hf::generate::sample(&model, &prompts, &seeds, &[], &s, &d).unwrap();
            let eos: Vec<u32> = free.iter().take(1).map(|(t, _)| t[3]).collect();
            let run = |device: bool| {
                force_device_picks(Some(device), lead);
                let out = hf::generate::sample(&model, &prompts, &seeds, &eos, &s, &d).unwrap();
                force_device_picks(None, None);
                out
            };
            let (host, device) = (run(false), run(true));
            for ((a, x), (b, y)) in host.iter().zip(&device) {
                assert_eq!(a, b, "{arch} at T = {temperature}, lead {lead:?}: tokens");
                assert!(
                    (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                    "{arch}: reply log-probability {x} on the host vs {y}"
                );
            }
            let lengths: std::collections::BTreeSet<usize> =
                host.iter().map(|(t, _)| t.len()).collect();
            assert!(lengths.len() > 1, "{arch}: rows stop apart");
        }
        // A reward model's m samples (`model::reward`, drawn in their tokens' order): from a
        // word list (the allowed tokens selected on the device) and from the whole
        // vocabulary, each with a copy of its prompt's cache and on one shared cache.
        let words = Tokenizer::words(&[]);
        let mut apart = 0;
        let hf_tok = HfTokenizer::from_dir(&dir, &HfArch::from_dir(&dir).unwrap()).unwrap();
        for v in [Verdicts::Words(&words), Verdicts::Text(&hf_tok, "")] {
            for shared in [false, true] {
                let run = |device: bool| {
                    force_device_picks(Some(device), None);
                    let j = match shared {
                        true => {
                            let (last, cache, lens) = model.encode(&prompts, &d);
                            reward::generate_shared(
                                &model, v, last, cache, &lens, &seeds, 3, 6, 1.3, &d,
                            )
                        }
                        false => reward::generate(&model, v, &prompts, &seeds, 3, 6, 1.3, &d),
                    };
                    force_device_picks(None, None);
                    j.into_iter().flatten().collect::<Vec<_>>()
                };
                let (host, device) = (run(false), run(true));
                let lengths: std::collections::BTreeSet<usize> =
                    host.iter().map(|j| j.tokens.len()).collect();
                apart += usize::from(lengths.len() > 1);
                for (a, b) in host.iter().zip(&device) {
                    assert_eq!(a.tokens, b.tokens, "{arch}, shared {shared}: RM tokens");
                    assert_eq!(a.score, b.score);
                    assert!(
                        (a.logprob - b.logprob).abs() <= 1e-5 * a.logprob.abs().max(1.0),
                        "{arch}: RM sample log-probability {} on the host vs {}",
                        a.logprob,
                        b.logprob
                    );
                }
            }
        }
        assert!(apart > 0, "{arch}: some samples stop apart");
    }
}

/// The GPU's key/value cache layout (`model::kv`: buffers of a bucketed number of keys written
/// in place, the keys past the filled ones masked, and on decoding finished rows kept in the
/// batch), forced on the CPU, against the CPU's own layout: the same tokens, and
/// log-probabilities and logits within 1e-5 relative (the masked keys add exact zeros to the
/// attention's sums, which burn's products may block differently). Covered: sampled and greedy
/// replies with rows that stop at different steps, a reward model's m samples with a copied and
/// with a shared prompt cache, and decoding steps that outgrow a bucket.
#[test]
fn device_cache_layout_follows_the_cpu_layout() {
    use rla_pipe::model::kv::{BUCKET, force_device_layout};
    use rla_pipe::model::lm::Lm;
    use rla_pipe::model::reward::{self, Verdicts};
    use rla_pipe::model::tokenizer::Tokenizer;
    let f = Fixture::new();
    let d = Default::default();
    let close = |a: f64, b: f64, what: &str| {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1.0),
            "{what}: {a} vs {b}"
        );
    };
    let prompts: Vec<Vec<u32>> = vec![
        vec![1, 5, 9, 33, 12, 40],
        vec![7, 8],
        vec![9, 10, 11, 12, 13, 14, 15, 16, 17],
        vec![3, 30, 31],
    ];
    let seeds = [21u64, 22, 23, 24];
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        let model = load(&dir);
        let both = |run: &dyn Fn() -> Vec<(Vec<u32>, f64)>, what: &str| {
            force_device_layout(Some(false));
            let cpu = run();
            force_device_layout(Some(true));
            let device = run();
            force_device_layout(None);
            for (i, (a, b)) in cpu.iter().zip(&device).enumerate() {
                assert_eq!(a.0, b.0, "{arch} {what}: prompt {i}'s tokens");
                close(
                    a.1,
                    b.1,
                    &format!("{arch} {what}: prompt {i}'s log-probability"),
                );
            }
            cpu
        };
        for temperature in [0.0, 1.3] {
            let s = Sampling {
                temperature,
                top_p: 0.95,
                max_tokens: 10,
                seed: 0,
            };
            let sample = |eos: &[u32]| hf::generate::sample(&model, &prompts, &seeds, eos, &s, &d);
            // An end token that stops some rows early, others not at all: the CPU drops them
            // from the batch, the device layout keeps them.
            let free = both(&|| sample(&[]).unwrap(), "no end token");
            let eos = [free[0].0[2], free[2].0[5]];
            let stopped = both(&|| sample(&eos).unwrap(), "end tokens");
            let lens: std::collections::BTreeSet<usize> =
                stopped.iter().map(|(ids, _)| ids.len()).collect();
            assert!(
                lens.len() > 1,
                "{arch}: rows stop at different steps: {lens:?}"
            );
        }
        // A reward model's samples: each with a copy of its prompt's cache, and m samples on
        // one shared prompt cache.
        let tok = Tokenizer::words(&[]);
        let (m, max_tokens, t) = (3, 6, 1.3);
        let judged = |shared: bool| {
            let v = Verdicts::Words(&tok);
            let j = if shared {
                let (last, cache, lens) = model.encode(&prompts, &d);
                reward::generate_shared(&model, v, last, cache, &lens, &seeds, m, max_tokens, t, &d)
            } else {
                reward::generate(&model, v, &prompts, &seeds, m, max_tokens, t, &d)
            };
            j.into_iter()
                .flatten()
                .map(|j| (j.tokens, j.logprob))
                .collect::<Vec<_>>()
        };
        both(&|| judged(false), "reward samples, copied prompt cache");
        both(&|| judged(true), "reward samples, shared prompt cache");
        // Steps past the bucket the reservation made: the buffers grow by a bucket.
        let decode = || {
            let prompt: Vec<u32> = (0..BUCKET as u32 - 3).map(|i| 3 + i % 60).collect();
            let n = prompt.len();
            let mut cache = hf::KvCache::new(Vec::new());
            let ints = |v: Vec<i64>| {
                let k = v.len();
                int_tensor::<Cpu, 2>(v, [1, k], &d)
            };
            let _ = model.forward(
                ints(prompt.iter().map(|&x| x as i64).collect()),
                ints((0..n as i64).collect()),
                bool_tensor(causal(n, 0), [1, n, n], &d),
                Some(&mut cache),
            );
            cache.reserve(1);
            let mut out = Vec::new();
            for step in 0..6 {
                let keys = n + step + 1;
                let l: Vec<f32> = model
                    .forward(
                        ints(vec![5 + step as i64]),
                        ints(vec![(n + step) as i64]),
                        bool_tensor(vec![false; keys], [1, 1, keys], &d),
                        Some(&mut cache),
                    )
                    .into_data()
                    .to_vec()
                    .unwrap();
                assert_eq!(cache.keys(), keys, "{arch}: the cache holds every key");
                out.push((vec![], l.iter().map(|&x| x as f64).sum::<f64>()));
                out.extend(l.iter().map(|&x| (vec![], x as f64)));
            }
            let room = cache.layers[0].0.dims()[2];
            (out, room)
        };
        force_device_layout(Some(true));
        let (_, room) = decode();
        force_device_layout(None);
        assert_eq!(room, 2 * BUCKET, "{arch}: grown by a bucket");
        both(&|| decode().0, "decoding past the bucket");
    }
}

fn causal(t: usize, cached: usize) -> Vec<bool> {
    let mut m = Vec::new();
    for i in 0..t {
        for k in 0..cached + t {
            m.push(k > cached + i);
        }
    }
    m
}

#[test]
fn save_then_load_is_bit_identical() {
    let f = Fixture::new();
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "BF16");
        let model = load(&dir);
        let saved = weights::to_safetensors(&model).unwrap();
        let again = f.dir.path().join(format!("{arch}-saved"));
        std::fs::create_dir_all(&again).unwrap();
        let arch_cfg = HfArch::from_dir(&dir).unwrap();
        std::fs::write(again.join("config.json"), arch_cfg.config_json("float32")).unwrap();
        std::fs::write(again.join("model.safetensors"), &saved).unwrap();
        let reloaded = load(&again);
        let resaved = weights::to_safetensors(&reloaded).unwrap();
        let first_difference = resaved.iter().zip(&saved).position(|(a, b)| a != b);
        assert!(
            resaved == saved,
            "{arch}: {} vs {} bytes, first difference at {first_difference:?}",
            resaved.len(),
            saved.len()
        );
        // The saved file is in the Hugging Face layout: the same names and shapes as the
        // original, f32.
        let names = |bytes: &[u8]| -> BTreeMap<String, Vec<usize>> {
            let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
            st.tensors()
                .into_iter()
                .map(|(n, v)| {
                    assert_eq!(v.dtype(), safetensors::Dtype::F32);
                    (n, v.shape().to_vec())
                })
                .collect()
        };
        let original: BTreeMap<String, Vec<usize>> =
            arch_cfg.expected_tensors().into_iter().collect();
        assert_eq!(names(&saved), original);
        let seqs = vec![vec![3, 4, 5, 6, 7]];
        assert_eq!(logits(&model, &seqs), logits(&reloaded, &seqs), "{arch}");
    }
}

#[test]
fn model_inspect_and_generate_through_the_binary() {
    let f = Fixture::new();
    let dir = f.dir.path().join("qwen3");
    tiny_model(&dir, "Qwen3ForCausalLM", "BF16");
    let d = dir.to_str().unwrap();
    let r = f.rla(&["model", "inspect", d, "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["architecture"], "Qwen3ForCausalLM");
    assert_eq!(v["kv_heads"], 2);
    assert_eq!(v["dtypes"]["BF16"], 25);
    assert_eq!(v["eos_ids"], serde_json::json!([2]));
    let digest = blake3::hash(&std::fs::read(dir.join("model.safetensors")).unwrap());
    assert_eq!(v["digest"], digest.to_hex().as_str());
    let text = f.rla(&["model", "inspect", d]);
    assert!(text.stdout.contains("Qwen3ForCausalLM") && text.stdout.contains("blake3:"));

    let generate = |extra: &[&str]| {
        let mut args = vec![
            "model",
            "generate",
            d,
            "--prompt",
            "t5 t6 t7",
            "--max-tokens",
            "6",
            "--format",
            "json",
        ];
        args.extend_from_slice(extra);
        let r = f.rla(&args);
        assert_eq!(r.code, 0, "{}", r.stderr);
        serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap()
    };
    let g = generate(&[]);
    assert_eq!(g["prompt_ids"], serde_json::json!([5, 6, 7]));
    let ids = g["generated_ids"].as_array().unwrap();
    assert!(!ids.is_empty() && ids.len() <= 6);
    // Greedy is greedy: the numpy reference's argmax continuation.
    let expected = reference_greedy(&dir, &[5, 6, 7], ids.len());
    let got: Vec<u64> = ids.iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(got, expected);
    // Sampling is seeded: equal seeds, equal ids.
    let s1 = generate(&["--temperature", "1.0", "--seed", "3"]);
    let s2 = generate(&["--temperature", "1.0", "--seed", "3"]);
    assert_eq!(s1["generated_ids"], s2["generated_ids"]);
    // The chat template frames the prompt.
    let c = generate(&["--chat"]);
    assert_eq!(c["prompt_ids"], serde_json::json!([1, 0, 5, 6, 7, 2, 1, 3]));
    // Several prompts are one batch (prompts of different lengths, padded); each greedy reply
    // is the one the prompt gets alone.
    let batch = |prompts: &[&str]| {
        let mut args = vec![
            "model",
            "generate",
            d,
            "--max-tokens",
            "6",
            "--format",
            "json",
        ];
        for p in prompts {
            args.extend_from_slice(&["--prompt", p]);
        }
        let r = f.rla(&args);
        assert_eq!(r.code, 0, "{}", r.stderr);
        serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap()
    };
    let both = batch(&["t5 t6 t7", "t6"]);
    let alone = batch(&["t6"]);
    assert_eq!(both.as_array().map(Vec::len), Some(2));
    assert_eq!(both[0]["generated_ids"], g["generated_ids"]);
    assert_eq!(both[1]["generated_ids"], alone["generated_ids"]);
    assert_eq!(both[1]["prompt_ids"], serde_json::json!([6]));
}

/// The reference's greedy continuation (`--greedy N`).
fn reference_greedy(dir: &Path, prompt: &[u32], n: usize) -> Vec<u64> {
    let _ = reference_logits(dir, &[prompt.to_vec()]);
    let ids = dir.join("ids.json");
    let out = dir.join("greedy.json");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/hf/reference.py");
    let o = Command::new("python3")
        .args([
            script,
            dir.to_str().unwrap(),
            ids.to_str().unwrap(),
            out.to_str().unwrap(),
            "--greedy",
            &n.to_string(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    v["generated"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn bad_checkpoints_are_clear_errors() {
    let f = Fixture::new();
    let inspect = |dir: &Path| f.rla(&["model", "inspect", dir.to_str().unwrap()]);
    let fresh = |name: &str| {
        let dir = f.dir.path().join(name);
        let config = tiny_model(&dir, "LlamaForCausalLM", "F32");
        (dir, config)
    };

    // A tensor missing: named, with the shape config.json implies.
    let (dir, mut config) = fresh("missing");
    config["num_hidden_layers"] = 3.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let r = inspect(&dir);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("model.layers.2.input_layernorm.weight") && r.stderr.contains("[32]"),
        "{}",
        r.stderr
    );

    // A wrong shape: both shapes named.
    let (dir, mut config) = fresh("shape");
    config["intermediate_size"] = 40.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let r = inspect(&dir);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("model.layers.0.mlp.gate_proj.weight")
            && r.stderr.contains("[48, 32]")
            && r.stderr.contains("[40, 32]"),
        "{}",
        r.stderr
    );

    // An unknown tensor.
    let (dir, mut config) = fresh("unknown");
    config["num_hidden_layers"] = 1.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let r = inspect(&dir);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("model.layers.1.") && r.stderr.contains("not part of"),
        "{}",
        r.stderr
    );

    // A truncated file.
    let (dir, _) = fresh("truncated");
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() - 100]).unwrap();
    let r = inspect(&dir);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("model.safetensors") && r.stderr.contains("truncated"),
        "{}",
        r.stderr
    );

    // An unknown architecture, and a config that is not JSON.
    let (dir, mut config) = fresh("arch");
    config["architectures"] = serde_json::json!(["MambaForCausalLM"]);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let r = inspect(&dir);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("config.json") && r.stderr.contains("MambaForCausalLM"),
        "{}",
        r.stderr
    );
    std::fs::write(dir.join("config.json"), "{\n  \"vocab_size\": ,\n}").unwrap();
    let r = inspect(&dir);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("config.json") && r.stderr.contains("line 2"),
        "{}",
        r.stderr
    );

    // Not a model directory at all; generation errors the same way, without a panic.
    let r = f.rla(&[
        "model",
        "generate",
        f.dir.path().to_str().unwrap(),
        "--prompt",
        "x",
    ]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("config.json") && !r.stderr.contains("panicked"),
        "{}",
        r.stderr
    );
}

#[test]
fn sharded_checkpoints_load_like_one_file() {
    let f = Fixture::new();
    let one = f.dir.path().join("one");
    let config = tiny_model(&one, "Qwen2ForCausalLM", "F32");
    // Split the tensors over two shards + an index.
    let sharded = f.dir.path().join("sharded");
    std::fs::create_dir_all(&sharded).unwrap();
    std::fs::write(sharded.join("config.json"), config.to_string()).unwrap();
    write_tokenizer(&sharded);
    let bytes = std::fs::read(one.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut map = serde_json::Map::new();
    let mut shards: [Vec<(String, safetensors::tensor::TensorView)>; 2] = [Vec::new(), Vec::new()];
    for (name, view) in st.tensors() {
        let k = usize::from(name.contains("layers.1") || name.starts_with("model.norm"));
        let file = format!("model-0000{}-of-00002.safetensors", k + 1);
        map.insert(name.clone(), file.into());
        shards[k].push((name, view));
    }
    for (k, views) in shards.into_iter().enumerate() {
        let file = sharded.join(format!("model-0000{}-of-00002.safetensors", k + 1));
        std::fs::write(file, safetensors::serialize(views, None).unwrap()).unwrap();
    }
    std::fs::write(
        sharded.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    let seqs = vec![vec![1, 2, 3, 4, 5, 6]];
    assert_eq!(logits(&load(&one), &seqs), logits(&load(&sharded), &seqs));
    let r = f.rla(&[
        "model",
        "inspect",
        sharded.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("model-00002-of-00002.safetensors"));
}

/// GPT-2's byte → printable character map (the byte-level BPE alphabet).
fn byte_alphabet() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in printable.iter().zip(&chars) {
        out[*b as usize] = char::from_u32(*c).unwrap();
    }
    out
}

/// A byte-level BPE tokenizer without merges (every byte a token: any text encodes) with
/// ChatML specials at 256, 257, and the ChatML template.
pub(crate) fn write_byte_tokenizer(dir: &Path) {
    let mut vocab = serde_json::Map::new();
    for (b, c) in byte_alphabet().into_iter().enumerate() {
        vocab.insert(c.to_string(), b.into());
    }
    let special = |id: usize, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
        "trim_offsets": true, "use_regex": true});
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(256, "<|im_start|>"), special(257, "<|im_end|>")],
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": false, "vocab": vocab, "merges": []},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>"}).to_string(),
    )
    .unwrap();
}

/// A tiny pretrained-format model over bytes.
pub(crate) fn byte_model(dir: &Path, arch: &str, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let mut config = tiny_config(arch);
    config["vocab_size"] = 258.into();
    config["eos_token_id"] = 257.into();
    config["bos_token_id"] = 256.into();
    config["max_position_embeddings"] = 4096.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.join("model.safetensors"),
        tiny_weights(&config, seed, "BF16"),
    )
    .unwrap();
    write_byte_tokenizer(dir);
}

/// A small gridnav run's settings with the two roles starting from `policy` and `rm`, then
/// `extra` (later keys win).
pub(crate) fn pretrained_sets(policy: &Path, rm: &Path, extra: &[&str]) -> Vec<String> {
    [
        "env.initial_tasks=4",
        "rollout.n=2",
        "eval.tasks=4",
        "eval.ood_tasks=4",
        "eval.rollouts=1",
        "env.max_steps=6",
        "policy.context=1024",
        "reward_model.context=1024",
        "reward_model.samples=2",
        "reward_model.max_tokens=6",
        "update.policy_steps=2",
        "update.rm_steps=2",
        "update.minibatch=16",
        "pretrain.policy_episodes=2",
        "pretrain.policy_epochs=1",
        "pretrain.rm_steps=8",
        "pretrain.rm_epochs=1",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .chain([
        format!("policy.init=hf:{}", policy.display()),
        format!("reward_model.init=hf:{}", rm.display()),
    ])
    .collect()
}

/// The whole loop with pretrained-format models as policy (Qwen2) and reward model (Llama):
/// every stage commits, the checkpoints are safetensors in the Hugging Face layout, run.json
/// and the manifests name the weights the run started from, replay re-executes an iteration
/// bit for bit, and changed starting weights refuse to resume.
#[test]
fn pipeline_runs_with_pretrained_models_and_replays() {
    let f = Fixture::new();
    let (policy, rm) = (f.dir.path().join("policy"), f.dir.path().join("rm"));
    byte_model(&policy, "Qwen2ForCausalLM", 31);
    byte_model(&rm, "LlamaForCausalLM", 32);
    let sets = pretrained_sets(&policy, &rm, &[]);
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let r = f.run_pipeline(GRIDNAV, "hf", 2, &sets);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);

    // run.json names the starting weights by the digest of their files.
    let run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.store().join("hf/run.json")).unwrap()).unwrap();
    for (name, dir) in [("policy", &policy), ("rm", &rm)] {
        let digest = blake3::hash(&std::fs::read(dir.join("model.safetensors")).unwrap());
        let origin = run["models"][name].as_str().unwrap();
        assert!(
            origin.ends_with(&format!("blake3:{}", digest.to_hex())),
            "{origin}"
        );
    }
    // So do the manifests that read them; and every checkpoint written is safetensors in the
    // Hugging Face layout that `model inspect` accepts with the config.
    let manifests = f.files();
    let pretrain = manifests
        .iter()
        .find(|p| p.contains("iter=000000") && p.contains("pretrain") && p.ends_with(".json"))
        .unwrap_or_else(|| panic!("{manifests:?}"));
    let text = std::fs::read_to_string(f.store().join(pretrain)).unwrap();
    assert!(text.contains("\"source\": \"hf:"), "{text}");
    let artifacts: Vec<&String> = manifests
        .iter()
        .filter(|p| p.contains("artifacts/"))
        .collect();
    assert!(artifacts.len() >= 4, "{artifacts:?}");
    for a in artifacts {
        let bytes = std::fs::read(f.store().join(a)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert!(st.names().iter().any(|n| *n == "model.norm.weight"), "{a}");
    }

    // Every stage of both iterations committed; the RM's replies are text with parsed verdicts.
    let r = f.sql(
        "SELECT count(DISTINCT stage) AS s, count(*) AS n FROM stage_runs WHERE run_id = 'hf'",
    );
    assert!(
        r.stdout.contains("11,22") || r.stdout.contains("11,21"),
        "{}",
        r.stdout
    );
    let r = f.sql("SELECT count(*) FROM rm_samples WHERE score NOT IN (-1, 0, 1)");
    assert!(r.stdout.contains("\n0"), "{}", r.stdout);

    // Replay re-executes iteration 1 (rollout, RM scoring, the update's safetensors) bit for bit.
    let store = f.store_arg();
    let r = f.rla(&[
        "replay", "--store", &store, "--run", "hf", "--iter", "1", "--verify",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);

    // Export: the trained policy as a Hugging Face directory (config, tokenizer, weights) that
    // `model inspect` and `model generate` take as they are.
    let out = f.dir.path().join("exported");
    let o = out.to_str().unwrap();
    let r = f.rla(&[
        "export", "--store", &store, "--run", "hf", "--iter", "1", "--model", "policy", "--out", o,
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("update of iteration 1"), "{}", r.stdout);
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(out.join(file).exists(), "{file}");
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(config["torch_dtype"], "float32");
    let r = f.rla(&["model", "inspect", o, "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = f.rla(&[
        "model",
        "generate",
        o,
        "--chat",
        "--prompt",
        "go",
        "--max-tokens",
        "4",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The exported weights are the ones the update committed (not the starting ones).
    let exported = std::fs::read(out.join("model.safetensors")).unwrap();
    let committed = f
        .files()
        .into_iter()
        .filter(|p| p.contains("artifacts/iter=000001/policy"))
        .map(|p| std::fs::read(f.store().join(p)).unwrap())
        .collect::<Vec<_>>();
    assert_eq!(committed.len(), 1);
    assert!(committed[0] == exported);
    // A second export into the same directory is refused; so is a run of the small model.
    let r = f.rla(&[
        "export", "--store", &store, "--run", "hf", "--iter", "1", "--out", o,
    ]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("not empty"), "{}", r.stderr);
    let r = f.rla(&[
        "export", "--store", &store, "--run", "hf", "--iter", "7", "--out", "x",
    ]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("iteration 7 is not committed"),
        "{}",
        r.stderr
    );

    // Different starting weights under the same config: resuming is refused, naming both.
    byte_model(&policy, "Qwen2ForCausalLM", 99);
    let r = f.run_pipeline(GRIDNAV, "hf", 3, &sets);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("policy model") && r.stderr.contains("blake3:"),
        "{}",
        r.stderr
    );
}

/// `policy.action_mode = "generate"`: the policy writes replies ending in `\boxed{index}` (the
/// warm start teaches them), invalid replies cost a step and observe "Nothing happens.", the
/// update trains on the replies token by token, and replay re-executes it all bit for bit.
#[test]
fn generative_policy_writes_replies_and_trains_on_them() {
    let f = Fixture::new();
    let (policy, rm) = (f.dir.path().join("policy"), f.dir.path().join("rm"));
    byte_model(&policy, "Qwen3ForCausalLM", 41);
    byte_model(&rm, "Qwen2ForCausalLM", 42);
    let sets = pretrained_sets(
        &policy,
        &rm,
        &[
            "env.gridnav.size=4",
            "env.gridnav.wall_density=0.0",
            "env.gridnav.min_distance=1",
            "env.gridnav.max_distance=2",
            "reward.policy_acc_min=0.0",
            "reward.policy_acc_max=1.0",
            "policy.action_mode=generate",
            "policy.reasoning=false",
            "policy.max_tokens=12",
            "pretrain.policy_episodes=16",
            "pretrain.policy_epochs=12",
            "pretrain.minibatch=16",
            "pretrain.lr=0.02",
            "pretrain.rm_epochs=4",
        ],
    );
    let mut args = vec!["run", "-v", GRIDNAV, "--run-id", "gen", "--iterations", "2"];
    for s in &sets {
        args.extend(["--set", s.as_str()]);
    }
    let r = f.rla(&args);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    // The warm start taught both models in their own reply formats: each one's loss fell.
    for model in ["policy", "rm"] {
        let line = r
            .stderr
            .lines()
            .find(|l| {
                l.contains("supervised warm start") && l.contains(&format!("model=\"{model}\""))
            })
            .unwrap_or_else(|| panic!("no warm-start line for {model}: {}", r.stderr));
        let field = |name: &str| -> f64 {
            let at = line.find(&format!("{name}=")).unwrap() + name.len() + 1;
            line[at..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let (first, last) = (field("first_loss"), field("last_loss"));
        assert!(last < first, "{model}: warm-start loss {first} -> {last}");
    }
    // Every step holds its reply; a valid one names an admissible action, an invalid one
    // observes "Nothing happens.".
    let r = f.sql(
        "SELECT count(*) AS steps, count(response) AS replies, \
         sum(CASE WHEN strpos(admissible, concat('\"', action, '\"')) > 0 THEN 1 ELSE 0 END) AS valid, \
         sum(CASE WHEN action = '(invalid reply)' AND next_observation = 'Nothing happens.' THEN 1 ELSE 0 END) AS invalid \
         FROM steps WHERE run_id = 'gen'",
    );
    let row: Vec<u64> = r
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .split(',')
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(row[0], row[1], "{}", r.stdout);
    assert_eq!(row[2] + row[3], row[0], "{}", r.stdout);
    assert!(
        row[2] > 0,
        "the warm start taught \\boxed{{index}} replies: {}",
        r.stdout
    );
    // The learning-signal diagnostics' reply-format error rate is the invalid share, per
    // iteration (the counts above, split by iteration).
    let rows = f
        .rla(&["sql", "--format", "csv", "--file", crate::LEARNING_SIGNAL])
        .ok()
        .records();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        let q = format!(
            "SELECT sum(CASE WHEN action = '(invalid reply)' THEN 1.0 ELSE 0.0 END) / count(*) \
             FROM steps WHERE run_id = 'gen' AND iter = {}",
            row["iter"]
        );
        let want: f64 = f.sql(&q).ok().scalar().parse().unwrap();
        let got: f64 = row["reply_error_rate"].parse().unwrap();
        assert!((got - want).abs() <= 5e-4, "{got} vs {want}: {rows:?}");
    }
    // The update trained the policy on replies (token counts above one token per sample).
    let r =
        f.sql("SELECT sum(tokens) FROM update_metrics WHERE run_id = 'gen' AND model = 'policy'");
    let tokens: u64 = r.stdout.lines().nth(1).unwrap().trim().parse().unwrap_or(0);
    assert!(tokens > 0, "{}", r.stdout);
    let store = f.store_arg();
    let r = f.rla(&[
        "replay", "--store", &store, "--run", "gen", "--iter", "1", "--verify",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
}

/// `inference_dtype = "bf16"`: the projections and the head in bf16 (AMX tiles, AVX512-BF16,
/// or emulated on other CPUs) give logits within bf16's rounding of the f32 forward (max
/// |Δlogit| ≤ 0.1, measured 0.027–0.042 on these models, whose logits spread over more than 1
/// unit), the same bits on a second forward.
#[test]
fn bf16_inference_logits_stay_within_bf16_rounding_of_f32() {
    let f = Fixture::new();
    let seqs: Vec<Vec<u32>> = vec![
        vec![
            1, 5, 9, 33, 2, 17, 40, 63, 8, 12, 3, 44, 50, 7, 6, 21, 19, 30, 31, 4,
        ],
        vec![60, 3, 3, 3, 45, 2, 11, 9, 1, 0, 13, 24, 35],
    ];
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        let exact = logits(&load(&dir), &seqs);
        let packed = load(&dir).pack_bf16();
        let bf = logits(&packed, &seqs);
        assert_eq!(bf, logits(&packed, &seqs), "{arch}: the same bits again");
        let worst = exact
            .iter()
            .zip(&bf)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 0.1, "{arch}: max |Δlogit| = {worst}");
        assert!(worst > 0.0, "{arch}: the packed path was not taken");
    }
}

/// The loop with both pretrained models at `inference_dtype = "bf16"`, on any CPU (its bf16
/// kernel, or the emulation): every stage commits and `replay --verify` re-executes an iteration
/// bit for bit. The small transformer refuses the key.
#[test]
fn bf16_inference_runs_the_loop_and_replays() {
    let f = Fixture::new();
    let (policy, rm) = (f.dir.path().join("policy"), f.dir.path().join("rm"));
    byte_model(&policy, "Qwen2ForCausalLM", 51);
    byte_model(&rm, "LlamaForCausalLM", 52);
    let sets = pretrained_sets(
        &policy,
        &rm,
        &[
            "policy.inference_dtype=bf16",
            "reward_model.inference_dtype=bf16",
        ],
    );
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let r = f.run_pipeline(GRIDNAV, "bf", 2, &sets);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let store = f.store_arg();
    let r = f.rla(&[
        "replay", "--store", &store, "--run", "bf", "--iter", "1", "--verify",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    // The same run in f32 takes other actions somewhere: bf16 is not a no-op.
    let sets = pretrained_sets(&policy, &rm, &[]);
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let r = f.run_pipeline(GRIDNAV, "f32", 2, &sets);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let r = f.sql(
        "SELECT count(*) FROM steps a JOIN steps b ON a.iter = b.iter AND a.traj_id = b.traj_id \
         AND a.step_idx = b.step_idx WHERE a.run_id = 'bf' AND b.run_id = 'f32' \
         AND a.action_logprob <> b.action_logprob",
    );
    assert!(!r.stdout.contains("\n0\n"), "{}", r.stdout);

    // The small transformer has no bf16 path.
    let r = f.run_pipeline(GRIDNAV, "small", 1, &["policy.inference_dtype=bf16"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("policy.inference_dtype") && r.stderr.contains("pretrained"),
        "{}",
        r.stderr
    );
}
