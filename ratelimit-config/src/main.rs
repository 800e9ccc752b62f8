//! `ratelimit-config`: validates a team limits file and generates the
//! configurations that must agree with it. The command lives in [`cli`].

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
