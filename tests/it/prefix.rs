//! Prefix trees (`rla_pipe::model::tree`): samples that share a prefix, packed into one
//! sequence with a tree attention mask, give the same per-token log-probabilities, the same
//! loss and the same gradients as every sample computed alone — on rla-pipe's small
//! transformer and on tiny Llama, Qwen2 and Qwen3 models. Tolerance: 1e-5 relative (to the
//! larger of 1 and the value for log-probabilities and the loss, to the largest gradient
//! entry of the model for gradients); the two computations differ only in the order of
//! floating-point sums.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use rla_pipe::model::checkpoint::Checkpoint;
use rla_pipe::model::lm::{Lm, padded_inputs};
use rla_pipe::model::policy::{self, Decision};
use rla_pipe::model::transformer::{ModelConfig, bool_tensor, int_tensor};
use rla_pipe::model::tree::{pack, tree_logprobs};
use rla_pipe::model::{AnyLm, CpuTrain};

use crate::Fixture;
use crate::hf::{ARCHS, load_on, tiny_model};

type B = CpuTrain;

/// Samples with shared prefixes: three responses to one prompt, a prompt sharing its first 8
/// tokens, one unrelated prompt, one whose prompt is a prefix of another's.
fn samples() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let a: Vec<u32> = vec![1, 5, 9, 33, 2, 17, 40, 63, 8, 12, 3, 44];
    let b: Vec<u32> = [&a[..8], &[20, 21, 22][..]].concat();
    let c: Vec<u32> = vec![60, 3, 3, 45, 2, 11];
    let d: Vec<u32> = a[..10].to_vec();
    let prompts = vec![a.clone(), b, a.clone(), c, a, d];
    let responses = vec![
        vec![7],
        vec![30, 31, 32, 33],
        vec![7, 8, 9],
        vec![50, 51],
        vec![13, 14, 15, 16, 17],
        vec![3, 44, 10],
    ];
    (prompts, responses)
}

/// Each sample alone: one causal sequence `prompt ++ response`, full logits, log_softmax(/T).
fn independent<M: Lm<B>>(
    model: &M,
    prompts: &[Vec<u32>],
    responses: &[Vec<u32>],
    temperature: f64,
) -> Vec<Tensor<B, 1>> {
    let dev = Default::default();
    prompts
        .iter()
        .zip(responses)
        .map(|(p, r)| {
            let seq = [p.as_slice(), r.as_slice()].concat();
            let (tokens, positions, mask, b, t) = padded_inputs(std::slice::from_ref(&seq));
            let logits = model.forward(
                int_tensor(tokens, [b, t], &dev),
                int_tensor(positions, [b, t], &dev),
                bool_tensor(mask, [b, t, t], &dev),
                None,
            );
            let v = model.vocab();
            let lp = log_softmax(logits.reshape([t, v]).div_scalar(temperature), 1);
            let at: Vec<i64> = (0..r.len()).map(|j| (p.len() - 1 + j) as i64).collect();
            let tgt: Vec<i64> = r.iter().map(|x| *x as i64).collect();
            lp.select(0, int_tensor(at, [r.len()], &dev))
                .gather(1, int_tensor(tgt, [r.len(), 1], &dev))
                .reshape([r.len()])
        })
        .collect()
}

/// The packed computation, cut back into each sample's scored tokens.
fn packed<M: Lm<B>>(
    model: &M,
    prompts: &[Vec<u32>],
    responses: &[Vec<u32>],
    temperature: f64,
) -> Vec<Tensor<B, 1>> {
    let p: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let r: Vec<&[u32]> = responses.iter().map(Vec::as_slice).collect();
    let (rows, slot) = pack(&p, &r, 1, 4096);
    assert!(
        rows.len() < prompts.len(),
        "the samples share prefixes: fewer rows than samples"
    );
    let (lp, valid) = tree_logprobs(model, &rows, None, temperature, &Default::default());
    let l = valid.len() / slot.len();
    slot.iter()
        .zip(responses)
        .map(|(&k, resp)| {
            assert!(valid[k * l..k * l + resp.len()].iter().all(|v| *v));
            lp.clone()
                .narrow(0, k, 1)
                .narrow(1, 0, resp.len())
                .reshape([resp.len()])
        })
        .collect()
}

fn host(t: &Tensor<B, 1>) -> Vec<f32> {
    t.clone().into_data().to_vec().unwrap()
}

/// A loss with a different weight on every scored token (so every gradient path counts).
fn loss(lps: &[Tensor<B, 1>]) -> Tensor<B, 1> {
    let dev = Default::default();
    let mut k = 0.0f32;
    let parts: Vec<Tensor<B, 1>> = lps
        .iter()
        .map(|lp| {
            let n = lp.dims()[0];
            let w: Vec<f32> = (0..n)
                .map(|_| {
                    k += 1.0;
                    0.5 + (k * 0.37).sin()
                })
                .collect();
            (lp.clone() * Tensor::<B, 1>::from_data(TensorData::new(w, [n]), &dev)).sum()
        })
        .collect();
    Tensor::cat(parts, 0).sum()
}

fn check<M: Lm<B> + AutodiffModule<B>>(name: &str, model: &M) {
    let (prompts, responses) = samples();
    let t = 0.8;
    let alone = independent(model, &prompts, &responses, t);
    let tree = packed(model, &prompts, &responses, t);
    for (i, (a, b)) in alone.iter().zip(&tree).enumerate() {
        let (a, b) = (host(a), host(b));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            let tol = 1e-5 * x.abs().max(1.0);
            assert!(
                (x - y).abs() <= tol,
                "{name} sample {i}: log-prob {y} packed vs {x} alone"
            );
        }
    }
    let (la, lb) = (loss(&alone), loss(&tree));
    let (sa, sb) = (host(&la)[0], host(&lb)[0]);
    assert!(
        (sa - sb).abs() <= 1e-5 * sa.abs().max(1.0),
        "{name}: loss {sb} packed vs {sa} alone"
    );
    let va = param_grads(model, &GradientsParams::from_grads(la.backward(), model));
    let vb = param_grads(model, &GradientsParams::from_grads(lb.backward(), model));
    let scale = va.iter().flatten().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(scale > 1e-3, "{name}: gradients are not trivially zero");
    assert_eq!(va.len(), vb.len());
    for (p, (a, b)) in va.iter().zip(&vb).enumerate() {
        assert_eq!(a.len(), b.len(), "{name}: parameter {p}");
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-5 * scale,
                "{name}: parameter {p} gradient {y} packed vs {x} alone (largest {scale})"
            );
        }
    }
    // A decision's actions (leaves scored from their first token) through the policy's own
    // scorer equal each action scored alone after the prompt.
    let d = Decision {
        prompt: prompts[0].clone(),
        actions: vec![vec![7], vec![30, 31], vec![13, 14, 15]],
    };
    let lp = policy::to_host(policy::log_probs(
        model,
        std::slice::from_ref(&d),
        1.0,
        false,
        &Default::default(),
    ));
    let each = independent(model, &vec![d.prompt.clone(); 3], &d.actions, 1.0);
    let sums: Vec<f64> = each
        .iter()
        .map(|t| host(t).iter().map(|x| *x as f64).sum())
        .collect();
    let lse = sums.iter().map(|s| s.exp()).sum::<f64>().ln();
    for (k, s) in sums.iter().enumerate() {
        let want = s - lse;
        let got = lp[0][k] as f64;
        assert!(
            (want - got).abs() <= 1e-5 * want.abs().max(1.0),
            "{name}: log π(action {k}) {got} vs {want}"
        );
    }
}

/// rla-pipe's small transformer (vocabulary 64, 2 layers), seeded.
fn small(role: &str, seed: u64) -> AnyLm<B> {
    let config = ModelConfig {
        vocab: 64,
        d_model: 16,
        layers: 2,
        heads: 2,
        context: 48,
    };
    AnyLm::Small(Checkpoint::init(role, &config, seed).to_model::<B>(&Default::default()))
}

#[test]
fn packed_prefix_trees_equal_independent_sequences_on_every_model_family() {
    check("small transformer", &small("policy", 3));
    let f = Fixture::new();
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        check(arch, &AnyLm::Hf(load_on::<B>(&dir)));
    }
}

/// Training attention that recomputes its probabilities in the backward pass
/// (`update.recompute_attention`, `model::hf::recompute`) on packed prefix trees: the same
/// log-probabilities to the bit, and every parameter's gradient within 1e-5 of the largest
/// (the closed-form softmax gradient sums in another order), on tiny Llama, Qwen2 and Qwen3.
#[test]
fn recomputed_attention_trains_as_the_plain_graph() {
    let f = Fixture::new();
    let (prompts, responses) = samples();
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        let run = |recompute: bool| {
            let mut model = load_on::<B>(&dir);
            model.recompute_attention = recompute;
            let lps = packed(&model, &prompts, &responses, 0.8);
            let values: Vec<u32> = lps.iter().flat_map(host).map(f32::to_bits).collect();
            let grads = GradientsParams::from_grads(loss(&lps).backward(), &model);
            (values, param_grads(&model, &grads))
        };
        let (plain, plain_grads) = run(false);
        let (ours, our_grads) = run(true);
        assert_eq!(ours, plain, "{arch}: log-probabilities to the bit");
        same_gradients(arch, "recomputed", &our_grads, &plain_grads);
    }
}

/// Every parameter's gradient (flattened, visiting order) within 1e-5 of the largest of the
/// plain graph's, which are not trivially zero; the same parameters have one.
fn same_gradients(case: &str, what: &str, ours: &[Vec<f32>], plain: &[Vec<f32>]) {
    let scale = plain.iter().flatten().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(scale > 1e-3, "{case}: gradients are not trivially zero");
    assert_eq!(ours.len(), plain.len(), "{case}: parameters");
    for (p, (a, b)) in ours.iter().zip(plain).enumerate() {
        assert_eq!(a.len(), b.len(), "{case}: parameter {p}");
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-5 * scale,
                "{case}: parameter {p} gradient {x} {what} vs {y} (largest {scale})"
            );
        }
    }
}

/// The GPU's one-kernel operations (`model::hf::fused`: RMSNorm, RoPE, the MLP's activation,
/// each an autodiff operation with its closed-form gradient), run on the CPU with burn's
/// operations in place of the kernels (`force_reference`), through packed prefix trees on tiny
/// Llama, Qwen2 and Qwen3 (Qwen3: the per-head q/k norms too): log-probabilities within 1e-5
/// relative and every parameter's gradient (the norms' scales included) within 1e-5 of the
/// largest of burn's graph; and without autodiff (the inference backend) the logits within
/// 1e-5 of the largest and greedy replies with the same tokens (decoding steps run the
/// attention's softmax too). The bits differ (`x · r` against burn's `x / rms`): the path ran.
#[test]
fn fused_operations_train_as_the_plain_graph() {
    use rla_pipe::model::hf::fused::force_reference;
    use rla_pipe::model::hf::{self, Sampling};
    let f = Fixture::new();
    let (prompts, responses) = samples();
    let seeds: Vec<u64> = (0..prompts.len() as u64).collect();
    let greedy = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        max_tokens: 6,
        seed: 0,
    };
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        let run = |fused: bool| {
            let model = load_on::<B>(&dir);
            force_reference(fused);
            let lps = packed(&model, &prompts, &responses, 0.8);
            force_reference(false);
            let values: Vec<f32> = lps.iter().flat_map(host).collect();
            let grads = GradientsParams::from_grads(loss(&lps).backward(), &model);
            let g = param_grads(&model, &grads);
            let plain = load_on::<rla_pipe::model::Cpu>(&dir);
            let d = Default::default();
            force_reference(fused);
            let logits = plain.forward_full(&prompts, &d);
            // Decoding steps: the attention's softmax too.
            let replies = hf::generate::sample(&plain, &prompts, &seeds, &[], &greedy, &d);
            force_reference(false);
            let logits: Vec<f32> = logits.into_data().to_vec().unwrap();
            (values, g, logits, replies.unwrap())
        };
        let (plain, plain_grads, plain_logits, plain_replies) = run(false);
        let (ours, our_grads, our_logits, our_replies) = run(true);
        for ((a, x), (b, y)) in our_replies.iter().zip(&plain_replies) {
            assert_eq!(a, b, "{arch}: greedy tokens");
            assert!(
                (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                "{arch}: reply log-probability {x} fused vs {y}"
            );
        }
        for (x, y) in ours.iter().zip(&plain) {
            assert!(
                (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                "{arch}: log-probability {x} fused vs {y}"
            );
        }
        assert_ne!(
            ours.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            plain.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{arch}: the fused operations ran (their rounding differs)"
        );
        let top = |v: &[f32]| v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let scale = top(&plain_grads.concat());
        assert!(scale > 1e-3, "{arch}: gradients are not trivially zero");
        assert_eq!(our_grads.len(), plain_grads.len());
        for (p, (a, b)) in our_grads.iter().zip(&plain_grads).enumerate() {
            assert_eq!(a.len(), b.len(), "{arch}: parameter {p}");
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-5 * scale,
                    "{arch}: parameter {p} gradient {x} fused vs {y} (largest {scale})"
                );
            }
        }
        let scale = top(&plain_logits);
        for (x, y) in our_logits.iter().zip(&plain_logits) {
            assert!(
                (x - y).abs() <= 1e-5 * scale,
                "{arch}: logit {x} fused vs {y} (largest {scale})"
            );
        }
        assert_ne!(our_logits, plain_logits, "{arch}: inference ran them too");
    }
}

/// A reward model's m samples continuing from one shared prompt cache (a tree mask over the
/// samples' tokens, [`reward::generate_shared`]) — also after the prompt reused the keys of
/// an earlier prompt it extends ([`encode_reusing`]) — draw the same tokens as samples that
/// each copy the prompt's cache ([`reward::generate`]), with log-probabilities equal to
/// 1e-5 relative.
fn check_shared_generation<M: Lm<B>>(name: &str, model: &M) {
    use rla_pipe::model::reward::{self, Verdicts};
    use rla_pipe::model::tokenizer::Tokenizer;
    use rla_pipe::model::tree::encode_reusing;
    let dev = Default::default();
    let tok = Tokenizer::words(&[]);
    let v = Verdicts::Words(&tok);
    let (prompts, _) = samples();
    let seeds: Vec<u64> = (0..prompts.len() as u64).map(|s| 40 + s).collect();
    let (m, max_tokens, t) = (3, 6, 1.3);
    let same = |a: &[Vec<reward::Judgement>], b: &[Vec<reward::Judgement>], what: &str| {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
            assert_eq!(x.tokens, y.tokens, "{name} {what}: tokens");
            assert_eq!(x.score, y.score, "{name} {what}: verdict");
            assert!(
                (x.logprob - y.logprob).abs() <= 1e-5 * x.logprob.abs().max(1.0),
                "{name} {what}: {} vs {}",
                x.logprob,
                y.logprob
            );
        }
        // The draws are not degenerate: several lengths and tokens.
        let lens: std::collections::BTreeSet<usize> =
            a.iter().flatten().map(|j| j.tokens.len()).collect();
        assert!(
            lens.len() > 1,
            "{name} {what}: every sample has length {lens:?}"
        );
    };
    let copied = reward::generate(model, v, &prompts, &seeds, m, max_tokens, t, &dev);
    let (last, cache, lens) = model.encode(&prompts, &dev);
    let shared =
        reward::generate_shared(model, v, last, cache, &lens, &seeds, m, max_tokens, t, &dev);
    same(&copied, &shared, "fresh prompts");
    // The next step's prompts extend these (one does not: it is encoded afresh).
    let (_, _, _, own) = encode_reusing(model, &prompts, &vec![None; prompts.len()], &dev);
    let mut next: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| [p.as_slice(), &[4, 19, 6]].concat())
        .collect();
    next[3] = vec![7, 7, 2];
    let past: Vec<_> = own.iter().map(Some).collect();
    let (last, cache, lens, _) = encode_reusing(model, &next, &past, &dev);
    let shared =
        reward::generate_shared(model, v, last, cache, &lens, &seeds, m, max_tokens, t, &dev);
    let copied = reward::generate(model, v, &next, &seeds, m, max_tokens, t, &dev);
    same(&copied, &shared, "prompts reusing the previous step's keys");
}

#[test]
fn reward_samples_sharing_a_prompt_cache_equal_samples_with_copies() {
    let f = Fixture::new();
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        check_shared_generation(arch, &AnyLm::Hf(load_on::<B>(&dir)));
    }
    check_shared_generation("small transformer", &small("rm", 5));
}

/// Every parameter's gradient in `grads`, flattened, in `model`'s visiting order (empty where
/// it has none), on any training backend (the GPU check uses it too).
pub(crate) fn param_grads<A: AutodiffBackend, M: AutodiffModule<A>>(
    model: &M,
    grads: &GradientsParams,
) -> Vec<Vec<f32>> {
    struct Visit<'a> {
        grads: &'a GradientsParams,
        out: Vec<Vec<f32>>,
    }
    impl<A: AutodiffBackend> ModuleVisitor<A> for Visit<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<A, D>>) {
            let g = self
                .grads
                .get::<A::InnerBackend, D>(param.id)
                .map(|g| g.into_data().to_vec::<f32>().unwrap())
                .unwrap_or_default();
            self.out.push(g);
        }
    }
    let mut v = Visit {
        grads,
        out: Vec::new(),
    };
    model.visit(&mut v);
    v.out
}

/// Per-layer activation checkpointing (`update.checkpoint_layers`, `model::hf::checkpointed`):
/// a forward of several model calls (the packed trees, and two samples alone) recorded
/// (`model::tape`), then the loss's backward pass and the layers' deferred ones
/// (`ppo::gradients`), against the plain graph: the same log-probabilities to the bit (the
/// untracked forward runs the same operations), and every parameter's gradient within 1e-5 of
/// the largest (a parameter's gradients from several calls are summed in another order) — on
/// tiny Llama, Qwen2 and Qwen3, with burn's attention and with the recomputed one, with
/// adapters on every projection of every layer or of the top layer only (only they get
/// gradients; the layers below the top one are not run again), and as the GPU trains (the
/// recomputed attention and its one-kernel operations, `force_reference`: their untracked
/// forward too).
#[test]
fn checkpointed_layers_train_as_the_plain_graph() {
    use rla_pipe::model::hf::fused::force_reference;
    use rla_pipe::model::hf::lora::{self, LoraSpec};
    use rla_pipe::model::{ppo, tape};
    let f = Fixture::new();
    let (prompts, responses) = samples();
    let adapters = |layers: usize| LoraSpec {
        rank: 4,
        alpha: 8.0,
        targets: rla_pipe::model::config::LORA_TARGETS
            .iter()
            .map(|s| s.to_string())
            .collect(),
        layers,
    };
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        // Adapters: `None`, or on the top `Some(n)` layers (0: all). `fused`: the GPU's
        // operations forced on the CPU (`force_reference`), as the GPU trains.
        for (recompute, lora, fused) in [
            (false, None, false),
            (true, None, false),
            (false, Some(0), false),
            (false, Some(1), false),
            (true, None, true),
        ] {
            let case = format!(
                "{arch}, recomputed attention {recompute}, adapters {lora:?}, fused {fused}"
            );
            let run = |layers: bool| {
                let mut model = load_on::<B>(&dir);
                if let Some(layers) = lora {
                    model = lora::attach_fresh(model, &adapters(layers), 3, &Default::default());
                }
                model.recompute_attention = recompute;
                force_reference(fused);
                let forward = || {
                    let mut lps = packed(&model, &prompts, &responses, 0.8);
                    lps.extend(independent(&model, &prompts[..2], &responses[..2], 1.0));
                    lps
                };
                let (lps, deferred) = match layers {
                    true => tape::record(forward),
                    false => (forward(), Vec::new()),
                };
                assert_eq!(deferred.len(), if layers { 3 } else { 0 }, "{case}: calls");
                let values: Vec<u32> = lps.iter().flat_map(host).map(f32::to_bits).collect();
                let grads = ppo::gradients(&model, loss(&lps), deferred);
                force_reference(false);
                (values, param_grads(&model, &grads))
            };
            let (plain, plain_grads) = run(false);
            let (ours, our_grads) = run(true);
            assert_eq!(ours, plain, "{case}: log-probabilities to the bit");
            same_gradients(&case, "checkpointed", &our_grads, &plain_grads);
        }
    }
}

/// The update's own loop (`ppo::train`: micro-batches of at most 30 tokens, two threads, the
/// global-norm clip, AdamW) with checkpointed layers against without, on a tiny Qwen2 with
/// every sample its own model call: step 0's loss to the bit (the same forward), its gradient
/// norm within 1e-5 relative (sums in another order), step 1's loss within 1e-4 relative (after
/// one AdamW step from those gradients).
#[test]
fn an_update_with_checkpointed_layers_trains_as_one_without() {
    use rla_pipe::model::ppo::{self, PpoSettings, Schedule};
    let f = Fixture::new();
    let (prompts, responses) = samples();
    let dir = f.dir.path().join("qwen2");
    tiny_model(&dir, "Qwen2ForCausalLM", "F32");
    let sizes = ppo::sample_tokens(&prompts, &responses);
    let run = |layers: bool| {
        let s = PpoSettings {
            clip_eps: 0.2,
            kl_beta: 0.0,
            log_ratio_clamp: 10.0,
            lr: 1e-3,
            weight_decay: 0.0,
            adam_eps: 1e-8,
            grad_clip: 1.0,
            steps: 2,
            minibatch: 4,
            schedule: Schedule::Fixed,
            micro_tokens: 30,
            threads: 2,
            target_kl: 0.0,
            gpu: false,
            checkpoint_layers: layers,
        };
        let (_, metrics) = ppo::train(load_on::<B>(&dir), &sizes, &s, 7, |m, idx| {
            let pick =
                |v: &[Vec<u32>]| -> Vec<Vec<u32>> { idx.iter().map(|&i| v[i].clone()).collect() };
            let lps = independent(m, &pick(&prompts), &pick(&responses), 1.0);
            let zero = Tensor::<B, 1>::zeros([1], &Default::default());
            let tokens = lps.iter().map(|l| l.dims()[0] as u64).sum();
            (loss(&lps), zero.clone(), zero, tokens)
        });
        metrics
    };
    let (plain, ours) = (run(false), run(true));
    assert_eq!(plain.len(), 2);
    assert_eq!(ours.len(), 2);
    assert_eq!(
        ours[0].loss.to_bits(),
        plain[0].loss.to_bits(),
        "step 0's loss"
    );
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
    assert!(
        rel(ours[0].grad_norm, plain[0].grad_norm) <= 1e-5,
        "gradient norm {} checkpointed vs {}",
        ours[0].grad_norm,
        plain[0].grad_norm
    );
    assert!(plain[0].grad_norm > 1e-3, "the loss has a gradient");
    assert!(
        rel(ours[1].loss, plain[1].loss) <= 1e-4,
        "step 1's loss {} checkpointed vs {}",
        ours[1].loss,
        plain[1].loss
    );
}
