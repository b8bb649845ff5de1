//! A fault plan: which faults of Li et al. [CI] Table 2 strike, where (Table 4),
//! how often, and when. Plans are built in Rust, parsed from a compact
//! command-line form (`drop:p=0.01`, `delay:p=0.001,mean=2ms`) or from a
//! TOML file, and printed back in both forms. One field table serves both
//! syntaxes, so they accept exactly the same keys, and an invalid plan is
//! rejected with an error that names the rule and the field.

use std::time::Duration;

use thiserror::Error;

use crate::dist::{Recurrence, Span, Spread};

/// The status a faulted call fails with: Li et al. [CI] Table 1, as the
/// transport layer types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    LocalResource,
    RemoteResource,
    InvalidBuffer,
    InvalidEndpoint,
    InvalidArgs,
    DestReject,
    Unreachable,
    NotInitialized,
    Interrupted,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 9] = [
        ErrorKind::LocalResource,
        ErrorKind::RemoteResource,
        ErrorKind::InvalidBuffer,
        ErrorKind::InvalidEndpoint,
        ErrorKind::InvalidArgs,
        ErrorKind::DestReject,
        ErrorKind::Unreachable,
        ErrorKind::NotInitialized,
        ErrorKind::Interrupted,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::LocalResource => "local_resource",
            ErrorKind::RemoteResource => "remote_resource",
            ErrorKind::InvalidBuffer => "invalid_buffer",
            ErrorKind::InvalidEndpoint => "invalid_endpoint",
            ErrorKind::InvalidArgs => "invalid_args",
            ErrorKind::DestReject => "dest_reject",
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::NotInitialized => "not_initialized",
            ErrorKind::Interrupted => "interrupted",
        }
    }
}

/// How a modify fault mangles a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modify {
    /// Flip this many random bits.
    Flip(Span),
    /// Cut the datagram at a random length shorter than it was.
    Truncate,
    /// Append this many random bytes.
    Extend(Span),
}

/// What a fault does (Li et al. [CI] Table 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    Drop,
    /// Hold the datagram for a drawn duration, then deliver it.
    Delay(Spread),
    Modify(Modify),
    /// Hold the datagram until 1 to `depth` later ones have passed it, or
    /// `max_hold` has passed (a reordered datagram is late, never lost).
    Reorder {
        depth: u32,
        max_hold: Duration,
    },
    /// Deliver `copies` extra copies.
    Duplicate {
        copies: u32,
    },
    /// Also send a copy of a recently sent datagram to a destination drawn
    /// from those seen.
    Inject,
    /// The call fails at once with this status, touching nothing below.
    Invocation(ErrorKind),
    /// The call succeeds; the operation then completes with this status,
    /// and with probability `drop` the datagram never leaves.
    Operation {
        error: ErrorKind,
        drop: f64,
    },
}

/// The kinds of fault, without their parameters: counters and campaigns
/// are per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    Drop,
    Delay,
    Modify,
    Reorder,
    Duplicate,
    Inject,
    Invocation,
    Operation,
}

impl FaultKind {
    pub const ALL: [FaultKind; 8] = [
        FaultKind::Drop,
        FaultKind::Delay,
        FaultKind::Modify,
        FaultKind::Reorder,
        FaultKind::Duplicate,
        FaultKind::Inject,
        FaultKind::Invocation,
        FaultKind::Operation,
    ];
    /// The faults that strike messages in flight (Li et al. [CI] "message faults").
    pub const MESSAGE: [FaultKind; 6] = [
        FaultKind::Drop,
        FaultKind::Delay,
        FaultKind::Modify,
        FaultKind::Reorder,
        FaultKind::Duplicate,
        FaultKind::Inject,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Drop => "drop",
            FaultKind::Delay => "delay",
            FaultKind::Modify => "modify",
            FaultKind::Reorder => "reorder",
            FaultKind::Duplicate => "duplicate",
            FaultKind::Inject => "inject",
            FaultKind::Invocation => "invocation",
            FaultKind::Operation => "operation",
        }
    }

    pub fn from_name(name: &str) -> Option<FaultKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Where the fault may be injected (Li et al. [CI] Table 4 and section 5):
    /// delay, reorder and modify only on receipt, where no completion
    /// status is owed and no sender copy gets mangled; inject only on send.
    pub fn sides(self) -> &'static [Side] {
        match self {
            FaultKind::Drop | FaultKind::Duplicate => &[Side::Recv, Side::Send],
            FaultKind::Delay | FaultKind::Modify | FaultKind::Reorder => &[Side::Recv],
            FaultKind::Inject => &[Side::Send],
            FaultKind::Invocation => &[Side::Send, Side::Recv, Side::Api],
            FaultKind::Operation => &[Side::Send, Side::Api],
        }
    }
}

impl Fault {
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::Drop => FaultKind::Drop,
            Fault::Delay(_) => FaultKind::Delay,
            Fault::Modify(_) => FaultKind::Modify,
            Fault::Reorder { .. } => FaultKind::Reorder,
            Fault::Duplicate { .. } => FaultKind::Duplicate,
            Fault::Inject => FaultKind::Inject,
            Fault::Invocation(_) => FaultKind::Invocation,
            Fault::Operation { .. } => FaultKind::Operation,
        }
    }
}

/// Where a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Datagrams handed to the transport.
    Send,
    /// Datagrams the transport received.
    Recv,
    /// The application's calls into tether: invocation and operation
    /// faults that the application itself must survive.
    Api,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Send => "send",
            Side::Recv => "recv",
            Side::Api => "api",
        }
    }
}

/// When a rule is active, in time since the injector started: from `from`
/// until `until`, and within that, if `burst` is set, `on` of every
/// `on + off` (burst loss, a link dead for 200 ms every second).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Schedule {
    pub from: Duration,
    pub until: Option<Duration>,
    pub burst: Option<(Duration, Duration)>,
}

impl Schedule {
    pub fn always() -> Self {
        Schedule::default()
    }

    pub fn active(&self, now: Duration) -> bool {
        if now < self.from || self.until.is_some_and(|u| now >= u) {
            return false;
        }
        match self.burst {
            None => true,
            Some((on, off)) => {
                let period = (on + off).as_nanos().max(1);
                (now - self.from).as_nanos() % period < on.as_nanos()
            }
        }
    }
}

/// One fault, where it strikes, how often, and when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    pub fault: Fault,
    pub side: Side,
    pub recurrence: Recurrence,
    pub schedule: Schedule,
}

impl Rule {
    /// A rule on the fault's first listed side (receive where allowed),
    /// always active.
    pub fn new(fault: Fault, recurrence: Recurrence) -> Self {
        Rule { side: fault.kind().sides()[0], fault, recurrence, schedule: Schedule::always() }
    }
    pub fn drop(recurrence: Recurrence) -> Self {
        Rule::new(Fault::Drop, recurrence)
    }
    pub fn on(mut self, side: Side) -> Self {
        self.side = side;
        self
    }
    pub fn during(mut self, from: Duration, until: Option<Duration>) -> Self {
        self.schedule.from = from;
        self.schedule.until = until;
        self
    }
    pub fn bursts(mut self, on: Duration, off: Duration) -> Self {
        self.schedule.burst = Some((on, off));
        self
    }

    pub fn kind(&self) -> FaultKind {
        self.fault.kind()
    }

    /// Check every value; `index` names the rule in the error.
    pub fn validate(&self, index: usize) -> Result<(), PlanError> {
        let bad = |field: &'static str, problem: String| {
            Err(PlanError::Field { rule: index, kind: self.kind().name(), field, problem })
        };
        let probability = |p: f64| (0.0..=1.0).contains(&p);
        if !self.kind().sides().contains(&self.side) {
            let allowed: Vec<_> = self.kind().sides().iter().map(|s| s.name()).collect();
            return bad("side", format!("{} faults go on {}", self.kind().name(), allowed.join(" or ")));
        }
        match self.recurrence {
            Recurrence::Probability(p) if !probability(p) => {
                return bad("p", format!("{p} is not a probability in [0, 1]"))
            }
            Recurrence::EveryNth(0) => return bad("every", "must be at least 1".into()),
            Recurrence::MeanGap(m) if !(m >= 1.0 && m.is_finite()) => {
                return bad("mean_gap", format!("{m} is not a mean of at least 1 message"))
            }
            Recurrence::UniformGap(lo, hi) if lo == 0 || hi < lo => {
                return bad("gap", format!("{lo}..{hi} is not a range of at least 1 message"))
            }
            Recurrence::MeanInterval(d) if d.is_zero() => {
                return bad("mean_interval", "must be longer than 0".into())
            }
            Recurrence::UniformInterval(lo, hi) if hi < lo || hi.is_zero() => {
                return bad("interval", format!("{lo:?}..{hi:?} is not a range longer than 0"))
            }
            _ => {}
        }
        match self.fault {
            Fault::Delay(Spread::Uniform(lo, hi)) if hi < lo => {
                return bad("max", format!("{hi:?} is below min {lo:?}"))
            }
            Fault::Modify(Modify::Flip(s)) if s.lo == 0 || s.hi < s.lo => {
                return bad("bits", "must be a count or range of at least 1 bit".into())
            }
            Fault::Modify(Modify::Extend(s)) if s.lo == 0 || s.hi < s.lo => {
                return bad("by", "must be a count or range of at least 1 byte".into())
            }
            Fault::Reorder { depth: 0, .. } => return bad("depth", "must be at least 1".into()),
            Fault::Duplicate { copies: 0 } => return bad("copies", "must be at least 1".into()),
            Fault::Operation { drop, .. } if !probability(drop) => {
                return bad("drop", format!("{drop} is not a probability in [0, 1]"))
            }
            _ => {}
        }
        if let Some((on, off)) = self.schedule.burst {
            if on.is_zero() || (on + off).is_zero() {
                return bad("on", "a burst must be on for longer than 0".into());
            }
        }
        if self.schedule.until.is_some_and(|u| u <= self.schedule.from) {
            return bad("until", "must be later than from".into());
        }
        Ok(())
    }
}

/// A whole plan: its rules and the seed of every draw.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FaultPlan {
    pub seed: u64,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    #[error("fault {rule} ({kind}): field `{field}`: {problem}")]
    Field { rule: usize, kind: &'static str, field: &'static str, problem: String },
    #[error("fault {rule}: unknown fault kind `{kind}` (known: drop, delay, modify, reorder, duplicate, inject, invocation, operation)")]
    UnknownKind { rule: usize, kind: String },
    #[error("fault {rule} ({kind}): unknown field `{field}` (this kind takes: {known})")]
    UnknownField { rule: usize, kind: &'static str, field: String, known: String },
    #[error("fault {rule} ({kind}): give exactly one of p, every, mean_gap, gap, mean_interval, interval")]
    Recurrence { rule: usize, kind: &'static str },
    #[error("fault plan file: {0}")]
    Toml(String),
}

impl FaultPlan {
    pub fn new(seed: u64) -> Self {
        FaultPlan { seed, rules: Vec::new() }
    }

    pub fn with(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn validate(&self) -> Result<(), PlanError> {
        self.rules.iter().enumerate().try_for_each(|(i, r)| r.validate(i))
    }

    /// Whether any rule applies at `side`.
    pub fn touches(&self, side: Side) -> bool {
        self.rules.iter().any(|r| r.side == side)
    }
}
