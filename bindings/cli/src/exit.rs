//! The exit-code convention every command follows, and how an error is
//! sorted into it.
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | success (also: the reader closed standard output early) |
//! | 1 | a "no" answer: the attributes do not satisfy the policy, the machine cannot open the envelope |
//! | 2 | usage or bad input: a malformed policy, attribute list, ciphertext, key or envelope, a file that cannot be read, a directory that is not a store, an output that is one of the inputs or would replace a master secret key |
//! | 3 | any other failure: the system refused (a write, a thread, the key process), a timeout, a bug |
//!
//! Scripts branch on 1 versus 2 versus 3 without parsing messages, so the
//! classification comes from the library's stable [`ErrorCode`]s rather
//! than from each command.

use std::fmt;

use keyfence::ErrorCode;

/// A "no" answer.
pub const NO: u8 = 1;
/// Usage or bad input.
pub const INPUT: u8 = 2;
/// Any other failure.
pub const FAILURE: u8 = 3;

/// The convention in words, for every command's `--help`.
pub const HELP: &str = "\
Exit status:
  0  success
  1  a \"no\" answer: attributes do not satisfy the policy, the machine cannot open the envelope
  2  usage or bad input: a malformed policy, attribute list, ciphertext, key or envelope;
     an input that cannot be read; a directory that is not a store; an output that is
     one of the command's inputs (by device and inode) or would replace a master secret key
  3  any other failure (a write the system refused, the key process, a timeout, a bug)

`-` as --in or --out means standard input or output. Secret outputs (keys, decrypted
secrets) are written readable by their owner only (mode 600).
Documentation: https://github.com/keyfence/keyfence/tree/main/docs/ (policy-language.md, abe.md,
wrapping.md, signing.md, deploy.md, errors.md): the package ships none of it.";

/// An outcome a command decided on itself, carried to `main` as an error.
#[derive(Debug)]
pub enum Exit {
    /// The reader closed standard output: stop quietly, successfully, as
    /// `head` expects of the command before it.
    Quiet,
    /// The message has already been printed (a policy with its caret);
    /// exit with this code.
    Reported(u8),
    /// Usage or bad input that no library error describes.
    Input(String),
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Quiet => f.write_str("standard output was closed"),
            Exit::Reported(code) => write!(f, "exit {code}"),
            Exit::Input(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Exit {}

/// Usage or bad input, in words.
pub fn input(message: impl Into<String>) -> anyhow::Error {
    Exit::Input(message.into()).into()
}

/// The exit code for a library error code.
pub fn for_code(code: ErrorCode) -> u8 {
    match code {
        ErrorCode::PolicyNotSatisfied
        | ErrorCode::RetiredGeneration
        | ErrorCode::UnknownPolicyKey
        | ErrorCode::WrongAuthority
        | ErrorCode::MachineRevoked => NO,
        ErrorCode::InvalidArgument
        | ErrorCode::PolicySyntax
        | ErrorCode::PolicyTooLarge
        | ErrorCode::InvalidAttributes
        | ErrorCode::InvalidCiphertext
        | ErrorCode::InvalidKey
        | ErrorCode::ReservedLabel
        | ErrorCode::LimitExceeded
        | ErrorCode::InvalidEnvelope
        | ErrorCode::UnknownAlgorithm
        | ErrorCode::NoAuthority
        | ErrorCode::AuthorityExists
        | ErrorCode::InvalidStoreKey
        | ErrorCode::InvalidPrivateKey
        | ErrorCode::InvalidRequest => INPUT,
        _ => FAILURE,
    }
}

/// What `main` does with a failed command: the exit code, and whether
/// the error still has to be printed.
pub fn classify(err: &anyhow::Error) -> (u8, bool) {
    use keyfence::{abe::AbeError, policy, sign, wrap};
    // The outermost error that knows its code decides: context added on
    // the way out only describes it.
    for e in err.chain() {
        if let Some(x) = e.downcast_ref::<Exit>() {
            return match x {
                Exit::Quiet => (0, false),
                Exit::Reported(code) => (*code, false),
                Exit::Input(_) => (INPUT, true),
            };
        }
        let code = if let Some(x) = e.downcast_ref::<policy::ParseError>() {
            Some(ErrorCode::from(x))
        } else if let Some(x) = e.downcast_ref::<policy::AttributesError>() {
            Some(ErrorCode::from(x))
        } else if let Some(x) = e.downcast_ref::<AbeError>() {
            Some(x.code())
        } else if let Some(x) = e.downcast_ref::<wrap::WrapError>() {
            Some(x.code())
        } else if let Some(x) = e.downcast_ref::<wrap::StoreError>() {
            Some(x.code())
        } else if let Some(x) = e.downcast_ref::<sign::SignError>() {
            Some(x.code())
        } else if let Some(x) = e.downcast_ref::<sign::KeyError>() {
            Some(x.code())
        } else if e.downcast_ref::<sign::AlgorithmError>().is_some() {
            Some(ErrorCode::InvalidRequest)
        } else if let Some(x) = e.downcast_ref::<std::io::Error>() {
            if x.kind() == std::io::ErrorKind::BrokenPipe {
                return (0, false);
            }
            Some(ErrorCode::Io)
        } else {
            None
        };
        if let Some(code) = code {
            return (for_code(code), true);
        }
    }
    (FAILURE, true)
}
