//! `rla-pipe files`: the committed files of a run, for readers outside rla-pipe (Polars, DuckDB,
//! pyarrow), which must read exactly what `sql` reads — never an uncommitted attempt.

use crate::{Fixture, Run};

/// A run of the small synthetic pipeline plus an uncommitted attempt beside a committed file
/// (an interrupted stage, or the loser of a commit race, leaves such files until `gc`).
fn run_with_an_uncommitted_attempt() -> Fixture {
    let f = Fixture::new();
    f.run_small(&["--iterations", "2"]).ok();
    let dir = f.store().join("small/data/step_rewards/iter=000001");
    let committed = crate::first_file(&dir);
    std::fs::copy(&committed, dir.join("zzzz-uncommitted-attempt.parquet")).unwrap();
    f
}

#[test]
fn files_lists_exactly_the_committed_files() {
    let f = run_with_an_uncommitted_attempt();
    let text = f.rla(&["files", "--run", "small"]).ok();
    assert!(!text.stdout.contains("uncommitted"), "{}", text.stdout);
    let lines: Vec<Vec<&str>> = text
        .stdout
        .lines()
        .map(|l| l.split('\t').collect())
        .collect();
    let files_in_manifests = f
        .sql("SELECT count(*) FROM stage_runs")
        .ok()
        .scalar()
        .parse::<usize>()
        .unwrap();
    assert!(lines.len() >= files_in_manifests, "{}", text.stdout);
    for l in &lines {
        assert_eq!(l.len(), 6, "{l:?}");
        assert!(std::path::Path::new(l[0]).is_absolute() && std::path::Path::new(l[0]).exists());
        assert_eq!(l[5].len(), 64, "blake3 hex");
        let bytes = std::fs::read(l[0]).unwrap();
        assert_eq!(bytes.len().to_string(), l[4]);
        assert_eq!(blake3::hash(&bytes).to_hex().as_str(), l[5]);
    }

    // Filters: a table, an iteration, a range; rows equal `sql`'s.
    let json = f
        .rla(&[
            "files",
            "--run",
            "small",
            "--table",
            "step_rewards",
            "--iters",
            "1..2",
            "--format",
            "json",
        ])
        .ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let listed = v.as_array().unwrap();
    assert!(!listed.is_empty());
    let rows: u64 = listed.iter().map(|f| f["rows"].as_u64().unwrap()).sum();
    for file in listed {
        assert_eq!(file["table"], "step_rewards");
        assert_eq!(file["iter"], 1);
        assert_eq!(file["run"], "small");
        assert!(file["written_by"].is_null());
    }
    let counted = f
        .sql("SELECT count(*) FROM step_rewards WHERE iter = 1")
        .ok()
        .scalar();
    assert_eq!(rows.to_string(), counted);
    let one = f
        .rla(&["files", "--run", "small", "--table", "tasks", "--iter", "0"])
        .ok();
    assert!(
        one.stdout.lines().all(|l| l.contains("\ttasks\t0\t")),
        "{}",
        one.stdout
    );
    let inclusive = f.rla(&["files", "--run", "small", "--iters", "0..=1"]).ok();
    assert_eq!(inclusive.stdout, text.stdout);

    // Values the parser cannot check alone are usage errors too: exit 2, `error: usage error:`.
    f.rla(&["files", "--run", "small", "--table", "nope"])
        .fails(2, &["error: usage error: --table nope", "tables:"]);
    f.rla(&["files", "--run", "small", "--iters", "2..1"])
        .fails(2, &["2..1", "empty"]);
    f.rla(&["files", "--run", "small", "--iters", "x"])
        .fails(2, &["A..B"]);
    f.rla(&["files", "--run", "nosuch"])
        .fails(1, &["nosuch", "not found"]);
}

/// The Python readers the tests use (the versions the README names).
fn python_readers() {
    crate::python_packages(
        "polars, duckdb, pyarrow",
        &["polars==2.1.0", "duckdb==2.0.1", "pyarrow==26.0.1"],
    );
}

/// `tests/readers/read_committed.py` over `rla-pipe files`' list of `step_rewards` of run
/// `small` in `store`, with `env` (the S3 environment for an `s3://` store): each reader's
/// (rows, sum of reward), checked against `sql`'s `want` for the `readers` named.
fn readers_agree_with_sql(
    store: &str,
    env: &[(&str, String)],
    want: &Run,
    readers: &[&str],
) -> serde_json::Value {
    python_readers();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/readers/read_committed.py"
    );
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(crate::rla_pipe_bin())
        .args([store, "small", "step_rewards", "reward"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want = want.csv();
    let (rows, sum): (u64, f64) = (want[0][0].parse().unwrap(), want[0][1].parse().unwrap());
    for reader in readers {
        assert_eq!(got[reader][0].as_u64(), Some(rows), "{reader}: {got}");
        let s = got[reader][1].as_f64().unwrap();
        assert!(
            (s - sum).abs() <= 1e-9 * sum.abs().max(1.0),
            "{reader}: {s} vs {sum}"
        );
    }
    got
}

const COUNT_AND_SUM: &str = "SELECT count(*), sum(reward) FROM step_rewards";

/// Polars (eager and lazy), DuckDB and pyarrow read `files`' list and get exactly `sql`'s rows
/// and sums, although an uncommitted attempt lies in the same directory.
#[test]
fn python_readers_get_exactly_the_committed_rows() {
    let f = run_with_an_uncommitted_attempt();
    let want = f.sql(COUNT_AND_SUM).ok();
    readers_agree_with_sql(
        &f.store_arg(),
        &[],
        &want,
        &["polars", "lazy", "duckdb", "pyarrow"],
    );
    let rows: u64 = want.csv()[0][0].parse().unwrap();
    // The directory listing a user might glob holds more rows than were committed.
    let all = std::process::Command::new("python3")
        .args([
            "-c",
            &format!(
                "import polars as pl; print(pl.scan_parquet('{}/small/data/step_rewards/**/*.parquet').select(pl.len()).collect()[0,0])",
                f.store_arg()
            ),
        ])
        .output()
        .unwrap();
    let globbed: u64 = String::from_utf8_lossy(&all.stdout).trim().parse().unwrap();
    assert!(
        globbed > rows,
        "the uncommitted attempt should be visible to a glob: {globbed} vs {rows}"
    );
}

/// The README's S3 lines: Polars (eager and lazy, `storage_options`) and pyarrow
/// (`S3FileSystem`) read `files`' `s3://` URLs from an S3 server (moto) and get exactly `sql`'s
/// rows, although an uncommitted attempt lies beside a committed file in the bucket. (DuckDB
/// reads S3 through its `httpfs` extension, which it downloads at run time: not testable
/// offline.)
#[test]
fn python_readers_read_s3_stores() {
    let url = "s3://rla/readers";
    let (moto, f) = crate::s3::small_run_on_s3(url, "2");
    let listed = crate::s3::rla_s3(
        &f,
        &moto,
        &[
            "files",
            "--store",
            url,
            "--run",
            "small",
            "--table",
            "step_rewards",
        ],
    )
    .ok();
    let committed = listed
        .stdout
        .lines()
        .next()
        .unwrap()
        .split('\t')
        .next()
        .unwrap();
    let key = committed.strip_prefix("s3://rla/").unwrap();
    let attempt = format!(
        "{}/zzzz-uncommitted-attempt.parquet",
        key.rsplit_once('/').unwrap().0
    );
    // An interrupted attempt: a copy of a committed file that no manifest names.
    let copied = std::process::Command::new("python3")
        .args([
            "-c",
            "import boto3, os, sys; boto3.client('s3', endpoint_url=os.environ['AWS_ENDPOINT_URL']).copy_object(Bucket='rla', Key=sys.argv[2], CopySource={'Bucket': 'rla', 'Key': sys.argv[1]})",
            key,
            &attempt,
        ])
        .envs(moto.env())
        .status()
        .unwrap();
    assert!(copied.success());
    let want = crate::s3::rla_s3(
        &f,
        &moto,
        &["sql", "--store", url, "--format", "csv", COUNT_AND_SUM],
    )
    .ok();
    let got = readers_agree_with_sql(url, &moto.env(), &want, &["polars", "lazy", "pyarrow"]);
    assert!(got["duckdb"].is_null(), "{got}");
}

/// `schema --format json` describes exactly the columns `sql` exposes, in order, with a meaning
/// for each; `--format md` prints the schema files.
#[test]
fn schema_describes_the_tables_sql_exposes() {
    let f = Fixture::new();
    f.run_small(&["--iterations", "1"]).ok();
    let all: serde_json::Value =
        serde_json::from_str(&f.rla(&["schema", "--format", "json"]).ok().stdout).unwrap();
    let tables = all.as_array().unwrap();
    assert_eq!(tables.len(), 18);
    for t in tables {
        let name = t["table"].as_str().unwrap();
        let sql_columns: Vec<String> = f
            .sql(&format!(
                "SELECT column_name FROM information_schema.columns WHERE table_name = '{name}' ORDER BY ordinal_position"
            ))
            .ok()
            .csv()
            .into_iter()
            .map(|r| r[0].clone())
            .collect();
        let columns: Vec<String> = t["columns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                assert!(!c["meaning"].as_str().unwrap().is_empty(), "{name}: {c}");
                c["name"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(columns, sql_columns, "{name}");
        assert_eq!(t["fingerprint"].as_str().unwrap().len(), 16);
    }
    let one: serde_json::Value =
        serde_json::from_str(&f.rla(&["schema", "steps", "--format", "json"]).ok().stdout).unwrap();
    assert_eq!(one["table"], "steps");
    let md = f.rla(&["schema", "tasks"]).ok();
    assert_eq!(
        md.stdout,
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/tasks.md")).unwrap()
    );
    f.rla(&["schema", "nope"])
        .fails(2, &["error: usage error: no table \"nope\"", "tables:"]);
}
