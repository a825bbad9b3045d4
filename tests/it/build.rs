//! The dev profile's overrides (Cargo.toml) match the dependency graph they were written for.

use std::collections::BTreeSet;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `cargo tree`'s package names (one per line, `--prefix none -f {p}`) for these edges.
fn tree(edges: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(ROOT)
        .args([
            "tree", "--locked", "-e", edges, "--prefix", "none", "-f", "{p}",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree -e {edges}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Every crate the default build compiles only to run it while compiling (procedural macros,
/// build scripts and their dependencies) is built unoptimised: `[profile.dev.package."*"]`
/// takes precedence over `build-override`, so a crate missing from the list builds at
/// `opt-level = 2` (slower to build, no faster to run). No entry names a crate that left the
/// lock file, and none a crate the program itself runs (that would make it slow).
#[test]
fn build_time_crates_build_unoptimised_and_nothing_else_does_by_mistake() {
    let manifest: toml::Table = std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let overrides = manifest["profile"]["dev"]["package"].as_table().unwrap();
    let unoptimised: BTreeSet<String> = overrides
        .iter()
        .filter(|(_, v)| v.get("opt-level").and_then(toml::Value::as_integer) == Some(0))
        .map(|(k, _)| k.clone())
        .collect();
    let lock: toml::Table = std::fs::read_to_string(Path::new(ROOT).join("Cargo.lock"))
        .unwrap()
        .parse()
        .unwrap();
    let locked: BTreeSet<String> = lock["package"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    let stale: Vec<&String> = overrides
        .keys()
        .filter(|k| *k != "*" && !locked.contains(*k))
        .collect();
    assert!(
        stale.is_empty(),
        "Cargo.toml's [profile.dev.package] names crates that are not in Cargo.lock: {stale:?}"
    );

    let everything = tree("normal,build");
    let run_time = tree("normal,no-proc-macro");
    let build_time: BTreeSet<&String> = everything.difference(&run_time).collect();
    let missing: Vec<&&String> = build_time
        .iter()
        .filter(|c| !unoptimised.contains(**c))
        .collect();
    assert!(
        missing.is_empty(),
        "build-time-only crates without `{{ opt-level = 0 }}` in Cargo.toml's \
         [profile.dev.package]: {missing:?}"
    );
    // The build-time list must not slow down what runs: the only run-time crates built
    // unoptimised are the ones Cargo.toml says so of by name (Polars' and DataFusion's planning).
    let runtime_unoptimised: Vec<&String> = unoptimised
        .iter()
        .filter(|c| run_time.contains(*c))
        .filter(|c| !c.starts_with("polars") && !c.starts_with("datafusion") && *c != "sqlparser")
        .collect();
    assert!(
        runtime_unoptimised.is_empty(),
        "crates the program runs are built unoptimised: {runtime_unoptimised:?}"
    );
}
