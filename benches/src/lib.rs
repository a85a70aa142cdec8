//! Shared helpers for the keyfence benchmarks.
