//! Any bytes as the body of a key file (what the provider's PEM block
//! carries, `keyfence::key_file`): a typed error or a file, never a panic.
//! An accepted file writes a body (the writer must take whatever the
//! reader accepts) that reads back as the same file and writes the same
//! body again. That body may differ from the input: the reader takes the
//! fields in any order and an empty server name as none.
#![no_main]

use keyfence::key_file::KeyFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = KeyFile::from_bytes(data) else { return };
    let body = file.to_bytes().expect("a file the reader accepted must write");
    let again = KeyFile::from_bytes(&body).expect("a written body must read");
    assert_eq!(again, file);
    assert_eq!(again.to_bytes().expect("it wrote once"), body);
    assert!(body.len() <= data.len(), "the written body is longer than one the reader accepted");
});
