//! `rla-pipe export`: a run's trained model as a Hugging Face (or PEFT adapter) directory.

use anyhow::{Context, Result, bail};

use crate::error::Error;

use super::args::{ModelRole, StoreArgs};
use crate::model::hf;

pub(super) async fn export(
    store: &StoreArgs,
    run: &str,
    iter: u32,
    role: ModelRole,
    out: &std::path::Path,
    merge: bool,
    force: bool,
    base_name: Option<&str>,
) -> Result<()> {
    let name = match role {
        ModelRole::Policy => crate::model::POLICY,
        ModelRole::Rm => crate::model::RM,
    };
    let store = store.open()?;
    let ck = crate::engine::checkpoints::committed_checkpoint(&store, run, iter, name).await?;
    let Some(origin) = ck.run.models.get(name) else {
        bail!(Error::Model(format!(
            "run {run:?} trains rla-pipe's small transformer as its {name} model; export writes \
             Hugging Face directories of runs that started from one (`{}.init = \"hf:DIR\"`)",
            if name == crate::model::POLICY {
                "policy"
            } else {
                "reward_model"
            }
        )));
    };
    // `hf:DIR blake3:DIGEST`: the architecture and tokenizer come from DIR.
    let (spec, recorded) = origin
        .rsplit_once(" blake3:")
        .unwrap_or((origin.as_str(), ""));
    let dir = std::path::PathBuf::from(spec.strip_prefix("hf:").unwrap_or(spec));
    if !dir.join("config.json").exists() {
        bail!(Error::Model(format!(
            "run {run:?} started its {name} model from {origin}; {} is needed for the \
             architecture and tokenizer and is not there",
            dir.display()
        )));
    }
    let now = hf::directory_digest(&dir)
        .with_context(|| format!("reading the base model in {}", dir.display()))?;
    if now != recorded {
        if !force {
            bail!(Error::Model(format!(
                "the base model in {} changed since run {run:?} started from it: the run \
                 recorded blake3:{recorded}, the directory now holds blake3:{now}. Restore the \
                 base model the run started from, or pass --force to export against the \
                 directory as it is now",
                dir.display()
            )));
        }
        eprintln!(
            "warning: --force: the base model in {} changed since run {run:?} started from it \
             (blake3:{recorded} then, blake3:{now} now); its files are used as they are now",
            dir.display()
        );
    }
    // What an adapter directory names as its base: the user's name, else the base directory's
    // absolute path (a relative one would be resolved against whoever loads the adapter).
    let base = match base_name {
        Some(name) => name.to_string(),
        None => std::path::absolute(&dir)
            .with_context(|| format!("resolving {}", dir.display()))?
            .display()
            .to_string(),
    };
    // The run's own settings say whether it trained adapters (a run.json from before adapters
    // existed has no `lora` section: full weights).
    let section = if name == crate::model::POLICY {
        "policy"
    } else {
        "reward_model"
    };
    let lora_config: crate::model::LoraConfig = match ck.run.config[section].get("lora") {
        Some(v) => serde_json::from_value(v.clone())
            .with_context(|| format!("run {run:?}: run.json's `{section}.lora` does not parse"))?,
        None => Default::default(),
    };
    let lora = crate::model::hf::lora::LoraSpec::of(&lora_config);
    let (files, what) = match &lora {
        Some(spec) if merge => (
            hf::export_merged_dir(&dir, spec, &ck.bytes, out)?,
            "model with its adapters merged",
        ),
        Some(spec) => (
            hf::export_adapter_dir(&base, spec, &ck.bytes, out)?,
            "adapters (PEFT)",
        ),
        None => (hf::export_dir(&dir, &ck.bytes, out)?, "model"),
    };
    if merge && lora.is_none() {
        eprintln!(
            "note: run {run:?} fine-tuned the whole {name} model; --merge has nothing to merge"
        );
    }
    println!(
        "wrote {} ({}): the {name} {what} after {} of iteration {} ({})",
        out.display(),
        files.join(", "),
        ck.stage,
        ck.iter,
        ck.path
    );
    Ok(())
}
