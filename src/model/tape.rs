//! Deferred backward passes: how a model call whose layers are checkpointed
//! (`update.checkpoint_layers`, [`super::hf::checkpointed`]) takes part in an optimizer step's
//! backward pass without keeping its layers' autodiff graphs.
//!
//! While [`record`] runs a micro-batch's forward pass, such a call runs its layers untracked,
//! keeps only each layer's input, and leaves a [`Deferred`] here: once the loss's own backward
//! pass has given the gradient of the call's last hidden state, the deferred pass recomputes one
//! layer at a time, from the last to the first, each with a graph of its own that its backward
//! pass frees, and returns the layers' (and the embeddings') gradients. [`super::ppo`] runs
//! them and sums them into the step's gradients. Each backward pass is burn's own, one after the
//! other: burn's autodiff holds a graph's lock through a backward pass, so a backward pass cannot
//! run inside another's operation.
//!
//! The tape is the thread's own (each update thread records its own micro-batch).

use burn::optim::GradientsParams;
use std::any::Any;
use std::cell::RefCell;

/// A checkpointed call's backward pass: given the loss's gradients (`&mut` the training
/// backend's `Gradients`, as `dyn Any`), the gradients of the call's parameters, one part per
/// layer (and one for the embeddings).
pub type Deferred = Box<dyn FnOnce(&mut dyn Any) -> Vec<GradientsParams>>;

thread_local! {
    static TAPE: RefCell<Option<Vec<Deferred>>> = const { RefCell::new(None) };
}

/// `f()`, with the checkpointed calls it makes on this thread deferred: its value and their
/// backward passes, in call order.
pub fn record<T>(f: impl FnOnce() -> T) -> (T, Vec<Deferred>) {
    /// Ends the recording even when `f` panics (a later micro-batch starts with none).
    struct Recording;
    impl Drop for Recording {
        fn drop(&mut self) {
            TAPE.with(|t| t.borrow_mut().take());
        }
    }
    TAPE.with(|t| {
        let mut t = t.borrow_mut();
        assert!(t.is_none(), "one recording at a time on a thread");
        *t = Some(Vec::new());
    });
    let guard = Recording;
    let value = f();
    let deferred = TAPE.with(|t| t.borrow_mut().take()).unwrap_or_default();
    drop(guard);
    (value, deferred)
}

/// Whether this thread is recording ([`record`]): a model call checkpoints its layers then.
pub fn recording() -> bool {
    TAPE.with(|t| t.borrow().is_some())
}

/// Leave a call's backward pass on this thread's tape. Outside [`record`] it would be lost:
/// callers check [`recording`] first.
pub fn defer(pass: Deferred) {
    TAPE.with(|t| {
        t.borrow_mut()
            .as_mut()
            .expect("a deferred pass is left only while recording")
            .push(pass)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_collects_its_calls_and_ends_even_on_a_panic() {
        assert!(!recording());
        let (v, deferred) = record(|| {
            assert!(recording());
            defer(Box::new(|_| Vec::new()));
            defer(Box::new(|_| vec![GradientsParams::new()]));
            7
        });
        assert_eq!((v, deferred.len()), (7, 2));
        assert!(!recording());
        let panicked = std::panic::catch_unwind(|| record(|| panic!("a failing forward")));
        assert!(panicked.is_err());
        assert!(!recording(), "the panic ended the recording");
        let ((), none) = record(|| ());
        assert!(none.is_empty());
    }
}
