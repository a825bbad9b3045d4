//! Helpers of the relational stages: binding the parameters of a stage's SQL file, literals,
//! planning a query against the stage's session.

use datafusion::dataframe::DataFrame;
use datafusion::prelude::SessionContext;

use crate::error::{Error, Result};

/// Substitute `${name}` parameters of a stage's SQL file. Every parameter must be used and every
/// `${...}` in the file given a value, so a typo in a SQL file fails loudly.
pub fn render(sql: &str, params: &[(&str, String)]) -> Result<String> {
    let mut out = sql.to_string();
    for (name, value) in params {
        let key = format!("${{{name}}}");
        if !out.contains(&key) {
            return Err(Error::sql(format!(
                "SQL parameter {key} is not used by the query"
            )));
        }
        out = out.replace(&key, value);
    }
    if let Some(pos) = out.find("${") {
        let end = out[pos..].find('}').map_or(out.len(), |e| pos + e + 1);
        return Err(Error::sql(format!(
            "SQL parameter {} is not bound",
            &out[pos..end]
        )));
    }
    Ok(out)
}

/// A double literal that round-trips exactly.
pub fn f64_lit(x: f64) -> String {
    format!("CAST('{x:?}' AS DOUBLE)")
}

/// A single-quoted SQL string literal.
pub fn str_lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Plan a query of a stage against its session.
pub async fn query(ctx: &SessionContext, sql: &str) -> Result<DataFrame> {
    ctx.sql(sql).await.map_err(Error::from)
}

/// Every batch a query returns.
pub async fn collect(ctx: &SessionContext, sql: &str) -> Result<Vec<arrow::array::RecordBatch>> {
    query(ctx, sql).await?.collect().await.map_err(Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_checks_parameters() {
        assert_eq!(render("a ${x} b", &[("x", "1".into())]).unwrap(), "a 1 b");
        assert!(render("a ${x} ${y}", &[("x", "1".into())]).is_err());
        assert!(render("a", &[("x", "1".into())]).is_err());
        assert_eq!(f64_lit(1e-8), "CAST('1e-8' AS DOUBLE)");
    }
}
