//! `rla-pipe files`: a run's committed data files.

use crate::error::Error;
use anyhow::Result;

use super::args::{StoreArgs, TextOrJson};
use crate::store::{catalog, layout};

/// `A..B` (B excluded) or `A..=B`.
pub(super) fn parse_iters(text: &str) -> Result<std::ops::RangeInclusive<u32>> {
    let bad = || {
        Error::usage(format!(
            "--iters {text:?}: expected A..B (B excluded) or A..=B, e.g. 0..3"
        ))
    };
    let (a, b, inclusive) = if let Some((a, b)) = text.split_once("..=") {
        (a, b, true)
    } else if let Some((a, b)) = text.split_once("..") {
        (a, b, false)
    } else {
        return Err(bad().into());
    };
    let a: u32 = a.trim().parse().map_err(|_| bad())?;
    let b: u32 = b.trim().parse().map_err(|_| bad())?;
    let end = if inclusive { Some(b) } else { b.checked_sub(1) };
    match end {
        Some(e) if e >= a => Ok(a..=e),
        _ => return Err(Error::usage(format!("--iters {text:?} is empty")).into()),
    }
}

pub(super) async fn files(
    store: &StoreArgs,
    run: &str,
    table: Option<&str>,
    iters: std::ops::RangeInclusive<u32>,
    format: TextOrJson,
) -> Result<()> {
    let store = store.open()?;
    layout::validate_run_id(run)?;
    let tables = crate::schema::data_table_names();
    if let Some(t) = table
        && !tables.contains(&t)
    {
        return Err(Error::usage(format!(
            "--table {t}: no such table (tables: {})",
            tables.join(", ")
        ))
        .into());
    }
    let state = catalog::load_run(&store, run).await?;
    let files: Vec<_> = state
        .files()
        .into_iter()
        .filter(|f| table.is_none_or(|t| f.file.table == t) && iters.contains(&f.iter))
        .collect();
    match format {
        TextOrJson::Text => {
            for f in &files {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    store.external_url(&f.file.path),
                    f.file.table,
                    f.iter,
                    f.file.rows,
                    f.file.bytes,
                    f.file.digest
                );
            }
        }
        TextOrJson::Json => {
            let rows: Vec<_> = files
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "url": store.external_url(&f.file.path),
                        "path": f.file.path,
                        "run": f.run,
                        "table": f.file.table,
                        "iter": f.iter,
                        "stage": f.stage,
                        "rows": f.file.rows,
                        "bytes": f.file.bytes,
                        "blake3": f.file.digest,
                        "written_by": f.written_by,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
    }
    Ok(())
}
