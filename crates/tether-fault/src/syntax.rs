//! The one field table behind both plan syntaxes: a rule is a kind plus
//! `key=value` fields, whether they come from `--fault drop:p=0.01` or from
//! a `[[fault]]` table in TOML. Values are read here and nowhere else, so
//! the two syntaxes cannot drift apart, and printing a rule gives fields
//! that read back to the same rule.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::time::Duration;

use crate::dist::{Recurrence, Span, Spread};
use crate::plan::{ErrorKind, Fault, FaultKind, FaultPlan, Modify, PlanError, Rule, Schedule, Side};

const COMMON: &[&str] =
    &["side", "p", "every", "mean_gap", "gap", "mean_interval", "interval", "from", "until", "on", "off"];

fn kind_fields(kind: FaultKind) -> &'static [&'static str] {
    match kind {
        FaultKind::Delay => &["fixed", "mean", "min", "max"],
        FaultKind::Modify => &["mode", "bits", "by"],
        FaultKind::Reorder => &["depth", "max_hold"],
        FaultKind::Duplicate => &["copies"],
        FaultKind::Invocation => &["error"],
        FaultKind::Operation => &["error", "drop"],
        FaultKind::Drop | FaultKind::Inject => &[],
    }
}

/// Reads the fields of one rule, naming the rule and field in every error.
struct Fields<'a> {
    rule: usize,
    kind: FaultKind,
    fields: &'a [(String, String)],
}

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.fields.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn error(&self, field: &'static str, problem: String) -> PlanError {
        PlanError::Field { rule: self.rule, kind: self.kind.name(), field, problem }
    }

    fn parse<T>(
        &self,
        key: &'static str,
        what: &str,
        read: impl Fn(&str) -> Option<T>,
    ) -> Result<Option<T>, PlanError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                read(v).map(Some).ok_or_else(|| self.error(key, format!("expected {what}, got `{v}`")))
            }
        }
    }

    fn float(&self, key: &'static str) -> Result<Option<f64>, PlanError> {
        self.parse(key, "a number", |v| v.parse::<f64>().ok().filter(|x| x.is_finite()))
    }
    fn int(&self, key: &'static str) -> Result<Option<u64>, PlanError> {
        self.parse(key, "a whole number", |v| v.parse().ok())
    }
    fn duration(&self, key: &'static str) -> Result<Option<Duration>, PlanError> {
        self.parse(key, "a duration like 2ms, 500us or 1.5s", parse_duration)
    }
    fn int_span(&self, key: &'static str) -> Result<Option<Span>, PlanError> {
        self.parse(key, "a count like 3 or a range like 1..3", |v| match v.split_once("..") {
            Some((lo, hi)) => Some(Span { lo: lo.trim().parse().ok()?, hi: hi.trim().parse().ok()? }),
            None => v.parse().ok().map(Span::exactly),
        })
    }
    fn duration_range(&self, key: &'static str) -> Result<Option<(Duration, Duration)>, PlanError> {
        self.parse(key, "a range like 5ms..15ms", |v| {
            let (lo, hi) = v.split_once("..")?;
            Some((parse_duration(lo.trim())?, parse_duration(hi.trim())?))
        })
    }
    fn error_kind(&self, default: ErrorKind) -> Result<ErrorKind, PlanError> {
        let names: Vec<_> = ErrorKind::ALL.iter().map(|e| e.name()).collect();
        let read = |v: &str| ErrorKind::ALL.into_iter().find(|e| e.name() == v);
        Ok(self.parse("error", &format!("one of {}", names.join(", ")), read)?.unwrap_or(default))
    }
}

pub(crate) fn rule_from_fields(
    rule: usize,
    kind: &str,
    fields: &[(String, String)],
) -> Result<Rule, PlanError> {
    let Some(kind) = FaultKind::from_name(kind) else {
        return Err(PlanError::UnknownKind { rule, kind: kind.to_string() });
    };
    let known: Vec<&str> = COMMON.iter().chain(kind_fields(kind)).copied().collect();
    if let Some((field, _)) = fields.iter().find(|(k, _)| !known.contains(&k.as_str())) {
        return Err(PlanError::UnknownField {
            rule,
            kind: kind.name(),
            field: field.clone(),
            known: known.join(", "),
        });
    }
    let f = Fields { rule, kind, fields };
    let fault = fault(&f)?;
    let recurrence = recurrence(&f)?;
    let side = match f.get("side") {
        None => kind.sides()[0],
        Some(v) => [Side::Send, Side::Recv, Side::Api]
            .into_iter()
            .find(|s| s.name() == v)
            .ok_or_else(|| f.error("side", format!("expected send, recv or api, got `{v}`")))?,
    };
    let burst = match (f.duration("on")?, f.duration("off")?) {
        (Some(on), Some(off)) => Some((on, off)),
        (None, None) => None,
        (Some(_), None) => return Err(f.error("off", "a burst needs both on and off".into())),
        (None, Some(_)) => return Err(f.error("on", "a burst needs both on and off".into())),
    };
    let schedule =
        Schedule { from: f.duration("from")?.unwrap_or_default(), until: f.duration("until")?, burst };
    let rule = Rule { fault, side, recurrence, schedule };
    rule.validate(f.rule)?;
    Ok(rule)
}

fn fault(f: &Fields) -> Result<Fault, PlanError> {
    Ok(match f.kind {
        FaultKind::Drop => Fault::Drop,
        FaultKind::Inject => Fault::Inject,
        FaultKind::Delay => {
            let spread =
                match (f.duration("fixed")?, f.duration("mean")?, f.duration("min")?, f.duration("max")?) {
                    (Some(d), None, None, None) => Spread::Fixed(d),
                    (None, Some(mean), None, None) => Spread::Exponential { mean },
                    (None, None, Some(lo), Some(hi)) => Spread::Uniform(lo, hi),
                    (None, None, None, None) => Spread::Exponential { mean: Duration::from_millis(1) },
                    _ => {
                        return Err(f.error(
                            "mean",
                            "give one of fixed=D, mean=D (exponential) or min=D,max=D".into(),
                        ))
                    }
                };
            Fault::Delay(spread)
        }
        FaultKind::Modify => {
            let mode = f.get("mode").unwrap_or("flip");
            match mode {
                "flip" => Fault::Modify(Modify::Flip(f.int_span("bits")?.unwrap_or(Span::exactly(1)))),
                "truncate" => Fault::Modify(Modify::Truncate),
                "extend" => {
                    Fault::Modify(Modify::Extend(f.int_span("by")?.unwrap_or(Span { lo: 1, hi: 16 })))
                }
                other => {
                    return Err(f.error("mode", format!("expected flip, truncate or extend, got `{other}`")))
                }
            }
        }
        FaultKind::Reorder => Fault::Reorder {
            depth: f.int("depth")?.unwrap_or(3).min(u32::MAX as u64) as u32,
            max_hold: f.duration("max_hold")?.unwrap_or(Duration::from_millis(10)),
        },
        FaultKind::Duplicate => {
            Fault::Duplicate { copies: f.int("copies")?.unwrap_or(1).min(u32::MAX as u64) as u32 }
        }
        FaultKind::Invocation => Fault::Invocation(f.error_kind(ErrorKind::LocalResource)?),
        FaultKind::Operation => Fault::Operation {
            error: f.error_kind(ErrorKind::RemoteResource)?,
            drop: f.float("drop")?.unwrap_or(1.0),
        },
    })
}

fn recurrence(f: &Fields) -> Result<Recurrence, PlanError> {
    let given = [
        f.float("p")?.map(Recurrence::Probability),
        f.int("every")?.map(Recurrence::EveryNth),
        f.float("mean_gap")?.map(Recurrence::MeanGap),
        f.int_span("gap")?.map(|s| Recurrence::UniformGap(s.lo, s.hi)),
        f.duration("mean_interval")?.map(Recurrence::MeanInterval),
        f.duration_range("interval")?.map(|(lo, hi)| Recurrence::UniformInterval(lo, hi)),
    ];
    let mut given = given.into_iter().flatten();
    match (given.next(), given.next()) {
        (Some(r), None) => Ok(r),
        _ => Err(PlanError::Recurrence { rule: f.rule, kind: f.kind.name() }),
    }
}

/// The fields that describe `rule`, in a fixed order; reading them back
/// gives the same rule.
pub(crate) fn rule_fields(rule: &Rule) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let d = format_duration;
    match rule.fault {
        Fault::Drop | Fault::Inject => {}
        Fault::Delay(Spread::Fixed(x)) => out.push(("fixed", d(x))),
        Fault::Delay(Spread::Exponential { mean }) => out.push(("mean", d(mean))),
        Fault::Delay(Spread::Uniform(lo, hi)) => out.extend([("min", d(lo)), ("max", d(hi))]),
        Fault::Modify(Modify::Flip(s)) => out.extend([("mode", "flip".into()), ("bits", span(s))]),
        Fault::Modify(Modify::Truncate) => out.push(("mode", "truncate".into())),
        Fault::Modify(Modify::Extend(s)) => out.extend([("mode", "extend".into()), ("by", span(s))]),
        Fault::Reorder { depth, max_hold } => {
            out.extend([("depth", depth.to_string()), ("max_hold", d(max_hold))])
        }
        Fault::Duplicate { copies } => out.push(("copies", copies.to_string())),
        Fault::Invocation(e) => out.push(("error", e.name().into())),
        Fault::Operation { error, drop } => {
            out.extend([("error", error.name().into()), ("drop", drop.to_string())])
        }
    }
    out.push(match rule.recurrence {
        Recurrence::Probability(p) => ("p", p.to_string()),
        Recurrence::EveryNth(n) => ("every", n.to_string()),
        Recurrence::MeanGap(m) => ("mean_gap", m.to_string()),
        Recurrence::UniformGap(lo, hi) => ("gap", format!("{lo}..{hi}")),
        Recurrence::MeanInterval(m) => ("mean_interval", d(m)),
        Recurrence::UniformInterval(lo, hi) => ("interval", format!("{}..{}", d(lo), d(hi))),
    });
    out.push(("side", rule.side.name().into()));
    let s = rule.schedule;
    if !s.from.is_zero() {
        out.push(("from", d(s.from)));
    }
    if let Some(u) = s.until {
        out.push(("until", d(u)));
    }
    if let Some((on, off)) = s.burst {
        out.extend([("on", d(on)), ("off", d(off))]);
    }
    out
}

fn span(s: Span) -> String {
    if s.lo == s.hi {
        s.lo.to_string()
    } else {
        format!("{}..{}", s.lo, s.hi)
    }
}

/// `2ms`, `500us`, `1.5s`, `100ns` (`µs` too), and whatever else humantime
/// reads (`1s 500ms`, `2min`); a bare number other than 0 has no unit and
/// is refused.
pub fn parse_duration(text: &str) -> Option<Duration> {
    humantime::parse_duration(text.trim()).ok()
}

/// The largest unit that shows `d` exactly, so it parses back unchanged.
/// One token, not humantime's `1us 500ns`: a printed rule stays one
/// `key=value` per field, as it is typed.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    for (unit, scale) in [("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)] {
        if ns != 0 && ns.is_multiple_of(scale) {
            return format!("{}{unit}", ns / scale);
        }
    }
    format!("{ns}ns")
}

pub(crate) fn plan_from_toml(text: &str) -> Result<FaultPlan, PlanError> {
    let table: toml::Table =
        text.parse().map_err(|e: toml::de::Error| PlanError::Toml(e.message().into()))?;
    let mut plan = FaultPlan::default();
    for (key, value) in &table {
        match (key.as_str(), value) {
            ("seed", toml::Value::Integer(s)) if *s >= 0 => plan.seed = *s as u64,
            // TOML integers stop at i64::MAX; larger seeds are written quoted.
            ("seed", toml::Value::String(s)) if s.parse::<u64>().is_ok() => {
                plan.seed = s.parse().expect("checked by the guard")
            }
            ("seed", _) => {
                return Err(PlanError::Toml("`seed` must be a whole number from 0 to 2^64-1".into()))
            }
            ("fault", toml::Value::Array(rules)) => {
                for (i, rule) in rules.iter().enumerate() {
                    plan.rules.push(rule_from_toml(i, rule)?);
                }
            }
            (other, _) => {
                return Err(PlanError::Toml(format!(
                    "unknown key `{other}` (expected seed and [[fault]] tables)"
                )))
            }
        }
    }
    Ok(plan)
}

fn rule_from_toml(index: usize, value: &toml::Value) -> Result<Rule, PlanError> {
    let toml::Value::Table(t) = value else {
        return Err(PlanError::Toml(format!("fault {index}: expected a [[fault]] table")));
    };
    let Some(toml::Value::String(kind)) = t.get("kind") else {
        return Err(PlanError::Toml(format!("fault {index}: needs kind = \"drop\" (or delay, modify, ...)")));
    };
    let fields = t
        .iter()
        .filter(|(k, _)| k.as_str() != "kind")
        .map(|(k, v)| {
            let v = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(x) => x.to_string(),
                other => other.to_string(),
            };
            (k.clone(), v)
        })
        .collect::<Vec<_>>();
    rule_from_fields(index, kind, &fields)
}

/// A TOML document with the place of every top-level key and value.
type Spanned = toml::Spanned<toml::Value>;
type Keyed = BTreeMap<toml::Spanned<String>, Spanned>;

/// The `[[fault]]` tables with the place of each table and each of its keys.
#[derive(serde::Deserialize)]
struct Faults {
    #[serde(default)]
    fault: Vec<toml::Spanned<Keyed>>,
}

/// Where in `text` the error `e` of `plan_from_toml(text)` lies: the byte
/// range of the offending key or value, else of its `[[fault]]` table.
/// Found by reading the text again with places kept, in the order
/// `plan_from_toml` checks it, so the place is that of the first problem,
/// the one `e` reports.
pub(crate) fn toml_error_span(text: &str, e: &PlanError) -> Option<Range<usize>> {
    let top: Keyed = match toml::from_str(text) {
        Ok(top) => top,
        Err(syntax) => return syntax.span(),
    };
    let faults = toml::from_str::<Faults>(text).map(|f| f.fault).unwrap_or_default();
    // The key's place, or its table's when the error is about a key that
    // is missing (`on` without `off`) or about the table as a whole.
    let in_rule = |rule: usize, field: Option<&str>| {
        let table = faults.get(rule)?;
        let key = table.get_ref().keys().find(|k| Some(k.get_ref().as_str()) == field);
        Some(key.map_or(table.span(), |k| k.span()))
    };
    match e {
        PlanError::Field { rule, field, .. } => in_rule(*rule, Some(field)),
        PlanError::UnknownField { rule, field, .. } => in_rule(*rule, Some(field)),
        PlanError::UnknownKind { rule, .. } => in_rule(*rule, Some("kind")),
        PlanError::Recurrence { rule, .. } => in_rule(*rule, None),
        PlanError::Toml(_) => {
            for (key, value) in &top {
                match (key.get_ref().as_str(), value.get_ref()) {
                    ("seed", toml::Value::Integer(s)) if *s >= 0 => {}
                    ("seed", toml::Value::String(s)) if s.parse::<u64>().is_ok() => {}
                    ("seed", _) => return Some(value.span()),
                    ("fault", toml::Value::Array(rules)) => {
                        let bad =
                            rules.iter().position(|r| !matches!(r.get("kind"), Some(toml::Value::String(_))));
                        if let Some(i) = bad {
                            return Some(faults.get(i).map_or(value.span(), |t| t.span()));
                        }
                    }
                    _ => return Some(key.span()),
                }
            }
            None
        }
    }
}

/// 1-based line and column (in characters) of byte `at` in `text`.
pub(crate) fn line_column(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..text.floor_char_boundary(at.min(text.len()))];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

pub(crate) fn plan_to_toml(plan: &FaultPlan) -> String {
    let mut out = match i64::try_from(plan.seed) {
        Ok(seed) => format!("seed = {seed}\n"),
        Err(_) => format!("seed = \"{}\"\n", plan.seed),
    };
    for rule in &plan.rules {
        out.push_str(&format!("\n[[fault]]\nkind = \"{}\"\n", rule.kind().name()));
        for (k, v) in rule_fields(rule) {
            // Numbers TOML reads back exactly stay numbers; everything else
            // is a string. A whole f64 past i64 (mean_gap = 7e75) prints
            // without a point, which TOML would take for an integer too
            // large to hold: it goes quoted.
            let integer = v.parse::<i64>().is_ok();
            let float = v.contains('.') && v.parse::<f64>().is_ok_and(f64::is_finite);
            if integer || float {
                out.push_str(&format!("{k} = {v}\n"));
            } else {
                out.push_str(&format!("{k} = \"{v}\"\n"));
            }
        }
    }
    out
}

/// The plan's two syntaxes, read and written (`FaultPlan`'s own methods
/// live here, beside the field table, so the plan's types need nothing of it).
impl FaultPlan {
    /// Parse one rule in the compact form, `kind:key=value,key=value`;
    /// `index` names it in errors.
    pub fn parse_rule(text: &str, index: usize) -> Result<Rule, PlanError> {
        let (kind, rest) = text.split_once(':').unwrap_or((text, ""));
        let fields = rest
            .split(',')
            .filter(|f| !f.trim().is_empty())
            .map(|f| {
                let (k, v) = f.split_once('=').unwrap_or((f, ""));
                (k.trim().to_string(), v.trim().to_string())
            })
            .collect::<Vec<_>>();
        rule_from_fields(index, kind.trim(), &fields)
    }

    /// A plan from compact rules, e.g. the values of repeated `--fault` options.
    pub fn parse_rules<S: AsRef<str>>(seed: u64, rules: &[S]) -> Result<Self, PlanError> {
        let rules = rules.iter().enumerate().map(|(i, r)| Self::parse_rule(r.as_ref(), i));
        Ok(FaultPlan { seed, rules: rules.collect::<Result<_, _>>()? })
    }

    /// A plan from TOML: an optional `seed` and `[[fault]]` tables whose
    /// keys are the compact form's (`kind = "delay"`, `p = 0.001`,
    /// `mean = "2ms"`).
    pub fn from_toml(text: &str) -> Result<Self, PlanError> {
        plan_from_toml(text)
    }

    /// Where the error `e` that `from_toml(text)` returned lies in `text`,
    /// as a 1-based line and column, to print as `FILE:LINE:COLUMN`: the
    /// offending key or value, or the `[[fault]]` table it is missing from.
    pub fn toml_error_location(text: &str, e: &PlanError) -> Option<(usize, usize)> {
        let span = toml_error_span(text, e)?;
        Some(line_column(text, span.start))
    }

    pub fn to_toml(&self) -> String {
        plan_to_toml(self)
    }
}

impl fmt::Display for Rule {
    /// The compact form, which `FaultPlan::parse_rule` reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fields = rule_fields(self);
        write!(f, "{}:", self.kind().name())?;
        for (i, (k, v)) in fields.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { "" } else { "," })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_and_print_back() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("2ms"), Some(ms(2)));
        assert_eq!(parse_duration("1.5s"), Some(ms(1500)));
        assert_eq!(parse_duration("500us"), Some(Duration::from_micros(500)));
        assert_eq!(parse_duration("7ns"), Some(Duration::from_nanos(7)));
        assert_eq!(parse_duration(" 1s 500ms "), Some(ms(1500)));
        for bad in ["", "2", "ms", "2 parsecs", "-1ms", "1e400s"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        for d in [ms(0), ms(2), Duration::from_nanos(1_500), Duration::from_secs(3), Duration::from_nanos(7)]
        {
            assert_eq!(parse_duration(&format_duration(d)), Some(d));
        }
    }

    /// Every kind of error in a plan file, with the line and column it
    /// must point at.
    #[test]
    fn toml_errors_have_a_place() {
        let cases = [
            ("[[fault]]\nkind = \"drop\"\np = 2\n", (3, 1)),
            ("[[fault]]\nkind = \"drop\"\np = \n", (3, 5)),
            ("[[fault]]\nkind = \"bogus\"\np = 0.1\n", (2, 1)),
            ("[[fault]]\nkind = \"drop\"\n  q = 0.1\n", (3, 3)),
            ("seed = 1\n\n[[fault]]\nkind = \"drop\"\np = 0.1\n\n[[fault]]\nkind = \"drop\"\np = 0.1\nevery = 3\n", (7, 1)),
            ("seed = \"x\"\n", (1, 8)),
            ("colour = 1\n", (1, 1)),
            ("[[fault]]\np = 0.1\n", (1, 1)),
        ];
        for (text, place) in cases {
            let e = FaultPlan::from_toml(text).unwrap_err();
            assert_eq!(FaultPlan::toml_error_location(text, &e), Some(place), "{text:?}: {e}");
        }
    }
}
