//! For tests that wrap a store to change one thing about it (when its
//! commits happen, whether its lock holds): the reads and single writes it
//! passes to the store it wraps, written once.

/// The body of a `Store` impl's reads and single writes (`get`,
/// `get_stamped`, `put`, `delete`, `list`), each passed to `self.inner`.
#[macro_export]
macro_rules! passes_reads_and_writes_to_inner {
    () => {
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>, keyfence::wrap::StoreError> {
            self.inner.get(key)
        }
        fn get_stamped(&self, key: &str) -> Result<Option<(Vec<u8>, keyfence::wrap::Stamp)>, keyfence::wrap::StoreError> {
            self.inner.get_stamped(key)
        }
        fn put(&self, key: &str, value: &[u8]) -> Result<(), keyfence::wrap::StoreError> {
            self.inner.put(key, value)
        }
        fn delete(&self, key: &str) -> Result<(), keyfence::wrap::StoreError> {
            self.inner.delete(key)
        }
        fn list(&self, prefix: &str) -> Result<Vec<String>, keyfence::wrap::StoreError> {
            self.inner.list(prefix)
        }
    };
}
