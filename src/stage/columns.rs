//! What stages use between rows and Arrow: the constant `run_id` / `iter` columns, and the
//! schema's row helpers ([`Columns`] to read a query result by name, [`TableBuilder`] to build
//! an output table from rows).

use std::sync::Arc;

use arrow::array::{ArrayRef, StringArray, UInt32Array};

use super::StageContext;
pub use crate::schema::rows::{Columns, TableBuilder};

/// The `run_id` and `iter` columns (constant within a stage's output) for `n` rows.
pub fn run_iter_columns(ctx: &StageContext, n: usize) -> Vec<ArrayRef> {
    vec![
        Arc::new(StringArray::from(vec![ctx.run_id.as_str(); n])),
        Arc::new(UInt32Array::from(vec![ctx.iter; n])),
    ]
}
