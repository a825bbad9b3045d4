//! `rla_pipe::frames::scan` (cargo feature `polars`): the LazyFrame of a committed table equals
//! `rla-pipe sql` row for row — with an uncommitted attempt beside the files, and for a branch.

use polars::prelude::*;

use crate::{Fixture, GRIDNAV, SMALL_GRIDNAV};

fn scan(f: &Fixture, run: &str, table: &str) -> DataFrame {
    let store = rla_pipe::store::Store::open_existing(&f.store_arg()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(rla_pipe::frames::scan(&store, run, table))
        .unwrap()
        .collect()
        .unwrap()
}

/// Rows of a DataFrame as CSV-like lines (the columns given), sorted.
fn lines(df: &DataFrame, columns: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = (0..df.height())
        .map(|i| {
            columns
                .iter()
                .map(|c| match df.column(c).unwrap().get(i).unwrap() {
                    AnyValue::String(s) => s.to_string(),
                    AnyValue::StringOwned(s) => s.to_string(),
                    AnyValue::Null => String::new(),
                    v => v.to_string(),
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    out.sort();
    out
}

fn sql_lines(f: &Fixture, run: &str, table: &str, columns: &[&str]) -> Vec<String> {
    f.sql(&format!(
        "SELECT {} FROM {table} WHERE run_id = '{run}'",
        columns.join(", ")
    ))
    .ok()
    .sorted_lines()
}

#[test]
fn lazy_frames_equal_sql_row_for_row() {
    let f = Fixture::new();
    f.run_pipeline(GRIDNAV, "p", 2, &SMALL_GRIDNAV).ok();
    // An uncommitted attempt beside a committed file.
    let dir = f.store().join("p/data/tasks/iter=000001");
    let committed = crate::first_file(&dir);
    std::fs::copy(&committed, dir.join("zzzz-uncommitted.parquet")).unwrap();
    f.rla(&[
        "replay",
        "--run",
        "p",
        "--from",
        "1",
        "--set",
        "reward.lambda=0.5",
        "--into",
        "b",
    ])
    .ok();
    for (table, columns) in [
        (
            "tasks",
            &[
                "run_id",
                "iter",
                "task_id",
                "slot",
                "status",
                "parent_task_id",
                "rolled_out",
            ][..],
        ),
        (
            "step_rewards",
            &["run_id", "iter", "task_id", "traj_id", "step_idx"][..],
        ),
        (
            "judgements",
            &["run_id", "iter", "task_id", "decision", "slot"][..],
        ),
    ] {
        for run in ["p", "b"] {
            let df = scan(&f, run, table);
            assert_eq!(
                lines(&df, columns),
                sql_lines(&f, run, table, columns),
                "{run} {table}"
            );
        }
    }
    // Floats too: the same values, bit for bit.
    let df = scan(&f, "b", "step_rewards");
    let got: f64 = df
        .column("reward")
        .unwrap()
        .as_materialized_series()
        .sum()
        .unwrap();
    let want: f64 = f
        .sql("SELECT sum(reward) FROM step_rewards WHERE run_id = 'b'")
        .ok()
        .scalar()
        .parse()
        .unwrap();
    assert!(
        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
        "{got} vs {want}"
    );
    // A table no stage wrote is empty with its schema; an unknown table is an error.
    let store = rla_pipe::store::Store::open_existing(&f.store_arg()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt
        .block_on(rla_pipe::frames::scan(&store, "p", "nope"))
        .err()
        .unwrap();
    assert!(e.to_string().contains("nope"), "{e}");
}

const TASK_COLUMNS: [&str; 6] = ["run_id", "iter", "task_id", "slot", "status", "rolled_out"];

/// `frames::scan` on an `s3://` store (moto): Polars reads the committed files from S3 with the
/// store's environment and gets `sql`'s rows. The scan runs in a child process of this test
/// binary (`s3_scan_child`), which is given the S3 environment: tests must not set variables
/// in their own, shared process.
#[test]
fn lazy_frames_read_s3_stores() {
    let url = "s3://rla/frames";
    let (moto, f) = crate::s3::small_run_on_s3(url, "1");
    let q = format!("SELECT {} FROM tasks", TASK_COLUMNS.join(", "));
    let want = crate::s3::rla_s3(&f, &moto, &["sql", "--store", url, "--format", "csv", &q])
        .ok()
        .sorted_lines();
    assert!(!want.is_empty());
    let rows = f.dir.path().join("scanned.csv");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "frames::s3_scan_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .envs(moto.env())
        .env("RLA_FRAMES_STORE", url)
        .env("RLA_FRAMES_OUT", &rows)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let got = std::fs::read_to_string(&rows).unwrap();
    assert_eq!(got.lines().collect::<Vec<_>>(), want);
}

/// The child half of `lazy_frames_read_s3_stores`: writes the scanned `tasks` rows, sorted,
/// to `RLA_FRAMES_OUT`.
#[test]
#[ignore = "run by lazy_frames_read_s3_stores, with the S3 environment"]
fn s3_scan_child() {
    let url = std::env::var("RLA_FRAMES_STORE").expect("RLA_FRAMES_STORE");
    let store = rla_pipe::store::Store::open_existing(&url).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let df = rt
        .block_on(rla_pipe::frames::scan(&store, "small", "tasks"))
        .unwrap()
        .collect()
        .unwrap();
    let out = std::env::var("RLA_FRAMES_OUT").expect("RLA_FRAMES_OUT");
    std::fs::write(out, lines(&df, &TASK_COLUMNS).join("\n")).unwrap();
}
