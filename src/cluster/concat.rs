//! The coordinator's head of a task plan: its input's partitions (one per task) concatenated in
//! order, a few tasks at a time. It runs on the coordinator only (never encoded for a worker).

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};

/// What the caller does with a task's batches (by task index) before they are passed on.
pub type Finish =
    Arc<dyn Fn(usize, Vec<RecordBatch>) -> crate::error::Result<Vec<RecordBatch>> + Send + Sync>;

/// Partition `i` of the input is task `i`: each is collected, handed to `finish`, and emitted
/// in task order; up to `lookahead` tasks run at once.
pub struct OrderedConcatExec {
    input: Arc<dyn ExecutionPlan>,
    lookahead: usize,
    finish: Finish,
    properties: Arc<PlanProperties>,
}

impl OrderedConcatExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, lookahead: usize, finish: Finish) -> Self {
        let p = input.properties();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(input.schema()),
            Partitioning::UnknownPartitioning(1),
            p.emission_type,
            p.boundedness,
        );
        OrderedConcatExec {
            input,
            lookahead: lookahead.max(1),
            finish,
            properties: Arc::new(properties),
        }
    }
}

impl std::fmt::Debug for OrderedConcatExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderedConcatExec")
            .field("lookahead", &self.lookahead)
            .finish()
    }
}

impl DisplayAs for OrderedConcatExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OrderedConcatExec: lookahead={}", self.lookahead)
    }
}

impl ExecutionPlan for OrderedConcatExec {
    fn name(&self) -> &str {
        "OrderedConcatExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(format!(
                "OrderedConcatExec has one child, got {}",
                children.len()
            )));
        }
        Ok(Arc::new(OrderedConcatExec::new(
            children.swap_remove(0),
            self.lookahead,
            self.finish.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "OrderedConcatExec has one partition, asked for {partition}"
            )));
        }
        let tasks = self.input.properties().partitioning.partition_count();
        let (input, finish) = (self.input.clone(), self.finish.clone());
        let collected = futures::stream::iter(0..tasks)
            .map(move |i| {
                let (input, finish, context) = (input.clone(), finish.clone(), context.clone());
                async move {
                    let batches: Vec<RecordBatch> =
                        input.execute(i, context)?.try_collect().await?;
                    finish(i, batches).map_err(|e| DataFusionError::External(Box::new(e)))
                }
            })
            .buffered(self.lookahead);
        let batches = collected
            .map_ok(|bs| futures::stream::iter(bs.into_iter().map(Ok)))
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            batches,
        )))
    }
}
