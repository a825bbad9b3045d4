//! Stage `judge`: this iteration's pool (`tasks`), `task_accuracy` and the previous iteration's
//! `adaptations` → `judgements`. Every pending candidate is accepted or rejected from this
//! iteration's rollouts ([`adapt::accept`] on the acc(q) it was written at and acc(q′) now),
//! BEFORE the `advantage` stage builds training data: as in the reference implementation, a
//! rejected candidate's samples never train either model (`advantage` reads the decisions).
//! `adapt` copies the decisions into `adaptations`, which the next `pool` applies.
//!
//! With `adapt.enabled = false` nothing is ever pending and the table is empty.

use crate::adapt::{self, Decision, parse_direction};
use crate::error::Error;
use crate::schema::rows::{Columns, TableBuilder};
use crate::stage::sql::collect;
use crate::stage::{Stage, StageContext, StageRun, TableOutput};

const JUDGE: &str = include_str!("judge.sql");

pub struct Judge;

impl Stage for Judge {
    fn name(&self) -> &'static str {
        "judge"
    }
    /// This iteration's pool and accuracies; the previous iteration's `adaptations` (what the
    /// pending candidates were written for).
    fn inputs(&self) -> &'static [&'static str] {
        &["tasks", "task_accuracy", "adaptations"]
    }
    fn outputs(&self) -> &'static [&'static str] {
        &["judgements"]
    }
    fn config_sections(&self) -> &'static [&'static str] {
        &["adapt"]
    }
    fn run<'a>(&'a self, ctx: &'a StageContext) -> StageRun<'a> {
        Box::pin(async move {
            let cfg = &ctx.config.adapt;
            let mut out = TableBuilder::new("judgements")?;
            for b in collect(&ctx.session, JUDGE).await? {
                let c = Columns::new(&b, "stages/judge.sql");
                let slot = c.u32("slot")?;
                let (cand, parent, dir) = (
                    c.str("task_id")?,
                    c.str("parent_task_id")?,
                    c.str("direction")?,
                );
                let (prev, cacc) = (c.f64("parent_acc")?, c.f64("acc")?);
                let (spec, adapter) = (c.str("spec")?, c.str("adapter")?);
                for i in 0..b.num_rows() {
                    let direction = parse_direction(dir.value(i)).ok_or_else(|| {
                        Error::data(format!(
                            "adaptations of iteration {}: unknown direction {:?}",
                            ctx.iter.saturating_sub(1),
                            dir.value(i)
                        ))
                    })?;
                    let decision = if adapt::accept(direction, prev.value(i), cacc.value(i), cfg) {
                        Decision::Accepted
                    } else {
                        Decision::Rejected
                    };
                    out.push_str(cand.value(i))
                        .push_str(parent.value(i))
                        .push_str(dir.value(i))
                        .push_f64(prev.value(i))
                        .push_f64(cacc.value(i))
                        .push_str(decision.as_str())
                        .push_u32(slot.value(i))
                        .push_str(spec.value(i))
                        .push_str(adapter.value(i));
                }
            }
            let batch = out.finish_with(&ctx.run_id, ctx.iter)?;
            Ok(vec![(
                "judgements",
                TableOutput::Frame(ctx.session.read_batch(batch)?),
            )])
        })
    }
}
