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
pub mod cluster;
pub mod config;
pub mod determinism;
pub mod engine;
pub mod env;
pub mod error;
#[cfg(feature = "polars")]
pub mod frames;
pub mod model;
pub mod pipeline;
pub mod report;
pub mod sandbox;
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

    type Layers = BTreeMap<String, (usize, BTreeSet<String>)>;

    /// The layering's own faults: a module missing from the table, or allowed to use one that
    /// is not below it.
    fn table_faults(layers: &Layers, top: &BTreeSet<String>) -> Vec<String> {
        let mut bad = Vec::new();
        for m in top {
            let Some((rank, uses)) = layers.get(m) else {
                bad.push(format!("ARCHITECTURE.md has no line for module `{m}`"));
                continue;
            };
            for u in uses {
                match layers.get(u) {
                    Some((below, _)) if below > rank => {}
                    _ => bad.push(format!("`{m}` may use `{u}`, which is not below it")),
                }
            }
        }
        bad
    }

    /// Every `crate::x` path (and `use crate::{x, ...}` group) of the given files (path under
    /// src/, text; test modules excepted) that the layering does not allow.
    fn import_faults(
        layers: &Layers,
        top: &BTreeSet<String>,
        files: &[(String, String)],
    ) -> Vec<String> {
        let mut bad = Vec::new();
        for (rel, text) in files {
            let own = rel.split('/').next().unwrap().trim_end_matches(".rs");
            if own == "lib" || own == "main" {
                continue;
            }
            let allowed = layers.get(own).map(|l| l.1.clone()).unwrap_or_default();
            let code = text.split("#[cfg(test)]").next().unwrap();
            for (n, line) in code.lines().enumerate() {
                let line = line.split("//").next().unwrap();
                let mut used: Vec<String> = line
                    .match_indices("crate::")
                    .map(|(i, _)| {
                        line[i + "crate::".len()..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect()
                    })
                    .collect();
                if let Some(group) = line.split("use crate::{").nth(1) {
                    used.extend(
                        group
                            .split([',', '}'])
                            .map(|s| s.trim().split("::").next().unwrap_or("").to_string()),
                    );
                }
                for u in used {
                    if top.contains(&u) && u != own && !allowed.contains(&u) {
                        bad.push(format!("src/{rel}:{}: `{own}` uses `{u}`", n + 1));
                    }
                }
            }
        }
        bad
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
        let faults = table_faults(&layers, &top);
        assert!(faults.is_empty(), "{}", faults.join("\n"));
        let mut paths = Vec::new();
        sources(&src, &mut paths);
        let files: Vec<(String, String)> = paths
            .iter()
            .map(|p| {
                let rel = p
                    .strip_prefix(&src)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                (rel, std::fs::read_to_string(p).unwrap())
            })
            .collect();
        let faults = import_faults(&layers, &top, &files);
        assert!(
            faults.is_empty(),
            "imports ARCHITECTURE.md does not allow:\n{}",
            faults.join("\n")
        );
    }

    #[test]
    fn upward_imports_are_caught() {
        let layers = layers();
        let top: BTreeSet<String> = layers.keys().cloned().collect();
        let files = vec![
            (
                "env/mod.rs".to_string(),
                "use crate::engine::Dag;\nuse crate::{error, stages};\n// crate::cli in a comment\n#[cfg(test)]\nuse crate::config;\n".to_string(),
            ),
            ("stages/x.rs".to_string(), "fn f() { crate::engine::runner::go() }".to_string()),
            ("engine/x.rs".to_string(), "use crate::stage::Stage;".to_string()),
        ];
        let faults = import_faults(&layers, &top, &files);
        assert_eq!(faults.len(), 3, "{faults:?}");
        assert!(faults[0].contains("`env` uses `engine`"));
        assert!(faults[1].contains("`env` uses `stages`"));
        assert!(faults[2].contains("`stages` uses `engine`"));
        let mut upside_down = layers.clone();
        upside_down
            .get_mut("store")
            .unwrap()
            .1
            .insert("engine".into());
        assert_eq!(table_faults(&upside_down, &top).len(), 1);
    }
}
