#![deny(unsafe_code)]

fn main() -> std::process::ExitCode {
    leash::cli::main()
}
