//! `rla-pipe schema`: the schema of every table, from this build's code.

use crate::error::Error;
use anyhow::Result;

use super::args::SchemaFormat;

pub(super) fn print_schema(table: Option<&str>, format: SchemaFormat) -> Result<()> {
    let all = crate::schema::all_tables();
    let tables: Vec<_> = match table {
        None => all,
        Some(t) => {
            let names: Vec<_> = all.iter().map(|d| d.name).collect();
            let Some(d) = all.iter().find(|d| d.name == t) else {
                return Err(
                    Error::usage(format!("no table {t:?} (tables: {})", names.join(", "))).into(),
                );
            };
            vec![d.clone()]
        }
    };
    match format {
        SchemaFormat::Json => {
            let v: Vec<_> = tables.iter().map(crate::schema::to_json).collect();
            let v = if table.is_some() {
                v.into_iter().next().expect("one table")
            } else {
                serde_json::Value::Array(v)
            };
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        SchemaFormat::Md => {
            for (i, t) in tables.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                print!("{}", crate::schema::markdown(t.name).unwrap_or_default());
            }
        }
    }
    Ok(())
}
