//! Fuzz the records an application and its engine exchange
//! (docs/ENGINE.md): arbitrary bytes as a submission, as a completion and
//! as the body of a direct path's batch record. No panic; what parses
//! encodes back to exactly its bytes.

use tether_attach::records::{batch_count, put_batch_message, BatchMessages};
use tether_engine::{Completion, Submission};

/// One fuzz input.
pub fn run(bytes: &[u8]) {
    let mut buf = vec![0u8; bytes.len() + 64];
    if let Ok(s) = Submission::decode(bytes) {
        let n = s.encode(&mut buf).expect("a parsed record fits its own length");
        assert_eq!(&buf[..n], bytes);
    }
    if let Ok(c) = Completion::decode(bytes) {
        let n = c.encode(&mut buf).expect("a parsed record fits its own length");
        assert_eq!(&buf[..n], bytes);
    }
    if let Some(n) = batch_count(bytes) {
        let mut body = Vec::new();
        let mut taken = 0;
        for m in BatchMessages(bytes) {
            put_batch_message(&mut body, m);
            taken += 1;
        }
        assert_eq!((taken, &body[..]), (n, bytes));
    }
}
