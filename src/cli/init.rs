//! `rla-pipe init`: a commented iteration.toml with every key at its default.

use anyhow::{Context, Result};

use crate::config;

pub(super) fn init(dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("iteration.toml");
    if path.exists() {
        return Err(crate::error::Error::config(format!(
            "{} already exists; not overwriting it",
            path.display()
        ))
        .into());
    }
    std::fs::write(&path, config::DEFAULT_TOML)
        .with_context(|| format!("writing {}", path.display()))?;
    println!(
        "wrote {}; run it with: rla-pipe run {}",
        path.display(),
        path.display()
    );
    Ok(())
}
