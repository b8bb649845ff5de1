//! The functional fault model of Li et al. [CI] (docs/REFERENCES.md; sections
//! 4-5, Tables 2 and 4): message faults (drop, delay, modify, reorder, duplicate, inject),
//! invocation faults and operation faults, each with a recurrence drawn from a
//! distribution, a side it strikes on, and a schedule; all driven by one
//! seeded RNG so a run replays exactly.
//!
//! Pure: no I/O, no clock, no threads. The same `Injector` is wrapped
//! around real transports (tether-io's `FaultyTransport`), guards the
//! application's calls (the tether runtime) and is the fault source of the
//! simulator (tether-sim).
//!
//! ```
//! use std::time::Duration;
//! use tether_fault::{FaultPlan, Recurrence, Rule, Fault, Spread, Side};
//! // The same plan three ways: builder, compact form, TOML.
//! let built = FaultPlan::new(7)
//!     .with(Rule::drop(Recurrence::Probability(0.01)).on(Side::Send))
//!     .with(Rule::new(Fault::Delay(Spread::Exponential { mean: Duration::from_millis(2) }),
//!                     Recurrence::Probability(0.001)));
//! let parsed = FaultPlan::parse_rules(7, &["drop:p=0.01,side=send", "delay:p=0.001,mean=2ms"])?;
//! assert_eq!(built, parsed);
//! assert_eq!(FaultPlan::from_toml(&built.to_toml())?, built);
//! # Ok::<(), tether_fault::PlanError>(())
//! ```

mod dist;
mod injector;
mod plan;
mod syntax;

pub use dist::{Recurrence, Span, Spread};
pub use injector::{node_seed, CallVerdict, FaultCounters, Injector, SendVerdict, MAX_QUEUED};
pub use plan::{ErrorKind, Fault, FaultKind, FaultPlan, Modify, PlanError, Rule, Schedule, Side};
pub use syntax::{format_duration, parse_duration};
