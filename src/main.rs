fn main() -> std::process::ExitCode {
    leash::cli::main()
}
