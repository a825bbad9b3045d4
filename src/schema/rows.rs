//! Between rows and Arrow: reading a query result by column name (a typed error naming the
//! column and both types, never a panicking downcast) and building a table's batch from rows
//! ([`TableBuilder`]).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanBuilder, Float64Builder, Int8Builder, Int64Builder, RecordBatch,
    StringArray, StringBuilder, UInt32Builder, UInt64Builder,
};
use arrow::datatypes::{DataType, SchemaRef};

use crate::error::{Error, Result};

/// A batch of a query result, read by column name. `what` names the query in errors.
pub struct Columns<'a> {
    batch: &'a RecordBatch,
    what: &'a str,
}

impl<'a> Columns<'a> {
    pub fn new(batch: &'a RecordBatch, what: &'a str) -> Columns<'a> {
        Columns { batch, what }
    }

    /// The column `name` as the Arrow array type `A`: an error naming the query, the column
    /// and both types if it is missing or of another type.
    pub fn get<A: Array + 'static>(&self, name: &str) -> Result<&'a A> {
        let col = self.batch.column_by_name(name).ok_or_else(|| {
            let have: Vec<&str> = self
                .batch
                .schema_ref()
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect();
            Error::sql(format!(
                "{}: the result has no column `{name}` (it has: {})",
                self.what,
                have.join(", ")
            ))
        })?;
        col.as_any().downcast_ref::<A>().ok_or_else(|| {
            Error::sql(format!(
                "{}: column `{name}` is {}, expected {}",
                self.what,
                col.data_type(),
                std::any::type_name::<A>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("?")
            ))
        })
    }

    pub fn str(&self, name: &str) -> Result<&'a StringArray> {
        self.get(name)
    }
    pub fn u32(&self, name: &str) -> Result<&'a arrow::array::UInt32Array> {
        self.get(name)
    }
    pub fn u64(&self, name: &str) -> Result<&'a arrow::array::UInt64Array> {
        self.get(name)
    }
    pub fn i8(&self, name: &str) -> Result<&'a arrow::array::Int8Array> {
        self.get(name)
    }
    pub fn i64(&self, name: &str) -> Result<&'a arrow::array::Int64Array> {
        self.get(name)
    }
    pub fn f64(&self, name: &str) -> Result<&'a arrow::array::Float64Array> {
        self.get(name)
    }
    pub fn bool(&self, name: &str) -> Result<&'a arrow::array::BooleanArray> {
        self.get(name)
    }
}

/// The builder of one column, by type (a match per value, no dynamic downcast: the synthetic
/// stage pushes tens of millions of values through here).
enum Column {
    Str(StringBuilder),
    U32(UInt32Builder),
    U64(UInt64Builder),
    I8(Int8Builder),
    I64(Int64Builder),
    F64(Float64Builder),
    Bool(BooleanBuilder),
}

impl Column {
    fn for_type(dt: &DataType) -> Option<Column> {
        Some(match dt {
            DataType::Utf8 => Column::Str(StringBuilder::new()),
            DataType::UInt32 => Column::U32(UInt32Builder::new()),
            DataType::UInt64 => Column::U64(UInt64Builder::new()),
            DataType::Int8 => Column::I8(Int8Builder::new()),
            DataType::Int64 => Column::I64(Int64Builder::new()),
            DataType::Float64 => Column::F64(Float64Builder::new()),
            DataType::Boolean => Column::Bool(BooleanBuilder::new()),
            _ => return None,
        })
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Column::Str(b) => Arc::new(b.finish()),
            Column::U32(b) => Arc::new(b.finish()),
            Column::U64(b) => Arc::new(b.finish()),
            Column::I8(b) => Arc::new(b.finish()),
            Column::I64(b) => Arc::new(b.finish()),
            Column::F64(b) => Arc::new(b.finish()),
            Column::Bool(b) => Arc::new(b.finish()),
        }
    }
}

/// Rows of one table, built column by column in the table's schema order: without `run_id`
/// and `iter` ([`TableBuilder::new`], which [`TableBuilder::finish_with`] adds), or with every
/// column ([`TableBuilder::all_columns`], [`TableBuilder::finish`]). Each `push_*` fills the
/// next column of the current row; a value of the wrong type or an incomplete last row is an
/// error at `finish`.
pub struct TableBuilder {
    table: &'static str,
    schema: SchemaRef,
    /// Leading schema columns the rows do not give (2: `run_id`, `iter`; or 0).
    skip: usize,
    columns: Vec<Column>,
    at: usize,
    rows: usize,
    error: Option<String>,
}

macro_rules! push {
    ($(#[$doc:meta])* $name:ident, $opt:ident, $variant:ident, $t:ty) => {
        $(#[$doc])*
        #[inline]
        pub fn $name(&mut self, v: $t) -> &mut Self {
            match &mut self.columns[self.at] {
                Column::$variant(b) => b.append_value(v),
                _ => self.mismatch(stringify!($t)),
            }
            self.next()
        }
        /// The same, nullable.
        #[inline]
        pub fn $opt(&mut self, v: Option<$t>) -> &mut Self {
            match &mut self.columns[self.at] {
                Column::$variant(b) => b.append_option(v),
                _ => self.mismatch(stringify!($t)),
            }
            self.next()
        }
    };
}

impl TableBuilder {
    /// A builder for a table of the schema; rows give every column but `run_id` and `iter`.
    pub fn new(table: &'static str) -> Result<TableBuilder> {
        Self::skipping(table, 2)
    }

    /// A builder whose rows give every column, `run_id` and `iter` included.
    pub fn all_columns(table: &'static str) -> Result<TableBuilder> {
        Self::skipping(table, 0)
    }

    fn skipping(table: &'static str, skip: usize) -> Result<TableBuilder> {
        let def = super::table_def(table)
            .ok_or_else(|| Error::sql(format!("no table {table} in the schema")))?;
        let columns = def
            .schema
            .fields()
            .iter()
            .skip(skip)
            .map(|f| {
                Column::for_type(f.data_type()).ok_or_else(|| {
                    Error::sql(format!(
                        "{table}: column `{}` is {}, which rows cannot be pushed into",
                        f.name(),
                        f.data_type()
                    ))
                })
            })
            .collect::<Result<_>>()?;
        Ok(TableBuilder {
            table,
            schema: def.schema,
            skip,
            columns,
            at: 0,
            rows: 0,
            error: None,
        })
    }

    /// Record a value of the wrong type for the current column (reported by `finish`).
    #[cold]
    fn mismatch(&mut self, what: &str) {
        if self.error.is_none() {
            let field = self.schema.field(self.at + self.skip);
            self.error = Some(format!(
                "{}: column `{}` is {}, a stage pushed a {what}",
                self.table,
                field.name(),
                field.data_type()
            ));
        }
    }

    /// Move to the next column (and row).
    #[inline]
    fn next(&mut self) -> &mut Self {
        self.at += 1;
        if self.at == self.columns.len() {
            self.at = 0;
            self.rows += 1;
        }
        self
    }

    push!(
        /// Push a string.
        push_str, push_opt_str, Str, &str
    );
    push!(
        /// Push a UInt32.
        push_u32, push_opt_u32, U32, u32
    );
    push!(
        /// Push a UInt64.
        push_u64, push_opt_u64, U64, u64
    );
    push!(
        /// Push an Int8.
        push_i8, push_opt_i8, I8, i8
    );
    push!(
        /// Push an Int64.
        push_i64, push_opt_i64, I64, i64
    );
    push!(
        /// Push a Float64.
        push_f64, push_opt_f64, F64, f64
    );
    push!(
        /// Push a Boolean.
        push_bool, push_opt_bool, Bool, bool
    );

    /// The batch, with the given `run_id` and `iter` (a builder from [`TableBuilder::new`]).
    pub fn finish_with(&mut self, run_id: &str, iter: u32) -> Result<RecordBatch> {
        self.check()?;
        if self.skip != 2 {
            return Err(Error::sql(format!(
                "{}: the rows already give run_id and iter",
                self.table
            )));
        }
        let n = self.rows;
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec![run_id; n])),
            Arc::new(arrow::array::UInt32Array::from(vec![iter; n])),
        ];
        columns.extend(self.columns.iter_mut().map(Column::finish));
        self.rows = 0;
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }

    /// The batch (a builder from [`TableBuilder::all_columns`]).
    pub fn finish(&mut self) -> Result<RecordBatch> {
        self.check()?;
        if self.skip != 0 {
            return Err(Error::sql(format!(
                "{}: the rows lack run_id and iter: use finish_with",
                self.table
            )));
        }
        let columns: Vec<ArrayRef> = self.columns.iter_mut().map(Column::finish).collect();
        self.rows = 0;
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }

    fn check(&mut self) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(Error::sql(e));
        }
        if self.at != 0 {
            return Err(Error::sql(format!(
                "{}: the last row is incomplete ({} of {} columns)",
                self.table,
                self.at,
                self.columns.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_rows_and_reads_by_name() {
        let mut b = TableBuilder::new("evaluations").unwrap();
        b.push_str("t1")
            .push_u32(3)
            .push_u32(1)
            .push_str("held_out");
        b.push_str("t2").push_u32(3).push_u32(2).push_str("ood");
        let batch = b.finish_with("r", 4).unwrap();
        assert_eq!(batch.num_rows(), 2);
        let c = Columns::new(&batch, "test");
        assert_eq!(c.u32("successes").unwrap().value(1), 2);
        assert_eq!(c.str("split").unwrap().value(0), "held_out");
        assert_eq!(c.u32("iter").unwrap().value(0), 4);
        let e = c.f64("successes").unwrap_err().to_string();
        assert!(e.contains("successes") && e.contains("UInt32"), "{e}");
        let e = c.str("nope").unwrap_err().to_string();
        assert!(e.contains("no column `nope`"), "{e}");
    }

    #[test]
    fn wrong_types_and_short_rows_are_errors() {
        let mut b = TableBuilder::new("evaluations").unwrap();
        b.push_str("t1").push_f64(3.0).push_u32(1).push_str("x");
        let e = b.finish_with("r", 0).unwrap_err().to_string();
        assert!(e.contains("rollouts"), "{e}");
        let mut b = TableBuilder::new("evaluations").unwrap();
        b.push_str("t1");
        assert!(b.finish_with("r", 0).is_err());
    }
}
