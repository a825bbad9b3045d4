//! The commit protocol through the library: put-if-absent, one winner among concurrent writers.

use rla_pipe::Error;
use rla_pipe::config::Config;
use rla_pipe::engine::{Dag, Engine};
use rla_pipe::store::Store;

fn config() -> Config {
    Config::from_toml(crate::SMALL, "small.toml").unwrap()
}

async fn engine(url: &str) -> Engine {
    let cfg = config();
    let dag = Dag::for_config(&cfg).unwrap();
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
    let dag = Dag::for_config(&cfg).unwrap();
    let e = Engine::open(store.clone(), "small", cfg, dag)
        .await
        .unwrap();
    e.run(1, None).await.unwrap();
    let report = rla_pipe::engine::replay::verify(&store, "small", 0, None)
        .await
        .unwrap();
    assert_eq!(report.len(), 8);
    assert!(report.iter().all(|v| v.how == "replayed"));
}

#[tokio::test]
async fn open_refuses_changed_config() {
    let store = Store::open("memory://").unwrap();
    let cfg = config();
    let dag = Dag::for_config(&cfg).unwrap();
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
