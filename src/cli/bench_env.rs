//! `rla-pipe bench-env`: an environment's steps per second under uniform random play.

use anyhow::Result;

use crate::config::Config;

pub(super) fn bench_env(pipeline: &std::path::Path, steps: u64, sets: &[String]) -> Result<()> {
    let cfg = Config::load(pipeline, sets)?;
    let env = crate::env::from_config(&cfg.env)?;
    let t0 = std::time::Instant::now();
    let tasks = env.generate(cfg.run.seed, cfg.env.initial_tasks)?;
    println!(
        "{}: {} tasks generated in {:.3} s (textworld: games made, or taken from its cache)",
        env.name(),
        tasks.len(),
        t0.elapsed().as_secs_f64()
    );
    let (n, secs) = crate::env::throughput(env.as_ref(), &tasks, steps, cfg.run.seed)?;
    println!(
        "{}: {n} steps in {secs:.3} s on one core = {:.0} steps/s ({} tasks, uniform random play)",
        env.name(),
        n as f64 / secs,
        tasks.len()
    );
    Ok(())
}
