//! Low-rank adapters (`policy.lora`, `reward_model.lora`): a fresh adapter leaves the model as
//! it was; base + adapter equals the merged weights and an independent numpy forward that
//! applies the exported PEFT directory as peft does; only the adapters get gradients; and a
//! whole run commits adapter-only checkpoints, resumes, replays bit for bit and exports.

use burn::module::{ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use rla_pipe::model::hf::lora::{self, LoraSpec};
use rla_pipe::model::hf::{self, CausalLm, weights};
use rla_pipe::model::{Cpu, CpuTrain};

use crate::Fixture;
use crate::hf::{ARCHS, byte_model, load_on, pretrained_sets, reference_logits_with, tiny_model};

fn spec(targets: &[&str]) -> LoraSpec {
    LoraSpec {
        rank: 4,
        alpha: 8.0,
        targets: targets.iter().map(|s| s.to_string()).collect(),
        layers: 0,
    }
}

const ALL: [&str; 7] = rla_pipe::model::config::LORA_TARGETS;

fn seqs() -> Vec<Vec<u32>> {
    vec![
        vec![1, 5, 9, 33, 2, 17, 40, 63, 8, 12, 3, 44],
        vec![60, 3, 3, 3, 45, 2, 11, 9, 1, 0, 13, 24],
    ]
}

fn logits(model: &CausalLm<Cpu>) -> Vec<f32> {
    model
        .forward_full(&seqs(), &Default::default())
        .into_data()
        .to_vec()
        .unwrap()
}

/// A fresh adapter with every `B` drawn at random (a fresh one is zero, which would hide a
/// wrong `B`), as adapter-file bytes.
fn random_adapter(dir: &std::path::Path, spec: &LoraSpec, digest: &str) -> Vec<u8> {
    let dev = Default::default();
    let fresh = lora::attach_fresh(load_on::<Cpu>(dir), spec, 3, &dev);
    let (tensors, _) = lora::decode(&lora::to_bytes(&fresh, digest).unwrap(), "x").unwrap();
    let mut k = 0.0f32;
    let raw: Vec<weights::RawTensor> = tensors
        .into_iter()
        .map(|(name, shape, data)| {
            let data: Vec<f32> = if name.ends_with("lora_B.weight") {
                data.iter()
                    .map(|_| {
                        k += 1.0;
                        0.3 * (k * 0.71).sin()
                    })
                    .collect()
            } else {
                data
            };
            let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name, "F32", shape, bytes)
        })
        .collect();
    weights::write_safetensors(&raw, &[("format", "pt"), ("rla_pipe.base_blake3", digest)])
}

/// The largest |a − b|.
fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The largest |a − b| / max(|a|, 1): adapters against merged weights.
fn max_relative(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| ((x - y) / x.abs().max(1.0)).abs())
        .fold(0.0, f32::max)
}

fn worst(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - y).abs())
        .fold(0.0, f64::max)
}

/// Tolerances: base + fresh adapter equals the base bit for bit (B = 0); base + adapter vs
/// the merged weights ≤ 1e-5 (f32, the same products in another association); ours vs the
/// numpy reference in f64 ≤ 1e-4 (as the models' own parity test).
#[test]
fn adapters_equal_merged_weights_and_peft_semantics_on_every_architecture() {
    let f = Fixture::new();
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        let base = load_on::<Cpu>(&dir);
        let before = logits(&base);
        let dev = Default::default();
        let s = spec(&ALL);
        let fresh = lora::attach_fresh(load_on::<Cpu>(&dir), &s, 3, &dev);
        assert_eq!(
            logits(&fresh),
            before,
            "{arch}: a fresh adapter changes nothing"
        );

        let digest = hf::directory_digest(&dir).unwrap();
        let bytes = random_adapter(&dir, &s, &digest);
        let adapted = lora::attach_bytes(load_on::<Cpu>(&dir), &s, &bytes, "x", &dev).unwrap();
        // The adapter file round-trips byte for byte.
        assert_eq!(lora::to_bytes(&adapted, &digest).unwrap(), bytes);
        // A file with more targets, or fewer, than the config is refused, naming a tensor.
        let fewer = spec(&["q_proj"]);
        let e = lora::attach_bytes(load_on::<Cpu>(&dir), &fewer, &bytes, "x", &dev).unwrap_err();
        assert!(
            e.to_string()
                .contains("is not an adapter of the configured targets"),
            "{e}"
        );
        let q_only = random_adapter(&dir, &fewer, &digest);
        let e = lora::attach_bytes(load_on::<Cpu>(&dir), &s, &q_only, "x", &dev).unwrap_err();
        assert!(
            e.to_string().contains("k_proj.lora_A.weight` is missing"),
            "{e}"
        );
        let ours = logits(&adapted);
        let moved = max_abs(&ours, &before);
        assert!(
            moved > 0.05,
            "{arch}: the adapter moves the logits ({moved})"
        );
        let merged = logits(&lora::merge(adapted));
        let d = max_relative(&ours, &merged);
        assert!(d <= 1e-5, "{arch}: adapters vs merged weights {d}");

        // The exported PEFT directory, applied by the numpy reference as peft applies it.
        let out = f.dir.path().join(format!("{arch}-adapter"));
        let files = hf::export_adapter_dir("base", &s, &bytes, &out).unwrap();
        assert_eq!(files, ["adapter_config.json", "adapter_model.safetensors"]);
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("adapter_config.json")).unwrap())
                .unwrap();
        assert_eq!(config["r"], 4);
        assert_eq!(config["lora_alpha"], 8.0);
        assert_eq!(config["peft_type"], "LORA");
        let reference = reference_logits_with(&dir, &seqs(), &["--adapter", out.to_str().unwrap()]);
        let w = worst(&ours, &reference);
        assert!(w <= 1e-4, "{arch}: ours vs numpy+PEFT adapter: {w}");
        // And `export --merge`'s directory is that same model for the reference alone.
        let merged_dir = f.dir.path().join(format!("{arch}-merged"));
        hf::export_merged_dir(&dir, &s, &bytes, &merged_dir).unwrap();
        std::fs::copy(
            dir.join("tokenizer.json"),
            merged_dir.join("tokenizer.json"),
        )
        .ok();
        let reference_merged = reference_logits_with(&merged_dir, &seqs(), &[]);
        let w = worst(&ours, &reference_merged);
        assert!(w <= 1e-4, "{arch}: ours vs numpy on the merged export: {w}");
    }
}

/// Which parameters got a gradient.
struct HasGrad<'a> {
    grads: &'a <CpuTrain as AutodiffBackend>::Gradients,
    with: usize,
    without: usize,
    nonzero: usize,
}

impl ModuleVisitor<CpuTrain> for HasGrad<'_> {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<CpuTrain, D>>) {
        match p.grad(self.grads) {
            Some(g) => {
                self.with += 1;
                if g.abs().max().into_scalar() > 0.0 {
                    self.nonzero += 1;
                }
            }
            None => self.without += 1,
        }
    }
}

#[test]
fn only_the_adapters_get_gradients() {
    use burn::module::Module;
    let f = Fixture::new();
    let dir = f.dir.path().join("m");
    tiny_model(&dir, "Qwen2ForCausalLM", "F32");
    let dev = Default::default();
    let s = spec(&["q_proj", "v_proj", "down_proj"]);
    let digest = hf::directory_digest(&dir).unwrap();
    let bytes = random_adapter(&dir, &s, &digest);
    let model = lora::attach_bytes(load_on::<CpuTrain>(&dir), &s, &bytes, "x", &dev).unwrap();
    let loss = model.forward_full(&seqs(), &dev).powi_scalar(2).mean();
    let grads = loss.backward();
    let mut v = HasGrad {
        grads: &grads,
        with: 0,
        without: 0,
        nonzero: 0,
    };
    model.visit(&mut v);
    // 2 layers × 3 targets × (A, B) adapters train; nothing else does.
    assert_eq!(v.with, 12, "parameters with a gradient");
    assert_eq!(v.nonzero, 12);
    assert!(v.without > 20, "frozen base parameters: {}", v.without);
}

/// A whole run with adapters on both models (tiny byte-level Qwen2 policy and Llama RM, the
/// RM's on its top layer only):
/// every checkpoint committed is an adapter file of PEFT's keys recording the base weights'
/// blake3, far smaller than the model; the update moves the adapters; the run resumes,
/// replays an iteration bit for bit, and exports a PEFT directory and a merged model.
#[test]
fn a_lora_run_commits_adapters_resumes_replays_and_exports() {
    let f = Fixture::new();
    let (policy, rm) = (f.dir.path().join("policy"), f.dir.path().join("rm"));
    byte_model(&policy, "Qwen2ForCausalLM", 31);
    byte_model(&rm, "LlamaForCausalLM", 32);
    let sets = pretrained_sets(
        &policy,
        &rm,
        &[
            "policy.lora.rank=4",
            "reward_model.lora.rank=2",
            "reward_model.lora.targets=[\"q_proj\",\"v_proj\"]",
            "reward_model.lora.layers=1",
            "update.policy_lr=0.01",
            "update.rm_lr=0.01",
        ],
    );
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let r = f.run_pipeline(crate::GRIDNAV, "lora", 1, &sets);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    // Resume: a second iteration on top of the first.
    let r = f.run_pipeline(crate::GRIDNAV, "lora", 2, &sets);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let model_bytes = std::fs::metadata(policy.join("model.safetensors"))
        .unwrap()
        .len();
    let digest = blake3::hash(&std::fs::read(policy.join("model.safetensors")).unwrap());
    let artifacts: Vec<String> = f
        .files()
        .into_iter()
        .filter(|p| p.contains("artifacts/"))
        .collect();
    assert!(artifacts.len() >= 4, "{artifacts:?}");
    let mut moved = false;
    for a in &artifacts {
        let bytes = std::fs::read(f.store().join(a)).unwrap();
        let (tensors, base) = lora::decode(&bytes, a).unwrap();
        assert!(
            tensors
                .iter()
                .all(|(n, _, _)| n.starts_with("base_model.model.model.layers.")
                    && (n.ends_with(".lora_A.weight") || n.ends_with(".lora_B.weight"))),
            "{a}"
        );
        if a.contains("/policy") {
            assert_eq!(tensors.len(), 2 * 7 * 2, "{a}");
            assert_eq!(base, digest.to_hex().to_string(), "{a}");
            // (This tiny model is mostly embeddings; SmolLM2's adapters are 0.5% of it.)
            assert!(
                (bytes.len() as u64) * 2 < model_bytes,
                "{a}: {} bytes",
                bytes.len()
            );
            if a.contains("iter=000001") {
                moved |= tensors
                    .iter()
                    .any(|(n, _, v)| n.ends_with("lora_B.weight") && v.iter().any(|x| *x != 0.0));
            }
        } else {
            // The RM's adapters: the last of its two layers only (`reward_model.lora.layers`).
            assert_eq!(tensors.len(), 2 * 2, "{a}");
            assert!(
                tensors.iter().all(|(n, _, _)| n.contains(".layers.1.")),
                "{a}"
            );
        }
    }
    assert!(moved, "the policy update moved its adapters");
    // The update's manifest names the base weights its adapter input builds on.
    let update = f
        .files()
        .into_iter()
        .find(|p| p.contains("iter=000001") && p.contains("update") && p.ends_with(".json"))
        .unwrap();
    let text = std::fs::read_to_string(f.store().join(&update)).unwrap();
    assert!(
        text.contains(&format!("blake3:{}", digest.to_hex())),
        "{text}"
    );

    let store = f.store_arg();
    let r = f.rla(&[
        "replay", "--store", &store, "--run", "lora", "--iter", "1", "--verify",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);

    // Export: the PEFT directory; with --merge a Hugging Face model directory.
    let out = f.dir.path().join("adapter");
    let o = out.to_str().unwrap();
    let r = f.rla(&[
        "export", "--store", &store, "--run", "lora", "--iter", "1", "--out", o,
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("adapters (PEFT)"), "{}", r.stdout);
    let committed = artifacts
        .iter()
        .find(|p| p.contains("iter=000001") && p.contains("/policy"))
        .unwrap();
    assert_eq!(
        std::fs::read(out.join("adapter_model.safetensors")).unwrap(),
        std::fs::read(f.store().join(committed)).unwrap()
    );
    let merged = f.dir.path().join("merged");
    let m = merged.to_str().unwrap();
    let r = f.rla(&[
        "export", "--store", &store, "--run", "lora", "--iter", "1", "--merge", "--out", m,
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = f.rla(&["model", "inspect", m, "--format", "json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The merged model is base + adapter for the numpy reference too.
    let ids = vec![vec![256, 104, 105, 257, 10, 256, 97]];
    let a = reference_logits_with(&merged, &ids, &[]);
    let b = reference_logits_with(&policy, &ids, &["--adapter", o]);
    let w = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(w <= 1e-4, "merged export vs base + adapter: {w}");

    // A changed base model: the adapters no longer describe a model; refused, naming both.
    byte_model(&policy, "Qwen2ForCausalLM", 99);
    let r = f.run_pipeline(crate::GRIDNAV, "lora", 3, &sets);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("blake3:"), "{}", r.stderr);
    // So is an export against it (both digests named), unless forced; the adapter directory
    // names its base as the user chose, else by its absolute path.
    let recorded = format!("blake3:{}", digest.to_hex());
    let now = format!("blake3:{}", hf::directory_digest(&policy).unwrap());
    let again = f.dir.path().join("again");
    let a = again.to_str().unwrap();
    let r = f.rla(&[
        "export", "--store", &store, "--run", "lora", "--iter", "1", "--merge", "--out", a,
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains(&recorded) && r.stderr.contains(&now) && r.stderr.contains("--force"),
        "{}",
        r.stderr
    );
    assert!(!again.exists(), "a refused export writes nothing");
    let r = f.rla(&[
        "export",
        "--store",
        &store,
        "--run",
        "lora",
        "--iter",
        "1",
        "--out",
        a,
        "--force",
        "--base-name",
        "org/base-model",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("warning: --force"), "{}", r.stderr);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(again.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(config["base_model_name_or_path"], "org/base-model");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(
        config["base_model_name_or_path"],
        policy.to_str().unwrap(),
        "by default the base directory's absolute path"
    );
}

/// `update.checkpoint_dtype = "bf16"` (full fine-tuning): the committed checkpoints are bf16
/// safetensors, half the f32 bytes; the run still replays bit for bit (every stage reads the
/// rounded weights the store holds), and `export` widens them back to an f32 model directory.
#[test]
fn full_fine_tuning_can_store_bf16_checkpoints_and_still_replays() {
    let f = Fixture::new();
    let (policy, rm) = (f.dir.path().join("policy"), f.dir.path().join("rm"));
    byte_model(&policy, "Qwen2ForCausalLM", 31);
    byte_model(&rm, "LlamaForCausalLM", 32);
    let sets = pretrained_sets(&policy, &rm, &["update.checkpoint_dtype=\"bf16\""]);
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let r = f.run_pipeline(crate::GRIDNAV, "bf16", 2, &sets);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let artifacts: Vec<String> = f
        .files()
        .into_iter()
        .filter(|p| p.contains("artifacts/"))
        .collect();
    assert!(artifacts.len() >= 4, "{artifacts:?}");
    let arch = hf::HfArch::from_dir(&policy).unwrap();
    let f32_bytes = arch.parameters() * 4;
    for a in artifacts.iter().filter(|a| a.contains("/policy")) {
        let bytes = std::fs::read(f.store().join(a)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert!(
            st.tensors()
                .iter()
                .all(|(_, v)| v.dtype() == safetensors::Dtype::BF16),
            "{a}"
        );
        assert!(
            bytes.len() < f32_bytes * 6 / 10,
            "{a}: {} bytes",
            bytes.len()
        );
    }
    let store = f.store_arg();
    let r = f.rla(&[
        "replay", "--store", &store, "--run", "bf16", "--iter", "1", "--verify",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let out = f.dir.path().join("exported");
    let o = out.to_str().unwrap();
    let r = f.rla(&[
        "export", "--store", &store, "--run", "bf16", "--iter", "1", "--out", o,
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert!(
        st.tensors()
            .iter()
            .all(|(_, v)| v.dtype() == safetensors::Dtype::F32)
    );
}

/// `lora.layers = N`: adapters on the last N decoder layers only (PEFT's
/// `layers_to_transform`). The adapted layers get the same fresh `A` as with every layer
/// adapted (seeded per layer and projection); the file holds those layers alone and a file
/// for other layers is refused; base + adapter equals the merged weights (≤ 1e-5 relative) and
/// the numpy reference applying the exported PEFT directory (≤ 1e-4, which fails on a layer
/// outside `layers_to_transform`); only the top layer's adapters get gradients; more layers
/// than the model has is an error naming the key.
#[test]
fn adapters_on_the_top_layers_only() {
    use burn::module::Module;
    let f = Fixture::new();
    let dir = f.dir.path().join("m");
    tiny_model(&dir, "LlamaForCausalLM", "F32");
    let dev = Default::default();
    let digest = hf::directory_digest(&dir).unwrap();
    let (all, top) = (
        spec(&ALL),
        LoraSpec {
            layers: 1,
            ..spec(&ALL)
        },
    );
    let names = |s: &LoraSpec| {
        let m = lora::attach_fresh(load_on::<Cpu>(&dir), s, 3, &dev);
        lora::decode(&lora::to_bytes(&m, &digest).unwrap(), "x")
            .unwrap()
            .0
    };
    let (every, upper) = (names(&all), names(&top));
    assert_eq!(upper.len(), 7 * 2, "one layer of two: 7 targets × (A, B)");
    for t in &upper {
        assert!(
            t.0.starts_with("base_model.model.model.layers.1."),
            "{}",
            t.0
        );
        assert_eq!(
            every.iter().find(|e| e.0 == t.0),
            Some(t),
            "{}: as fresh",
            t.0
        );
    }

    let bytes = random_adapter(&dir, &top, &digest);
    assert_eq!(lora::adapted_layers(&bytes, "x").unwrap(), [1]);
    let adapted = lora::attach_bytes(load_on::<Cpu>(&dir), &top, &bytes, "x", &dev).unwrap();
    assert_eq!(lora::to_bytes(&adapted, &digest).unwrap(), bytes);
    let e = lora::attach_bytes(load_on::<Cpu>(&dir), &all, &bytes, "x", &dev).unwrap_err();
    assert!(
        e.to_string()
            .contains("layers.0.self_attn.q_proj.lora_A.weight` is missing"),
        "{e}"
    );
    let both = random_adapter(&dir, &all, &digest);
    let e = lora::attach_bytes(load_on::<Cpu>(&dir), &top, &both, "x", &dev).unwrap_err();
    assert!(e.to_string().contains("layers.0."), "{e}");
    let e = lora::attach_bytes(
        load_on::<Cpu>(&dir),
        &LoraSpec {
            layers: 3,
            ..spec(&ALL)
        },
        &bytes,
        "x",
        &dev,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("lora.layers = 3: the model has 2 decoder layers"),
        "{e}"
    );

    let ours = logits(&adapted);
    let base = logits(&load_on::<Cpu>(&dir));
    let moved = max_abs(&ours, &base);
    assert!(moved > 0.05, "the adapter moves the logits ({moved})");
    let d = max_relative(&ours, &logits(&lora::merge(adapted)));
    assert!(d <= 1e-5, "adapters vs merged weights {d}");
    let out = f.dir.path().join("adapter");
    hf::export_adapter_dir("base", &top, &bytes, &out).unwrap();
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(config["layers_to_transform"], serde_json::json!([1]));
    let reference = reference_logits_with(&dir, &seqs(), &["--adapter", out.to_str().unwrap()]);
    let w = worst(&ours, &reference);
    assert!(w <= 1e-4, "ours vs numpy+PEFT adapter: {w}");

    let model = lora::attach_bytes(load_on::<CpuTrain>(&dir), &top, &bytes, "x", &dev).unwrap();
    let grads = model
        .forward_full(&seqs(), &dev)
        .powi_scalar(2)
        .mean()
        .backward();
    let mut v = HasGrad {
        grads: &grads,
        with: 0,
        without: 0,
        nonzero: 0,
    };
    model.visit(&mut v);
    assert_eq!(
        (v.with, v.nonzero),
        (14, 14),
        "the top layer's 7 × (A, B) train"
    );
}

/// `update.base_dtype = "bf16"`, the frozen base's products in bf16 in training (warm start and
/// update; AMX tiles, AVX512-BF16, or emulated on other CPUs): a run with adapters commits,
/// trains other bits than f32 (the first step's gradient norms within bf16 rounding of f32's),
/// and `replay --verify` re-executes an iteration bit for bit. Without adapters the key is
/// refused whatever the CPU (a fully fine-tuned base is not frozen).
#[test]
fn bf16_training_of_adapters_runs_and_replays() {
    let f = Fixture::new();
    let (policy, rm) = (f.dir.path().join("policy"), f.dir.path().join("rm"));
    byte_model(&policy, "Qwen2ForCausalLM", 35);
    byte_model(&rm, "LlamaForCausalLM", 36);
    let adapters = [
        "policy.lora.rank=4",
        "reward_model.lora.rank=2",
        "update.policy_lr=0.01",
        "update.rm_lr=0.01",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        let all: Vec<&str> = adapters.iter().chain(extra).copied().collect();
        pretrained_sets(&policy, &rm, &all)
    };
    let bf = with(&["update.base_dtype=bf16"]);
    let bf: Vec<&str> = bf.iter().map(String::as_str).collect();
    let r = f.run_pipeline(crate::GRIDNAV, "bf", 2, &bf);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let store = f.store_arg();
    let r = f.rla(&[
        "replay", "--store", &store, "--run", "bf", "--iter", "1", "--verify",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    // Without the warm start, the first update trains both ways on the same samples (nothing
    // trained before it): its gradient norms within bf16 rounding of f32's, not equal.
    let bf0 = with(&["update.base_dtype=bf16", "pretrain.enabled=false"]);
    let bf0: Vec<&str> = bf0.iter().map(String::as_str).collect();
    let r = f.run_pipeline(crate::GRIDNAV, "bf0", 2, &bf0);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let exact = with(&["pretrain.enabled=false"]);
    let exact: Vec<&str> = exact.iter().map(String::as_str).collect();
    let r = f.run_pipeline(crate::GRIDNAV, "f0", 2, &exact);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let r = f.sql(
        "SELECT a.model, a.grad_norm, b.grad_norm FROM update_metrics a JOIN update_metrics b \
         ON a.iter = b.iter AND a.model = b.model AND a.step = b.step \
         WHERE a.run_id = 'bf0' AND b.run_id = 'f0' AND a.step = 0 \
         AND a.iter = (SELECT min(iter) FROM update_metrics WHERE run_id = 'f0') \
         ORDER BY a.model",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let rows: Vec<(f64, f64)> = r
        .stdout
        .lines()
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            (c[1].parse().unwrap(), c[2].parse().unwrap())
        })
        .collect();
    assert!(!rows.is_empty(), "{}", r.stdout);
    assert!(
        rows.iter().any(|(a, b)| a != b),
        "bf16 training changed nothing: {}",
        r.stdout
    );
    for (a, b) in &rows {
        assert!(
            (a - b).abs() <= 0.05 * b.abs().max(1e-6),
            "first step's gradient norm {a} vs f32 {b}"
        );
    }
    // A fully fine-tuned model has no frozen base.
    let full = pretrained_sets(&policy, &rm, &["update.base_dtype=bf16"]);
    let full: Vec<&str> = full.iter().map(String::as_str).collect();
    let r = f.run_pipeline(crate::GRIDNAV, "full", 1, &full);
    assert_ne!(r.code, 0);
    assert!(
        r.stderr.contains("update.base_dtype") && r.stderr.contains("adapters"),
        "{}",
        r.stderr
    );
}

/// Per-layer activation checkpointing through the real binary (`update.checkpoint_layers =
/// "on"`; `auto` is off on the CPU), with the policy's adapters on its top layer only (the
/// layer below it is not run again): every optimizer step of the update trains as without it — the same losses within 1e-5 relative (step 0's the same
/// forward; later steps after AdamW steps from gradients summed in another order) and gradient
/// norms within 1e-4 relative.
#[test]
fn checkpointed_layers_train_a_run_as_kept_ones() {
    let f = Fixture::new();
    let (policy, rm) = (f.dir.path().join("policy"), f.dir.path().join("rm"));
    byte_model(&policy, "Qwen2ForCausalLM", 31);
    byte_model(&rm, "LlamaForCausalLM", 32);
    let base = pretrained_sets(
        &policy,
        &rm,
        &[
            "policy.lora.rank=4",
            "policy.lora.layers=1",
            "reward_model.lora.rank=2",
            "update.policy_lr=0.01",
            "update.rm_lr=0.01",
        ],
    );
    for (id, extra) in [
        ("kept", None),
        ("checkpointed", Some("update.checkpoint_layers=on")),
    ] {
        let sets: Vec<&str> = base.iter().map(String::as_str).chain(extra).collect();
        let r = f.run_pipeline(crate::GRIDNAV, id, 1, &sets);
        assert_eq!(r.code, 0, "{id}: {}\n{}", r.stdout, r.stderr);
    }
    let metrics = |id: &str| {
        f.sql(&format!(
            "SELECT model, step, loss, grad_norm FROM update_metrics WHERE run_id = '{id}' \
             ORDER BY model, step"
        ))
        .ok()
        .csv()
    };
    let (kept, ours) = (metrics("kept"), metrics("checkpointed"));
    assert!(kept.len() >= 2, "the policy stepped: {kept:?}");
    assert_eq!(ours.len(), kept.len());
    let rel = |a: &str, b: &str| {
        let (a, b): (f64, f64) = (a.parse().unwrap(), b.parse().unwrap());
        (a - b).abs() / b.abs().max(1e-9)
    };
    for (o, k) in ours.iter().zip(&kept) {
        assert_eq!(o[..2], k[..2], "the same model and step");
        assert!(
            rel(&o[2], &k[2]) <= 1e-5,
            "loss {o:?} checkpointed vs {k:?}"
        );
        assert!(
            rel(&o[3], &k[3]) <= 1e-4,
            "gradient norm {o:?} checkpointed vs {k:?}"
        );
    }
}
