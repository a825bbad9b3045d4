//! A store written by an earlier build (`tests/fixtures/store-2026-11-23`, never regenerated):
//! this build must read it as it is — `sql` (the numbers it held), `report`, `replay --verify`
//! of every iteration (bit for bit on the class of CPU that wrote it, `avx512`), and resuming
//! the run for one more iteration.

use crate::{Fixture, GRIDNAV, SMALL_GRIDNAV};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/store-2026-11-23"
);

#[test]
fn a_store_written_by_an_earlier_build_stays_readable_replayable_and_resumable() {
    let f = Fixture::new();
    crate::copy_dir(std::path::Path::new(FIXTURE), &f.store());
    let _ = std::fs::remove_file(f.store().join("README.md"));

    // The numbers it held when it was written.
    for (table, rows) in [
        ("tasks", 20),
        ("trajectories", 64),
        ("steps", 567),
        ("rm_samples", 1701),
        ("step_rewards", 567),
        ("policy_advantages", 567),
        ("rm_advantages", 1701),
        ("update_metrics", 8),
        ("task_accuracy", 16),
        ("judgements", 4),
        ("adaptations", 9),
        ("evaluations", 32),
        ("demonstrations", 77),
        ("stage_runs", 21),
    ] {
        let r = f.sql(&format!("SELECT count(*) FROM {table}"));
        assert_eq!(r.code, 0, "{table}: {}", r.stderr);
        assert_eq!(
            r.stdout.lines().nth(1),
            Some(rows.to_string().as_str()),
            "{table}"
        );
    }
    let r = f.sql(
        "SELECT iter, split, sum(successes) s, sum(rollouts) n FROM evaluations \
         GROUP BY iter, split ORDER BY iter, split",
    );
    assert_eq!(
        r.stdout,
        "iter,split,s,n\n0,held_out,3,8\n0,ood,1,8\n1,held_out,2,8\n1,ood,0,8\n"
    );
    // Its `policy_advantages` files are not in key order (DataFusion 55.2 dropped the stage's
    // final sort; README, Known problem): `sql` must not take them for sorted, or `ORDER BY`
    // the key is skipped and, on one partition, ordered grouping splits groups.
    let q = "SELECT task_id, traj_id, step_idx FROM policy_advantages WHERE iter = 0 \
             ORDER BY task_id, traj_id, step_idx";
    let rows = f.sql(q).ok().stdout;
    let got: Vec<&str> = rows.lines().skip(1).collect();
    let mut sorted = got.clone();
    sorted.sort_by_key(|l| {
        let c: Vec<&str> = l.split(',').collect();
        (
            c[0].to_string(),
            c[1].to_string(),
            c[2].parse::<u32>().unwrap(),
        )
    });
    assert!(
        got == sorted,
        "ORDER BY the key returned rows out of key order, first: {:?}",
        &got[..4]
    );
    let one_partition = std::process::Command::new(crate::rla_pipe_bin())
        .env("RLA_PIPE_STORE", f.store())
        .env("DATAFUSION_EXECUTION_TARGET_PARTITIONS", "1")
        .args([
            "sql",
            "--format",
            "csv",
            "SELECT count(*) FROM (SELECT iter, task_id, traj_id FROM policy_advantages \
             GROUP BY iter, task_id, traj_id)",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&one_partition.stdout),
        "count(*)\n64\n",
        "{}",
        String::from_utf8_lossy(&one_partition.stderr)
    );
    // Its manifests predate `store_seconds`: NULL, not a made-up zero.
    assert_eq!(
        f.sql("SELECT count(store_seconds) FROM stage_runs")
            .ok()
            .scalar(),
        "0"
    );
    let r = f.sql("SELECT round(sum(advantage), 9) AS a FROM policy_advantages");
    assert_eq!(r.stdout, "a\n2.333333333\n");

    let store = f.store_arg();
    let r = f.rla(&["report", "--store", &store, "fixture", "--out", "r.html"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    for iter in ["0", "1"] {
        let r = f.rla(&[
            "replay", "--store", &store, "--run", "fixture", "--iter", iter, "--verify",
        ]);
        // Written on an `avx512` CPU: bit for bit there. Another class of CPU rounds its f32
        // kernels differently (from the warm start's training on), and the replay says where
        // it first differs — a clear mismatch, not a crash; the run still resumes below.
        if crate::numerics() != "avx512" {
            assert!(
                r.code == 0 || (r.code == 1 && r.stderr.contains("replay mismatch: stage ")),
                "iteration {iter} on an {} CPU: {}\n{}",
                crate::numerics(),
                r.stdout,
                r.stderr
            );
            continue;
        }
        assert_eq!(r.code, 0, "iteration {iter}: {}\n{}", r.stdout, r.stderr);
        // This build sorts what DataFusion left out of order: the committed file holds the
        // replayed rows in another order, and is verified by its rows put in key order.
        let reordered: Vec<&str> = r
            .stdout
            .lines()
            .filter(|l| l.ends_with("(replayed, rows in key order)"))
            .collect();
        assert_eq!(reordered.len(), 1, "{}", r.stdout);
        assert!(reordered[0].contains("policy_advantages"), "{}", r.stdout);
        // `evaluate` writes its episodes' steps since a later build: reported, not compared.
        let uncompared: Vec<&str> = r
            .stdout
            .lines()
            .filter(|l| l.contains("not compared"))
            .collect();
        assert_eq!(uncompared.len(), 1, "{}", r.stdout);
        assert!(uncompared[0].contains("eval_steps"), "{}", r.stdout);
    }
    let r = f.run_pipeline(GRIDNAV, "fixture", 3, &SMALL_GRIDNAV);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    let r = f.sql("SELECT count(DISTINCT iter) FROM evaluations WHERE run_id = 'fixture'");
    assert_eq!(r.stdout.lines().nth(1), Some("3"));
    // The iteration this build added: every file checked and in key order (its
    // `policy_advantages` too, whose sort DataFusion drops on this data), and it replays.
    assert_eq!(committed_in_key_order(&f.store(), "fixture", 2), 13);
    let r = f.rla(&[
        "replay", "--store", &store, "--run", "fixture", "--iter", "2", "--verify",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stdout, r.stderr);
    assert!(!r.stdout.contains("not compared"), "{}", r.stdout);
    // The evaluation episodes this build committed: one per held-out and OOD task (one
    // sampled rollout each), their outcomes the counts `evaluations` holds.
    let r = f.sql(
        "SELECT e.split, e.successes, e.rollouts, s.episodes, s.won FROM \
           (SELECT split, sum(successes) AS successes, sum(rollouts) AS rollouts \
            FROM evaluations WHERE run_id = 'fixture' AND iter = 2 GROUP BY split) e \
         JOIN (SELECT split, count(*) AS episodes, sum(CASE WHEN outcome > 0 THEN 1 ELSE 0 END) AS won \
               FROM eval_steps WHERE run_id = 'fixture' AND iter = 2 AND step_idx = 0 \
               GROUP BY split) s \
         ON e.split = s.split ORDER BY e.split",
    );
    let rows = r.ok().csv();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        assert_eq!((&row[1], &row[2]), (&row[4], &row[3]), "{rows:?}");
    }
}

/// Check every data file committed for iteration `iter` of `run`: its manifest entry says the
/// writer checked key order (`sorted`), and its rows are in the table's key order. Returns
/// how many files were checked.
pub fn committed_in_key_order(store: &std::path::Path, run: &str, iter: u32) -> usize {
    use arrow::row::{RowConverter, SortField};
    let commits = store.join(run).join(format!("_commits/iter={iter:06}"));
    let mut checked = 0;
    for e in std::fs::read_dir(&commits).unwrap() {
        let path = e.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with('_') {
            continue;
        }
        let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for out in m["outputs"].as_array().unwrap() {
            let table = out["table"].as_str().unwrap();
            assert_eq!(out["sorted"], true, "{}: {table}", path.display());
            let def = rla_pipe::schema::table_def(table).unwrap();
            let file = std::fs::File::open(store.join(out["path"].as_str().unwrap())).unwrap();
            let reader =
                parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                    .unwrap()
                    .build()
                    .unwrap();
            let idx: Vec<usize> = def
                .key
                .iter()
                .map(|k| def.schema.index_of(k).unwrap())
                .collect();
            let conv = RowConverter::new(
                idx.iter()
                    .map(|i| SortField::new(def.schema.field(*i).data_type().clone()))
                    .collect(),
            )
            .unwrap();
            let mut keys = Vec::new();
            for b in reader {
                let b = b.unwrap();
                let cols: Vec<_> = def
                    .key
                    .iter()
                    .map(|k| b.column_by_name(k).unwrap().clone())
                    .collect();
                let rows = conv.convert_columns(&cols).unwrap();
                keys.extend(rows.iter().map(|r| r.owned()));
            }
            assert!(
                keys.windows(2).all(|w| w[0] <= w[1]),
                "{table} of iteration {iter} is not in key order ({})",
                def.key.join(", ")
            );
            checked += 1;
        }
    }
    checked
}

/// A manifest naming a file outside its run (another run's, `..`, an absolute path) is a
/// corrupt manifest, named, for every reader — never data read from elsewhere.
#[test]
fn manifests_cannot_name_files_outside_their_run() {
    for forged in [
        "../../etc/passwd",
        "other/data/steps/iter=000000/x.parquet",
        "/etc/passwd",
        "fixture/data/../../other/x.parquet",
    ] {
        let f = Fixture::new();
        crate::copy_dir(std::path::Path::new(FIXTURE), &f.store());
        let m = f.store().join("fixture/_commits/iter=000000/rollout.json");
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
        v["outputs"][0]["path"] = forged.into();
        std::fs::write(&m, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
        let store = f.store_arg();
        for args in [
            vec!["sql", "--store", &store, "SELECT count(*) FROM steps"],
            vec![
                "replay", "--store", &store, "--run", "fixture", "--iter", "0", "--verify",
            ],
            vec!["show", "--store", &store, "fixture"],
        ] {
            let r = f.rla(&args);
            assert_eq!(r.code, 1, "{forged} {args:?}: {}", r.stdout);
            assert!(
                r.stderr.contains("corrupt manifest") && r.stderr.contains("rollout.json"),
                "{forged} {args:?}: {}",
                r.stderr
            );
        }
    }
}

/// A forged `shared` reference (to its own run, or to another run while naming its own files)
/// is a corrupt manifest too.
#[test]
fn forged_shared_references_are_corrupt_manifests() {
    for (run, path, needle) in [
        (
            "fixture",
            "fixture/_commits/iter=000000/rollout.json",
            "is shared from",
        ),
        (
            "other",
            "other/_commits/iter=000001/rollout.json",
            "is shared from",
        ),
        (
            "other",
            "other/_commits/iter=000000/rollout.json",
            "a file outside run \"other\"",
        ),
    ] {
        let f = Fixture::new();
        crate::copy_dir(std::path::Path::new(FIXTURE), &f.store());
        let m = f.store().join("fixture/_commits/iter=000000/rollout.json");
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
        v["shared"] = serde_json::json!({"run": run, "path": path, "digest": "00"});
        std::fs::write(&m, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
        f.sql("SELECT count(*) FROM steps")
            .fails(1, &["corrupt manifest", "rollout.json", needle]);
    }
}

/// A run written by an earlier build can be branched: the branch shares its iteration 0 and
/// executes iteration 1 with this build.
#[test]
fn a_run_of_an_earlier_build_can_be_branched() {
    let f = Fixture::new();
    crate::copy_dir(std::path::Path::new(FIXTURE), &f.store());
    let _ = std::fs::remove_file(f.store().join("README.md"));
    f.rla(&[
        "replay",
        "--run",
        "fixture",
        "--from",
        "1",
        "--set",
        "reward.lambda=0.5",
        "--into",
        "b",
    ])
    .ok();
    let rows = f
        .sql("SELECT run_id, iter, count(*) FROM task_accuracy GROUP BY run_id, iter ORDER BY run_id, iter")
        .ok()
        .csv();
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(rows[0][0], "b");
    assert_eq!(rows[0][2], rows[2][2], "{rows:?}");
    f.rla(&["replay", "--run", "b", "--iter", "1", "--verify"])
        .ok();
}

/// A committed file whose column has another type than this build's schema: `sql` names the
/// run, the table, the column and both types instead of failing somewhere in the query.
#[test]
fn a_column_whose_type_changed_is_an_error_naming_both_types() {
    use arrow::array::RecordBatch;
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    let f = Fixture::new();
    crate::copy_dir(std::path::Path::new(FIXTURE), &f.store());
    let dir = f.store().join("fixture/data/task_accuracy/iter=000000");
    let file = crate::first_file(&dir);
    let batches: Vec<RecordBatch> =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(&file).unwrap(),
        )
        .unwrap()
        .build()
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // `acc` as written by a hypothetical build that kept it as text.
    let old = batches[0].schema();
    let fields: Vec<Field> = old
        .fields()
        .iter()
        .map(|fd| {
            if fd.name() == "acc" {
                Field::new("acc", DataType::Utf8, false)
            } else {
                fd.as_ref().clone()
            }
        })
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let mut bytes = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut bytes, schema.clone(), None).unwrap();
    for b in &batches {
        let cols = b
            .columns()
            .iter()
            .zip(old.fields())
            .map(|(c, fd)| {
                if fd.name() == "acc" {
                    arrow::compute::cast(c, &DataType::Utf8).unwrap()
                } else {
                    c.clone()
                }
            })
            .collect();
        w.write(&RecordBatch::try_new(schema.clone(), cols).unwrap())
            .unwrap();
    }
    w.close().unwrap();
    std::fs::write(&file, &bytes).unwrap();
    // The manifest describes the file as it now is (size and digest), as a build that wrote it
    // would have.
    let m = f
        .store()
        .join("fixture/_commits/iter=000000/task_accuracy.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
    v["outputs"][0]["bytes"] = bytes.len().into();
    v["outputs"][0]["digest"] = blake3::hash(&bytes).to_hex().to_string().into();
    std::fs::write(&m, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let r = f.sql("SELECT avg(acc) FROM task_accuracy");
    assert_eq!(r.code, 1, "{}", r.stdout);
    for part in ["\"fixture\"", "task_accuracy", "`acc`", "Utf8", "Float64"] {
        assert!(r.stderr.contains(part), "{part}: {}", r.stderr);
    }
}

/// A Parquet file whose footer claims far more rows than it holds, the manifest forged to match
/// (size, digest, rows): refused by every reader, naming the file — row groups that disagree
/// with their column chunks, or larger than rla-pipe's writer makes (a count would otherwise be
/// answered from the footer, and a filtered scan walk 10^12 rows). A forgery within those
/// bounds and consistent down to every column chunk cannot be seen without decoding; reads of
/// it stay bounded, and `replay --verify` (the audit) finds it.
#[test]
fn a_parquet_file_with_a_forged_row_count_is_refused() {
    use parquet::file::metadata::{ParquetMetaDataReader, ParquetMetaDataWriter};

    // (claimed rows per row group, column chunks forged too)
    for (claimed, deep) in [
        (1_000_000_000_000i64, false),
        (1_000_000_000_000, true),
        (100_000, true),
    ] {
        let f = Fixture::new();
        crate::copy_dir(std::path::Path::new(FIXTURE), &f.store());
        let dir = f.store().join("fixture/data/steps/iter=000000");
        let file = crate::first_file(&dir);
        let bytes = std::fs::read(&file).unwrap();
        let n = bytes.len();
        let len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
        let md = ParquetMetaDataReader::decode_metadata(&bytes[n - 8 - len..n - 8]).unwrap();
        let row_groups = md
            .row_groups()
            .iter()
            .map(|rg| {
                let columns = rg
                    .columns()
                    .iter()
                    .map(|c| {
                        let n = if deep { claimed } else { c.num_values() };
                        c.clone().into_builder().set_num_values(n).build().unwrap()
                    })
                    .collect();
                rg.clone()
                    .into_builder()
                    .set_num_rows(claimed)
                    .set_column_metadata(columns)
                    .build()
                    .unwrap()
            })
            .collect::<Vec<_>>();
        let row_groups_n = row_groups.len() as u64;
        let fm = md.file_metadata();
        let file_meta = parquet::file::metadata::FileMetaData::new(
            fm.version(),
            claimed * row_groups_n as i64,
            fm.created_by().map(str::to_string),
            fm.key_value_metadata().cloned(),
            fm.schema_descr_ptr(),
            fm.column_orders().cloned(),
        );
        let forged_md = parquet::file::metadata::ParquetMetaData::new(file_meta, row_groups);
        let mut forged = bytes[..n - 8 - len].to_vec();
        let mut footer = Vec::new();
        ParquetMetaDataWriter::new(&mut footer, &forged_md)
            .finish()
            .unwrap();
        forged.extend_from_slice(&footer);
        std::fs::write(&file, &forged).unwrap();
        let m = f.store().join("fixture/_commits/iter=000000/rollout.json");
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&m).unwrap()).unwrap();
        for o in v["outputs"].as_array_mut().unwrap() {
            if o["table"] == "steps" {
                o["bytes"] = forged.len().into();
                o["digest"] = blake3::hash(&forged).to_hex().to_string().into();
                o["rows"] = (claimed as u64 * row_groups_n).into();
            }
        }
        std::fs::write(&m, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
        let name = file.file_name().unwrap().to_str().unwrap().to_string();
        for q in [
            "SELECT count(*) FROM steps",
            "SELECT * FROM steps",
            "SELECT avg(action_logprob) FROM steps WHERE iter = 0",
        ] {
            let r = f.sql(q);
            if claimed <= 131_072 && deep {
                assert!(!r.stderr.contains("panicked"), "{q}: {}", r.stderr);
            } else {
                r.fails(1, &[&name, "forged or corrupt"]);
            }
        }
        let replay = f.rla(&[
            "replay", "--run", "fixture", "--iter", "0", "--stage", "rollout", "--verify",
        ]);
        if claimed <= 131_072 && deep {
            replay.fails(
                1,
                &[
                    "stage rollout",
                    "table steps differs",
                    "committed 100000 rows",
                ],
            );
        } else {
            replay.fails(1, &[&name, "forged or corrupt"]);
        }
    }
}
