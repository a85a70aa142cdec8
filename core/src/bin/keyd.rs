//! `keyfence-keyd`: the isolated key process. The signing engine starts it
//! with a socket on standard input; see `keyfence::sign::isolated`.

fn main() -> std::process::ExitCode {
    keyfence::sign::isolated::key_process_main(std::env::args_os())
}
