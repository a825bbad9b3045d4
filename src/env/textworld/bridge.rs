//! The bridge processes that make and play TextWorld's games.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

use crate::env::external::{ExternalConfig, Process};
use crate::error::{Error, Result};

/// The bridge processes, started on demand; episode and generation calls are spread over them.
pub(super) struct Bridges {
    pub(super) cfg: ExternalConfig,
    pub(super) timeout: Duration,
    pub(super) slots: Vec<Mutex<Option<Process>>>,
}

impl Bridges {
    /// A call on bridge `k` (started if it is not running). A bridge that died or broke the
    /// protocol is dropped (the next call starts another); an error reply leaves it serving.
    pub(super) fn call(&self, k: usize, request: &Value) -> Result<Value> {
        self.send(k, request, true)
            .expect("a bridge is started for it")
    }

    /// Tell a running bridge to forget an episode (one that is not running forgot it already).
    pub(super) fn close(&self, k: usize, episode: u64) {
        let _ = self.send(k, &json!({"op": "close", "episode": episode}), false);
    }

    /// `request` on bridge `k`, starting it if `start`; `None`: not running and not started.
    pub(super) fn send(&self, k: usize, request: &Value, start: bool) -> Option<Result<Value>> {
        let mut slot = self.slots[k % self.slots.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            if !start {
                return None;
            }
            match Process::spawn(&self.cfg) {
                Ok(p) => *slot = Some(p),
                Err(e) => return Some(Err(hint(e))),
            }
        }
        let p = slot.as_mut()?;
        let reply = p.call(request, self.timeout);
        if reply.is_err() && !p.alive() {
            *slot = None;
        }
        Some(reply.map_err(hint))
    }
}

/// Adds the set-up step to a bridge that could not import TextWorld.
pub(super) fn hint(e: Error) -> Error {
    let msg = e.detail();
    if msg.contains("No module named") {
        Error::Environment(format!(
            "{msg} — TextWorld is not installed for env.textworld.python: pip install textworld==1.7.0"
        ))
    } else {
        e
    }
}
