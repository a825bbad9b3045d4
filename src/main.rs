fn main() -> std::process::ExitCode {
    tune_allocator();
    rla_pipe::cli::main()
}

/// glibc's malloc hands blocks over its (adaptive) mmap threshold to the kernel and back on
/// every free, so each model call's large tensors (logits, attention scores, caches) came as
/// fresh zeroed pages: a sixth of a pretrained model's rollout time was page faults and page
/// clearing (profiled). Keep blocks up to 32 MiB in the heap and do not trim it eagerly.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before any other thread runs.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}
