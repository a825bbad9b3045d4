//! rla-pipe: RLAnything-style reinforcement learning as a staged dataflow.
//!
//! The modules form one-way layers (ARCHITECTURE.md; a test checks every `use crate::`):
//! - ground: [`determinism`] (seeds, Rng, canonical JSON), [`error`];
//! - data: [`schema`] (the Arrow schema of every table), [`store`] (object_store URLs, the layout,
//!   manifests, deterministic Parquet, the catalog of committed files, gc);
//! - components: [`env`] (environments), [`model`] (burn models), [`adapt`] (task adapters), each
//!   owning its config sections;
//! - [`config`]: aggregates the sections, loading, `--set`, hashing;
//! - [`sql`]: the read-only query session of `rla-pipe sql`;
//! - [`stage`]: the stage contract both the engine and the stages depend on;
//! - [`stages`] (one file per stage, SQL beside them) and [`engine`] (DAG runner, resume,
//!   replay), neither importing the other;
//! - [`pipeline`]: the registry that assembles a config's DAG;
//! - [`report`], [`cli`] (clap only).

pub mod adapt;
pub mod cli;
pub mod config;
pub mod determinism;
pub mod engine;
pub mod env;
pub mod error;
pub mod model;
pub mod pipeline;
pub mod report;
pub mod schema;
pub mod sql;
pub mod stage;
pub mod stages;
pub mod store;

pub use error::{Error, Result};

#[cfg(test)]
mod architecture {
    //! ARCHITECTURE.md's layering, checked against the source.
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// module → (rank from the top, modules it may use), read from ARCHITECTURE.md's table.
    fn layers() -> BTreeMap<String, (usize, BTreeSet<String>)> {
        let text = include_str!("../ARCHITECTURE.md");
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            if cells.len() < 5 || !cells[1].starts_with('`') {
                continue;
            }
            let module = cells[1].trim_matches('`').to_string();
            let uses = cells[3]
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty() && *u != "—")
                .map(str::to_string)
                .collect();
            let rank = out.len();
            out.insert(module, (rank, uses));
        }
        out
    }

    fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                sources(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    #[test]
    fn architecture_is_one_way() {
        let layers = layers();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut top: BTreeSet<String> = BTreeSet::new();
        for e in std::fs::read_dir(&src).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_stem().unwrap().to_string_lossy().to_string();
            if name != "lib" && name != "main" {
                top.insert(name);
            }
        }
        // Every module is in the table, and may use only modules below it.
        for m in &top {
            let (rank, uses) = layers
                .get(m)
                .unwrap_or_else(|| panic!("ARCHITECTURE.md has no line for module `{m}`"));
            for u in uses {
                let (below, _) = layers
                    .get(u)
                    .unwrap_or_else(|| panic!("`{m}` may use `{u}`, which has no line"));
                assert!(below > rank, "`{m}` may use `{u}`, which is not below it");
            }
        }
        // Every `crate::x` path of every source file (test modules excepted) is allowed.
        let mut files = Vec::new();
        sources(&src, &mut files);
        let mut bad = Vec::new();
        for f in files {
            let rel = f.strip_prefix(&src).unwrap();
            let own = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string();
            if own == "lib" || own == "main" {
                continue;
            }
            let allowed = &layers[&own].1;
            let text = std::fs::read_to_string(&f).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            for (n, line) in code.lines().enumerate() {
                let line = line.split("//").next().unwrap();
                for (i, _) in line.match_indices("crate::") {
                    let rest = &line[i + "crate::".len()..];
                    let used: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if top.contains(&used) && used != own && !allowed.contains(&used) {
                        bad.push(format!(
                            "src/{}:{}: `{own}` uses `{used}`",
                            rel.display(),
                            n + 1
                        ));
                    }
                }
                // A `use crate::{a, b}` group names modules too.
                if let Some(group) = line.split("use crate::{").nth(1) {
                    for used in group
                        .split([',', '}'])
                        .map(|s| s.trim().split("::").next().unwrap_or(""))
                    {
                        if top.contains(used) && used != own && !allowed.contains(used) {
                            bad.push(format!(
                                "src/{}:{}: `{own}` uses `{used}`",
                                rel.display(),
                                n + 1
                            ));
                        }
                    }
                }
            }
        }
        assert!(
            bad.is_empty(),
            "imports ARCHITECTURE.md does not allow:\n{}",
            bad.join("\n")
        );
    }
}
