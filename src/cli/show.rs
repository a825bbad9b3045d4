//! `rla-pipe show`: a run's config, iterations and stages, or one iteration's files.

use anyhow::{Context, Result};

use super::args::StoreArgs;
use crate::store::catalog;

pub(super) async fn show(store: &StoreArgs, id: &str, iter: Option<u32>) -> Result<()> {
    let store = store.open()?;
    let r = catalog::load_run(&store, id).await?;
    println!("run        {}", r.run.run_id);
    println!("created    {}", r.run.created_at);
    println!("code       {}", r.run.code_version);
    println!("config     {}", r.run.config_hash);
    if let Some(b) = &r.run.branch {
        println!(
            "branch of  {} from iteration {} (iterations before it shared){}",
            b.parent,
            b.from_iter,
            if b.overrides.is_empty() {
                String::new()
            } else {
                format!(", --set {}", b.overrides.join(" --set "))
            }
        );
    }
    let status = |it: &catalog::IterState| {
        if it.complete.is_some() {
            "complete"
        } else {
            "incomplete"
        }
    };
    let Some(n) = iter else {
        println!("config:\n{}", serde_json::to_string_pretty(&r.run.config)?);
        println!(
            "\n{:>5}  {:<16} {:>12} {:>9}  status",
            "iter", "stage", "rows", "seconds"
        );
        for (i, it) in &r.iters {
            for c in it.stages.values() {
                let rows: u64 = c.manifest.outputs.iter().map(|o| o.rows).sum();
                println!(
                    "{i:>5}  {:<16} {rows:>12} {:>9.2}  {}",
                    c.manifest.stage, c.manifest.seconds, c.manifest.status
                );
            }
            println!("{i:>5}  {:<16} {}", "_iteration", status(it));
        }
        return Ok(());
    };
    let it = r
        .iters
        .get(&n)
        .with_context(|| format!("run {id:?} has no committed iteration {n}"))?;
    for c in it.stages.values() {
        println!(
            "\nstage {}  (seed {}, config {}, {:.2}s, manifest blake3 {})",
            c.manifest.stage,
            c.manifest.seed,
            &c.manifest.config_hash[..12],
            c.manifest.seconds,
            &c.digest[..16]
        );
        for input in &c.manifest.inputs {
            println!("  in   {:<30} {}", input.tables.join(","), input.path);
        }
        for o in &c.manifest.outputs {
            println!(
                "  out  {:<18} {:>10} rows {:>12} bytes  blake3 {}  {}",
                o.table,
                o.rows,
                o.bytes,
                &o.digest[..16],
                o.path
            );
        }
    }
    println!("\niteration {n}: {}", status(it));
    Ok(())
}
