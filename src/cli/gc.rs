//! `rla-pipe gc`: delete data files no committed manifest names.

use anyhow::Result;

use super::args::StoreArgs;
use crate::store::gc;

pub(super) async fn collect_garbage(
    store: &StoreArgs,
    run: Option<&str>,
    dry_run: bool,
    grace_secs: u64,
) -> Result<()> {
    let store = store.open()?;
    let verb = if dry_run { "would remove" } else { "removed" };
    let orphans = gc::collect(&store, run, grace_secs, dry_run, |o| {
        println!("{verb} {}  ({} bytes)", o.path, o.bytes)
    })
    .await?;
    println!(
        "{verb} {} unreferenced files ({} bytes)",
        orphans.len(),
        orphans.iter().map(|o| o.bytes).sum::<u64>()
    );
    Ok(())
}
