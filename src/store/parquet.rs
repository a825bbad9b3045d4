//! Deterministic Parquet writing with blake3 hashing on the fly.
//!
//! Fixed writer properties (zstd level 3, 128 Ki-row row groups, a fixed `created_by`, no
//! timestamps) make identical batches produce byte-identical files, which is what replay checks.

use bytes::Bytes;
use futures::future::BoxFuture;
use object_store::buffered::BufWriter;
use parquet::arrow::async_writer::{AsyncArrowWriter, AsyncFileWriter};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};

/// Rows per row group.
pub const ROW_GROUP_ROWS: usize = 1 << 17;

/// zstd level of every committed file.
pub const ZSTD_LEVEL: i32 = 3;

/// The one set of writer properties every committed file uses: zstd, fixed row groups, chunk
/// statistics, a fixed `created_by`.
pub fn writer_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_1_0)
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(ZSTD_LEVEL).expect("valid zstd level"),
        ))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_created_by("rla-pipe".to_string())
        .build()
}

/// An [`AsyncFileWriter`] that hashes and counts every byte, and forwards them to an object store
/// upload (or nowhere, when replay only needs the digest).
pub struct HashingWriter {
    inner: Option<BufWriter>,
    hasher: blake3::Hasher,
    bytes: u64,
}

impl HashingWriter {
    pub fn new(inner: Option<BufWriter>) -> Self {
        HashingWriter {
            inner,
            hasher: blake3::Hasher::new(),
            bytes: 0,
        }
    }

    /// (bytes written, blake3 hex digest).
    pub fn finish(&self) -> (u64, String) {
        (self.bytes, self.hasher.finalize().to_hex().to_string())
    }
}

impl AsyncFileWriter for HashingWriter {
    fn write(&mut self, bs: Bytes) -> BoxFuture<'_, parquet::errors::Result<()>> {
        self.hasher.update(&bs);
        self.bytes += bs.len() as u64;
        match self.inner.as_mut() {
            Some(w) => w.write(bs),
            None => Box::pin(async { Ok(()) }),
        }
    }

    fn complete(&mut self) -> BoxFuture<'_, parquet::errors::Result<()>> {
        match self.inner.as_mut() {
            Some(w) => w.complete(),
            None => Box::pin(async { Ok(()) }),
        }
    }
}

/// A Parquet writer with the fixed properties over a [`HashingWriter`].
pub fn writer(
    sink: Option<BufWriter>,
    schema: arrow::datatypes::SchemaRef,
) -> parquet::errors::Result<AsyncArrowWriter<HashingWriter>> {
    AsyncArrowWriter::try_new(HashingWriter::new(sink), schema, Some(writer_properties()))
}
