//! What the engine fault campaign strikes an engine with (Zhou et al.
//! [FTGM] Table 1): signals from outside, and bit flips inside its state
//! through the fault hook. Its own module so the campaign's options
//! (`CampaignOpts`) name the classes without depending on the campaign
//! that strikes them.

use clap::ValueEnum;
use serde::Serialize;

/// What strikes an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultClass {
    /// SIGKILL the engine.
    Kill,
    /// SIGSTOP it for 1 to 50 ms.
    Hang,
    /// Flip a bit of a buffered payload (fault hook).
    Payload,
    /// Flip a bit of a sequence number (fault hook).
    Seq,
    /// Flip a bit of a window pointer (fault hook).
    Window,
    /// Flip a bit of an address-book entry (fault hook).
    Book,
    /// Flip a rail's state (fault hook).
    Rail,
}

impl FaultClass {
    pub const ALL: [FaultClass; 7] = [
        FaultClass::Kill,
        FaultClass::Hang,
        FaultClass::Payload,
        FaultClass::Seq,
        FaultClass::Window,
        FaultClass::Book,
        FaultClass::Rail,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultClass::Kill => "kill",
            FaultClass::Hang => "hang",
            FaultClass::Payload => "payload",
            FaultClass::Seq => "seq",
            FaultClass::Window => "window",
            FaultClass::Book => "book",
            FaultClass::Rail => "rail",
        }
    }

    /// Struck through the fault hook, inside the engine's state.
    pub fn internal(self) -> bool {
        !matches!(self, FaultClass::Kill | FaultClass::Hang)
    }
}
