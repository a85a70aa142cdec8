//! The bottom layer: plain types that every other part of signing uses
//! and that import nothing else from `sign`. Nothing here needs AWS-LC,
//! so the key-process protocol codec (which carries these types) builds
//! without the `sign` feature.

mod algorithm;
mod error;
mod key_kind;
mod op_class;
mod operation;

#[cfg(feature = "sign")]
pub(crate) use algorithm::Family;
pub use algorithm::{Algorithm, AlgorithmError, Hash};
pub use error::{BackendFailure, CryptoOp, ErrorKind, KeyError, Resource, SignError, TokenFailure};
pub use key_kind::KeyKind;
pub use op_class::OpClass;
pub use operation::{Input, Operation, Output};
