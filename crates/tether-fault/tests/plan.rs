//! Fault plans: the builder, the compact form and TOML describe the same
//! plans, print back to themselves, and reject bad input with an error
//! that names the rule and the field.

use std::time::Duration;

use proptest::prelude::*;
use tether_fault::{ErrorKind, Fault, FaultPlan, Modify, PlanError, Recurrence, Rule, Side, Span, Spread};

fn field_of(e: &PlanError) -> String {
    match e {
        PlanError::Field { field, .. } => field.to_string(),
        PlanError::UnknownField { field, .. } => field.clone(),
        other => format!("{other:?}"),
    }
}

#[test]
fn the_issue_examples_parse() {
    let plan = FaultPlan::parse_rules(1, &["drop:p=0.01", "delay:p=0.001,mean=2ms"]).unwrap();
    assert_eq!(plan.rules[0], Rule::drop(Recurrence::Probability(0.01)));
    assert_eq!(
        plan.rules[1],
        Rule::new(
            Fault::Delay(Spread::Exponential { mean: Duration::from_millis(2) }),
            Recurrence::Probability(0.001)
        )
    );
    assert_eq!(plan.rules[1].side, Side::Recv);
}

#[test]
fn toml_plan_file() {
    let text = r#"
        seed = 42
        [[fault]]
        kind = "drop"
        every = 100
        side = "send"
        from = "100ms"
        until = "300ms"

        [[fault]]
        kind = "modify"
        mode = "flip"
        bits = "1..3"
        p = 0.001

        [[fault]]
        kind = "invocation"
        side = "api"
        error = "local_resource"
        mean_interval = "5ms"
    "#;
    let plan = FaultPlan::from_toml(text).unwrap();
    assert_eq!(plan.seed, 42);
    assert_eq!(plan.rules.len(), 3);
    assert_eq!(plan.rules[0].schedule.until, Some(Duration::from_millis(300)));
    assert_eq!(plan.rules[1].fault, Fault::Modify(Modify::Flip(Span { lo: 1, hi: 3 })));
    assert_eq!(plan.rules[2].fault, Fault::Invocation(ErrorKind::LocalResource));
    assert_eq!(FaultPlan::from_toml(&plan.to_toml()).unwrap(), plan);
}

#[test]
fn bad_plans_name_the_field() {
    let cases = [
        ("drop:p=1.5", "p"),
        ("drop:p=abc", "p"),
        ("drop:every=0", "every"),
        ("delay:p=0.1,mean=2parsecs", "mean"),
        ("delay:p=0.1,min=3ms,max=1ms", "max"),
        ("delay:p=0.1,side=send", "side"),
        ("inject:p=0.1,side=recv", "side"),
        ("modify:p=0.1,mode=shred", "mode"),
        ("modify:p=0.1,bits=0", "bits"),
        ("reorder:p=0.1,depth=0", "depth"),
        ("drop:p=0.1,colour=red", "colour"),
        ("invocation:p=0.1,error=sad", "error"),
        ("operation:p=0.1,side=api,drop=2", "drop"),
        ("drop:p=0.1,on=10ms", "off"),
        ("drop:p=0.1,from=20ms,until=10ms", "until"),
    ];
    for (text, field) in cases {
        let e = FaultPlan::parse_rules(0, &["drop:p=0.5", text]).unwrap_err();
        assert_eq!(field_of(&e), field, "{text}: {e}");
        let message = e.to_string();
        assert!(message.starts_with("fault 1 ") && message.contains(field), "{message}");
    }
    assert!(matches!(FaultPlan::parse_rule("explode:p=1", 0), Err(PlanError::UnknownKind { .. })));
    assert!(matches!(FaultPlan::parse_rule("drop", 0), Err(PlanError::Recurrence { .. })));
    assert!(matches!(FaultPlan::parse_rule("drop:p=0.1,every=3", 0), Err(PlanError::Recurrence { .. })));
    let e = FaultPlan::from_toml("[[fault]]\nkind = \"drop\"\np = \"lots\"\n").unwrap_err();
    assert_eq!(field_of(&e), "p");
    assert!(matches!(FaultPlan::from_toml("seed = \"x\""), Err(PlanError::Toml(_))));
    assert!(matches!(FaultPlan::from_toml("[[fault]]\np = 0.1"), Err(PlanError::Toml(_))));
    assert!(matches!(FaultPlan::from_toml("not toml ["), Err(PlanError::Toml(_))));
}

/// Found by the fault_plan fuzz target: a whole mean_gap past i64 printed
/// as a bare TOML integer too large to read back; so did a seed past i64.
#[test]
fn huge_numbers_survive_toml() {
    let plan = FaultPlan::parse_rules(u64::MAX, &["delay:mean_gap=7777777777777777777777777777777777777777"])
        .unwrap();
    assert_eq!(FaultPlan::from_toml(&plan.to_toml()).unwrap(), plan);
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (1u64..10_000).prop_map(Duration::from_micros),
        (1u64..1000).prop_map(Duration::from_millis),
        (1u64..100_000).prop_map(Duration::from_nanos),
    ]
}

fn recurrence() -> impl Strategy<Value = Recurrence> {
    prop_oneof![
        (0.0f64..=1.0).prop_map(Recurrence::Probability),
        (1u64..1000).prop_map(Recurrence::EveryNth),
        (1.0f64..1000.0).prop_map(Recurrence::MeanGap),
        (1.0f64..1e300).prop_map(Recurrence::MeanGap),
        (1u64..100, 0u64..100).prop_map(|(lo, d)| Recurrence::UniformGap(lo, lo + d)),
        duration().prop_map(Recurrence::MeanInterval),
        (duration(), duration()).prop_map(|(a, b)| Recurrence::UniformInterval(a, a + b)),
    ]
}

fn rule() -> impl Strategy<Value = Rule> {
    let fault = prop_oneof![
        Just(Fault::Drop),
        duration().prop_map(|d| Fault::Delay(Spread::Fixed(d))),
        duration().prop_map(|d| Fault::Delay(Spread::Exponential { mean: d })),
        (duration(), duration()).prop_map(|(a, b)| Fault::Delay(Spread::Uniform(a, a + b))),
        (1u64..8).prop_map(|n| Fault::Modify(Modify::Flip(Span { lo: 1, hi: n }))),
        Just(Fault::Modify(Modify::Truncate)),
        (1u32..8, duration()).prop_map(|(depth, max_hold)| Fault::Reorder { depth, max_hold }),
        (1u32..4).prop_map(|copies| Fault::Duplicate { copies }),
        Just(Fault::Inject),
        (0usize..9).prop_map(|i| Fault::Invocation(ErrorKind::ALL[i])),
        (0usize..9, 0.0f64..=1.0).prop_map(|(i, drop)| Fault::Operation { error: ErrorKind::ALL[i], drop }),
    ];
    (
        fault,
        recurrence(),
        any::<u8>(),
        proptest::option::of(duration()),
        proptest::option::of((duration(), duration())),
    )
        .prop_map(|(fault, recurrence, side, until, burst)| {
            let sides = fault.kind().sides();
            let mut r = Rule::new(fault, recurrence).on(sides[side as usize % sides.len()]);
            r.schedule.until = until;
            r.schedule.burst = burst;
            r
        })
}

proptest! {
    #[test]
    fn every_plan_prints_back_to_itself(rules in proptest::collection::vec(rule(), 0..5), seed in any::<u64>()) {
        let plan = FaultPlan { seed, rules };
        let compact: Vec<String> = plan.rules.iter().map(|r| r.to_string()).collect();
        prop_assert_eq!(&FaultPlan::parse_rules(plan.seed, &compact).unwrap(), &plan);
        prop_assert_eq!(&FaultPlan::from_toml(&plan.to_toml()).unwrap(), &plan);
    }

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,60}") {
        let _ = FaultPlan::parse_rule(&text, 0);
        let _ = FaultPlan::from_toml(&text);
    }
}
