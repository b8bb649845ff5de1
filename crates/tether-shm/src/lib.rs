//! Shared memory between an application and its engine process (Zhou et
//! al. [FTGM]: the network card's state that must survive the card lives
//! on the host; here the engine is a process and the host is each
//! application, docs/ENGINE.md).
//!
//! Three pieces, each safe to map from two processes at once, and the
//! layout of an application's region that puts them together
//! ([`ClientRegion`]):
//!
//! - [`Region`]: a file in `/dev/shm` (or anywhere) mapped shared, the unit
//!   an application creates and an engine maps, and that outlives the
//!   engine;
//! - [`Ring`]: a single-producer single-consumer ring of variable-length
//!   records, for submissions (application to engine) and completions
//!   (engine to application); every record carries its length and a
//!   CRC32C, so a record a crashed writer never finished is never visible
//!   and one a stray write damaged is detected, not taken;
//! - [`PairEnd`]: two applications' direct path, a ring each way that the
//!   engine lays out and stays out of;
//! - [`BoardWriter`] and [`BoardReader`]: a notice board, one writer's
//!   snapshot of any length that readers copy read-only (`tether stat`);
//! - [`Block`]: a control block (the host-side backup of a stream, say)
//!   written under a sequence lock and a CRC32C, so a reader can tell a
//!   half-written block from a whole one and never trusts the first.
//!
//! Nothing here parses what it did not check: every read of shared memory
//! is bounded and validated, with typed errors ([`ShmError`]).

mod block;
mod board;
mod client;
mod error;
mod pair;
mod region;
mod ring;

pub use block::{Block, BlockBody, StreamBackup, BLOCK_BODY};
pub use board::{BoardReader, BoardWriter, BOARD_HEADER, MAX_BOARD};
pub use client::{ClientHeader, ClientRegion, Control, LAYOUT_VERSION, MAX_STREAMS, SECRET_LEN};
pub use error::ShmError;
pub use pair::{create_pair, pair_len, PairEnd};
pub use region::Region;
pub use ring::{Ring, RING_HEADER};
