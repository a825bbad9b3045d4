//! The one-line summary of a committed iteration (`summary.sql` over its tables).

use arrow::array::Array;

use crate::error::Result;
use crate::schema::rows::Columns;
use crate::store::Store;
use crate::store::manifest::StageManifest;

const SQL: &str = include_str!("summary.sql");

/// What one iteration achieved.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub train_success: Option<f64>,
    pub held_out_success: Option<f64>,
    pub ood_success: Option<f64>,
    pub rm_process_acc: Option<f64>,
    pub accepted: i64,
    pub rejected: i64,
    pub pending: i64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Rounded half away from zero, as SQL's round(x, 3) (78/96 is 0.813 in both).
        let p = |x: Option<f64>| {
            x.map_or("–".to_string(), |v| {
                format!("{:.3}", (v * 1000.0).round() / 1000.0)
            })
        };
        write!(
            f,
            "train {} · held-out {} · OOD {} · RM process {} · tasks {} accepted, {} rejected, {} pending",
            p(self.train_success),
            p(self.held_out_success),
            p(self.ood_success),
            p(self.rm_process_acc),
            self.accepted,
            self.rejected,
            self.pending
        )
    }
}

/// The summary of an iteration from the manifests of its stages.
pub async fn of_iteration<'a>(
    store: &Store,
    manifests: impl Iterator<Item = &'a StageManifest>,
) -> Result<Summary> {
    let ctx = crate::sql::session_over(store, manifests).await?;
    let batches = ctx.sql(SQL).await?.collect().await?;
    let mut s = Summary::default();
    if let Some(b) = batches.iter().find(|b| b.num_rows() > 0) {
        let c = Columns::new(b, "engine/summary.sql");
        let f = |name: &str| -> Result<Option<f64>> {
            let col = c.f64(name)?;
            Ok((!col.is_null(0)).then(|| col.value(0)))
        };
        let n = |name: &str| -> Result<i64> { Ok(c.i64(name)?.value(0)) };
        s = Summary {
            train_success: f("train_success")?,
            held_out_success: f("held_out_success")?,
            ood_success: f("ood_success")?,
            rm_process_acc: f("rm_process_acc")?,
            accepted: n("accepted")?,
            rejected: n("rejected")?,
            pending: n("pending")?,
        };
    }
    Ok(s)
}
