//! The envelope each piece of a call travels in: one tether message each,
//! so the stream below has already made it exactly-once, in order and
//! uncorrupted between two live incarnations. What the envelope adds is
//! the call's identity, which survives incarnations: (client, seq), the
//! client being the caller's life (its incarnation) and seq its count of
//! calls toward this server (RIFL's rpc id, Lee et al., SOSP'15).
//!
//! Every message of the three-way exchange of Kaur's AMVIA (thesis
//! section 3.2, Figure 3.1) is one kind here: REQUEST, ACK (the handler
//! started), REPLY; the negative and error acknowledgements are REFUSED
//! with a reason; REPLY_ACK and ACK_REQUEST carry the caller's cumulative
//! "first incomplete" call, by which the server frees reply state; QUERY
//! asks how a call ended without running it.
//!
//! Layout (little-endian, as the rest of the wire): a 24-byte head for
//! every kind, `[kind u8][aux u8][0 u16][handler u32][client u64][seq u64]`,
//! then per kind: REQUEST and QUERY the first incomplete seq (u64) and,
//! for REQUEST, the arguments; REPLY the result; nothing else for the
//! rest. `aux` is REQUEST's flags (one-way) or REFUSED's reason, zero
//! otherwise. Bytes come from the network: `parse` checks everything and
//! returns a typed error, never panics (fuzz target `rpc_envelope`).

use thiserror::Error;

use crate::call::{CallId, HandlerId, Refusal};

/// Bytes before any kind's own fields.
pub const HEAD_LEN: usize = 24;
/// REQUEST's and QUERY's fixed part: the head and the first incomplete seq.
pub const REQUEST_HEAD_LEN: usize = HEAD_LEN + 8;

const REQUEST: u8 = 1;
const ACK: u8 = 2;
const REFUSED: u8 = 3;
const REPLY: u8 = 4;
const REPLY_ACK: u8 = 5;
const ACK_REQUEST: u8 = 6;
const QUERY: u8 = 7;

/// REQUEST's flag: no reply is wanted (and none is kept).
const ONE_WAY: u8 = 0x01;

/// One piece of a call, borrowed from the message it came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Envelope<'a> {
    /// Run `handler` with `args`; the caller has finished every call below
    /// `first_incomplete` (the server may forget them).
    Request { call: CallId, handler: HandlerId, one_way: bool, first_incomplete: u64, args: &'a [u8] },
    /// How did `call` end? Never runs it: one not seen yet is fenced off.
    Query { call: CallId, first_incomplete: u64 },
    /// The handler started (AMVIA's acknowledgement).
    Ack { call: CallId },
    /// The call did not run here, or its outcome is lost (the reason says).
    Refused { call: CallId, reason: Refusal },
    /// The handler ran; its result.
    Reply { call: CallId, result: &'a [u8] },
    /// The caller's cumulative acknowledgement of replies: every call of
    /// life `client` below `first_incomplete` is finished.
    ReplyAck { client: u64, first_incomplete: u64 },
    /// The server holds replies of life `client` it would like to free.
    AckRequest { client: u64 },
}

/// What is wrong with an envelope that came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum EnvelopeError {
    #[error("call envelope shorter than its {needed}-byte fixed part (got {got})")]
    Truncated { needed: usize, got: usize },
    #[error("unknown call envelope kind {0}")]
    UnknownKind(u8),
    #[error("call envelope of kind {kind} has unknown flags or reason {aux:#04x}")]
    BadAux { kind: u8, aux: u8 },
    #[error("reserved bytes of a call envelope are not zero")]
    Reserved,
    #[error("call envelope of kind {kind} carries {extra} bytes past its end")]
    Trailing { kind: u8, extra: usize },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl<'a> Envelope<'a> {
    /// Whether it is for the server's side (REQUEST, QUERY, REPLY_ACK) or
    /// the caller's (the rest): the envelope is parsed once, then handed
    /// to the side it is for.
    pub fn for_server(&self) -> bool {
        matches!(self, Envelope::Request { .. } | Envelope::Query { .. } | Envelope::ReplyAck { .. })
    }

    /// Check and read an envelope. Every field is validated here; nothing
    /// after can fail.
    pub fn parse(b: &'a [u8]) -> Result<Self, EnvelopeError> {
        if b.len() < HEAD_LEN {
            return Err(EnvelopeError::Truncated { needed: HEAD_LEN, got: b.len() });
        }
        let (kind, aux) = (b[0], b[1]);
        if b[2] != 0 || b[3] != 0 {
            return Err(EnvelopeError::Reserved);
        }
        let handler = u32_at(b, 4);
        let call = CallId { client: u64_at(b, 8), seq: u64_at(b, 16) };
        let bad_aux = Err(EnvelopeError::BadAux { kind, aux });
        // Fields a kind does not use must be zero: one encoding per envelope.
        let only_head = |e: Envelope<'a>| {
            if b.len() > HEAD_LEN {
                Err(EnvelopeError::Trailing { kind, extra: b.len() - HEAD_LEN })
            } else if aux != 0 && kind != REFUSED {
                Err(EnvelopeError::BadAux { kind, aux })
            } else {
                Ok(e)
            }
        };
        // Only a request names a handler; an ACK request no call.
        if (handler != 0 && kind != REQUEST) || (call.seq != 0 && kind == ACK_REQUEST) {
            return Err(EnvelopeError::Reserved);
        }
        match kind {
            REQUEST | QUERY => {
                if b.len() < REQUEST_HEAD_LEN {
                    return Err(EnvelopeError::Truncated { needed: REQUEST_HEAD_LEN, got: b.len() });
                }
                let first_incomplete = u64_at(b, HEAD_LEN);
                if kind == QUERY {
                    if aux != 0 {
                        return bad_aux;
                    }
                    if b.len() > REQUEST_HEAD_LEN {
                        return Err(EnvelopeError::Trailing { kind, extra: b.len() - REQUEST_HEAD_LEN });
                    }
                    return Ok(Envelope::Query { call, first_incomplete });
                }
                if aux & !ONE_WAY != 0 {
                    return bad_aux;
                }
                let args = &b[REQUEST_HEAD_LEN..];
                Ok(Envelope::Request { call, handler, one_way: aux & ONE_WAY != 0, first_incomplete, args })
            }
            ACK => only_head(Envelope::Ack { call }),
            REFUSED => match Refusal::from_u8(aux) {
                Some(reason) => only_head(Envelope::Refused { call, reason }),
                None => bad_aux,
            },
            REPLY if aux != 0 => bad_aux,
            REPLY => Ok(Envelope::Reply { call, result: &b[HEAD_LEN..] }),
            // The seq field carries the first incomplete call.
            REPLY_ACK => only_head(Envelope::ReplyAck { client: call.client, first_incomplete: call.seq }),
            ACK_REQUEST => only_head(Envelope::AckRequest { client: call.client }),
            other => Err(EnvelopeError::UnknownKind(other)),
        }
    }

    /// Bytes `write` needs.
    pub fn len(&self) -> usize {
        match self {
            Envelope::Request { args, .. } => REQUEST_HEAD_LEN + args.len(),
            Envelope::Query { .. } => REQUEST_HEAD_LEN,
            Envelope::Reply { result, .. } => HEAD_LEN + result.len(),
            _ => HEAD_LEN,
        }
    }

    /// Never: every envelope has a head. (For clippy's `len` convention.)
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Append the envelope's bytes to `out` (`len()` of them).
    pub fn write<B: bytes::BufMut>(&self, out: &mut B) {
        let head = |out: &mut B, kind: u8, aux: u8, handler: u32, client: u64, seq: u64| {
            out.put_slice(&[kind, aux, 0, 0]);
            out.put_slice(&handler.to_le_bytes());
            out.put_slice(&client.to_le_bytes());
            out.put_slice(&seq.to_le_bytes());
        };
        match *self {
            Envelope::Request { call, handler, one_way, first_incomplete, args } => {
                head(out, REQUEST, if one_way { ONE_WAY } else { 0 }, handler, call.client, call.seq);
                out.put_slice(&first_incomplete.to_le_bytes());
                out.put_slice(args);
            }
            Envelope::Query { call, first_incomplete } => {
                head(out, QUERY, 0, 0, call.client, call.seq);
                out.put_slice(&first_incomplete.to_le_bytes());
            }
            Envelope::Ack { call } => head(out, ACK, 0, 0, call.client, call.seq),
            Envelope::Refused { call, reason } => head(out, REFUSED, reason as u8, 0, call.client, call.seq),
            Envelope::Reply { call, result } => {
                head(out, REPLY, 0, 0, call.client, call.seq);
                out.put_slice(result);
            }
            Envelope::ReplyAck { client, first_incomplete } => {
                head(out, REPLY_ACK, 0, 0, client, first_incomplete)
            }
            Envelope::AckRequest { client } => head(out, ACK_REQUEST, 0, 0, client, 0),
        }
    }

    /// The envelope as a new buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        self.write(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(client: u64, seq: u64) -> CallId {
        CallId { client, seq }
    }

    fn every_kind() -> Vec<Envelope<'static>> {
        vec![
            Envelope::Request {
                call: id(7, 3),
                handler: 9,
                one_way: false,
                first_incomplete: 2,
                args: b"args",
            },
            Envelope::Request { call: id(7, 4), handler: 0, one_way: true, first_incomplete: 4, args: b"" },
            Envelope::Query { call: id(7, 3), first_incomplete: 1 },
            Envelope::Ack { call: id(1, 2) },
            Envelope::Refused { call: id(1, 2), reason: Refusal::NotFound },
            Envelope::Refused { call: id(1, 2), reason: Refusal::Stale },
            Envelope::Reply { call: id(1, 2), result: b"result" },
            Envelope::Reply { call: id(1, 2), result: b"" },
            Envelope::ReplyAck { client: 5, first_incomplete: 77 },
            Envelope::AckRequest { client: 5 },
        ]
    }

    #[test]
    fn every_kind_reads_back_as_written() {
        for e in every_kind() {
            let bytes = e.to_vec();
            assert_eq!(bytes.len(), e.len());
            assert_eq!(Envelope::parse(&bytes), Ok(e));
        }
    }

    #[test]
    fn damaged_envelopes_are_typed_errors() {
        let ack = Envelope::Ack { call: id(1, 2) }.to_vec();
        assert_eq!(Envelope::parse(&ack[..10]), Err(EnvelopeError::Truncated { needed: 24, got: 10 }));
        let mut unknown = ack.clone();
        unknown[0] = 99;
        assert_eq!(Envelope::parse(&unknown), Err(EnvelopeError::UnknownKind(99)));
        let mut reserved = ack.clone();
        reserved[3] = 1;
        assert_eq!(Envelope::parse(&reserved), Err(EnvelopeError::Reserved));
        let mut trailing = ack.clone();
        trailing.push(0);
        assert_eq!(Envelope::parse(&trailing), Err(EnvelopeError::Trailing { kind: ACK, extra: 1 }));
        let mut reason = Envelope::Refused { call: id(1, 2), reason: Refusal::Busy }.to_vec();
        reason[1] = 0;
        assert_eq!(Envelope::parse(&reason), Err(EnvelopeError::BadAux { kind: REFUSED, aux: 0 }));
        let mut flags =
            Envelope::Request { call: id(1, 2), handler: 1, one_way: false, first_incomplete: 0, args: b"" }
                .to_vec();
        flags[1] = 0x80;
        assert_eq!(Envelope::parse(&flags), Err(EnvelopeError::BadAux { kind: REQUEST, aux: 0x80 }));
        let mut handler = ack.clone();
        handler[4] = 1;
        assert_eq!(Envelope::parse(&handler), Err(EnvelopeError::Reserved), "a handler only on a request");
        let query = Envelope::Query { call: id(1, 2), first_incomplete: 0 }.to_vec();
        assert!(matches!(Envelope::parse(&query[..HEAD_LEN]), Err(EnvelopeError::Truncated { .. })));
    }

    proptest! {
        /// Any bytes: a typed answer, never a panic; and whatever parses
        /// writes back to exactly the bytes it came from.
        #[test]
        fn any_bytes_parse_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(e) = Envelope::parse(&bytes) {
                prop_assert_eq!(e.to_vec(), bytes);
            }
        }
    }
}
