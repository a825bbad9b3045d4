//! The S3 path against a real S3 peer: moto's S3 server, on a free local port. The test installs
//! moto with pip if it is missing (the machine has PyPI access; CI does the same).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Fixture, Run};

pub(crate) struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    /// The environment a client of this server needs.
    pub(crate) fn env(&self) -> [(&'static str, String); 5] {
        [
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn python(code: &str) -> bool {
    Command::new("python3")
        .args(["-c", code])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub(crate) fn start_moto() -> Moto {
    crate::python_packages("moto.server", &["moto[server]==5.2.1"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto");
    let moto = Moto { child, port };
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(30), "moto did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let create = format!(
        "import urllib.request; urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:{port}/rla', method='PUT'))"
    );
    assert!(python(&create), "could not create the bucket");
    moto
}

/// Distinctive credentials (moto accepts any), so that a leak into any output can be found.
const ACCESS_KEY: &str = "AKIARLAPIPETESTKEY01";
const SECRET_KEY: &str = "rla-pipe-test-secret-3f9c2e71b6";

pub(crate) fn rla_s3(f: &Fixture, moto: &Moto, args: &[&str]) -> Run {
    let mut cmd = Command::new(crate::rla_pipe_bin());
    cmd.current_dir(f.dir.path())
        .env_remove("RUST_LOG")
        .envs(moto.env())
        .args(args);
    Run::from(cmd.output().unwrap())
}

/// moto, and a fixture whose small pipeline has run `iterations` iterations on the S3 store
/// `url` (run id `small`).
pub(crate) fn small_run_on_s3(url: &str, iterations: &str) -> (Moto, Fixture) {
    let moto = start_moto();
    let f = Fixture::new();
    let cfg = f.config().display().to_string();
    rla_s3(
        &f,
        &moto,
        &["run", &cfg, "--store", url, "--iterations", iterations],
    )
    .ok();
    (moto, f)
}

#[test]
fn s3_store_end_to_end() {
    let url = "s3://rla/some/prefix";
    let (moto, f) = small_run_on_s3(url, "1");
    let cfg = f.config().display().to_string();
    // The same run on a local store commits byte-identical files.
    f.run_small(&["--iterations", "1"]).ok();
    let q = "SELECT stage, rows, bytes FROM stage_runs ORDER BY stage";
    let remote = rla_s3(&f, &moto, &["sql", "--store", url, "--format", "csv", q])
        .ok()
        .stdout;
    assert_eq!(remote, f.sql(q).ok().stdout);
    let q = "SELECT count(*) FROM rm_advantages";
    let n = rla_s3(&f, &moto, &["sql", "--store", url, "--format", "csv", q])
        .ok()
        .scalar();
    assert!(n.parse::<u64>().unwrap() > 0);
    assert_eq!(n, f.sql(q).ok().scalar());
    let r = rla_s3(
        &f,
        &moto,
        &[
            "replay", "--store", url, "--run", "small", "--iter", "0", "--verify",
        ],
    )
    .ok();
    assert!(r.stdout.contains("verified (8 tables)"), "{}", r.stdout);
    // Resume on S3 skips everything; runs and gc see the run under the prefix.
    let r = rla_s3(
        &f,
        &moto,
        &["run", &cfg, "--store", url, "--iterations", "1"],
    )
    .ok();
    assert!(r.stderr.contains("already committed"), "{}", r.stderr);
    let runs = rla_s3(&f, &moto, &["runs", "--store", url]).ok();
    assert!(runs.stdout.contains("small"), "{}", runs.stdout);
    let gc = rla_s3(&f, &moto, &["gc", "--store", url, "--grace-secs", "0"]).ok();
    assert!(
        gc.stdout.contains("removed 0 unreferenced"),
        "{}",
        gc.stdout
    );

    // Two writers of one run id on S3 (conditional puts): each commits or stops on a commit
    // conflict; the run is whole and verifies.
    let race = |_: usize| {
        rla_s3(
            &f,
            &moto,
            &[
                "-q",
                "run",
                &cfg,
                "--store",
                url,
                "--run-id",
                "race",
                "--iterations",
                "2",
            ],
        )
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| race(0));
        let b = s.spawn(|| race(1));
        (a.join().unwrap(), b.join().unwrap())
    });
    for r in [&a, &b] {
        assert!(
            r.code == 0 || (r.code == 1 && r.stderr.contains("commit conflict")),
            "{} {}",
            r.code,
            r.stderr
        );
    }
    assert!(a.code == 0 || b.code == 0);
    let r = rla_s3(
        &f,
        &moto,
        &[
            "run",
            &cfg,
            "--store",
            url,
            "--run-id",
            "race",
            "--iterations",
            "2",
        ],
    )
    .ok();
    assert!(!r.stderr.contains("panicked"));
    for iter in ["0", "1"] {
        rla_s3(
            &f,
            &moto,
            &[
                "replay", "--store", url, "--run", "race", "--iter", iter, "--verify",
            ],
        )
        .ok();
    }

    // The credentials never reach any command's output, log, or the report, nor anything the
    // store holds (every table of every run through `sql`, the manifests through `show`).
    let report = f.dir.path().join("s3-report.html");
    let report_arg = report.display().to_string();
    let mut outputs = Vec::new();
    for args in [
        vec![
            "-v",
            "run",
            &cfg,
            "--store",
            url,
            "--run-id",
            "race",
            "--iterations",
            "2",
        ],
        vec!["-v", "sql", "--store", url, "SELECT * FROM stage_runs"],
        vec![
            "-v",
            "sql",
            "--store",
            url,
            "--format",
            "json",
            "SELECT * FROM rm_samples LIMIT 50",
        ],
        vec!["-v", "show", "--store", url, "race"],
        vec!["-v", "runs", "--store", url],
        vec![
            "-v", "replay", "--store", url, "--run", "race", "--iter", "0", "--verify",
        ],
        vec!["-v", "gc", "--store", url, "--dry-run"],
        vec!["-v", "report", "--store", url, "race", "--out", &report_arg],
        vec![
            "-v", "replay", "--store", url, "--run", "race", "--from", "1", "--into", "branch",
        ],
        vec!["sql", "--store", "s3://no-such-bucket/x", "SELECT 1"],
    ] {
        let r = rla_s3(&f, &moto, &args);
        outputs.push(format!("{args:?}\n{}\n{}", r.stdout, r.stderr));
    }
    // Every row of every table of both runs.
    for table in crate::DATA_TABLES.into_iter().chain(["stage_runs"]) {
        let q = format!("SELECT * FROM {table}");
        let r = rla_s3(&f, &moto, &["sql", "--store", url, "--format", "json", &q]).ok();
        outputs.push(r.stdout);
    }
    outputs.push(std::fs::read_to_string(&report).unwrap());
    for o in &outputs {
        assert!(
            !o.contains(SECRET_KEY) && !o.contains(ACCESS_KEY),
            "a credential leaked: {o}"
        );
    }
}
