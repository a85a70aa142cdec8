//! `keyfence-key-process`: the key process. The signing engine starts it
//! with a socket on standard input; see `keyfence::sign::key_process`.

fn main() -> std::process::ExitCode {
    keyfence::sign::key_process::key_process_main(std::env::args_os())
}
