//! What the commands print and write: query results on stdout, and the files a user asks for,
//! written whole or not at all.

use std::io::Write as _;

use anyhow::{Context, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;

use super::args::Format;

/// Stdout's reader went away (`rla-pipe sql ... | head`): the command ends quietly with exit 0.
#[derive(Debug)]
pub(super) struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Print query results; an empty result prints its header (table and CSV) or `[]` (JSON).
pub(super) fn print_batches(
    format: Format,
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    write_batches(format, schema, batches, &mut out).map_err(|e| {
        // Arrow's CSV writer keeps only the io error's text.
        let closed = e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
                || c.to_string().contains("Broken pipe")
        });
        if closed {
            anyhow::Error::new(StdoutClosed)
        } else {
            e
        }
    })
}

fn write_batches(
    format: Format,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    out: &mut impl std::io::Write,
) -> Result<()> {
    let empty = [RecordBatch::new_empty(schema.clone())];
    let batches = if batches.is_empty() {
        &empty[..]
    } else {
        batches
    };
    match format {
        Format::Table => {
            writeln!(
                out,
                "{}",
                arrow::util::pretty::pretty_format_batches_with_schema(schema.clone(), batches)?
            )?;
        }
        Format::Csv => {
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut *out);
            for b in batches {
                w.write(b)?;
            }
        }
        Format::Json => {
            let mut w = arrow::json::ArrayWriter::new(&mut *out);
            w.write_batches(&batches.iter().collect::<Vec<_>>())?;
            w.finish()?;
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Write query results to `path` whole or not at all, in the format its extension names
/// (`.parquet`, `.csv`, `.json`); another extension is an error naming the three. Returns the
/// rows written.
pub(super) fn write_results(
    path: &std::path::Path,
    schema: SchemaRef,
    batches: &[RecordBatch],
) -> Result<u64> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let format = match ext.as_str() {
        "parquet" => return write_parquet(path, schema, batches),
        "csv" => Format::Csv,
        "json" => Format::Json,
        _ => {
            return Err(crate::error::Error::usage(format!(
                "--out {}: the extension names the format: .parquet, .csv or .json",
                path.display()
            ))
            .into());
        }
    };
    let mut bytes = Vec::new();
    write_batches(format, &schema, batches, &mut bytes)?;
    write_atomic(path, &bytes)?;
    Ok(batches.iter().map(|b| b.num_rows() as u64).sum())
}

/// A temp file beside `path`, to be persisted onto it once complete (readers of `path` never
/// see a half-written file). It is created with the mode any new file gets, 0666 less the
/// process umask (0644 under the usual umask 022), not a temp file's 0600: it becomes the file
/// the user asked for.
pub(super) fn temp_beside(path: &std::path::Path) -> Result<tempfile::NamedTempFile> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut builder = tempfile::Builder::new();
    // open(2) applies the umask to the mode asked for, as it does for `std::fs::write`.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    builder.tempfile_in(dir).with_context(|| {
        format!(
            "cannot write {}: creating a temp file in {}",
            path.display(),
            dir.display()
        )
    })
}

/// Write a file whole or not at all.
pub(super) fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = temp_beside(path)?;
    tmp.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Write query results to a local Parquet file atomically (temp file, then rename).
fn write_parquet(
    path: &std::path::Path,
    schema: SchemaRef,
    batches: &[RecordBatch],
) -> Result<u64> {
    let tmp = temp_beside(path)?;
    let props = crate::store::parquet::writer_properties();
    let mut w = parquet::arrow::ArrowWriter::try_new(tmp.reopen()?, schema, Some(props))?;
    let mut rows = 0;
    for b in batches {
        w.write(b)?;
        rows += b.num_rows() as u64;
    }
    w.close()?;
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process umask, read without changing it (`umask(2)` can only be read by setting it,
    /// which would race with the other tests creating files).
    #[cfg(unix)]
    fn umask() -> u32 {
        #[cfg(target_os = "linux")]
        if let Some(mask) = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Umask:"))
                    .and_then(|m| u32::from_str_radix(m.trim(), 8).ok())
            })
        {
            return mask;
        }
        // Elsewhere: the mode of a file created as `std::fs::write` creates one (0666 & !umask).
        let dir = tempfile::tempdir().unwrap();
        let probe = dir.path().join("probe");
        std::fs::write(&probe, b"").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        !std::fs::metadata(&probe).unwrap().permissions().mode() & 0o777
    }

    #[cfg(unix)]
    fn mode(path: &std::path::Path) -> u32 {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    /// The files a user asks for (`report --out`, `sql --out`) get the usual mode, not 0600.
    #[cfg(unix)]
    #[test]
    fn written_files_get_the_usual_mode() {
        let expected = 0o666 & !umask();
        let dir = tempfile::tempdir().unwrap();

        let html = dir.path().join("report.html");
        write_atomic(&html, b"<html></html>").unwrap();
        assert_eq!(std::fs::read(&html).unwrap(), b"<html></html>");
        assert_eq!(mode(&html), expected, "{:o} != {expected:o}", mode(&html));
        // Replacing a file: the new one has the usual mode too.
        write_atomic(&html, b"again").unwrap();
        assert_eq!(std::fs::read(&html).unwrap(), b"again");
        assert_eq!(mode(&html), expected);

        use arrow::array::Int64Array;
        use arrow::datatypes::{DataType, Field, Schema};
        let schema =
            std::sync::Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![std::sync::Arc::new(Int64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let parquet = dir.path().join("out.parquet");
        assert_eq!(
            write_parquet(&parquet, schema.clone(), &[batch]).unwrap(),
            3
        );
        assert_eq!(mode(&parquet), expected);

        // `--out` by extension: CSV and JSON as printed; an unknown extension is refused.
        let csv = dir.path().join("out.csv");
        assert_eq!(write_results(&csv, schema.clone(), &[]).unwrap(), 0);
        assert_eq!(
            std::fs::read_to_string(&csv).unwrap(),
            "x\n",
            "an empty result keeps its header"
        );
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![std::sync::Arc::new(Int64Array::from(vec![4, 5]))],
        )
        .unwrap();
        let json = dir.path().join("out.JSON");
        assert_eq!(write_results(&json, schema.clone(), &[batch]).unwrap(), 2);
        assert_eq!(
            std::fs::read_to_string(&json).unwrap(),
            "[{\"x\":4},{\"x\":5}]\n"
        );
        let err = write_results(&dir.path().join("out.xlsx"), schema.clone(), &[]).unwrap_err();
        assert!(err.to_string().contains(".parquet, .csv or .json"), "{err}");
        let mut table = Vec::new();
        write_batches(Format::Table, &schema, &[], &mut table).unwrap();
        assert_eq!(
            String::from_utf8(table).unwrap(),
            "+---+\n| x |\n+---+\n+---+\n"
        );
        std::fs::remove_file(&csv).unwrap();
        std::fs::remove_file(&json).unwrap();

        // No temp file is left beside them.
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["out.parquet", "report.html"]);
    }
}
