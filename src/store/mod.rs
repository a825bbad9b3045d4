//! The object store a run lives in: URL parsing, the layout of DESIGN.md, manifests and the
//! put-if-absent commit. Only the engine uses this module; stages never touch storage.

pub mod catalog;
pub mod gc;
pub mod layout;
pub mod manifest;
pub mod parquet;
pub mod tables;

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::{Error, Result};

/// The URL DataFusion knows the store under.
pub const DATAFUSION_URL: &str = "rla://store/";

/// A store opened from a URL. Paths are relative to the store root (`<run_id>/...`). A URL's
/// prefix (`s3://bucket/prefix`) is applied here rather than with object_store's `PrefixStore`,
/// whose `head` returns un-stripped locations (DataFusion then silently skips the files).
#[derive(Clone, Debug)]
pub struct Store {
    url: String,
    inner: Arc<dyn ObjectStore>,
    prefix: Option<Path>,
    /// The root directory of a local store (absolute).
    local_root: Option<std::path::PathBuf>,
}

impl Store {
    /// Open a store: a path (`./runs`, `/abs/runs`), `file://PATH`, `memory://`, `s3://bucket[/prefix]`
    /// (AWS_* variables; `AWS_ENDPOINT_URL` for S3-compatible servers), and with the cargo features
    /// `gcp` / `azure`, `gs://bucket[/prefix]` and `az://container[/prefix]`.
    pub fn open(url: &str) -> Result<Store> {
        Self::open_with(url, true)
    }

    /// Open a store that must already exist, for the commands that only read: a local path that
    /// is not a directory is an error naming it (a mistyped `--store` must not read as an empty
    /// store, nor create one).
    pub fn open_existing(url: &str) -> Result<Store> {
        Self::open_with(url, false)
    }

    fn open_with(url: &str, create: bool) -> Result<Store> {
        let mut prefix = "";
        let mut local_root = None;
        let inner: Arc<dyn ObjectStore> = if let Some(rest) = url.strip_prefix("memory://") {
            if !rest.is_empty() {
                return Err(Error::store(format!("{url}: memory:// takes no path")));
            }
            Arc::new(InMemory::new())
        } else if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, p) = split_bucket(url, rest)?;
            prefix = p;
            let s3 = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry())
                .with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch)
                .build()
                .map_err(|e| Error::object_store(url, e))?;
            Arc::new(s3)
        } else if let Some(rest) = url.strip_prefix("gs://") {
            let (bucket, p) = split_bucket(url, rest)?;
            prefix = p;
            open_gcs(url, bucket)?
        } else if let Some(rest) = url.strip_prefix("az://") {
            let (container, p) = split_bucket(url, rest)?;
            prefix = p;
            open_azure(url, container)?
        } else if let Some(rest) = url.strip_prefix("file://") {
            local_root = Some(rest);
            local(url, rest, create)?
        } else if url.contains("://") {
            let scheme = url.split("://").next().unwrap_or_default();
            return Err(Error::store(format!(
                "{url}: unknown store scheme `{scheme}://` (use a path, file://, memory://, s3://, gs://, az://)"
            )));
        } else {
            local_root = Some(url);
            local(url, url, create)?
        };
        let prefix = (!prefix.is_empty()).then(|| Path::from(prefix));
        Ok(Store {
            url: url.to_string(),
            inner,
            prefix,
            local_root: local_root.and_then(|r| std::fs::canonicalize(r).ok()),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The underlying object store; its locations include the URL's prefix ([`Store::location`]).
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        self.inner.clone()
    }

    /// The object-store location of a store-relative path.
    pub fn location(&self, path: &Path) -> Path {
        match &self.prefix {
            Some(p) => p.parts().chain(path.parts()).collect(),
            None => path.clone(),
        }
    }

    /// The store-relative path of an object-store location.
    fn relative(&self, location: Path) -> Path {
        match &self.prefix {
            Some(p) => {
                let stripped: Option<Path> = location.prefix_match(p).map(|rest| rest.collect());
                stripped.unwrap_or(location)
            }
            None => location,
        }
    }

    /// Whether another process can open the store (everything but `memory://`).
    pub fn is_shared(&self) -> bool {
        !self.url.starts_with("memory://")
    }

    /// Whether the store is a local directory.
    pub fn is_local(&self) -> bool {
        self.local_root.is_some()
    }

    /// Where other readers (Polars, DuckDB, pyarrow) find a store-relative path: an absolute file
    /// path for a local store, `s3://bucket/prefix/<path>` (and gs://, az://) otherwise.
    pub fn external_url(&self, path: &str) -> String {
        match &self.local_root {
            Some(root) => root.join(path).display().to_string(),
            None => format!("{}/{path}", self.url.trim_end_matches('/')),
        }
    }

    /// The URL DataFusion reads a store-relative path under (see [`DATAFUSION_URL`]).
    pub fn datafusion_url(&self, path: &str) -> String {
        format!("{DATAFUSION_URL}{}", self.location(&Path::from(path)))
    }

    fn err(&self, path: &Path, e: object_store::Error) -> Error {
        Error::object_store(format!("{}/{path}", self.url.trim_end_matches('/')), e)
    }

    /// Read a whole object; `Ok(None)` if it does not exist.
    pub async fn get_opt(&self, path: &Path) -> Result<Option<Bytes>> {
        match self.inner.get(&self.location(path)).await {
            Ok(r) => Ok(Some(r.bytes().await.map_err(|e| self.err(path, e))?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(path, e)),
        }
    }

    /// Read a whole object that must exist.
    pub async fn get(&self, path: &Path) -> Result<Bytes> {
        self.get_opt(path).await?.ok_or_else(|| {
            Error::data(format!(
                "{}/{path}: missing",
                self.url.trim_end_matches('/')
            ))
        })
    }

    /// Size of an object; `Ok(None)` if missing.
    pub async fn size(&self, path: &Path) -> Result<Option<u64>> {
        match self.inner.head(&self.location(path)).await {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(path, e)),
        }
    }

    /// Write an object that must not exist yet (the commit point). A lost race is a
    /// [`Error::CommitConflict`], never an overwrite.
    pub async fn put_if_absent(&self, path: &Path, bytes: Bytes) -> Result<()> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .inner
            .put_opts(&self.location(path), PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Err(Error::CommitConflict(format!(
                "{path} was committed by another writer first"
            ))),
            Err(e) => Err(self.err(path, e)),
        }
    }

    /// Names of the direct children "directories" under a store-relative prefix.
    pub async fn list_dirs(&self, prefix: Option<&Path>) -> Result<Vec<String>> {
        let root = Path::from("");
        let at = self.location(prefix.unwrap_or(&root));
        let res = self
            .inner
            .list_with_delimiter((!at.as_ref().is_empty()).then_some(&at))
            .await
            .map_err(|e| self.err(prefix.unwrap_or(&root), e))?;
        let mut names: Vec<String> = res
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Every object under a store-relative prefix (recursively), sorted, with store-relative
    /// locations.
    pub async fn list(&self, prefix: &Path) -> Result<Vec<object_store::ObjectMeta>> {
        let mut all: Vec<object_store::ObjectMeta> = self
            .inner
            .list(Some(&self.location(prefix)))
            .try_collect()
            .await
            .map_err(|e| self.err(prefix, e))?;
        for meta in &mut all {
            meta.location = self.relative(std::mem::take(&mut meta.location));
        }
        all.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(all)
    }

    pub async fn delete(&self, path: &Path) -> Result<()> {
        self.inner
            .delete(&self.location(path))
            .await
            .map_err(|e| self.err(path, e))
    }
}

/// Retries for remote stores: a few quick attempts, so an unreachable store fails in seconds
/// with a clear error instead of hanging.
fn retry() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 3,
        retry_timeout: std::time::Duration::from_secs(30),
        ..Default::default()
    }
}

fn split_bucket<'a>(url: &str, rest: &'a str) -> Result<(&'a str, &'a str)> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(Error::store(format!("{url}: missing bucket name")));
    }
    Ok((bucket, prefix.trim_matches('/')))
}

fn local(url: &str, path: &str, create: bool) -> Result<Arc<dyn ObjectStore>> {
    if path.is_empty() {
        return Err(Error::store(format!("{url}: empty path")));
    }
    if !create && !std::path::Path::new(path).is_dir() {
        return Err(Error::store(format!(
            "{url}: no store there ({path} is not a directory); check --store or RLA_PIPE_STORE"
        )));
    }
    std::fs::create_dir_all(path)
        .map_err(|e| Error::store(format!("{url}: cannot create {path}: {e}")))?;
    let fs = LocalFileSystem::new_with_prefix(path).map_err(|e| Error::object_store(url, e))?;
    Ok(Arc::new(fs))
}

#[cfg(feature = "gcp")]
fn open_gcs(url: &str, bucket: &str) -> Result<Arc<dyn ObjectStore>> {
    let gcs = object_store::gcp::GoogleCloudStorageBuilder::from_env()
        .with_bucket_name(bucket)
        .with_retry(retry())
        .build()
        .map_err(|e| Error::object_store(url, e))?;
    Ok(Arc::new(gcs))
}

#[cfg(not(feature = "gcp"))]
fn open_gcs(url: &str, _bucket: &str) -> Result<Arc<dyn ObjectStore>> {
    Err(Error::store(format!(
        "{url}: this build has no gs:// support (rebuild with `--features gcp`)"
    )))
}

#[cfg(feature = "azure")]
fn open_azure(url: &str, container: &str) -> Result<Arc<dyn ObjectStore>> {
    let az = object_store::azure::MicrosoftAzureBuilder::from_env()
        .with_container_name(container)
        .with_retry(retry())
        .build()
        .map_err(|e| Error::object_store(url, e))?;
    Ok(Arc::new(az))
}

#[cfg(not(feature = "azure"))]
fn open_azure(url: &str, _container: &str) -> Result<Arc<dyn ObjectStore>> {
    Err(Error::store(format!(
        "{url}: this build has no az:// support (rebuild with `--features azure`)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_scheme_is_refused() {
        let e = Store::open("ftp://x/y").unwrap_err().to_string();
        assert!(e.contains("unknown store scheme `ftp://`"), "{e}");
    }

    #[tokio::test]
    async fn put_if_absent_refuses_second_writer() {
        let s = Store::open("memory://").unwrap();
        let p = Path::from("r/_commits/iter=000000/x.json");
        s.put_if_absent(&p, Bytes::from_static(b"a")).await.unwrap();
        let e = s
            .put_if_absent(&p, Bytes::from_static(b"b"))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::CommitConflict(_)), "{e}");
        assert_eq!(s.get(&p).await.unwrap(), Bytes::from_static(b"a"));
    }

    #[tokio::test]
    async fn local_store_put_if_absent() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&format!("file://{}", dir.path().display())).unwrap();
        let p = Path::from("r/_commits/iter=000000/x.json");
        s.put_if_absent(&p, Bytes::from_static(b"a")).await.unwrap();
        assert!(matches!(
            s.put_if_absent(&p, Bytes::from_static(b"b")).await,
            Err(Error::CommitConflict(_))
        ));
    }
}
