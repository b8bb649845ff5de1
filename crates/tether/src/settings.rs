//! Configuration without code: every option of an endpoint's builder and
//! of an engine, read from a `tether.toml` and from `TETHER_*` environment
//! variables, under what the program sets itself (builder calls,
//! command-line flags), each value with where it came from. UCX's `UCX_*`
//! variables and `ucx_info -c` are the model; docs/OPERATING.md,
//! "Configuration", has the table of every key.
//!
//! Precedence, lowest first: the default; the file (`$TETHER_TOML`, else
//! `tether.toml` in the working directory if there is one); the
//! environment (`TETHER_SECTION_NAME` for `section.name`, lists
//! comma-separated); the program (a builder call, a flag given). A key
//! nobody knows in the file, or in the environment under one of the
//! sections' prefixes (`TETHER_CONFIG_`, `TETHER_ENDPOINT_`,
//! `TETHER_CALLS_`, `TETHER_ENGINE_`), is refused with its origin: a
//! typo never passes for a setting. Other `TETHER_*` variables are not
//! settings and are left alone.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use tether_fault::{format_duration, parse_duration, FaultPlan};
use tether_proto::{ClusterKey, CongestionControl, NodeId, RailPolicy, RetransmitMode};
use tether_wire::{AuthKind, ChecksumKind, ChecksumSet};

use crate::rpc::{CallLogOptions, SyncPolicy};
use crate::{Options, Progress};

/// The variable naming the configuration file.
pub const FILE_VAR: &str = "TETHER_TOML";
/// The file read from the working directory when `FILE_VAR` is unset.
pub const DEFAULT_FILE: &str = "tether.toml";
/// The sections; a key is `section.name`.
pub const SECTIONS: [&str; 4] = ["config", "endpoint", "calls", "engine"];

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Nobody set it.
    Default,
    /// The configuration file.
    File(PathBuf),
    /// An environment variable.
    Env(String),
    /// The program: a builder call or a command-line flag.
    Program,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Env(v) => write!(f, "env {v}"),
            Source::Program => f.write_str("program"),
        }
    }
}

/// Why the configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// The file could not be read or is not TOML of settings.
    #[error("{}: {why}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A key no setting has.
    #[error("{origin}: `{key}` is not a setting{hint}")]
    Unknown {
        /// The key as given.
        key: String,
        /// Where it was given.
        origin: Source,
        /// The nearest setting, if one is near.
        hint: String,
    },
    /// A value the setting cannot take.
    #[error("{origin}: {key} = {value:?}: {why}")]
    Value {
        /// The setting.
        key: String,
        /// The value as given.
        value: String,
        /// Where it was given.
        origin: Source,
        /// Why not.
        why: String,
    },
}

/// What the settings set: an endpoint's builder (its options, rails,
/// engine and peers) and, as text for its command to read, an engine's
/// own options.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// The endpoint's options (and `options.config`, the protocol's).
    pub options: Options,
    /// Rails: one UDP socket bound at each address.
    pub bind: Vec<SocketAddr>,
    /// Attach to the engine serving this directory.
    pub engine: Option<PathBuf>,
    /// Peers and their addresses, one per rail.
    pub peers: BTreeMap<NodeId, Vec<SocketAddr>>,
    /// The cluster key's file and algorithm (`config.key_file`,
    /// `config.auth`).
    pub key_file: Option<PathBuf>,
    /// The authentication algorithm a key is used with.
    pub auth: AuthKind,
    /// The fault rules and their seed (`endpoint.faults`).
    pub fault_rules: Vec<String>,
    /// The seed of the fault rules.
    pub fault_seed: u64,
    /// An engine's settings (`engine.*`), checked, as text: `tether
    /// engine` reads them through its own flags' parsers.
    pub engine_settings: BTreeMap<&'static str, String>,
}

type Apply = Box<dyn Fn(&mut Target, &str) -> Result<(), String> + Send + Sync>;
// `&mut` only so a setting's one accessor serves both ways; showing
// changes nothing.
type Show = Box<dyn Fn(&mut Target) -> String + Send + Sync>;

/// One setting.
pub struct Setting {
    /// `section.name`.
    pub key: &'static str,
    /// What it sets.
    pub help: &'static str,
    apply: Apply,
    show: Show,
}

impl std::fmt::Debug for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setting").field("key", &self.key).finish()
    }
}

impl Setting {
    /// The environment variable that sets it.
    pub fn env_var(&self) -> String {
        format!("TETHER_{}", self.key.replace('.', "_").to_uppercase())
    }

    /// Its value in `t`, as text.
    pub fn show(&self, t: &mut Target) -> String {
        (self.show)(t)
    }

    /// Set it in `t` from text.
    pub fn apply(&self, t: &mut Target, text: &str) -> Result<(), String> {
        (self.apply)(t, text)
    }
}

fn parse_int<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.trim().replace('_', "").parse().map_err(|_| "not a whole number in range".to_string())
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err("not true or false".into()),
    }
}

fn parse_time(s: &str) -> Result<Duration, String> {
    parse_duration(s.trim()).ok_or_else(|| "not a duration like 500us, 2ms or 1.5s".into())
}

fn none(s: &str) -> bool {
    matches!(s.trim().to_ascii_lowercase().as_str(), "none" | "")
}

fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty())
}

fn parse_addrs(s: &str) -> Result<Vec<SocketAddr>, String> {
    list(s).map(|a| a.parse().map_err(|_| format!("`{a}` is not an address like 10.0.0.1:7000"))).collect()
}

fn show_addrs(a: &[SocketAddr]) -> String {
    a.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",")
}

fn show_path(p: &Option<PathBuf>) -> String {
    p.as_ref().map_or("none".into(), |p| p.display().to_string())
}

fn checksum(s: &str) -> Result<ChecksumKind, String> {
    ChecksumKind::from_name(s.trim()).ok_or_else(|| {
        let names: Vec<_> = ChecksumKind::ALL.iter().map(|k| k.name()).collect();
        format!("not a checksum (one of {})", names.join(", "))
    })
}

/// A setting of type `T` at the place `at` gives.
fn typed<T: 'static>(
    key: &'static str,
    help: &'static str,
    parse: fn(&str) -> Result<T, String>,
    show: fn(&T) -> String,
    at: fn(&mut Target) -> &mut T,
) -> Setting {
    Setting {
        key,
        help,
        apply: Box::new(move |t, s| {
            *at(t) = parse(s)?;
            Ok(())
        }),
        show: Box::new(move |t| show(at(t))),
    }
}

fn int<T: std::str::FromStr + std::fmt::Display + 'static>(
    key: &'static str,
    help: &'static str,
    at: fn(&mut Target) -> &mut T,
) -> Setting {
    typed(key, help, parse_int::<T>, |v| v.to_string(), at)
}

fn flag(key: &'static str, help: &'static str, at: fn(&mut Target) -> &mut bool) -> Setting {
    typed(key, help, parse_bool, |v| v.to_string(), at)
}

fn time(key: &'static str, help: &'static str, at: fn(&mut Target) -> &mut Duration) -> Setting {
    typed(key, help, parse_time, |d| format_duration(*d), at)
}

/// An engine's setting: checked by `check`, kept as text for `tether
/// engine`.
fn engine(key: &'static str, help: &'static str, check: fn(&str) -> Result<(), String>) -> Setting {
    Setting {
        key,
        help,
        apply: Box::new(move |t, s| {
            check(s)?;
            t.engine_settings.insert(key, s.trim().to_string());
            Ok(())
        }),
        show: Box::new(move |t| t.engine_settings.get(key).cloned().unwrap_or_else(|| "-".into())),
    }
}

fn call_log(at: fn(&mut Options) -> &mut Option<CallLogOptions>, s: &str, t: &mut Target) {
    *at(&mut t.options) = (!none(s)).then(|| CallLogOptions::new(s.trim()));
}

/// Every setting, in the order they apply (`config.auth` before
/// `config.key_file`, which reads the key with it).
pub fn all() -> &'static [Setting] {
    static ALL: OnceLock<Vec<Setting>> = OnceLock::new();
    ALL.get_or_init(|| {
        vec![
            // The protocol (`Config`), for an endpoint and an engine alike.
            int("config.max_datagram", "largest datagram sent, header included", |t| {
                &mut t.options.config.max_datagram
            }),
            int("config.send_window", "segments in flight per peer", |t| &mut t.options.config.send_window),
            int("config.send_window_bytes", "payload bytes in flight per peer", |t| {
                &mut t.options.config.send_window_bytes
            }),
            int("config.send_buffer_bytes", "bytes kept for retransmission per peer", |t| {
                &mut t.options.config.send_buffer_bytes
            }),
            int("config.send_buffer_messages", "messages kept for retransmission per peer", |t| {
                &mut t.options.config.send_buffer_messages
            }),
            int("config.recv_window", "segments accepted out of order per peer", |t| {
                &mut t.options.config.recv_window
            }),
            int("config.delivery_queue_bytes", "bytes delivered and not yet taken", |t| {
                &mut t.options.config.delivery_queue_bytes
            }),
            int("config.delivery_queue_messages", "messages delivered and not yet taken", |t| {
                &mut t.options.config.delivery_queue_messages
            }),
            int("config.max_message_len", "largest message", |t| &mut t.options.config.max_message_len),
            flag("config.deliver_fragments", "deliver a large message's fragments as they come", |t| {
                &mut t.options.config.deliver_fragments
            }),
            flag("config.verify_payloads", "verify each payload's checksum end to end", |t| {
                &mut t.options.config.verify_payloads
            }),
            time("config.rto_initial", "first retransmission timeout", |t| &mut t.options.config.rto_initial),
            time("config.rto_min", "least retransmission timeout", |t| &mut t.options.config.rto_min),
            time("config.rto_max", "greatest retransmission timeout", |t| &mut t.options.config.rto_max),
            time("config.coalesce_delay", "how long small messages wait to share a datagram", |t| {
                &mut t.options.config.coalesce_delay
            }),
            time("config.ack_delay", "how long an acknowledgement waits for company", |t| {
                &mut t.options.config.ack_delay
            }),
            int("config.ack_request_at", "segments after which an acknowledgement is asked for", |t| {
                &mut t.options.config.ack_request_at
            }),
            time("config.abandon_after", "silence after which a peer's messages fail", |t| {
                &mut t.options.config.abandon_after
            }),
            typed(
                "config.abandon_limit",
                "the most abandon_after stretches to (none: twelve times it)",
                |s| if none(s) { Ok(None) } else { parse_time(s).map(Some) },
                |d| d.map_or("none".into(), format_duration),
                |t| &mut t.options.config.abandon_limit,
            ),
            typed(
                "config.checksum",
                "the checksum sent with",
                checksum,
                |k| k.name().into(),
                |t| &mut t.options.config.checksum,
            ),
            typed(
                "config.accept_checksums",
                "checksums accepted from peers besides one's own (comma-separated)",
                |s| list(s).try_fold(ChecksumSet::empty(), |set, n| Ok(set.with(checksum(n)?))),
                |set| set.iter().map(|k| k.name()).collect::<Vec<_>>().join(","),
                |t| &mut t.options.config.accept_checksums,
            ),
            typed(
                "config.retransmit",
                "how losses are repaired: selective or go-back-n",
                |s| match s.trim() {
                    "selective" => Ok(RetransmitMode::Selective),
                    "go-back-n" => Ok(RetransmitMode::GoBackN),
                    _ => Err("selective or go-back-n".into()),
                },
                |m| match m {
                    RetransmitMode::Selective => "selective".into(),
                    RetransmitMode::GoBackN => "go-back-n".into(),
                },
                |t| &mut t.options.config.retransmit,
            ),
            typed(
                "config.rail_policy",
                "how data uses a peer's healthy rails: primary-backup or stripe",
                |s| match s.trim() {
                    "primary-backup" => Ok(RailPolicy::PrimaryBackup),
                    "stripe" => Ok(RailPolicy::Stripe),
                    _ => Err("primary-backup or stripe".into()),
                },
                |p| match p {
                    RailPolicy::Stripe => "stripe".into(),
                    _ => "primary-backup".into(),
                },
                |t| &mut t.options.config.rail_policy,
            ),
            time("config.path_suspect_after", "silence after which a path is suspect", |t| {
                &mut t.options.config.path_suspect_after
            }),
            time("config.path_down_after", "silence after which a path is down", |t| {
                &mut t.options.config.path_down_after
            }),
            time("config.path_probe_interval", "probe interval of a suspect path", |t| {
                &mut t.options.config.path_probe_interval
            }),
            time("config.path_down_probe_interval", "probe interval of a down path", |t| {
                &mut t.options.config.path_down_probe_interval
            }),
            time("config.path_idle_probe_interval", "probe interval of an idle healthy path", |t| {
                &mut t.options.config.path_idle_probe_interval
            }),
            typed(
                "config.congestion",
                "the congestion controller: delay, new-reno or off",
                |s| match s.trim() {
                    "delay" => Ok(CongestionControl::Delay),
                    "new-reno" => Ok(CongestionControl::NewReno),
                    "off" => Ok(CongestionControl::Off),
                    _ => Err("delay, new-reno or off".into()),
                },
                |c| match c {
                    CongestionControl::Delay => "delay".into(),
                    CongestionControl::NewReno => "new-reno".into(),
                    CongestionControl::Off => "off".into(),
                    CongestionControl::Custom(_) => "custom".into(),
                },
                |t| &mut t.options.config.congestion,
            ),
            int("config.unreliable_queue_bytes", "bytes of unreliable messages queued each way", |t| {
                &mut t.options.config.unreliable_queue_bytes
            }),
            int("config.unreliable_queue_messages", "unreliable messages queued each way", |t| {
                &mut t.options.config.unreliable_queue_messages
            }),
            time(
                "config.nacked_hold",
                "how long a NACK-reliable message is held for its receiver to ask again",
                |t| &mut t.options.config.nacked_hold,
            ),
            int(
                "config.accept_peers",
                "peers not given that may join after their handshake (0: none)",
                |t| &mut t.options.config.accept_peers,
            ),
            flag("config.accept_unkeyed", "without a cluster key, take in peers not given anyway", |t| {
                &mut t.options.config.accept_unkeyed
            }),
            typed(
                "config.auth",
                "the authentication algorithm a cluster key is used with",
                |s| {
                    AuthKind::from_name(s.trim()).ok_or_else(|| {
                        let names: Vec<_> = AuthKind::ALL.iter().map(|k| k.name()).collect();
                        format!("not an algorithm (one of {})", names.join(", "))
                    })
                },
                |k| k.name().into(),
                |t| &mut t.auth,
            ),
            Setting {
                key: "config.key_file",
                help: "the cluster's secret (16 bytes or more): every datagram authenticated",
                apply: Box::new(|t, s| {
                    if none(s) {
                        t.key_file = None;
                        t.options.config.key = None;
                        return Ok(());
                    }
                    let path = PathBuf::from(s.trim());
                    let material = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                    let key = ClusterKey::from_material(&material).map_err(|e| e.to_string())?;
                    t.options.config.key = Some(key.with_auth(t.auth));
                    t.key_file = Some(path);
                    Ok(())
                }),
                show: Box::new(|t| show_path(&t.key_file)),
            },
            // The endpoint's builder.
            typed(
                "endpoint.bind",
                "rails: one UDP socket at each address (comma-separated)",
                parse_addrs,
                |a| show_addrs(a),
                |t| &mut t.bind,
            ),
            typed(
                "endpoint.engine",
                "attach to the engine serving this directory instead (none: embedded)",
                |s| Ok((!none(s)).then(|| PathBuf::from(s.trim()))),
                show_path,
                |t| &mut t.engine,
            ),
            typed(
                "endpoint.progress",
                "who drives the protocol between calls: thread or polling",
                |s| match s.trim() {
                    "thread" => Ok(Progress::Thread),
                    "polling" => Ok(Progress::Polling),
                    _ => Err("thread or polling".into()),
                },
                |p| match p {
                    Progress::Thread => "thread".into(),
                    _ => "polling".into(),
                },
                |t| &mut t.options.progress,
            ),
            time("endpoint.spin", "how long a blocked call busy-polls before it sleeps", |t| {
                &mut t.options.spin
            }),
            int(
                "endpoint.connected_peers",
                "peers per UDP rail with a socket connected to them, the busiest first (0: none)",
                |t| &mut t.options.connected_peers,
            ),
            flag(
                "endpoint.offload",
                "let the kernel segment and coalesce runs of datagrams (UDP GSO/GRO) where it can",
                |t| &mut t.options.offload,
            ),
            typed(
                "endpoint.incarnation",
                "this life's incarnation (none: from the clock)",
                |s| if none(s) { Ok(None) } else { parse_int(s).map(Some) },
                |i: &Option<u64>| i.map_or("none".into(), |i| i.to_string()),
                |t| &mut t.options.incarnation,
            ),
            time("endpoint.linger", "how long closing waits for what was sent to settle", |t| {
                &mut t.options.linger
            }),
            int("endpoint.fault_seed", "the seed of the fault rules", |t| &mut t.fault_seed),
            typed(
                "endpoint.faults",
                "fault rules (docs/FAULTS.md), e.g. drop:p=0.01 (comma-separated in the environment)",
                |s| {
                    let rules: Vec<String> =
                        if none(s) { Vec::new() } else { list(s).map(String::from).collect() };
                    FaultPlan::parse_rules(0, &rules).map_err(|e| e.to_string())?;
                    Ok(rules)
                },
                |r| if r.is_empty() { "none".into() } else { r.join(",") },
                |t| &mut t.fault_rules,
            ),
            typed(
                "endpoint.publish_stats",
                "publish counters on a board in this directory, for tether stat (none: not)",
                |s| Ok((!none(s)).then(|| PathBuf::from(s.trim()))),
                show_path,
                |t| &mut t.options.publish_stats,
            ),
            typed(
                "endpoint.metrics",
                "serve metrics for Prometheus at this address (none: not; the metrics feature)",
                |s| {
                    if none(s) {
                        Ok(None)
                    } else {
                        s.trim().parse().map(Some).map_err(|_| "not an address".into())
                    }
                },
                |a: &Option<SocketAddr>| a.map_or("none".into(), |a| a.to_string()),
                |t| &mut t.options.metrics,
            ),
            Setting {
                key: "endpoint.call_log",
                help: "the server's call log file (none: in memory)",
                apply: Box::new(|t, s| {
                    call_log(|o| &mut o.call_log, s, t);
                    Ok(())
                }),
                show: Box::new(|t| show_path(&t.options.call_log.as_ref().map(|l| l.path.clone()))),
            },
            Setting {
                key: "endpoint.caller_log",
                help: "the caller's log file (none: not kept)",
                apply: Box::new(|t, s| {
                    call_log(|o| &mut o.caller_log, s, t);
                    Ok(())
                }),
                show: Box::new(|t| show_path(&t.options.caller_log.as_ref().map(|l| l.path.clone()))),
            },
            Setting {
                key: "endpoint.call_log_sync",
                help: "when the call logs reach the disk: none, batch or record",
                apply: Box::new(|t, s| {
                    let sync = match s.trim() {
                        "none" => SyncPolicy::None,
                        "batch" => SyncPolicy::Batch,
                        "record" => SyncPolicy::Record,
                        _ => return Err("none, batch or record".into()),
                    };
                    for log in [&mut t.options.call_log, &mut t.options.caller_log].into_iter().flatten() {
                        log.sync = sync;
                    }
                    Ok(())
                }),
                show: Box::new(|t| {
                    let sync = t.options.call_log.as_ref().or(t.options.caller_log.as_ref()).map(|l| l.sync);
                    match sync.unwrap_or(SyncPolicy::None) {
                        SyncPolicy::None => "none".into(),
                        SyncPolicy::Batch => "batch".into(),
                        SyncPolicy::Record => "record".into(),
                    }
                }),
            },
            // The calls (`RpcConfig`).
            int("calls.credit", "calls a caller keeps open per server", |t| &mut t.options.calls.credit),
            int("calls.retries", "times a call's request is sent again", |t| &mut t.options.calls.retries),
            time("calls.ack_timeout", "how long a request waits for its acknowledgement", |t| {
                &mut t.options.calls.ack_timeout
            }),
            time("calls.reply_timeout", "how long an acknowledged call waits for its reply", |t| {
                &mut t.options.calls.reply_timeout
            }),
            time("calls.max_retry_interval", "the longest wait between a request's copies", |t| {
                &mut t.options.calls.max_retry_interval
            }),
            time("calls.ack_request_after", "how long a server waits before asking for an ack", |t| {
                &mut t.options.calls.ack_request_after
            }),
            int("calls.lives_per_node", "a peer's lives a server remembers", |t| {
                &mut t.options.calls.lives_per_node
            }),
            int("calls.max_calls", "calls a server keeps", |t| &mut t.options.calls.max_calls),
            int("calls.max_args", "largest arguments", |t| &mut t.options.calls.max_args),
            int("calls.max_reply", "largest reply", |t| &mut t.options.calls.max_reply),
            int("calls.max_events", "call events kept for the application", |t| {
                &mut t.options.calls.max_events
            }),
            // An engine (`tether engine`'s flags of the same names).
            engine("engine.dir", "the directory applications attach through", |_| Ok(())),
            engine("engine.bind", "rails: one UDP address each (comma-separated)", |s| {
                parse_addrs(s).map(|_| ())
            }),
            engine("engine.metrics", "serve the engine's metrics for Prometheus at this address", |s| {
                s.trim().parse::<SocketAddr>().map(|_| ()).map_err(|_| "not an address".into())
            }),
            engine("engine.hang_after_us", "heartbeat silence after which the engine is hung", |s| {
                parse_int::<u64>(s).map(|_| ())
            }),
            engine("engine.spin_us", "how long the engine polls before it sleeps", |s| {
                parse_int::<u64>(s).map(|_| ())
            }),
            engine("engine.selftest_every_ms", "interval of the self-test's probes (0: off)", |s| {
                parse_int::<u64>(s).map(|_| ())
            }),
            engine("engine.selftest_deadline_ms", "how long a probe may take", |s| {
                parse_int::<u64>(s).map(|_| ())
            }),
            engine("engine.seed", "the seed of the fault draws", |s| parse_int::<u64>(s).map(|_| ())),
            engine("engine.faults", "fault rules on what the rails receive (comma-separated)", |s| {
                let rules: Vec<&str> = if none(s) { Vec::new() } else { list(s).collect() };
                FaultPlan::parse_rules(0, &rules).map(|_| ()).map_err(|e| e.to_string())
            }),
        ]
    })
}

/// The setting named `key`.
pub fn setting(key: &str) -> Option<&'static Setting> {
    all().iter().find(|s| s.key == key)
}

/// The known key nearest to `key`, as " (did you mean ...?)".
fn hint(key: &str) -> String {
    let distance = |a: &str, b: &str| {
        let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for i in 1..=a.len() {
            let mut prev = row[0];
            row[0] = i;
            for j in 1..=b.len() {
                let cur = row[j];
                row[j] = (prev + usize::from(a[i - 1] != b[j - 1])).min(row[j] + 1).min(row[j - 1] + 1);
                prev = cur;
            }
        }
        row[b.len()]
    };
    all()
        .iter()
        .map(|s| (distance(key, s.key), s.key))
        .min()
        .filter(|&(d, _)| d <= 4)
        .map_or(String::new(), |(_, k)| format!(" (did you mean {k}?)"))
}

/// The values the file and the environment give, by key, each with its
/// source; peers (`endpoint.peers.NODE`) apart.
#[derive(Debug, Clone, Default)]
pub struct Layers {
    values: BTreeMap<&'static str, (String, Source)>,
    peers: BTreeMap<NodeId, (String, Source)>,
    /// The file read, if any.
    pub file: Option<PathBuf>,
}

/// A TOML value as a setting's text: lists comma-joined, as in the
/// environment.
fn text_of(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Array(items) => items.iter().map(text_of).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

impl Layers {
    /// The file (`$TETHER_TOML`, else `./tether.toml` if there is one) and
    /// this process's environment.
    pub fn load() -> Result<Self, SettingsError> {
        let file = match std::env::var_os(FILE_VAR) {
            Some(p) => Some(PathBuf::from(p)),
            None => Some(PathBuf::from(DEFAULT_FILE)).filter(|p| p.is_file()),
        };
        Self::from_parts(file.as_deref(), std::env::vars())
    }

    /// `file`, if given, under the variables `env`.
    pub fn from_parts(
        file: Option<&Path>,
        env: impl Iterator<Item = (String, String)>,
    ) -> Result<Self, SettingsError> {
        let mut layers = Layers { file: file.map(Path::to_path_buf), ..Default::default() };
        if let Some(path) = file {
            let bad = |why: String| SettingsError::File { path: path.to_path_buf(), why };
            let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
            let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| bad(e.message().to_string()))?;
            let origin = Source::File(path.to_path_buf());
            for (section, body) in doc {
                let toml::Value::Table(body) = body else {
                    return Err(bad(format!("`{section}` is not a section ([{section}])")));
                };
                for (name, value) in body {
                    if section == "endpoint" && name == "peers" {
                        let toml::Value::Table(peers) = value else {
                            return Err(bad("[endpoint.peers] maps a node id to its addresses".into()));
                        };
                        for (node, addrs) in peers {
                            layers.peer(&node, &text_of(&addrs), origin.clone())?;
                        }
                        continue;
                    }
                    layers.value(&format!("{section}.{name}"), text_of(&value), origin.clone())?;
                }
            }
        }
        let mut env: Vec<(String, String)> = env.collect();
        env.sort();
        for (var, value) in env {
            let origin = Source::Env(var.clone());
            if let Some(node) = var.strip_prefix("TETHER_ENDPOINT_PEERS_") {
                layers.peer(node, &value, origin)?;
                continue;
            }
            let Some(rest) = var.strip_prefix("TETHER_") else { continue };
            let Some(section) = SECTIONS.iter().find(|s| rest.starts_with(&format!("{}_", s.to_uppercase())))
            else {
                continue; // not a setting's variable (TETHER_TOML, say)
            };
            let key = format!("{section}.{}", rest[section.len() + 1..].to_lowercase());
            layers.value(&key, value, origin)?;
        }
        Ok(layers)
    }

    fn value(&mut self, key: &str, text: String, origin: Source) -> Result<(), SettingsError> {
        let Some(s) = setting(key) else {
            return Err(SettingsError::Unknown { key: key.to_string(), origin, hint: hint(key) });
        };
        // Checked now, against a scratch target: a bad value is refused
        // with its origin even where the program overrides it.
        if let Err(why) = s.apply(&mut Target::default(), &text) {
            return Err(SettingsError::Value { key: key.to_string(), value: text, origin, why });
        }
        self.values.insert(s.key, (text, origin));
        Ok(())
    }

    fn peer(&mut self, node: &str, text: &str, origin: Source) -> Result<(), SettingsError> {
        let key = format!("endpoint.peers.{node}");
        let bad = |why: String| SettingsError::Value {
            key: key.clone(),
            value: text.to_string(),
            origin: origin.clone(),
            why,
        };
        let node: NodeId = node.parse().map_err(|_| bad("the key after peers. is a node id".into()))?;
        parse_addrs(text).map_err(bad)?;
        self.peers.insert(node, (text.to_string(), origin));
        Ok(())
    }

    /// The layered value of `key`, with its source.
    pub fn get(&self, key: &str) -> Option<&(String, Source)> {
        self.values.get(key)
    }

    /// Apply to `t` every value whose key `given` does not claim (the
    /// program set it), and the peers `t` does not have; every value with
    /// its source, in the settings' order, then the peers.
    pub fn apply(
        &self,
        t: &mut Target,
        given: impl Fn(&str) -> bool,
    ) -> Result<Vec<Resolved>, SettingsError> {
        let mut resolved = Vec::new();
        for s in all() {
            let source = match self.values.get(s.key) {
                _ if given(s.key) => Source::Program,
                Some((text, origin)) => {
                    s.apply(t, text).map_err(|why| SettingsError::Value {
                        key: s.key.into(),
                        value: text.clone(),
                        origin: origin.clone(),
                        why,
                    })?;
                    origin.clone()
                }
                None => Source::Default,
            };
            resolved.push(Resolved { key: s.key.to_string(), value: s.show(t), source });
        }
        for (&node, (text, origin)) in &self.peers {
            let key = format!("endpoint.peers.{node}");
            let source = match t.peers.entry(node) {
                std::collections::btree_map::Entry::Occupied(_) => Source::Program,
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(parse_addrs(text).expect("checked when read"));
                    origin.clone()
                }
            };
            resolved.push(Resolved { key, value: show_addrs(&t.peers[&node]), source });
        }
        if !t.fault_rules.is_empty() {
            t.options.faults =
                FaultPlan::parse_rules(t.fault_seed, &t.fault_rules).expect("checked when read");
        }
        Ok(resolved)
    }
}

/// A setting's effective value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// `section.name`.
    pub key: String,
    /// The value, as text.
    pub value: String,
    /// Where it came from.
    pub source: Source,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>().into_iter()
    }

    fn file(name: &str, text: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("tether-settings-{}-{name}.toml", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn file_then_environment_then_program() {
        let f = file(
            "layers",
            "[config]\nmax_datagram = 1400\nabandon_after = \"3s\"\n[endpoint]\nbind = [\"127.0.0.1:7000\"]\n\
             [endpoint.peers]\n2 = [\"127.0.0.1:7001\", \"127.0.0.2:7001\"]\n[calls]\ncredit = 9\n",
        );
        let vars =
            [("TETHER_CONFIG_ABANDON_AFTER", "5s"), ("TETHER_TEST_SEED", "1"), ("TETHER_CALLS_CREDIT", "12")];
        let layers = Layers::from_parts(Some(&f), env(&vars)).unwrap();
        let mut t = Target::default();
        // The program set calls.credit itself.
        let resolved = layers.apply(&mut t, |k| k == "calls.credit").unwrap();
        assert_eq!(t.options.config.max_datagram, 1400);
        assert_eq!(t.options.config.abandon_after, Duration::from_secs(5), "the environment over the file");
        assert_eq!(t.options.calls.credit, tether_rpc::RpcConfig::default().credit, "the program over both");
        assert_eq!(t.bind, vec!["127.0.0.1:7000".parse().unwrap()]);
        assert_eq!(t.peers[&2].len(), 2);
        let of = |k: &str| resolved.iter().find(|r| r.key == k).unwrap().clone();
        assert_eq!(of("config.max_datagram").source, Source::File(f.clone()));
        assert_eq!(of("config.abandon_after").source, Source::Env("TETHER_CONFIG_ABANDON_AFTER".into()));
        assert_eq!(of("config.abandon_after").value, "5s");
        assert_eq!(of("calls.credit").source, Source::Program);
        assert_eq!(of("config.rto_min").source, Source::Default);
        assert_eq!(of("endpoint.peers.2").value, "127.0.0.1:7001,127.0.0.2:7001");
        std::fs::remove_file(f).unwrap();
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_with_their_origin() {
        let e = Layers::from_parts(None, env(&[("TETHER_CONFIG_MAX_DATAGRAMS", "1400")])).unwrap_err();
        assert!(matches!(&e, SettingsError::Unknown { key, .. } if key == "config.max_datagrams"), "{e}");
        assert!(e.to_string().contains("did you mean config.max_datagram?"), "{e}");
        let e = Layers::from_parts(None, env(&[("TETHER_CONFIG_ABANDON_AFTER", "soon")])).unwrap_err();
        assert!(
            e.to_string().contains("env TETHER_CONFIG_ABANDON_AFTER") && e.to_string().contains("duration"),
            "{e}"
        );
        let f = file("bad", "[config]\nchecksum = \"md5\"\n");
        let e = Layers::from_parts(Some(&f), env(&[])).unwrap_err();
        assert!(e.to_string().contains("not a checksum"), "{e}");
        std::fs::write(&f, "max_datagram = 3\n").unwrap();
        assert!(matches!(Layers::from_parts(Some(&f), env(&[])), Err(SettingsError::File { .. })));
        std::fs::write(&f, "[config\n").unwrap();
        assert!(matches!(Layers::from_parts(Some(&f), env(&[])), Err(SettingsError::File { .. })));
        std::fs::remove_file(f).unwrap();
        // Not settings: left alone.
        assert!(Layers::from_parts(None, env(&[("TETHER_RUN_OWNER", "1"), ("TETHER_TOML", "x")])).is_ok());
    }

    #[test]
    fn every_setting_shows_its_default_and_takes_it_back() {
        let mut t = Target::default();
        for s in all() {
            let shown = s.show(&mut t);
            if s.key.starts_with("engine.") || s.key == "endpoint.call_log_sync" {
                continue; // kept as text, or shown through the logs
            }
            s.apply(&mut t, &shown).unwrap_or_else(|e| panic!("{} = {shown:?}: {e}", s.key));
            assert_eq!(s.show(&mut t), shown, "{}", s.key);
        }
    }
}
