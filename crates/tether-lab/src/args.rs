//! Value parsers for the command line. Every number, probability and
//! duration is checked as it is read, against the limit that matters for
//! it, so a bad value is refused in one line that names the limit, before
//! anything is allocated, bound or sent. Numeric arguments also take
//! `allow_negative_numbers`, so `--count -5` reaches these parsers and is
//! refused as negative instead of being taken for an unknown option.

use std::time::Duration;

use tether::Config;

/// The largest message tether sends and reassembles: the ceiling for every
/// size on the command line (the raw baselines too, so both sides of a
/// ratio measure the same messages).
pub fn max_message() -> usize {
    Config::default().max_message_len
}

fn limits(lo: u64, hi: u64, unit: &str) -> String {
    let unit = if unit.is_empty() { String::new() } else { format!(" {unit}") };
    match (lo, hi) {
        (0, u64::MAX) => "must be a whole number".to_string(),
        (lo, u64::MAX) => format!("must be at least {lo}{unit}"),
        (lo, hi) => format!("must be between {lo} and {hi}{unit}"),
    }
}

/// A whole number from `lo` to `hi` (`unit` and `why` only shape the message).
fn whole(text: &str, lo: u64, hi: u64, unit: &str, why: &str) -> Result<u64, String> {
    let why = if why.is_empty() { String::new() } else { format!(" ({why})") };
    let text = text.trim();
    if text.starts_with('-') && text[1..].parse::<u64>().is_ok() {
        return Err(format!("negative: {}{why}", limits(lo, hi, unit)));
    }
    let v: u64 = text.parse().map_err(|_| format!("not a whole number: {}{why}", limits(lo, hi, unit)))?;
    if v < lo || v > hi {
        return Err(format!("{}{why}", limits(lo, hi, unit)));
    }
    Ok(v)
}

/// `value_parser` for a whole number in `lo..=hi` of any unsigned type.
pub fn int_in<T>(
    lo: u64,
    hi: u64,
    unit: &'static str,
    why: &'static str,
) -> impl Fn(&str) -> Result<T, String> + Clone
where
    T: TryFrom<u64>,
{
    move |text| {
        whole(text, lo, hi, unit, why).and_then(|v| T::try_from(v).map_err(|_| "too large".to_string()))
    }
}

/// Any u64 (seeds): refuses negatives and words with a clear message.
pub fn seed(text: &str) -> Result<u64, String> {
    whole(text, 0, u64::MAX, "", "").map_err(|e| {
        if e.starts_with("must") {
            e
        } else {
            format!("{e} from 0 to 2^64-1")
        }
    })
}

/// A message size in bytes: `min` up to the protocol's largest message.
pub fn size(min: u64) -> impl Fn(&str) -> Result<usize, String> + Clone {
    move |text| {
        let max = max_message() as u64;
        whole(text, min, max, "bytes", "the protocol's largest message is 64 MiB").map(|v| v as usize)
    }
}

/// A probability in [0, 1]: a fraction of datagrams or calls.
pub fn probability(text: &str) -> Result<f64, String> {
    let p: f64 =
        text.trim().parse().map_err(|_| "not a number: must be a probability, 0 to 1".to_string())?;
    if !(0.0..=1.0).contains(&p) {
        return Err("not a probability: must be between 0 and 1".into());
    }
    Ok(p)
}

/// A fault rate for a campaign: a probability above zero (a rate of zero
/// is the fault-free baseline every campaign runs anyway).
pub fn rate(text: &str) -> Result<f64, String> {
    let p = probability(text).map_err(|_| "not a probability in (0, 1]".to_string())?;
    if p == 0.0 {
        return Err("must be above 0 (the fault-free runs come with every campaign)".into());
    }
    Ok(p)
}

/// A duration like `500us`, `2ms` or `1.5s`, from `lo` to `hi`.
pub fn duration_in(
    lo: Duration,
    hi: Duration,
    why: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone {
    move |text| {
        let show = tether_fault::format_duration;
        let range = format!("between {} and {} ({why})", show(lo), show(hi));
        let d = tether_fault::parse_duration(text)
            .ok_or_else(|| format!("not a duration like 500us, 2ms or 1.5s: must be {range}"))?;
        if d < lo || d > hi {
            return Err(format!("must be {range}"));
        }
        Ok(d)
    }
}

/// A value the protocol's own configuration checks: set it on the default
/// configuration and let `Config::validate` say whether it fits, so the
/// command line and the protocol cannot disagree about a limit.
pub fn config_field(set: fn(&mut Config, usize)) -> impl Fn(&str) -> Result<usize, String> + Clone {
    move |text| {
        let v = whole(text, 0, u64::MAX, "", "")? as usize;
        let mut c = Config::default();
        set(&mut c, v);
        c.validate().map_err(|e| e.why.to_string())?;
        Ok(v)
    }
}

/// `--mtu`: a datagram size in bytes (checked as `config_field` does), or
/// `auto`: the largest the path to the peer carries
/// (`tether_io::max_datagram_to`), found once the peer is known:
/// [`MTU_AUTO`] until `NetOpts::resolve_mtu`.
pub fn mtu(text: &str) -> Result<usize, String> {
    if text == "auto" {
        return Ok(MTU_AUTO);
    }
    config_field(|c, v| c.max_datagram = v)(text)
}

/// `--mtu auto` before it is resolved: no datagram is this small, and
/// `Config::validate` refuses it, so an unresolved one cannot go unseen.
pub const MTU_AUTO: usize = 0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_problem() {
        let rails = int_in::<usize>(1, 8, "", "");
        assert_eq!(rails("3"), Ok(3));
        assert_eq!(rails("9").unwrap_err(), "must be between 1 and 8");
        assert_eq!(rails("-5").unwrap_err(), "negative: must be between 1 and 8");
        assert_eq!(rails("two").unwrap_err(), "not a whole number: must be between 1 and 8");
        assert!(seed("-1").unwrap_err().starts_with("negative"));
        assert_eq!(seed("18446744073709551615"), Ok(u64::MAX));
        assert!(probability("nan").is_err() && probability("1.5").is_err() && probability("-0.1").is_err());
        assert_eq!(probability("0.25"), Ok(0.25));
        assert!(rate("0").is_err() && rate("1").is_ok());
        assert!(size(0)(&(64 << 20).to_string()).is_ok() && size(0)(&((64 << 20) + 1).to_string()).is_err());
        let ms = duration_in(Duration::from_millis(1), Duration::from_secs(1), "test");
        assert_eq!(ms("2ms"), Ok(Duration::from_millis(2)));
        assert!(ms("2").is_err() && ms("2s").is_err());
    }

    #[test]
    fn protocol_limits_come_from_the_protocol() {
        assert_eq!(super::mtu("auto"), Ok(MTU_AUTO));
        assert!(super::mtu("9").is_err());
        let mtu = config_field(|c, v| c.max_datagram = v);
        assert!(mtu("1472").is_ok());
        assert!(mtu("10").unwrap_err().contains("between"), "{:?}", mtu("10"));
        assert!(mtu("65508").is_err());
    }
}
