//! How well behaviour cloning generalizes, without a browser or an environment: the warm
//! start's policy loss (`pretrain`'s, the same code) trained on the committed demonstrations of
//! 80% of their tasks, then the share of decisions where the trained policy's most likely action
//! is the planner's — on those tasks and on the other 20% (split by task id) — per kind of task
//! (the instruction's first word). For settings of the small transformer, the pretrain budget
//! and the learning rate, at the cost of the training alone.
//!
//! ```sh
//! rla-pipe sql --run web "SELECT task_id, episode, step_idx, observation, action, admissible
//!   FROM demonstrations WHERE purpose = 'policy' ORDER BY episode, step_idx" --out demos.json
//! cargo run --example clone_probe -- pipelines/web.toml demos.json epochs=16 \
//!   policy.action_score=sum          # KEY=VALUE: any --set of the pipeline; epochs, mb, lr
//! ```

use std::path::Path;

use anyhow::{Context, bail};
use rla_pipe::config::Config;
use rla_pipe::model::ppo::{PpoSettings, Schedule};
use rla_pipe::model::{Cpu, CpuTrain, POLICY, initial_checkpoint, policy, pretrain};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [pipeline, demos, rest @ ..] = &args[..] else {
        bail!("usage: clone_probe PIPELINE.toml DEMOS.json [KEY=VALUE ...]");
    };
    let demos: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(demos).with_context(|| format!("reading {demos}"))?,
    )
    .with_context(|| format!("{demos}: not a JSON array of demonstration rows"))?;
    let mut sets = Vec::new();
    let mut cfg = Config::load(Path::new(pipeline), &[])?;
    let (mut epochs, mut mb, mut lr) = (
        cfg.pretrain.policy_epochs,
        cfg.pretrain.minibatch as usize,
        cfg.pretrain.lr,
    );
    for a in rest {
        let Some((k, v)) = a.split_once('=') else {
            bail!("{a}: expected KEY=VALUE");
        };
        match k {
            "epochs" => epochs = v.parse().context("epochs")?,
            "mb" => mb = v.parse().context("mb")?,
            "lr" => lr = v.parse().context("lr")?,
            _ => sets.push(a.clone()),
        }
    }
    cfg = Config::load(Path::new(pipeline), &sets)?;
    let spec = rla_pipe::stages::model_spec(&cfg, POLICY)?;
    let weights = spec.load(&initial_checkpoint(&spec, cfg.run.seed)?)?;
    let (mut train, mut test) = ((vec![], vec![], vec![]), (vec![], vec![], vec![]));
    let mut task = String::new();
    for (i, d) in demos.iter().enumerate() {
        let field = |k: &str| {
            d[k].as_str()
                .with_context(|| format!("row {i}: no string field {k:?}"))
        };
        let obs = field("observation")?;
        if d["step_idx"].as_u64() == Some(0) {
            task = obs.to_string();
        }
        let admissible: Vec<String> = serde_json::from_str(field("admissible")?)
            .with_context(|| format!("row {i}: admissible is not a JSON array"))?;
        let action = field("action")?;
        let Some(k) = admissible.iter().position(|a| a == action) else {
            bail!("row {i}: the action {action:?} is not admissible");
        };
        let decision = spec.decision(&task, &[], obs, &admissible)?;
        let kind = task.split_whitespace().nth(1).unwrap_or("?").to_string();
        let tid = field("task_id")?;
        let held_out = u8::from_str_radix(tid.get(..2).unwrap_or("ff"), 16).unwrap_or(255) < 52;
        let set = if held_out { &mut test } else { &mut train };
        set.0.push(decision);
        set.1.push(k);
        set.2.push(kind);
    }
    if train.1.is_empty() || test.1.is_empty() {
        bail!("too few demonstrations to split ({} rows)", demos.len());
    }
    let s = PpoSettings {
        clip_eps: cfg.reward.clip_eps,
        kl_beta: 0.0,
        log_ratio_clamp: cfg.update.log_ratio_clamp,
        lr,
        weight_decay: cfg.update.weight_decay,
        adam_eps: cfg.update.adam_eps,
        grad_clip: cfg.update.grad_clip,
        steps: (train.1.len() * epochs as usize).div_ceil(mb.max(1)) as u32,
        minibatch: mb.max(1),
        schedule: Schedule::Fixed,
        micro_tokens: 0,
        threads: 1,
        // Behaviour cloning, as the warm start: no snapshot to stay near.
        target_kl: 0.0,
        gpu: false,
        checkpoint_layers: false,
    };
    let dev = Default::default();
    let (trained, metrics) =
        pretrain::clone_policy::<CpuTrain>(&dev, &spec, &weights, &train.0, &train.1, &s, 1)?;
    let model = trained.to_model::<Cpu>(&dev)?;
    println!(
        "{} decisions train, {} held out; {} steps of {} (lr {lr}); loss {:.3} -> {:.3}",
        train.1.len(),
        test.1.len(),
        s.steps,
        s.minibatch,
        metrics.first().map_or(f64::NAN, |m| m.loss),
        metrics.last().map_or(f64::NAN, |m| m.loss),
    );
    for (name, (decisions, chosen, kinds)) in [("train", &train), ("held out", &test)] {
        let lp = policy::to_host(policy::log_probs(
            &model,
            decisions,
            1.0,
            spec.action_mean,
            &dev,
        ));
        let right: Vec<bool> = chosen
            .iter()
            .enumerate()
            .map(|(i, k)| policy::greedy(&lp[i][..decisions[i].actions.len()]) == *k)
            .collect();
        let share = |pick: &dyn Fn(usize) -> bool| {
            let v: Vec<bool> = (0..right.len())
                .filter(|i| pick(*i))
                .map(|i| right[i])
                .collect();
            let n = v.iter().filter(|b| **b).count();
            format!("{:.3} ({n}/{})", n as f64 / v.len().max(1) as f64, v.len())
        };
        let mut line = format!("{name}: planner's action most likely {}", share(&|_| true));
        let mut all: Vec<&String> = kinds.iter().collect();
        all.sort();
        all.dedup();
        for kind in all {
            line += &format!("; {kind} {}", share(&|i| kinds[i] == *kind));
        }
        println!("{line}");
    }
    Ok(())
}
