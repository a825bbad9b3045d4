//! The README's ablation tables stay current: `benches/ablation.sh` writes the fingerprint of
//! the first iteration of its full-loop run of seed 0 (`docs/src/ablation/<env>/fingerprint.csv`,
//! from `pipelines/sql/ablation_fingerprint.sql`); this test computes it again with the current
//! code. A change that moves what the ablation computes (sample order, kernels, masks, formulas)
//! fails here, naming the command that re-measures the tables.

use crate::Fixture;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The fingerprint (`ablation_fingerprint.sql`, CSV) of the first iteration of
/// benches/ablation.sh's `abl-rmadapt-s0` of `pipeline` (seed 0), with `sets` besides.
fn first_iteration_fingerprint(f: &Fixture, pipeline: &str, sets: &[&str]) -> String {
    let sets: Vec<&str> = ["run.seed=0"].iter().chain(sets).copied().collect();
    f.run_pipeline(pipeline, "abl-rmadapt-s0", 1, &sets).ok();
    let sql = format!("{ROOT}/pipelines/sql/ablation_fingerprint.sql");
    f.rla(&["sql", "--format", "csv", "--file", &sql])
        .ok()
        .stdout
}

fn check(env: &str, iterations: u32) {
    let f = Fixture::new();
    let pipeline = format!("{ROOT}/pipelines/ablation/{env}.toml");
    let got = first_iteration_fingerprint(&f, &pipeline, &[]);
    // The tables were measured on `avx512` CPUs (`fingerprint.csv`); another class of CPU
    // rounds differently from the first update on, and compares with its own fingerprint of the
    // same code (`fingerprint-<class>.csv`, written with RLA_PIPE_BLESS=1 on such a CPU while
    // the `avx512` one still holds).
    let measured = format!("{ROOT}/docs/src/ablation/{env}/fingerprint.csv");
    let path = crate::reference_for_cpu(std::path::Path::new(&measured));
    let path = path.display().to_string();
    if path != measured && std::env::var_os("RLA_PIPE_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{path}: {e}: no fingerprint for this class of CPU ({}); record it with \
             RLA_PIPE_BLESS=1 where {measured} still holds",
            crate::numerics()
        )
    });
    let measured = std::fs::read_to_string(format!("{ROOT}/docs/src/ablation/{env}/measured.txt"))
        .unwrap_or_default();
    let also = match crate::numerics() {
        "avx512" => String::new(),
        class => format!(", and record this {class} CPU's fingerprint again (RLA_PIPE_BLESS=1)"),
    };
    assert!(
        got == want,
        "the {env} ablation tables in the README are stale: the first iteration of \
         abl-rmadapt-s0 no longer computes what they were measured with ({}).\n\
         Re-measure them on an avx512 CPU: `benches/ablation.sh {iterations} ./runs-ablation/{env} \
         docs/src/ablation/{env} {env}` (rewrites fingerprint.csv), then update the README's \
         tables{also}.\n--- {path}\n{want}--- now\n{got}",
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

/// The SmolLM2 curves' loops (`pipelines/ablation/<env>-smollm2.toml`) stay those their kept
/// grids ran. SmolLM2's weights are not among the tests' inputs (and its iteration takes
/// minutes), so seed 0's full loop runs its first iteration with a tiny pretrained-format model
/// over bytes as policy and reward model in SmolLM2's place: every other key of the file, but
/// f32 products (a bf16 product's last bits differ between CPUs with and without bf16
/// instructions) and contexts long enough for byte-long prompts. Its fingerprint
/// (`ablation_fingerprint.sql`) is compared with `tests/golden/smollm2-loop-<env>.csv`. A change
/// that moves what these loops compute (an environment, a prompt, an order of sampling, a
/// formula, the warm start's choice of demonstrations) fails here: re-measure the grids it moves
/// (or mark their tables stale), then record the fingerprint again with `RLA_PIPE_BLESS=1`. (The
/// random reward model seldom writes a verdict, so its update and the adaptation it drives are
/// left to the small transformers' fingerprints above, which run the same code.)
fn check_smollm2_loop(env: &str) {
    let f = Fixture::new();
    let (policy, rm) = (f.dir.path().join("policy"), f.dir.path().join("rm"));
    crate::hf::byte_model(&policy, "LlamaForCausalLM", 51);
    crate::hf::byte_model(&rm, "LlamaForCausalLM", 52);
    let pipeline = format!("{ROOT}/pipelines/ablation/{env}-smollm2.toml");
    let sets = [
        format!("policy.init=hf:{}", policy.display()),
        format!("reward_model.init=hf:{}", rm.display()),
        "policy.inference_dtype=f32".into(),
        "reward_model.inference_dtype=f32".into(),
        "update.base_dtype=f32".into(),
        "policy.context=4096".into(),
        "reward_model.context=4096".into(),
    ];
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let got = first_iteration_fingerprint(&f, &pipeline, &sets);
    let avx512 = format!("{ROOT}/tests/golden/smollm2-loop-{env}.csv");
    let path = crate::reference_for_cpu(std::path::Path::new(&avx512));
    if std::env::var_os("RLA_PIPE_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
    }
    let Ok(want) = std::fs::read_to_string(&path) else {
        // A class of CPU with no recorded fingerprint (recorded: avx512) rounds the models'
        // arithmetic differently; the planner's demonstrations are the part it shares.
        let demos = |t: &str| {
            t.lines()
                .find(|l| l.starts_with("demonstrations,"))
                .map(str::to_string)
        };
        let want = std::fs::read_to_string(&avx512).unwrap();
        assert_eq!(
            demos(&got),
            demos(&want),
            "{avx512}: the warm start's demonstrations"
        );
        eprintln!(
            "{}: missing: only the demonstrations compared on this class of CPU ({}); record \
             it with RLA_PIPE_BLESS=1",
            path.display(),
            crate::numerics()
        );
        return;
    };
    assert!(
        got == want,
        "pipelines/ablation/{env}-smollm2.toml's loop no longer computes what its kept grids \
         ran (docs/src/ablation.md, with their commands): re-measure the grids this change moves \
         or mark their tables stale, then record the fingerprint again (RLA_PIPE_BLESS=1).\n\
         --- {}\n{want}--- now\n{got}",
        path.display()
    );
}

#[test]
fn smollm2_loop_is_current_household() {
    check_smollm2_loop("household");
}

/// TextWorld's games come from `tw-make` (the test installs `textworld==1.7.0` with pip if it
/// is missing).
#[test]
fn smollm2_loop_is_current_textworld() {
    crate::python_packages("textworld", &["textworld==1.7.0"]);
    check_smollm2_loop("textworld");
}

/// `benches/ablation.sh` stops with a one-line error and exit status 2, before it runs anything,
/// on a malformed VARIANTS value, seed count or REEVAL (the binary given, so nothing is built).
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
        (
            "REEVAL",
            "0",
            "REEVAL takes a number of episodes per held-out game, not '0'",
        ),
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
            .env("RLA_PIPE_BIN", crate::rla_pipe_bin())
            .env(key, value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{key}={value}: {err}");
        assert!(err.contains(want), "{key}={value}: {err}");
        assert!(!store.exists(), "{key}={value} created the store");
    }
}

/// A grid longer than one machine's lifetime: `KEEP` keeps each seed's runs, `REEVAL=4` their
/// 64-episode-style re-evaluations (`e4-pre-s<seed>`, `e4-<setting>-s<seed>`); a variant added
/// later on a machine whose store lacks the kept full loop runs on its own — the rows the branch
/// of the full loop would have committed — without running the full loop again; and a third
/// machine finds the seed kept and runs nothing.
#[test]
fn ablation_script_keeps_reevaluates_and_adds_a_variant_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let path = |p: &str| dir.path().join(p);
    let keep = path("kept");
    let script = |store: &str, vars: &[(&str, &str)]| {
        let o = std::process::Command::new("bash")
            .arg(format!("{ROOT}/benches/ablation.sh"))
            .args([
                "2",
                path(store).to_str().unwrap(),
                path("out").to_str().unwrap(),
                "gridnav",
            ])
            .env("RLA_PIPE_BIN", crate::rla_pipe_bin())
            .env("KEEP", &keep)
            .env("REEVAL", "4")
            .env("SEEDS", "1")
            .env("ABL_SEEDS", "0")
            .env(
                "SETS",
                "update.policy_steps=2 update.rm_steps=2 env.initial_tasks=4 \
                 rollout.slots_per_iter=4 rollout.n=4 eval.tasks=4 eval.ood_tasks=4",
            )
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{store}: {err}");
        (String::from_utf8_lossy(&o.stdout).into_owned(), err)
    };
    let kept = |run: &str| keep.join(run).join("_commits").exists();
    let provenance = || std::fs::read_to_string(keep.join("provenance.csv")).unwrap();
    let rla = |args: &[&str]| {
        let o = std::process::Command::new(crate::rla_pipe_bin())
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };

    // Machine 1: seed 0's full loop, its warm start alone, both evaluated again.
    script("a", &[]);
    for r in ["pre-s0", "abl-rmadapt-s0", "e4-pre-s0", "e4-rmadapt-s0"] {
        assert!(kept(r), "{r} not kept");
    }
    let before = provenance();
    assert_eq!(before.lines().count(), 5, "{before}");
    // The fingerprint goes to this class of CPU's file, never another class's.
    let fingerprint = crate::reference_for_cpu(&path("out/fingerprint.csv"));
    let written = std::fs::read_to_string(&fingerprint).unwrap();
    assert!(written.starts_with("part,value\n"), "{written}");
    let files = std::fs::read_dir(path("out")).unwrap();
    let names: Vec<String> = files
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fingerprint"))
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");

    // Machine 2, a fresh store: a variant of the kept seed.
    let variant = [("VARIANTS", "v:rollout.n=2"), ("VARIANT_SEEDS", "1")];
    let (out, err) = script("b", &variant);
    assert!(err.contains("== abl-rmadapt-s0: kept in"), "{err}");
    assert!(!path("b/abl-rmadapt-s0").exists() && !path("b/pre-s0").exists());
    assert!(kept("abl-v-s0") && kept("e4-v-s0"));
    // The tables and the figure name the variant by its settings.
    assert!(out.contains("| v: rollout.n=2 |"), "{out}");
    let figure = std::fs::read_to_string(path("out/learning_curve.svg")).unwrap();
    assert!(figure.contains(">v: rollout.n=2 (1 seed)<"), "{figure}");
    let b = path("b").display().to_string();
    assert!(!rla(&["show", "--store", &b, "abl-v-s0"]).contains("branch of"));
    let after = provenance();
    assert!(
        after.starts_with(&before),
        "rows of the kept runs changed:\n{after}"
    );
    assert_eq!(after.lines().count(), 7, "{after}");
    // The gains of the re-evaluations, and the variant paired with the full loop on seed 0:
    // its difference is the two gains' of reeval_gain.sql's rows.
    let gains = std::fs::read_to_string(path("out/reeval_gain.csv")).unwrap();
    let column = gains
        .lines()
        .next()
        .and_then(|header| header.split(',').position(|c| c == "gain"))
        .unwrap_or_else(|| panic!("no gain column in {gains}"));
    let gain = |setting: &str| -> f64 {
        let row = gains
            .lines()
            .find(|l| l.starts_with(&format!("{setting},0,")))
            .unwrap_or_else(|| panic!("no {setting} row in {gains}"));
        row.split(',').nth(column).unwrap().parse().unwrap()
    };
    let paired = format!(
        "| v | 0 | {:+.3} | {:+.3} | {:+.3} |",
        gain("v"),
        gain("rmadapt"),
        gain("v") - gain("rmadapt")
    );
    assert!(out.contains(&paired), "no `{paired}` in:\n{out}");

    // Its rows are the branch's: the variant branched from the full loop on machine 1.
    let a = path("a").display().to_string();
    rla(&[
        "replay",
        "--store",
        &a,
        "--run",
        "abl-rmadapt-s0",
        "--from",
        "0",
        "--set",
        "rollout.n=2",
        "--into",
        "abl-v-s0",
        "--iterations",
        "2",
    ]);
    for table in [
        "trajectories",
        "step_rewards",
        "evaluations",
        "update_metrics",
    ] {
        let q = format!("SELECT * EXCEPT (run_id) FROM {table} WHERE run_id = 'abl-v-s0'");
        let rows = |store: &str| {
            let mut l: Vec<String> = rla(&["sql", "--store", store, "--format", "csv", &q])
                .lines()
                .map(String::from)
                .collect();
            l.sort();
            l
        };
        let (branch, own) = (rows(&a), rows(&b));
        assert!(branch.len() > 1, "{table}: no rows");
        assert_eq!(
            branch, own,
            "{table}: the run on its own differs from the branch"
        );
    }

    // Machine 3: everything kept, nothing runs.
    let (_, err) = script("c", &variant);
    assert!(err.contains("== seed 0: kept in"), "{err}");
    assert!(!path("c/abl-v-s0").exists());
    assert_eq!(provenance(), after);
}

/// `benches/learning_curve.py --svg`: with more settings than a legend row holds (three
/// settings and a variant named by its long settings, `--variants`), every legend entry lies
/// inside the figure (the fourth was drawn on its bottom edge, cut in half) and no label runs
/// into the next entry (they were 200 px apart, and "+ reward model + adaptation (3 seeds)" is
/// wider).
#[test]
fn learning_curve_figure_holds_its_whole_legend() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("curve.csv");
    let mut rows = String::from(
        "setting,seed,run_id,iter,held_out,held_out_greedy,ood,ood_greedy,rm_process\n",
    );
    for seed in 0..2 {
        rows += &format!("warm,{seed},pre-s{seed},0,0.25,0.25,0.0,0.0,0.5\n");
        for setting in ["policy", "rm", "rmadapt", "v"] {
            for iter in 0..2 {
                let x = 0.25 + 0.125 * (seed + iter) as f64;
                rows +=
                    &format!("{setting},{seed},abl-{setting}-s{seed},{iter},{x},{x},0.0,0.0,0.5\n");
            }
        }
    }
    std::fs::write(&csv, rows).unwrap();
    let svg = dir.path().join("curve.svg");
    let o = std::process::Command::new("python3")
        .arg(format!("{ROOT}/benches/learning_curve.py"))
        .arg(&csv)
        .arg("--svg")
        .arg(&svg)
        .arg("--variants")
        .arg("v:env.initial_tasks=32,rollout.slots_per_iter=8,reward.train_candidates=false")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg = std::fs::read_to_string(&svg).unwrap();
    let attr = |s: &str, name: &str| -> f64 {
        let at = s.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        s[at..].split('"').next().unwrap().parse().unwrap()
    };
    let height = attr(&svg, "height");
    let legend: Vec<&str> = svg
        .lines()
        .filter(|l| l.contains(" seeds)</text>"))
        .collect();
    assert_eq!(legend.len(), 4, "{svg}");
    assert!(
        legend[3].contains(">v: env.initial_tasks=32, rollout.slots_per_iter=8, "),
        "{}",
        legend[3]
    );
    let width = attr(&svg, "width");
    // (x, y, characters) of each label; 5.5 px a character is less than any sans-serif font's
    // mean at 11 px, so a label ends at or after x + 5.5 × characters.
    let labels: Vec<(f64, f64, usize)> = legend
        .iter()
        .map(|line| {
            let text = &line[line.find("<text").unwrap()..];
            let chars = text[text.find('>').unwrap() + 1..text.find("</text>").unwrap()]
                .chars()
                .count();
            (attr(text, "x"), attr(text, "y"), chars)
        })
        .collect();
    for (i, &(x, y, chars)) in labels.iter().enumerate() {
        // A baseline 4 px above the bottom edge leaves room for the descenders.
        assert!(y + 4.0 <= height, "{} outside height {height}", legend[i]);
        assert!(
            x + 5.5 * chars as f64 <= width,
            "{} past width {width}",
            legend[i]
        );
        if let Some(&(next_x, next_y, _)) = labels.get(i + 1) {
            assert!(
                next_y > y || x + 5.5 * chars as f64 + 18.0 <= next_x,
                "{} runs into {}",
                legend[i],
                legend[i + 1]
            );
        }
    }
    assert!(
        labels[3].1 > labels[0].1,
        "the long variant wraps to a second row: {labels:?}"
    );
}
