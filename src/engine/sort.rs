//! Key order of committed files: the sort the engine puts on a stage's output, and the check
//! the writer makes of every row it writes.
//!
//! DataFusion 55.2 can wrongly infer that a plan is already in key order (a hash join whose
//! build side is sorted by the key: README, Known problem). It then drops `ORDER BY` the key
//! from the plan, and a `SortExec` asked to sort such an input passes it through unsorted. The
//! engine's sort therefore sits on top of [`ForgetOrder`], which tells DataFusion nothing about
//! its input's order, and the writer checks the result.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::SortOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{
    EquivalenceProperties, LexOrdering, PhysicalExpr, PhysicalSortExpr, expressions::Column,
};
use datafusion::physical_plan::sorts::{
    sort::SortExec, sort_preserving_merge::SortPreservingMergeExec,
};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, ReplaceChildrenOptions,
};

use crate::error::Result;
use crate::schema::TableDef;

/// The order of every key column: ascending, nulls last (as `ORDER BY` the key).
pub const KEY_ORDER: SortOptions = SortOptions {
    descending: false,
    nulls_first: false,
};

/// `plan` sorted by `def`'s key, whatever DataFusion believes about its order: a sort per
/// partition over [`ForgetOrder`] and, for several partitions, an order-preserving merge.
pub fn sorted_by_key(
    def: &TableDef,
    plan: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = plan.schema();
    let exprs = def
        .key
        .iter()
        .map(|k| {
            Ok(PhysicalSortExpr::new(
                Arc::new(Column::new_with_schema(k, &schema)?),
                KEY_ORDER,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let Some(ordering) = LexOrdering::new(exprs) else {
        return Ok(plan);
    };
    let input: Arc<dyn ExecutionPlan> = Arc::new(ForgetOrder::new(plan));
    Ok(if input.output_partitioning().partition_count() > 1 {
        let sort = SortExec::new(ordering.clone(), input).with_preserve_partitioning(true);
        Arc::new(SortPreservingMergeExec::new(ordering, Arc::new(sort)))
    } else {
        Arc::new(SortExec::new(ordering, input))
    })
}

/// Passes its input's batches through and declares no order or partitioning of them.
#[derive(Debug, Clone)]
pub struct ForgetOrder {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl ForgetOrder {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> ForgetOrder {
        let p = input.properties();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(input.schema()),
            Partitioning::UnknownPartitioning(p.partitioning.partition_count()),
            p.emission_type,
            p.boundedness,
        );
        ForgetOrder {
            input,
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for ForgetOrder {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ForgetOrder")
    }
}

impl ExecutionPlan for ForgetOrder {
    fn name(&self) -> &str {
        "ForgetOrder"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(datafusion::error::DataFusionError::Internal(format!(
                "ForgetOrder has one child, got {}",
                children.len()
            )));
        }
        Ok(Arc::new(ForgetOrder::new(children.swap_remove(0))))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }
}

/// `batches` in key order: as they are when they already are (checked), else sorted into one
/// batch.
pub fn in_key_order(def: &TableDef, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
    let mut check = KeyOrderCheck::new(def)?;
    let mut sorted = true;
    for b in &batches {
        if check.check(b)?.is_err() {
            sorted = false;
            break;
        }
    }
    if sorted || batches.is_empty() {
        return Ok(batches);
    }
    let all = arrow::compute::concat_batches(&batches[0].schema(), &batches)?;
    tracing::debug!(
        table = def.name,
        rows = all.num_rows(),
        "DataFusion left rows out of key order: sorting them"
    );
    let keys = check
        .columns
        .iter()
        .map(|i| arrow::compute::SortColumn {
            values: all.column(*i).clone(),
            options: Some(KEY_ORDER),
        })
        .collect::<Vec<_>>();
    let indices = arrow::compute::lexsort_to_indices(&keys, None)?;
    Ok(vec![arrow::compute::take_record_batch(&all, &indices)?])
}

/// Checks that the rows a writer is given are in key order, across batches: column by column
/// with arrow's comparison kernels (no row-by-row loop here).
pub struct KeyOrderCheck {
    columns: Vec<usize>,
    /// The key columns of the last row checked.
    last: Option<Vec<ArrayRef>>,
    /// Rows checked so far.
    pub rows: u64,
}

impl KeyOrderCheck {
    pub fn new(def: &TableDef) -> Result<KeyOrderCheck> {
        let columns = def
            .key
            .iter()
            .map(|k| def.schema.index_of(k))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(KeyOrderCheck {
            columns,
            last: None,
            rows: 0,
        })
    }

    /// `Ok(Err(i))`: the batch's row `i` sorts before the row checked before it.
    pub fn check(&mut self, batch: &RecordBatch) -> Result<std::result::Result<(), usize>> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(Ok(()));
        }
        let keys: Vec<ArrayRef> = self
            .columns
            .iter()
            .map(|i| batch.column(*i).clone())
            .collect();
        let first: Vec<ArrayRef> = keys.iter().map(|c| c.slice(0, 1)).collect();
        if let Some(last) = &self.last
            && first_before(&first, last)?.is_some()
        {
            return Ok(Err(0));
        }
        let next: Vec<ArrayRef> = keys.iter().map(|c| c.slice(1, n - 1)).collect();
        let prev: Vec<ArrayRef> = keys.iter().map(|c| c.slice(0, n - 1)).collect();
        if let Some(i) = first_before(&next, &prev)? {
            return Ok(Err(i + 1));
        }
        // A copy, so that the check does not hold on to the batch's buffers.
        self.last = Some(
            keys.iter()
                .map(|c| arrow::compute::concat(&[c.slice(n - 1, 1).as_ref()]))
                .collect::<std::result::Result<_, _>>()?,
        );
        self.rows += n as u64;
        Ok(Ok(()))
    }
}

/// The first `i` where the key `next[..][i]` sorts before `prev[..][i]` (lexicographically over
/// the key columns, each ascending).
fn first_before(next: &[ArrayRef], prev: &[ArrayRef]) -> Result<Option<usize>> {
    use arrow::compute::kernels::{boolean, cmp};
    let mut before: Option<arrow::array::BooleanArray> = None;
    for (n, p) in next.iter().zip(prev).rev() {
        let lt = cmp::lt(n, p)?;
        before = Some(match before {
            None => lt,
            Some(later) => boolean::or(&lt, &boolean::and(&cmp::eq(n, p)?, &later)?)?,
        });
    }
    Ok(before.and_then(|b| b.values().set_indices().next()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{StringArray, UInt32Array};

    fn batch(tasks: &[&str], steps: &[u32]) -> RecordBatch {
        RecordBatch::try_from_iter([
            (
                "task_id",
                Arc::new(StringArray::from(tasks.to_vec())) as ArrayRef,
            ),
            ("step_idx", Arc::new(UInt32Array::from(steps.to_vec()))),
        ])
        .unwrap()
    }

    fn def() -> TableDef {
        let b = batch(&[], &[]);
        TableDef {
            name: "t",
            key: &["task_id", "step_idx"],
            schema: b.schema(),
        }
    }

    #[test]
    fn the_check_finds_the_first_row_out_of_order_across_batches() {
        let mut c = KeyOrderCheck::new(&def()).unwrap();
        assert_eq!(
            c.check(&batch(&["a", "a", "b"], &[1, 2, 0])).unwrap(),
            Ok(())
        );
        // Equal keys are in order; integers compare as integers (10 after 9).
        assert_eq!(
            c.check(&batch(&["b", "b", "c"], &[0, 9, 10])).unwrap(),
            Ok(())
        );
        assert_eq!(c.rows, 6);
        // The first row of a batch against the last of the one before.
        assert_eq!(c.check(&batch(&["b", "d"], &[11, 0])).unwrap(), Err(0));
        let mut c = KeyOrderCheck::new(&def()).unwrap();
        assert_eq!(
            c.check(&batch(&["a", "b", "a"], &[0, 0, 5])).unwrap(),
            Err(2)
        );
    }

    #[test]
    fn out_of_order_rows_are_sorted_and_ordered_ones_kept_as_they_are() {
        let d = def();
        let ordered = vec![batch(&["a", "b"], &[3, 1]), batch(&["b", "c"], &[2, 0])];
        assert_eq!(in_key_order(&d, ordered.clone()).unwrap(), ordered);
        let mixed = vec![batch(&["b", "a"], &[1, 3]), batch(&["c", "b"], &[0, 2])];
        assert_eq!(
            in_key_order(&d, mixed).unwrap(),
            vec![batch(&["a", "b", "b", "c"], &[3, 1, 2, 0])]
        );
        assert!(in_key_order(&d, vec![]).unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_sort_sorts_inputs_datafusion_takes_for_sorted() {
        use datafusion::datasource::memory::MemorySourceConfig;
        use datafusion::datasource::source::DataSourceExec;
        // A source that claims key order its rows do not have: DataFusion's own SortExec
        // passes it through; the engine's sort does not.
        let rows = batch(&["b", "a", "a"], &[0, 2, 1]);
        let d = def();
        let claim = LexOrdering::new(["task_id", "step_idx"].map(|k| {
            PhysicalSortExpr::new(
                Arc::new(Column::new_with_schema(k, &rows.schema()).unwrap()),
                KEY_ORDER,
            )
        }))
        .unwrap();
        let source = MemorySourceConfig::try_new(&[vec![rows.clone()]], rows.schema(), None)
            .unwrap()
            .try_with_sort_information(vec![claim.clone()])
            .unwrap();
        let lying: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(source);
        let ctx = Arc::new(TaskContext::default());
        let collect = |p: Arc<dyn ExecutionPlan>| {
            let ctx = ctx.clone();
            async move { datafusion::physical_plan::collect(p, ctx).await.unwrap() }
        };
        let df_sort = Arc::new(SortExec::new(claim, lying.clone()));
        let passed = collect(df_sort).await;
        assert_eq!(passed[0].column(0).as_ref(), rows.column(0).as_ref());
        let sorted = collect(sorted_by_key(&d, lying).unwrap()).await;
        let want = batch(&["a", "a", "b"], &[1, 2, 0]);
        assert_eq!(sorted, vec![want]);
    }
}
