//! The GPU path, on a machine with an NVIDIA GPU only (ignored elsewhere):
//! `cargo test --release --features cuda --test it gpu -- --ignored` (`benches/gpu.sh` runs it).
//! CUDA is not bit-reproducible, so the check is a tolerance: the same prefix-tree samples'
//! log-probabilities on `cuda` and on the CPU within 5e-3 (absolute), for tiny Llama, Qwen2 and
//! Qwen3 models; and a `cuda` iteration commits. Why 5e-3: burn-cuda multiplies f32 matrices
//! on the tensor cores in TF32 (cubek-matmul rounds both operands to a 10-bit mantissa,
//! relative 2^-11, and accumulates in f32: PyTorch's `allow_tf32`), so a log-probability of
//! −5 moves by ~1e-3 (measured on an H200: −5.054003 on the CPU, −5.055003 on CUDA).

use rla_pipe::model::tree::{TreeRow, tree_logprobs};
use rla_pipe::model::{Cpu, Gpu, policy};

use crate::hf::{ARCHS, load_on, tiny_model};
use crate::{Fixture, GRIDNAV, SMALL_GRIDNAV};

fn rows() -> Vec<TreeRow> {
    vec![
        TreeRow {
            stem: vec![1, 5, 9, 33, 2, 17, 40, 63],
            leaves: vec![(vec![7, 8, 9], 0), (vec![12, 13], 1), (vec![20], 0)],
        },
        TreeRow {
            stem: vec![60, 3, 3],
            leaves: vec![(vec![45, 2, 11, 9], 2)],
        },
    ]
}

/// Asserts that `ours` differs from `theirs` by at most `tol` times `theirs`' largest entry
/// (which is not zero); `what` names the failure.
fn within(ours: &[f32], theirs: &[f32], tol: f32, what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: sizes");
    let top = theirs.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = ours
        .iter()
        .zip(theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        top > 0.0 && worst <= tol * top,
        "{what}: differ by {worst} (largest {top})"
    );
}

/// A tiny model on the GPU's training backend (`set` adjusts it after loading): the packed
/// rows' log-probabilities and every parameter's gradient of their sum; with `layers`, the
/// layers checkpointed (`update.checkpoint_layers`: the forward recorded, the layers' backward
/// passes deferred).
fn trained(
    dir: &std::path::Path,
    layers: bool,
    set: impl FnOnce(&mut rla_pipe::model::hf::CausalLm<rla_pipe::model::GpuTrain>),
) -> (Vec<Vec<f32>>, Vec<f32>) {
    use burn::tensor::Tensor;
    use rla_pipe::model::{GpuTrain, ppo, tape};
    let mut model = load_on::<GpuTrain>(dir);
    set(&mut model);
    let forward = || tree_logprobs(&model, &rows(), None, 1.0, &Default::default());
    let ((lp, valid), deferred) = match layers {
        true => tape::record(forward),
        false => (forward(), Vec::new()),
    };
    let keep: Vec<f32> = valid.iter().map(|v| f32::from(u8::from(*v))).collect();
    let n = keep.len();
    let mask = Tensor::<GpuTrain, 1>::from_floats(keep.as_slice(), &Default::default());
    let grads = ppo::gradients(&model, (lp.clone().reshape([n]) * mask).sum(), deferred);
    (
        policy::to_host(lp),
        crate::prefix::param_grads(&model, &grads).concat(),
    )
}

/// Two of [`trained`]'s results agree as the GPU's paths must: log-probabilities within 5e-3,
/// every gradient within 1e-3 of the largest (TF32 products, sums in another order).
fn same_training(
    arch: &str,
    what: &str,
    plain: &(Vec<Vec<f32>>, Vec<f32>),
    ours: &(Vec<Vec<f32>>, Vec<f32>),
) {
    for (a, b) in plain.0.iter().flatten().zip(ours.0.iter().flatten()) {
        assert!(
            (a - b).abs() <= 5e-3,
            "{arch}: log-probability {a} vs {b} {what}"
        );
    }
    within(
        &ours.1,
        &plain.1,
        1e-3,
        &format!("{arch}: gradients {what}"),
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU (cargo test --features cuda --test it gpu -- --ignored)"]
fn cuda_log_probabilities_agree_with_the_cpu_and_an_iteration_commits() {
    let f = Fixture::new();
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        let (cpu, gpu) = (load_on::<Cpu>(&dir), load_on::<Gpu>(&dir));
        let (lc, valid) = tree_logprobs(&cpu, &rows(), None, 1.0, &Default::default());
        let (lg, _) = tree_logprobs(&gpu, &rows(), None, 1.0, &Default::default());
        let (lc, lg) = (policy::to_host(lc), policy::to_host(lg));
        let cols = lc[0].len();
        for (i, (a, b)) in lc.iter().flatten().zip(lg.iter().flatten()).enumerate() {
            if valid[i / cols * cols + i % cols] {
                assert!((a - b).abs() <= 5e-3, "{arch}: cpu {a} vs cuda {b} at {i}");
            }
        }
    }
    cuda_cache_layout_and_recomputed_attention(&f);
    cuda_kernels_follow_the_reference();
    cuda_fused_adamw_follows_burns();
    cuda_kernels_train_as_burns_operations(&f);
    cuda_sampled_picks_follow_the_hosts(&f);
    let mut sets: Vec<&str> = SMALL_GRIDNAV.to_vec();
    sets.push("run.device=cuda");
    f.run_pipeline(GRIDNAV, "gpu", 1, &sets).ok();
    let stages = f
        .sql("SELECT count(*) FROM stage_runs WHERE run_id = 'gpu'")
        .ok()
        .scalar();
    assert!(
        stages.parse::<u32>().unwrap() >= 8,
        "{stages} stages committed"
    );
}

/// On CUDA, against the same device's other path: greedy replies with the key/value cache in
/// bucketed buffers written in place (`model::kv`, the default there) give the tokens of the
/// cache grown by concatenation (`RLA_PIPE_DEVICE_KV=cat`'s path), log-probabilities within
/// 5e-3; training attention that recomputes its probabilities (`update.recompute_attention`)
/// gives the plain graph's log-probabilities within 5e-3 and every gradient within 1e-3 of the
/// largest (TF32 products, sums in another order).
fn cuda_cache_layout_and_recomputed_attention(f: &Fixture) {
    use rla_pipe::model::hf::{self, Sampling};
    use rla_pipe::model::kv::force_device_layout;
    let prompts: Vec<Vec<u32>> = vec![
        vec![1, 5, 9, 33, 12],
        vec![7, 8],
        vec![9, 10, 11, 12, 13, 14, 15],
    ];
    let greedy = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        max_tokens: 10,
        seed: 0,
    };
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        let gpu = load_on::<Gpu>(&dir);
        let d = Default::default();
        let seeds = [1u64, 2, 3];
        force_device_layout(Some(false));
        let cat = hf::generate::sample(&gpu, &prompts, &seeds, &[], &greedy, &d).unwrap();
        force_device_layout(None);
        let room = hf::generate::sample(&gpu, &prompts, &seeds, &[], &greedy, &d).unwrap();
        for ((a, x), (b, y)) in cat.iter().zip(&room) {
            assert_eq!(
                a, b,
                "{arch}: greedy tokens, concatenated vs bucketed cache"
            );
            assert!(
                (x - y).abs() <= 5e-3,
                "{arch}: reply log-probability {x} vs {y}"
            );
        }
        let plain = trained(&dir, false, |_| {});
        let ours = trained(&dir, false, |m| m.recompute_attention = true);
        same_training(arch, "recomputed", &plain, &ours);
        let layers = trained(&dir, true, |m| m.recompute_attention = true);
        same_training(arch, "with checkpointed layers", &plain, &layers);
    }
}

/// The GPU's kernels (`model::hf::cube`) against the same operations composed of burn's
/// (`kernels::Reference`) on the device, forward and backward, at SmolLM2's widths and a head's:
/// within 1e-5 of the largest entry (f32 throughout, sums in another order).
fn cuda_kernels_follow_the_reference() {
    use burn::tensor::{Distribution, Tensor};
    use rla_pipe::model::hf::cube::Cube;
    use rla_pipe::model::hf::kernels::{Kernels, Reference};
    type G = Gpu;
    let d = Default::default();
    let random = |shape: Vec<usize>| -> Tensor<G, 1> {
        let n: usize = shape.iter().product();
        Tensor::random([n], Distribution::Uniform(-2.0, 2.0), &d)
    };
    let close = |a: Vec<f32>, b: Vec<f32>, what: &str| {
        within(&a, &b, 1e-5, &format!("{what}: kernel against reference"))
    };
    let values = |x: Tensor<G, 2>| -> Vec<f32> { x.into_data().to_vec().unwrap() };
    for (rows, width) in [(1000, 576), (333, 64)] {
        let x = random(vec![rows, width]).reshape([rows, width]);
        let gamma = random(vec![width]);
        let g = random(vec![rows, width]).reshape([rows, width]);
        let (yk, rk) = Cube::rms_norm(x.clone(), gamma.clone(), 1e-5);
        let (yr, rr) = Reference::rms_norm(x.clone(), gamma.clone(), 1e-5);
        close(values(yk), values(yr), "rms_norm");
        close(
            values(rk.clone().unsqueeze_dim(1)),
            values(rr.unsqueeze_dim(1)),
            "rms_norm's r",
        );
        let (dk, gk) = Cube::rms_norm_backward(g.clone(), x.clone(), gamma.clone(), rk.clone());
        let (dr, gr) = Reference::rms_norm_backward(g, x, gamma, rk);
        close(values(dk), values(dr), "rms_norm backward: x");
        close(values(gk), values(gr), "rms_norm backward: gamma's terms");
    }
    let (b, t, n, hd) = (2, 5, 9, 64);
    let x = random(vec![b, t, n, hd]).reshape([b, t, n, hd]);
    let cos = random(vec![b, t, 1, hd]).reshape([b, t, 1, hd]);
    let sin = random(vec![b, t, 1, hd]).reshape([b, t, 1, hd]);
    for transpose in [false, true] {
        let k = Cube::rope(x.clone(), cos.clone(), sin.clone(), transpose);
        let r = Reference::rope(x.clone(), cos.clone(), sin.clone(), transpose);
        close(
            values(k.reshape([b * t, n * hd])),
            values(r.reshape([b * t, n * hd])),
            &format!("rope (transpose: {transpose})"),
        );
    }
    // Attention's softmax over 130 keys (more than a plane's 32 units, not a multiple), a
    // bias hiding about a third of them (−∞), never a whole row.
    let dims = [2, 3, 7, 130];
    let s4 = |x: Tensor<G, 1>| x.reshape(dims);
    let scores = s4(random(dims.to_vec()));
    let hide = s4(random(dims.to_vec())).lower_elem(-0.7);
    let mut bias = Tensor::<G, 4>::zeros(dims, &d).mask_fill(hide, f32::NEG_INFINITY);
    bias = bias.slice_assign([0..2, 0..3, 0..7, 0..1], Tensor::zeros([2, 3, 7, 1], &d));
    let rows4 = |x: Tensor<G, 4>| values(x.reshape([42, 130]));
    let rows1 = |x: Tensor<G, 4>| values(x.reshape([42, 1]));
    // And a bias shared by the heads (`[b, 1, q, keys]`, the GPU's layout: each batch row's
    // query rows read it in turn).
    let shared = bias.clone().narrow(1, 1, 1);
    for bias in [shared, bias.clone()] {
        let (pk, mk, sk) = Cube::softmax(scores.clone(), bias.clone(), 0.125);
        let (pr, mr, sr) = Reference::softmax(scores.clone(), bias.clone(), 0.125);
        close(rows4(pk), rows4(pr), "softmax");
        close(rows1(mk.clone()), rows1(mr), "softmax's max");
        close(rows1(sk.clone()), rows1(sr), "softmax's sum");
        let again =
            Cube::softmax_again(scores.clone(), bias.clone(), mk.clone(), sk.clone(), 0.125);
        let want = Reference::softmax_again(scores.clone(), bias, mk, sk, 0.125);
        close(rows4(again), rows4(want), "softmax again");
    }
    let (pk, _, _) = Cube::softmax(scores, bias, 0.125);
    let dp = s4(random(dims.to_vec()));
    let row = s4(random(dims.to_vec())).narrow(3, 0, 1);
    close(
        rows4(Cube::softmax_backward(
            pk.clone(),
            dp.clone(),
            row.clone(),
            0.125,
        )),
        rows4(Reference::softmax_backward(pk, dp, row, 0.125)),
        "softmax backward",
    );

    let shape = [3, 7, 1536];
    let three = || random(shape.to_vec()).reshape(shape);
    let (gate, up, g) = (three().mul_scalar(4.0), three(), three());
    let flat = |x: Tensor<G, 3>| values(x.reshape([21, 1536]));
    close(
        flat(Cube::silu_mul(gate.clone(), up.clone())),
        flat(Reference::silu_mul(gate.clone(), up.clone())),
        "silu_mul",
    );
    let (kg, ku) = Cube::silu_mul_backward(g.clone(), gate.clone(), up.clone());
    let (rg, ru) = Reference::silu_mul_backward(g, gate, up);
    close(flat(kg), flat(rg), "silu_mul backward: gate");
    close(flat(ku), flat(ru), "silu_mul backward: up");
}

/// AdamW as one kernel per parameter (`model::adamw`, the update's optimizer on `cuda`) against
/// burn's AdamW on the device: three steps of a linear layer with weight decay, the second with
/// its gradients clipped (scaled inside the fused step, before burn's), the parameters within
/// 1e-5 of the largest (f32 element-wise either way, another rounding of the divisions).
fn cuda_fused_adamw_follows_burns() {
    use burn::nn::LinearConfig;
    use burn::optim::GradientsParams;
    use burn::tensor::{Distribution, Tensor};
    use rla_pipe::model::GpuTrain;
    use rla_pipe::model::adamw::FusedAdamW;
    use rla_pipe::model::ppo::Adam;
    let d = Default::default();
    let start = LinearConfig::new(64, 48).init::<GpuTrain>(&d);
    let x = Tensor::<GpuTrain, 2>::random([16, 64], Distribution::Uniform(-1.0, 1.0), &d);
    let adam = FusedAdamW::new(0.01, 1e-8);
    let run = |fused: bool| {
        let mut model = start.clone();
        let mut optim = Adam::<GpuTrain, burn::nn::Linear<GpuTrain>>::new(&adam, fused);
        for step in 0..3 {
            let y = model.forward(x.clone());
            let loss = (y.clone() * y).sum().mul_scalar(step as f32 + 1.0);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            // The second step's gradients clipped (the factor inside the fused step).
            let by = if step == 1 { 0.5 } else { 1.0 };
            model = optim.step(1e-2, model, grads, by);
        }
        let w: Vec<f32> = model.weight.val().into_data().to_vec().unwrap();
        let b: Vec<f32> = model.bias.unwrap().val().into_data().to_vec().unwrap();
        [w, b].concat()
    };
    let (ours, theirs) = (run(true), run(false));
    within(&ours, &theirs, 1e-5, "fused AdamW against burn's");
    let before: Vec<f32> = start.weight.val().into_data().to_vec().unwrap();
    assert_ne!(&ours[..before.len()], &before[..], "the parameters moved");
}

/// A whole model on the GPU's training backend with its kernels (the default) and without
/// (`RLA_PIPE_CUDA_KERNELS=off`'s path): log-probabilities within 5e-3 and every gradient
/// within 1e-3 of the largest (TF32 products, sums in another order); and greedy replies on the
/// inference backend with the same tokens.
fn cuda_kernels_train_as_burns_operations(f: &Fixture) {
    use rla_pipe::model::hf::fused::force_kernels;
    use rla_pipe::model::hf::{self, Sampling};
    let greedy = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        max_tokens: 10,
        seed: 0,
    };
    let prompts: Vec<Vec<u32>> = vec![vec![1, 5, 9, 33, 12], vec![7, 8]];
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        let run = |kernels: bool| {
            force_kernels(Some(kernels));
            let training = trained(&dir, false, |_| {});
            let gpu = load_on::<Gpu>(&dir);
            let d = Default::default();
            let replies = hf::generate::sample(&gpu, &prompts, &[1, 2], &[], &greedy, &d).unwrap();
            force_kernels(None);
            (training, replies)
        };
        let (plain, plain_replies) = run(false);
        let (ours, our_replies) = run(true);
        same_training(arch, "with the kernels", &plain, &ours);
        for ((a, _), (b, _)) in plain_replies.iter().zip(&our_replies) {
            assert_eq!(a, b, "{arch}: greedy tokens with and without the kernels");
        }
    }
}

/// Sampled replies on CUDA drawn from each row's leading tokens (burn-cubecl's `argtopk`, the
/// default there; 4 and 32 of the tiny model's 64, so that some draws reach past them and read
/// the row), and a reward model's samples drawn on the device, give the tokens of the host's
/// draws from the same device's logits (`RLA_PIPE_DEVICE_SAMPLING=off`'s path),
/// log-probabilities within 1e-5 relative (the device's f32 sums against the host's f64 ones).
fn cuda_sampled_picks_follow_the_hosts(f: &Fixture) {
    use rla_pipe::model::hf::generate::force_device_picks;
    use rla_pipe::model::hf::{self, HfArch, HfTokenizer, Sampling};
    use rla_pipe::model::lm::Lm;
    use rla_pipe::model::reward::{self, Verdicts};
    let prompts: Vec<Vec<u32>> = vec![vec![1, 5, 9, 33, 12], vec![7, 8], vec![3, 30, 31]];
    let s = Sampling {
        temperature: 0.9,
        top_p: 1.0,
        max_tokens: 10,
        seed: 0,
    };
    for arch in ARCHS {
        let dir = f.dir.path().join(arch);
        tiny_model(&dir, arch, "F32");
        let gpu = load_on::<Gpu>(&dir);
        let d = Default::default();
        for lead in [Some(4), None] {
            let run = |device: bool| {
                force_device_picks(Some(device), lead);
                let out = hf::generate::sample(&gpu, &prompts, &[4, 5, 6], &[], &s, &d).unwrap();
                force_device_picks(None, None);
                out
            };
            let (host, device) = (run(false), run(true));
            for ((a, x), (b, y)) in host.iter().zip(&device) {
                assert_eq!(a, b, "{arch}, lead {lead:?}: sampled tokens");
                assert!(
                    (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                    "{arch}: reply log-probability {x} on the host vs {y}"
                );
            }
        }
        // A reward model's m samples on one shared prompt cache, drawn on the device (the
        // running sums by burn-cubecl's `cumsum`) and on the host.
        let tok = HfTokenizer::from_dir(&dir, &HfArch::from_dir(&dir).unwrap()).unwrap();
        let judged = |device: bool| {
            force_device_picks(Some(device), None);
            let (last, cache, lens) = gpu.encode(&prompts, &d);
            let v = Verdicts::Text(&tok, "");
            let j = reward::generate_shared(&gpu, v, last, cache, &lens, &[7, 8, 9], 3, 8, 1.0, &d);
            force_device_picks(None, None);
            j.into_iter().flatten().collect::<Vec<_>>()
        };
        let (host, device) = (judged(false), judged(true));
        for (a, b) in host.iter().zip(&device) {
            assert_eq!(a.tokens, b.tokens, "{arch}: RM sample tokens");
            assert!(
                (a.logprob - b.logprob).abs() <= 1e-5 * a.logprob.abs().max(1.0),
                "{arch}: RM sample log-probability {} on the host vs {}",
                a.logprob,
                b.logprob
            );
        }
    }
}

/// Runs wherever the tests are built with `--features cuda`: on a machine without a usable
/// CUDA (no driver, no GPU), `run.device = "cuda"` is a clean error naming the key and the
/// cause, never a panic from burn-cuda's device thread. (With a GPU, the test above covers it.)
#[test]
fn cuda_without_a_gpu_is_an_error_not_a_panic() {
    if rla_pipe::model::backend::cuda_ready().is_ok() {
        return;
    }
    let f = Fixture::new();
    let mut sets: Vec<&str> = SMALL_GRIDNAV.to_vec();
    sets.push("run.device=cuda");
    f.run_pipeline(GRIDNAV, "nogpu", 1, &sets)
        .fails(1, &["run.device", "not usable on this machine"]);
}
