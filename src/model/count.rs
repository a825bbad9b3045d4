//! How many tokens the models computed, and how many a shared prefix saved them: stages wrap
//! their model work in [`counting`] and report the counts (`stage_runs.tokens_computed`,
//! `stage_runs.tokens_reused`). The count is per thread, so concurrent work (tests, a worker's
//! shards) never mixes.

/// Tokens fed to a model, and tokens a shared prefix saved (what the same samples would have
/// cost as independent sequences, minus what was fed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub computed: u64,
    pub reused: u64,
}

thread_local! {
    static COUNT: std::cell::Cell<Option<Tokens>> = const { std::cell::Cell::new(None) };
}

/// Record model work on this thread's open count (see [`counting`]); no-op outside one.
pub fn record(computed: usize, reused: usize) {
    COUNT.with(|c| {
        if let Some(mut t) = c.get() {
            t.computed += computed as u64;
            t.reused += reused as u64;
            c.set(Some(t));
        }
    });
}

/// Run `work` (synchronous model work on this thread) and count the tokens it fed to models
/// and the tokens shared prefixes saved it. Counts nest: an outer count includes an inner one.
pub fn counting<R>(work: impl FnOnce() -> R) -> (R, Tokens) {
    let outer = COUNT.with(|c| c.replace(Some(Tokens::default())));
    let r = work();
    let mine = COUNT.with(|c| c.replace(outer)).unwrap_or_default();
    if outer.is_some() {
        record(mine.computed as usize, mine.reused as usize);
    }
    (r, mine)
}

/// Run `work` on the two halves `0..⌈n/2⌉` and `⌈n/2⌉..n` of `n` rows on two threads at once,
/// results in row order; the other thread's token counts join this thread's. The split is
/// fixed (not the machine's core count), so a run computes the same batches everywhere. Model
/// calls are parallel inside matrix products only; two halves keep both cores busy through
/// the rest (normalisation, attention's softmax, sampling, host work).
pub fn halves<R: Send>(n: usize, work: impl Fn(std::ops::Range<usize>) -> R + Sync) -> Vec<R> {
    if n < 2 {
        return vec![work(0..n)];
    }
    let mid = n.div_ceil(2);
    let (first, (second, counted)) = std::thread::scope(|s| {
        let other = s.spawn(|| counting(|| work(mid..n)));
        let first = work(0..mid);
        (first, other.join().expect("a model thread panicked"))
    });
    record(counted.computed as usize, counted.reused as usize);
    vec![first, second]
}
