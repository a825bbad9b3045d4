//! The README's ablation tables stay current: `benches/ablation.sh` writes the fingerprint of
//! the first iteration of its full-loop run of seed 0 (`docs/src/ablation/<env>/fingerprint.csv`,
//! from `pipelines/sql/ablation_fingerprint.sql`); this test computes it again with the current
//! code. A change that moves what the ablation computes (sample order, kernels, masks, formulas)
//! fails here, naming the command that re-measures the tables.

use crate::Fixture;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn check(env: &str, iterations: u32) {
    let f = Fixture::new();
    let pipeline = format!("{ROOT}/pipelines/ablation/{env}.toml");
    // The same command as benches/ablation.sh's `abl-rmadapt-s0`, one iteration.
    f.run_pipeline(&pipeline, "abl-rmadapt-s0", 1, &["run.seed=0"])
        .ok();
    let sql = format!("{ROOT}/pipelines/sql/ablation_fingerprint.sql");
    let got = f
        .rla(&["sql", "--format", "csv", "--file", &sql])
        .ok()
        .stdout;
    let path = format!("{ROOT}/docs/src/ablation/{env}/fingerprint.csv");
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let measured = std::fs::read_to_string(format!("{ROOT}/docs/src/ablation/{env}/measured.txt"))
        .unwrap_or_default();
    assert!(
        got == want,
        "the {env} ablation tables in the README are stale: the first iteration of \
         abl-rmadapt-s0 no longer computes what they were measured with ({}).\n\
         Re-measure them: `benches/ablation.sh {iterations} ./runs-ablation/{env} docs/src/ablation/{env} {env}` \
         (rewrites {path}), then update the README's tables.\n--- {path}\n{want}--- now\n{got}",
        measured.trim()
    );
}

#[test]
fn ablation_tables_are_current_gridnav() {
    check("gridnav", 8);
}

#[test]
fn ablation_tables_are_current_household() {
    check("household", 8);
}

/// The GUI setting's ablation (docs/src/web.md, "The ablation"): its first iteration drives
/// headless Chromium (installed with apt when missing, as the web tests do).
#[test]
fn ablation_tables_are_current_web() {
    crate::report::chromium();
    check("web", 6);
}

/// `benches/ablation.sh` stops with a one-line error and exit status 2, before it runs anything,
/// on a malformed VARIANTS value or seed count (the binary given, so nothing is built).
#[test]
fn ablation_script_rejects_malformed_settings() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out = dir.path().join("out");
    let cases: &[(&str, &str, &str)] = &[
        ("VARIANTS", "nocand", "VARIANTS: 'nocand' is not name:k=v"),
        (
            "VARIANTS",
            "rm:adapt.enabled=false",
            "VARIANTS: 'rm:adapt.enabled=false'",
        ),
        ("SEEDS", "x", "take a number of seeds, not 'x'"),
        ("VARIANT_SEEDS", "-1", "take a number of seeds, not '-1'"),
    ];
    for (key, value, want) in cases {
        let o = std::process::Command::new("bash")
            .arg(format!("{ROOT}/benches/ablation.sh"))
            .args([
                "2",
                store.to_str().unwrap(),
                out.to_str().unwrap(),
                "gridnav",
            ])
            .env("RLA_PIPE_BIN", env!("CARGO_BIN_EXE_rla-pipe"))
            .env(key, value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{key}={value}: {err}");
        assert!(err.contains(want), "{key}={value}: {err}");
        assert!(!store.exists(), "{key}={value} created the store");
    }
}
