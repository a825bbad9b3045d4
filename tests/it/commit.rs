//! The commit protocol through the library: put-if-absent, one winner among concurrent writers.

use rla_pipe::Error;
use rla_pipe::config::Config;
use rla_pipe::engine::{Dag, Engine};
use rla_pipe::pipeline;
use rla_pipe::store::Store;

fn config() -> Config {
    Config::from_toml(crate::SMALL, "small.toml").unwrap()
}

async fn engine(url: &str) -> Engine {
    let cfg = config();
    let dag = pipeline::dag(&cfg).unwrap();
    Engine::open(Store::open(url).unwrap(), "small", cfg, dag)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().display().to_string();
    let (a, b) = (engine(&url).await, engine(&url).await);
    // Both compute the same stage of the same iteration and try to commit it.
    let (ra, rb) = tokio::join!(
        a.commit_stage(0, "synthetic"),
        b.commit_stage(0, "synthetic")
    );
    let results = [ra, rb];
    let wins = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(wins, 1, "exactly one writer commits: {results:?}");
    let loser = results
        .into_iter()
        .find(|r| r.is_err())
        .unwrap()
        .unwrap_err();
    assert!(matches!(loser, Error::CommitConflict(_)), "{loser}");
    assert!(
        loser
            .to_string()
            .contains("committed by another writer first"),
        "{loser}"
    );
    // A third, sequential attempt conflicts as well: the manifest is never overwritten.
    assert!(matches!(
        a.commit_stage(0, "synthetic").await,
        Err(Error::CommitConflict(_))
    ));
    // The run continues from the committed stage.
    a.run(1, None).await.unwrap();
}

#[tokio::test]
async fn memory_store_runs_and_verifies() {
    let store = Store::open("memory://").unwrap();
    let cfg = config();
    let dag = pipeline::dag(&cfg).unwrap();
    let e = Engine::open(store.clone(), "small", cfg, dag)
        .await
        .unwrap();
    e.run(1, None).await.unwrap();
    let report = rla_pipe::engine::replay::verify(&store, "small", 0, None, pipeline::dag)
        .await
        .unwrap();
    assert_eq!(report.len(), 8);
    assert!(report.iter().all(|v| v.how == "replayed"));
    let rows = |t: &str| report.iter().find(|v| v.table == t).unwrap().rows;
    assert!(rows("steps") > 0);
    assert_eq!(rows("step_rewards"), rows("steps"));
    assert_eq!(rows("rm_advantages"), rows("rm_samples"));
}

#[tokio::test]
async fn open_refuses_changed_config() {
    let store = Store::open("memory://").unwrap();
    let cfg = config();
    let dag = pipeline::dag(&cfg).unwrap();
    Engine::open(store.clone(), "small", cfg.clone(), dag.clone())
        .await
        .unwrap();
    let mut other = cfg;
    other.reward.rm_acc_max = 0.9;
    let e = Engine::open(store, "small", other, dag)
        .await
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("reward.rm_acc_max: 0.8 → 0.9"),
        "{e}"
    );
}

/// A stage whose output breaks its table's schema: the engine refuses it, names the stage and
/// table, and commits nothing.
struct BadStage {
    nulls: bool,
}

impl rla_pipe::stage::Stage for BadStage {
    fn name(&self) -> &'static str {
        "bad"
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["evaluations"]
    }
    fn run<'a>(&'a self, ctx: &'a rla_pipe::stage::StageContext) -> rla_pipe::stage::StageRun<'a> {
        Box::pin(async move {
            let sql = if self.nulls {
                // task_id is declared non-nullable.
                "SELECT 'r' AS run_id, CAST(0 AS INT UNSIGNED) AS iter, CAST(NULL AS VARCHAR) AS task_id, \
             CAST(1 AS INT UNSIGNED) AS rollouts, CAST(1 AS INT UNSIGNED) AS successes, 'held_out' AS split"
            } else {
                "SELECT 'r' AS run_id, CAST(0 AS INT UNSIGNED) AS iter, 'x' AS task_id, 1.5 AS rollouts"
            };
            let df = ctx.session.sql(sql).await?;
            Ok(vec![(
                "evaluations",
                rla_pipe::stage::TableOutput::Frame(df),
            )])
        })
    }
}

#[tokio::test]
async fn bad_stage_output_is_refused() {
    for (nulls, needle) in [
        (true, "does not fit schemas/evaluations.md"),
        (false, "schemas/evaluations.md declares"),
    ] {
        let store = Store::open("memory://").unwrap();
        let dag = Dag::new(
            vec![std::sync::Arc::new(BadStage { nulls })],
            pipeline::initial_checkpoints(),
        )
        .unwrap();
        let e = Engine::open(store.clone(), "bad", config(), dag)
            .await
            .unwrap();
        let err = e.run(1, None).await.unwrap_err().to_string();
        assert!(err.contains("stage bad") && err.contains(needle), "{err}");
        let committed = store
            .list(&object_store::path::Path::from("bad/_commits"))
            .await
            .unwrap();
        assert!(
            committed.is_empty(),
            "nothing may be committed: {committed:?}"
        );
    }
}

/// Whether [`ToyExec`] records its second run as timed out (a program that behaves otherwise
/// when run again).
static FLIP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A stage writing `executions` whose `seconds` differ at every run (wall-clock time, as the
/// coding setting's `execute`), the other columns fixed unless [`FLIP`] is set.
struct ToyExec;

impl rla_pipe::stage::Stage for ToyExec {
    fn name(&self) -> &'static str {
        "execute"
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["executions"]
    }
    fn run<'a>(&'a self, ctx: &'a rla_pipe::stage::StageContext) -> rla_pipe::stage::StageRun<'a> {
        Box::pin(async move {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
            let flip = FLIP.load(std::sync::atomic::Ordering::SeqCst);
            let mut b = rla_pipe::schema::rows::TableBuilder::new("executions")?;
            for (k, (status, passed)) in [
                ("ok", true),
                (if flip { "timeout" } else { "wrong_answer" }, false),
            ]
            .into_iter()
            .enumerate()
            {
                b.push_str("t")
                    .push_str("p")
                    .push_str("truth")
                    .push_u32(k as u32)
                    .push_bool(passed)
                    .push_str(status)
                    .push_f64(f64::from(nanos) * 1e-9 + k as f64)
                    .push_opt_str(Some("abc"));
            }
            let batch = b.finish_with(&ctx.run_id, ctx.iter)?;
            Ok(vec![(
                "executions",
                rla_pipe::stage::TableOutput::Frame(ctx.session.read_batch(batch)?),
            )])
        })
    }
}

/// A table with wall-clock columns (`executions.seconds`) replays when every other column is
/// equal, and a replay whose status differs is refused, naming the table.
#[tokio::test]
async fn wall_clock_columns_are_left_out_of_replay() {
    let store = Store::open("memory://").unwrap();
    let toy = |_: &Config| {
        Dag::new(
            vec![std::sync::Arc::new(ToyExec)],
            pipeline::initial_checkpoints(),
        )
    };
    let e = Engine::open(store.clone(), "toy", config(), toy(&config()).unwrap())
        .await
        .unwrap();
    e.run(1, None).await.unwrap();
    let report = rla_pipe::engine::replay::verify(&store, "toy", 0, None, toy)
        .await
        .unwrap();
    assert_eq!(report.len(), 1);
    assert_eq!(report[0].how, "replayed, wall-clock columns left out");
    FLIP.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = rla_pipe::engine::replay::verify(&store, "toy", 0, None, toy)
        .await
        .unwrap_err()
        .to_string();
    FLIP.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(
        e.contains("table executions differs (compared without its wall-clock columns seconds)"),
        "{e}"
    );
}
