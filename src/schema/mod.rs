//! Arrow schemas of every table the engine commits. `schemas/<table>.md` documents each one and a
//! test checks that the two agree column by column.

pub mod rows;

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

/// `schemas/<table>.md`, compiled in (a test checks it against the code's schema).
pub fn markdown(table: &str) -> Option<&'static str> {
    Some(match table {
        "adaptations" => include_str!("../../schemas/adaptations.md"),
        "demonstrations" => include_str!("../../schemas/demonstrations.md"),
        "eval_steps" => include_str!("../../schemas/eval_steps.md"),
        "evaluations" => include_str!("../../schemas/evaluations.md"),
        "executions" => include_str!("../../schemas/executions.md"),
        "judgements" => include_str!("../../schemas/judgements.md"),
        "policy_advantages" => include_str!("../../schemas/policy_advantages.md"),
        "rm_advantages" => include_str!("../../schemas/rm_advantages.md"),
        "rm_samples" => include_str!("../../schemas/rm_samples.md"),
        "stage_runs" => include_str!("../../schemas/stage_runs.md"),
        "step_rewards" => include_str!("../../schemas/step_rewards.md"),
        "steps" => include_str!("../../schemas/steps.md"),
        "task_accuracy" => include_str!("../../schemas/task_accuracy.md"),
        "tasks" => include_str!("../../schemas/tasks.md"),
        "test_quality" => include_str!("../../schemas/test_quality.md"),
        "trajectories" => include_str!("../../schemas/trajectories.md"),
        "unit_tests" => include_str!("../../schemas/unit_tests.md"),
        "update_metrics" => include_str!("../../schemas/update_metrics.md"),
        _ => return None,
    })
}

/// Columns of a table that hold wall-clock measurements (not reproducible): `replay --verify`
/// compares every other column.
pub fn volatile(table: &str) -> &'static [&'static str] {
    match table {
        "executions" => &["seconds"],
        _ => &[],
    }
}

/// Tables a stage has written only since a later build than its first (`eval_steps`, written
/// by `evaluate` since 2026-11-28): a manifest of an earlier build does not list them, which
/// `replay --verify` reports instead of failing. Any other replayed table the manifest lacks
/// is a mismatch.
pub fn added_to_its_stage_later(table: &str) -> bool {
    matches!(table, "eval_steps")
}

/// The rows of a schema file's column table: (column, type, nullable, meaning).
pub fn markdown_columns(text: &str) -> Vec<(String, String, bool, String)> {
    text.lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect::<Vec<_>>()
        })
        .filter(|c| c.len() >= 4 && c[0] != "column" && !c[0].starts_with('-'))
        .map(|c| {
            (
                c[0].trim_matches('`').to_string(),
                c[1].clone(),
                c[2] == "yes",
                c[3..].join("|"),
            )
        })
        .collect()
}

/// A table's schema as JSON: name, key (row order), and each column's name, Arrow type,
/// nullability and meaning (from `schemas/<table>.md`).
pub fn to_json(t: &TableDef) -> serde_json::Value {
    let docs = markdown(t.name).map(markdown_columns).unwrap_or_default();
    let columns: Vec<_> = t
        .schema
        .fields()
        .iter()
        .map(|f| {
            let meaning = docs
                .iter()
                .find(|d| d.0 == *f.name())
                .map(|d| d.3.clone())
                .unwrap_or_default();
            serde_json::json!({
                "name": f.name(),
                "type": f.data_type().to_string(),
                "nullable": f.is_nullable(),
                "meaning": meaning,
            })
        })
        .collect();
    serde_json::json!({
        "table": t.name,
        "key": t.key,
        "fingerprint": fingerprint(&t.schema),
        "columns": columns,
    })
}

/// A short fingerprint of an Arrow schema (each column's name, type and nullability, in order):
/// what a manifest records as the version of the schema a file was written with.
pub fn fingerprint(schema: &arrow::datatypes::Schema) -> String {
    let mut h = blake3::Hasher::new();
    for f in schema.fields() {
        h.update(format!("{}:{}:{};", f.name(), f.data_type(), f.is_nullable()).as_bytes());
    }
    h.finalize().to_hex()[..16].to_string()
}

/// A committed table: its name, its Arrow schema, and the key its rows are sorted by.
#[derive(Debug, Clone)]
pub struct TableDef {
    pub name: &'static str,
    pub schema: SchemaRef,
    /// Columns (after `run_id`, `iter`) whose ascending order is the table's row order.
    pub key: &'static [&'static str],
}

fn f(name: &str, dt: DataType, nullable: bool) -> Field {
    Field::new(name, dt, nullable)
}

fn table(name: &'static str, key: &'static [&'static str], cols: Vec<Field>) -> TableDef {
    let mut fields = vec![
        f("run_id", DataType::Utf8, false),
        f("iter", DataType::UInt32, false),
    ];
    fields.extend(cols);
    TableDef {
        name,
        schema: Arc::new(Schema::new(fields)),
        key,
    }
}

use DataType::{Boolean, Float64, Int8, UInt32, UInt64, Utf8};

/// What a step of an episode holds after its keys and `step_idx` (`steps`, `eval_steps`).
fn step_fields() -> Vec<Field> {
    vec![
        f("observation", Utf8, false),
        f("action", Utf8, false),
        f("action_logprob", Float64, false),
        f("oracle_progress", Int8, true),
        f("next_observation", Utf8, false),
        f("admissible", Utf8, false),
        f("response", Utf8, true),
    ]
}

/// Every table of DESIGN.md plus `stage_runs`, in DAG order.
pub fn all_tables() -> Vec<TableDef> {
    vec![
        table(
            "demonstrations",
            &["purpose", "task_id", "episode", "step_idx"],
            vec![
                f("purpose", Utf8, false),
                f("task_id", Utf8, false),
                f("episode", UInt32, false),
                f("step_idx", UInt32, false),
                f("observation", Utf8, false),
                f("action", Utf8, false),
                f("planner", Boolean, false),
                f("oracle_progress", Int8, true),
                f("next_observation", Utf8, false),
                f("admissible", Utf8, false),
                f("spec", Utf8, false),
            ],
        ),
        table(
            "tasks",
            &["slot", "status", "task_id"],
            vec![
                f("task_id", Utf8, false),
                f("slot", UInt32, false),
                f("status", Utf8, false),
                f("spec", Utf8, false),
                f("parent_task_id", Utf8, true),
                f("rolled_out", Boolean, true),
                f("seed_task_id", Utf8, true),
                f("seed_spec", Utf8, true),
            ],
        ),
        table(
            "trajectories",
            &["task_id", "traj_id"],
            vec![
                f("task_id", Utf8, false),
                f("traj_id", Utf8, false),
                f("rollout_idx", UInt32, false),
                f("outcome", Int8, false),
                f("num_steps", UInt32, false),
            ],
        ),
        table(
            "steps",
            &["task_id", "traj_id", "step_idx"],
            vec![
                f("task_id", Utf8, false),
                f("traj_id", Utf8, false),
                f("step_idx", UInt32, false),
            ]
            .into_iter()
            .chain(step_fields())
            .collect(),
        ),
        table(
            "rm_samples",
            &["task_id", "traj_id", "step_idx", "sample_idx"],
            vec![
                f("task_id", Utf8, false),
                f("traj_id", Utf8, false),
                f("step_idx", UInt32, false),
                f("sample_idx", UInt32, false),
                f("reasoning", Utf8, false),
                f("score", Int8, false),
                f("response", Utf8, false),
                f("logprob", Float64, false),
            ],
        ),
        table(
            "step_rewards",
            &["task_id", "traj_id", "step_idx"],
            vec![
                f("task_id", Utf8, false),
                f("traj_id", Utf8, false),
                f("step_idx", UInt32, false),
                f("outcome", Int8, false),
                f("rm_mean", Float64, true),
                f("rm_count", UInt32, false),
                f("rm_pos", UInt32, false),
                f("rm_neg", UInt32, false),
                f("rm_unparsable", UInt32, false),
                f("reward", Float64, false),
            ],
        ),
        table(
            "policy_advantages",
            &["task_id", "traj_id", "step_idx"],
            vec![
                f("task_id", Utf8, false),
                f("traj_id", Utf8, false),
                f("step_idx", UInt32, false),
                f("reward", Float64, false),
                f("group_size", UInt32, false),
                f("group_mean", Float64, false),
                f("group_std", Float64, false),
                f("task_acc", Float64, false),
                f("advantage", Float64, false),
                f("included", Boolean, false),
            ],
        ),
        table(
            "rm_advantages",
            &["task_id", "traj_id", "step_idx", "sample_idx"],
            vec![
                f("task_id", Utf8, false),
                f("traj_id", Utf8, false),
                f("step_idx", UInt32, false),
                f("sample_idx", UInt32, false),
                f("score", Int8, false),
                f("consistency_reward", Float64, false),
                f("group_size", UInt32, false),
                f("group_std", Float64, false),
                f("task_acc", Float64, false),
                f("advantage", Float64, false),
                f("included", Boolean, false),
            ],
        ),
        table(
            "update_metrics",
            &["model", "step"],
            vec![
                f("model", Utf8, false),
                f("step", UInt32, false),
                f("loss", Float64, false),
                f("kl", Float64, false),
                f("clip_frac", Float64, false),
                f("grad_norm", Float64, false),
                f("samples", UInt32, false),
                f("tokens", UInt64, false),
            ],
        ),
        table(
            "unit_tests",
            &["task_id", "sample_idx"],
            vec![
                f("task_id", Utf8, false),
                f("sample_idx", UInt32, false),
                f("valid", Boolean, false),
                f("input", Utf8, false),
                f("output", Utf8, false),
            ],
        ),
        table(
            "executions",
            &["task_id", "traj_id", "test_kind", "test_idx"],
            vec![
                f("task_id", Utf8, false),
                f("traj_id", Utf8, false),
                f("test_kind", Utf8, false),
                f("test_idx", UInt32, false),
                f("passed", Boolean, false),
                f("status", Utf8, false),
                f("seconds", Float64, false),
                f("output_digest", Utf8, true),
            ],
        ),
        table(
            "test_quality",
            &["task_id"],
            vec![
                f("task_id", Utf8, false),
                f("programs", UInt32, false),
                f("passing", UInt32, false),
                f("tests", UInt32, false),
                f("valid_tests", UInt32, false),
                f("consistent", UInt32, false),
                f("perfect", UInt32, false),
                f("syn_ut_acc", Float64, true),
                f("perfect_ut_rate", Float64, true),
            ],
        ),
        table(
            "task_accuracy",
            &["task_id"],
            vec![
                f("task_id", Utf8, false),
                f("rollouts", UInt32, false),
                f("successes", UInt32, false),
                f("acc", Float64, false),
                f("judged_steps", UInt32, false),
                f("rm_process_acc", Float64, true),
                f("judged_trajectories", UInt32, false),
                f("rm_outcome_acc", Float64, true),
            ],
        ),
        table(
            "judgements",
            &["slot", "task_id"],
            vec![
                f("task_id", Utf8, false),
                f("parent_task_id", Utf8, false),
                f("direction", Utf8, false),
                f("parent_acc", Float64, false),
                f("acc", Float64, false),
                f("decision", Utf8, false),
                f("slot", UInt32, false),
                f("spec", Utf8, false),
                f("adapter", Utf8, false),
            ],
        ),
        table(
            "adaptations",
            &["slot", "task_id", "candidate_task_id"],
            vec![
                f("task_id", Utf8, false),
                f("candidate_task_id", Utf8, false),
                f("direction", Utf8, false),
                f("prev_acc", Float64, false),
                f("candidate_acc", Float64, true),
                f("decision", Utf8, false),
                f("slot", UInt32, false),
                f("candidate_spec", Utf8, false),
                f("adapter", Utf8, false),
                f("critic", Utf8, true),
            ],
        ),
        table(
            "evaluations",
            &["split", "task_id"],
            vec![
                f("task_id", Utf8, false),
                f("rollouts", UInt32, false),
                f("successes", UInt32, false),
                f("split", Utf8, false),
            ],
        ),
        table(
            "eval_steps",
            &["split", "task_id", "rollout_idx", "step_idx"],
            vec![
                f("split", Utf8, false),
                f("task_id", Utf8, false),
                f("rollout_idx", UInt32, false),
                f("outcome", Int8, false),
                f("step_idx", UInt32, false),
            ]
            .into_iter()
            .chain(step_fields())
            .collect(),
        ),
        table(
            "stage_runs",
            &["stage"],
            vec![
                f("stage", Utf8, false),
                f("status", Utf8, false),
                f("rows", UInt64, false),
                f("bytes", UInt64, false),
                f("seconds", Float64, false),
                f("store_seconds", Float64, true),
                f("cpu_seconds", Float64, true),
                f("peak_rss_bytes", UInt64, true),
                f("peak_device_bytes", UInt64, true),
                f("tokens_computed", UInt64, true),
                f("tokens_reused", UInt64, true),
                f("digest", Utf8, false),
                f("config_hash", Utf8, false),
                f("code_version", Utf8, false),
                f("started_at", Utf8, false),
            ],
        ),
    ]
}

/// The definition of a table by name.
pub fn table_def(name: &str) -> Option<TableDef> {
    all_tables().into_iter().find(|t| t.name == name)
}

/// Names of the tables that stages commit as Parquet (everything but `stage_runs`).
pub fn data_table_names() -> Vec<&'static str> {
    all_tables()
        .into_iter()
        .map(|t| t.name)
        .filter(|n| *n != "stage_runs")
        .collect()
}

/// The id of a task's `rollout`-th trajectory: `<task_id>-<rollout:04>`. Unique within an
/// iteration as long as task ids are, which the relational stages' joins rely on.
pub fn traj_id(task_id: &str, rollout: u32) -> String {
    format!("{task_id}-{rollout:04}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parse the `| column | type | nullable | meaning |` table of a schema file.
    fn parse_schema_md(text: &str) -> Vec<(String, String, bool)> {
        text.lines()
            .filter(|l| l.starts_with('|'))
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().trim_matches('`').to_string())
                    .collect::<Vec<_>>()
            })
            .filter(|c| c.len() >= 3 && c[0] != "column" && !c[0].starts_with('-'))
            .map(|c| (c[0].clone(), c[1].clone(), c[2] == "yes"))
            .collect()
    }

    #[test]
    fn code_schemas_match_schema_files() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
        for t in all_tables() {
            let path = dir.join(format!("{}.md", t.name));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(
                markdown(t.name),
                Some(text.as_str()),
                "{} compiled in",
                t.name
            );
            let documented: Vec<_> = markdown_columns(&text)
                .into_iter()
                .map(|(n, ty, null, meaning)| {
                    assert!(
                        !meaning.is_empty(),
                        "schemas/{}.md: {n} has no meaning",
                        t.name
                    );
                    (n, ty, null)
                })
                .collect();
            assert_eq!(parse_schema_md(&text), documented);
            let code: Vec<_> = t
                .schema
                .fields()
                .iter()
                .map(|f| (f.name().clone(), f.data_type().to_string(), f.is_nullable()))
                .collect();
            assert_eq!(
                documented, code,
                "schemas/{}.md disagrees with src/schema.rs",
                t.name
            );
            let key_line = text
                .lines()
                .find(|l| l.starts_with("Key:"))
                .unwrap_or_else(|| panic!("{}: no Key: line", path.display()));
            let key = format!(
                "Key: {}",
                t.key
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            assert_eq!(key_line.trim(), key, "schemas/{}.md key", t.name);
        }
        let files = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(files, all_tables().len(), "one file per table in schemas/");
    }
}
