//! Fuzz the fault-plan parsers (the compact `--fault` form and TOML plan
//! files): arbitrary text must give a plan or a `PlanError`, never a panic;
//! whatever parses must validate, survive a TOML round trip unchanged, and
//! drive an injector through sends, receives and releases without panicking.
//!
//! The first byte picks the parser, so one corpus covers both.

use std::time::Duration;

use tether_fault::{FaultPlan, Injector};

/// One fuzz input.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let parsed = if mode % 2 == 0 {
        let rules: Vec<&str> = text.split('\n').collect();
        FaultPlan::parse_rules(u64::from(mode), &rules)
    } else {
        FaultPlan::from_toml(text)
    };
    let Ok(plan) = parsed else { return };
    plan.validate().expect("a parsed plan is valid");
    let again = FaultPlan::from_toml(&plan.to_toml()).expect("a plan's own TOML parses");
    assert_eq!(again, plan, "TOML round trip");
    exercise(&plan);
}

/// A short run through every entry point of the injector.
fn exercise(plan: &FaultPlan) {
    let mut inj = Injector::new(plan).expect("a valid plan makes an injector");
    let datagram = [0xA5u8; 64];
    for i in 0..64u64 {
        let now = Duration::from_micros(i * 100);
        inj.on_call(now);
        inj.on_send(now, (i % 3) as u32, &datagram[..(i as usize % 64)], |_, _| {});
        let _ = inj.on_recv_call(now);
        inj.on_recv(now, Some(1), None, &datagram);
        inj.drain_ready(now, |_, _, _| true);
    }
    inj.drain_ready(Duration::from_secs(3600 * 24 * 365), |_, _, _| true);
}
