//! Game files: the digest-checked cache and the assets a run commits (spec and files, zstd).

use std::path::Path;

use serde_json::Value;

use super::spec::GameSpec;
use crate::determinism::canonical;

pub(super) const ASSET_MAGIC: &str = "rla-pipe textworld game 1\n";
/// The files of a game, in the order they are hashed and bundled.
pub(super) const GAME_FILES: [&str; 2] = ["game.json", "game.z8"];
/// The largest game asset accepted (decompressed): TextWorld's games are ~0.4 MB.
pub(super) const ASSET_MAX_BYTES: usize = 64 << 20;

/// A game's asset: the magic line, its spec (canonical JSON, naming the game's digest) and its
/// two files (name, newline, u64 little-endian length, bytes), zstd-compressed at a fixed level
/// (so the same game is the same bytes).
pub(super) fn bundle(spec: &GameSpec, files: &GameFiles) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    raw.extend_from_slice(ASSET_MAGIC.as_bytes());
    raw.extend_from_slice(canonical(&spec.0).as_bytes());
    raw.push(b'\n');
    for (name, bytes) in files {
        raw.extend_from_slice(name.as_bytes());
        raw.push(b'\n');
        raw.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        raw.extend_from_slice(bytes);
    }
    zstd::bulk::compress(&raw, 12)
}

/// A game's files by name.
pub(super) type GameFiles = Vec<(&'static str, Vec<u8>)>;

/// The spec and files of a game asset ([`bundle`]); an error says what is wrong with it.
pub(super) fn unbundle(bytes: &[u8]) -> std::result::Result<(Value, GameFiles), String> {
    let raw = zstd::bulk::decompress(bytes, ASSET_MAX_BYTES)
        .map_err(|e| format!("not a zstd frame of at most {ASSET_MAX_BYTES} bytes: {e}"))?;
    let rest = raw
        .strip_prefix(ASSET_MAGIC.as_bytes())
        .ok_or("it does not start with the game asset header")?;
    let nl = rest
        .iter()
        .position(|b| *b == b'\n')
        .ok_or("no spec line")?;
    let spec: Value = serde_json::from_slice(&rest[..nl]).map_err(|e| format!("spec: {e}"))?;
    let mut rest = &rest[nl + 1..];
    let mut files = Vec::new();
    for name in GAME_FILES {
        let head = format!("{name}\n");
        rest = rest
            .strip_prefix(head.as_bytes())
            .ok_or_else(|| format!("{name} is not where it should be"))?;
        let (len, body) = rest
            .split_first_chunk::<8>()
            .ok_or_else(|| format!("{name}: truncated length"))?;
        let len = u64::from_le_bytes(*len) as usize;
        if body.len() < len {
            return Err(format!("{name}: {} of {len} bytes", body.len()));
        }
        files.push((name, body[..len].to_vec()));
        rest = &body[len..];
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes after the files", rest.len()));
    }
    Ok((spec, files))
}

/// The digest recorded with a cached game, if its directory is complete.
pub(super) fn cached_digest(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("digest")).ok()
}

/// A game directory's two files and their blake3 (over name, length, bytes; in name order).
pub(super) fn read_game(dir: &Path) -> std::io::Result<(GameFiles, String)> {
    let mut h = blake3::Hasher::new();
    let mut files = Vec::new();
    for name in GAME_FILES {
        let bytes = std::fs::read(dir.join(name))?;
        h.update(name.as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
        files.push((name, bytes));
    }
    Ok((files, h.finalize().to_hex().to_string()))
}

/// The blake3 of a game directory's files ([`read_game`]).
pub(super) fn bundle_digest(dir: &Path) -> std::io::Result<String> {
    read_game(dir).map(|(_, digest)| digest)
}

/// Put the complete game directory `tmp` (its files checked to hash to `digest`) in place as
/// `dir`, with its digest file. When another thread or process placed one there meanwhile,
/// theirs stays and `tmp` goes. The digest of the game now at `dir`, if any.
pub(super) fn place(tmp: &Path, dir: &Path, digest: &str) -> std::io::Result<Option<String>> {
    std::fs::write(tmp.join("digest"), digest)?;
    if std::fs::rename(tmp, dir).is_err() {
        let _ = std::fs::remove_dir_all(tmp);
        return Ok(cached_digest(dir));
    }
    Ok(Some(digest.to_string()))
}
