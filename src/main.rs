fn main() -> std::process::ExitCode {
    rla_pipe::cli::main()
}
