//! `tether campaign --engine`: the engine fault campaign, Zhou et al.
//! [FTGM] section 5 (Table 1, Fig. 10) on this system. Their faults struck
//! the programmable network interface of a node; ours strike the engine
//! process that plays that part here (docs/ENGINE.md).
//!
//! Two hosts (network namespaces joined by veth pairs, `netns`), a
//! supervised `tether engine` on each, an application attached to each
//! (this process), and a verified stream from one to the other
//! (`verified_stream`). While it runs, faults strike one at a time, in a
//! drawn order, each on a drawn side (the sending or the receiving
//! engine), a drawn pause apart:
//!
//! - `kill`: SIGKILL (the interface dies);
//! - `hang`: SIGSTOP for a drawn 1 to 50 ms, then SIGCONT (the interface
//!   stops; a short stop may go unnoticed, which is a legitimate outcome);
//! - `payload`, `seq`, `window`, `book`, `rail`: a bit of the engine's own
//!   state flipped through its fault hook (`fault_hook`): a buffered
//!   payload, a sequence number, a window pointer, an address-book entry,
//!   a rail's state (the paper's flips in the interface's memory).
//!
//! Each strike is judged by what follows it, until the next one: detected
//! by crash (the supervisor saw the engine die), by the watchdog (it hung),
//! or by the self-test (it failed a probe or its state audit and exited); or, undetected, no
//! effect (the stream kept delivering, nothing lost, repeated, corrupted or
//! failed) or an effect (a stall, a loss, ...). Coverage is detected over
//! detected plus undetected with effect, the paper's measure. Recovery is
//! from the strike to the delivery of the first message submitted after
//! it, as in `tether bench engine`.
//!
//! A stream that stalls and does not resume cannot judge the strikes after
//! it: the episode ends and the next strikes run on fresh engines (a new
//! episode), as the paper restarted its nodes between injections. An
//! episode also ends before the stream runs out of message slots.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use tether::NodeId;
use tether_engine::Client;

use crate::campaign::CampaignOpts;
pub use crate::engine_fault::FaultClass;
use crate::engine_proc::{EngineProcess, Line};
use crate::fault_hook::{Hook, Reply};
use crate::netns::{Netns, NetnsError};
use crate::plot::{self, Chart, Series};
use crate::scratch::{Base, Scratch};
use crate::summary::Summary;
use crate::verified_stream::{self, Progress, Spec, Totals};

/// The sending and the receiving application.
const A: NodeId = 1;
const B: NodeId = 2;
/// The engines' UDP port; each episode takes the next, so a new engine
/// never waits for the old one's socket to close.
const PORT: u16 = 7700;
/// A strike after which no message submitted later is delivered within
/// this long stalled the stream.
const STALL: Duration = Duration::from_secs(1);
/// A stalled stream that has not resumed this long after its strike's
/// observation cannot judge later strikes: the episode ends.
const RESUME: Duration = Duration::from_secs(5);
/// How long after an internal fault the self-test may still report it:
/// tether engine probes a rail in use every 500 ms and fails a probe not
/// delivered within 1000 ms (its defaults), plus the supervisor's report.
const SELFTEST_REACH: Duration = Duration::from_millis(1600);
/// An engine that has not answered its fault hook in this long is dead,
/// stopped, or being replaced.
const HOOK_TIMEOUT: Duration = Duration::from_secs(1);
/// The pause between strikes, in microseconds: past a new engine's first
/// 50 ms, when its supervisor gives it four times the patience, so every
/// strike meets an engine in its steady state.
const PAUSE_US: std::ops::Range<u64> = 60_000..120_000;
/// How long a hang lasts, in microseconds.
const HANG_US: std::ops::RangeInclusive<u64> = 1_000..=50_000;
/// The stream's time per episode (it sizes the per-message stamps).
const EPISODE: Duration = Duration::from_secs(60);
/// After the stop: silence that ends the receiver's wait, and the sender's
/// bound on its final acknowledgements.
const DRAIN: Duration = Duration::from_secs(5);
/// Before the first strike of an episode: the stream flowing, the engines
/// past their start-up.
const WARMUP: Duration = Duration::from_millis(200);
/// How often the observation looks at the stream between timeline lines.
const LOOK: Duration = Duration::from_millis(2);

/// The names of `classes` that strike inside an engine's state.
fn internal_names(classes: &[FaultClass]) -> String {
    classes.iter().filter(|c| c.internal()).map(|c| c.name()).collect::<Vec<_>>().join(", ")
}

/// The classes that strike an engine from outside, as `--classes` takes them.
fn external_names() -> String {
    FaultClass::ALL.iter().filter(|c| !c.internal()).map(|c| c.name()).collect::<Vec<_>>().join(",")
}

/// The fault classes asked for, in the order of `FaultClass::ALL`, each once.
pub fn classes(o: &CampaignOpts) -> Vec<FaultClass> {
    let asked: BTreeSet<FaultClass> = o.classes.iter().copied().collect();
    FaultClass::ALL.into_iter().filter(|c| asked.is_empty() || asked.contains(c)).collect()
}

/// Which detector reported a strike (Zhou et al. [FTGM] section 3: the
/// daemon sees a crash, the watchdog a hang, the self-test wrong work).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Detection {
    Crash,
    Watchdog,
    SelfTest,
}

impl Detection {
    pub const ALL: [Detection; 3] = [Detection::Crash, Detection::Watchdog, Detection::SelfTest];

    pub fn name(self) -> &'static str {
        match self {
            Detection::Crash => "crash",
            Detection::Watchdog => "watchdog",
            Detection::SelfTest => "self-test",
        }
    }

    /// What a supervisor's timeline line reports, if it reports a failure.
    /// An engine that fails its self-test exits with status 3, which its
    /// supervisor reports as "died: failed its self-test (exit status 3)"
    /// (tether-engine's supervisor, `describe`).
    fn of(text: &str) -> Option<Detection> {
        match Line::parse(text) {
            Line::Died if text.contains("self-test") => Some(Detection::SelfTest),
            Line::Died => Some(Detection::Crash),
            Line::Hung { .. } => Some(Detection::Watchdog),
            _ => None,
        }
    }
}

/// What one strike came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The strike did not reach an engine (a signal or the hook failed).
    NotStruck,
    /// The hook found nothing of that kind to flip.
    NoState,
    /// Undetected, and the stream went on as if nothing happened.
    NoEffect,
    Crash,
    Watchdog,
    SelfTest,
    /// Undetected, and the application saw it (a stall, a loss, ...).
    Undetected,
}

/// How far a strike got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hit {
    Struck,
    NoState,
    Missed,
}

/// What the application saw between a strike and the next.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Effect {
    stalled: bool,
    lost: u64,
    duplicated: u64,
    corrupted: u64,
    failed: u64,
}

/// How the stream came through a strike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Through {
    /// Delivering again within `STALL`.
    Delivering,
    /// Delivering again, later than `STALL`.
    Stalled,
    /// Not delivering again within `RESUME`: the episode ends.
    Broken,
}

impl Effect {
    fn any(&self) -> bool {
        self.stalled || self.lost + self.duplicated + self.corrupted + self.failed > 0
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.stalled {
            parts.push("stall".to_string());
        }
        for (n, what) in [
            (self.lost, "lost"),
            (self.duplicated, "duplicated"),
            (self.corrupted, "corrupted"),
            (self.failed, "reported failed"),
        ] {
            if n > 0 {
                parts.push(format!("{what} {n}"));
            }
        }
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(", ")
        }
    }
}

/// The verdict: detection first (whatever else happened, a detector saw
/// it), then whether the application could tell.
fn verdict(hit: Hit, detection: Option<Detection>, effect: &Effect) -> Verdict {
    match (hit, detection) {
        (Hit::Missed, _) => Verdict::NotStruck,
        (Hit::NoState, _) => Verdict::NoState,
        (Hit::Struck, Some(Detection::Crash)) => Verdict::Crash,
        (Hit::Struck, Some(Detection::Watchdog)) => Verdict::Watchdog,
        (Hit::Struck, Some(Detection::SelfTest)) => Verdict::SelfTest,
        (Hit::Struck, None) if effect.any() => Verdict::Undetected,
        (Hit::Struck, None) => Verdict::NoEffect,
    }
}

/// One strike, as the CSV and the JSON have it.
#[derive(Debug, Clone, Serialize)]
pub struct StrikeRecord {
    /// 1-based, in the order struck.
    pub n: usize,
    pub class: FaultClass,
    /// `sender` or `receiver`: whose engine.
    pub side: &'static str,
    pub episode: usize,
    /// From the campaign's start.
    pub at_ms: f64,
    /// The engine process struck.
    pub engine: u32,
    pub detection: Option<Detection>,
    /// From the strike to the supervisor's report.
    pub detect_ms: Option<f64>,
    /// From the strike to the delivery of the first message submitted after it.
    pub recovery_ms: Option<f64>,
    /// How long the message delivered last before the strike took from
    /// submission to delivery: what a message submitted at the strike
    /// would have waited with nothing struck (a deep backlog's queue).
    pub queue_ms: Option<f64>,
    /// `recovery_ms` less `queue_ms`: the delay the strike added.
    pub added_ms: Option<f64>,
    /// How long the struck engine's supervisor was watched for this strike
    /// (until the next strike was due).
    pub observed_ms: f64,
    pub verdict: Verdict,
    /// What the application saw until the next strike, or `-`.
    pub effect: String,
    /// The hook's answer, or how a signal went.
    pub hook: String,
}

/// One line of the table: a fault class, or all of them.
#[derive(Debug, Clone, Serialize)]
pub struct ClassRow {
    pub class: &'static str,
    /// Strikes that reached an engine (all but `not_struck`).
    pub injected: usize,
    pub not_struck: usize,
    pub no_effect: usize,
    pub no_state: usize,
    pub crash: usize,
    pub watchdog: usize,
    pub self_test: usize,
    pub undetected: usize,
    /// Detected / (detected + undetected with effect), percent; `None`
    /// when nothing had an effect to detect.
    pub coverage_pct: Option<f64>,
    /// Over the detected strikes.
    pub detect_ms: Option<Summary>,
    pub recovery_ms: Option<Summary>,
    pub queue_ms: Option<Summary>,
    pub added_ms: Option<Summary>,
}

impl ClassRow {
    fn of(class: &'static str, strikes: &[&StrikeRecord]) -> ClassRow {
        let count = |v: Verdict| strikes.iter().filter(|s| s.verdict == v).count();
        let detected: Vec<&&StrikeRecord> = strikes
            .iter()
            .filter(|s| matches!(s.verdict, Verdict::Crash | Verdict::Watchdog | Verdict::SelfTest))
            .collect();
        let undetected = count(Verdict::Undetected);
        let judged = detected.len() + undetected;
        let not_struck = count(Verdict::NotStruck);
        let of = |f: fn(&StrikeRecord) -> Option<f64>| {
            Summary::of(&detected.iter().filter_map(|s| f(s)).collect::<Vec<_>>())
        };
        ClassRow {
            class,
            injected: strikes.len() - not_struck,
            not_struck,
            no_effect: count(Verdict::NoEffect),
            no_state: count(Verdict::NoState),
            crash: count(Verdict::Crash),
            watchdog: count(Verdict::Watchdog),
            self_test: count(Verdict::SelfTest),
            undetected,
            coverage_pct: (judged > 0).then(|| detected.len() as f64 * 100.0 / judged as f64),
            detect_ms: of(|s| s.detect_ms),
            recovery_ms: of(|s| s.recovery_ms),
            queue_ms: of(|s| s.queue_ms),
            added_ms: of(|s| s.added_ms),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct EngineCampaignReport {
    pub seed: u64,
    pub rails: u8,
    pub size: usize,
    pub pace_us: u64,
    pub hang_after_us: u64,
    pub window_ms: u64,
    /// Each engine's drop probability for what its rails receive.
    pub drop: f64,
    pub strikes_per_class: usize,
    pub classes: Vec<ClassRow>,
    pub all: ClassRow,
    /// The verified stream's outcome (flattened: the same JSON fields).
    #[serde(flatten)]
    pub totals: Totals,
    /// Messages the applications were told failed.
    pub reported_failed: u64,
    /// `EngineRecovered` events the applications were given.
    pub recovered_events_sender: u64,
    pub recovered_events_receiver: u64,
    /// Engines replaced that no strike of ours had reached, and why.
    pub unprovoked_replacements: usize,
    pub unprovoked: Vec<Incident>,
    /// At the rate of those replacements while no strike was watched, how
    /// many of the detections counted are likely coincidences: a failure
    /// of the struck engine's own, during its strike's observation.
    pub coincidences_expected: f64,
    /// Fresh pairs of engines the campaign ran on, and how many of them
    /// ended on a stall that did not resume.
    pub episodes: usize,
    pub broken_episodes: usize,
    pub seconds: f64,
    pub strikes: Vec<StrikeRecord>,
}

impl EngineCampaignReport {
    /// The application saw every message once, exact, and was told so.
    pub fn ok(&self) -> bool {
        self.totals.ok()
    }
}

/// An engine failure no strike explains.
#[derive(Debug, Clone, Serialize)]
pub struct Incident {
    /// From the campaign's start, when its replacement was reported.
    pub at_ms: f64,
    pub side: &'static str,
    /// The supervisor's report of the failure (e.g. `engine 123 hung: ...`).
    pub what: String,
}

/// Ran, or could not run here.
pub enum Outcome {
    Skipped(String),
    Ran(Box<EngineCampaignReport>),
}

/// `line` reports the replacement of engine `pid`.
fn line_replaces(line: &Line, pid: u32) -> bool {
    matches!(line, Line::Replaced { old, .. } if *old == pid)
}

/// Milliseconds to the microsecond: finer is noise, and the CSV stays legible.
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The side names, by index.
const SIDES: [&str; 2] = ["sender", "receiver"];

/// The campaign's state across episodes.
struct Campaign<'o> {
    o: &'o CampaignOpts,
    ns: Netns,
    rng: Pcg64Mcg,
    /// One per side, when internal classes are struck.
    /// The hooks, and the directory of their sockets.
    hooks: Option<([Hook; 2], Scratch)>,
    start: Instant,
    records: Vec<StrikeRecord>,
    /// Engines a strike reached: their replacements were provoked.
    struck: BTreeSet<u32>,
    unprovoked: Vec<Incident>,
    /// Per side, the last failure its supervisor reported.
    last_failure: [String; 2],
    /// Engine-time watched (two engines while strikes ran), and the part
    /// of it under a strike's observation.
    watched: Duration,
    observed: Duration,
    failed: u64,
    recovered: [u64; 2],
    totals: verified_stream::Totals,
    episodes: usize,
    broken: usize,
    /// Each supervisor's latest lines, for the account of a broken episode.
    recent: [std::collections::VecDeque<String>; 2],
}

/// Supervisor lines kept per side for the account of a broken episode.
const RECENT_LINES: usize = 60;

/// The draws of one strike, made before it whatever its class, so the
/// sequence of sides and pauses depends on the seed alone.
struct Draw {
    side: usize,
    pause: Duration,
    hang: Duration,
    seed: u64,
}

/// A strike's observation: the victim's timeline lines, as they come.
struct Watch {
    side: usize,
    pid: u32,
    at: Instant,
    detection: Option<(Detection, f64)>,
    replaced: bool,
}

pub fn run(o: &CampaignOpts, say: &dyn Fn(&str)) -> anyhow::Result<Outcome> {
    anyhow::ensure!(o.size >= 8, "--size must be at least 8 bytes (each message carries its index)");
    let ns = match Netns::pair(o.rails) {
        Ok(ns) => ns,
        Err(NetnsError::Unavailable(why)) => return Ok(Outcome::Skipped(why)),
        Err(e) => return Err(e.into()),
    };
    let classes = classes(o);
    let mut rng = Pcg64Mcg::seed_from_u64(o.seed);
    let mut plan: Vec<FaultClass> = classes.iter().flat_map(|&c| std::iter::repeat_n(c, o.strikes)).collect();
    for i in (1..plan.len()).rev() {
        plan.swap(i, rng.gen_range(0..=i));
    }
    let hooks = if classes.iter().any(|c| c.internal()) {
        // The hook is test machinery: the shipped engine leaves it out.
        if !cfg!(feature = "fault-hook") {
            anyhow::bail!(
                "faults inside the engine's state ({}) need the engine's fault hook, which this build \
                 leaves out: build with `cargo build --release -p tether-cli --features fault-hook`, \
                 or strike with --classes {}",
                internal_names(&classes),
                external_names()
            );
        }
        // In /dev/shm, which every namespace shares, as the engines' are.
        let dir = Scratch::new(Base::Shm, "campaign-hooks")?;
        let hooks =
            [Hook::bind(&dir.path().join("hook-a.sock"))?, Hook::bind(&dir.path().join("hook-b.sock"))?];
        Some((hooks, dir))
    } else {
        None
    };
    let mut c = Campaign {
        o,
        ns,
        rng,
        hooks,
        start: Instant::now(),
        records: Vec::new(),
        struck: BTreeSet::new(),
        unprovoked: Vec::new(),
        last_failure: [String::new(), String::new()],
        watched: Duration::ZERO,
        observed: Duration::ZERO,
        failed: 0,
        recovered: [0; 2],
        totals: verified_stream::Totals::default(),
        episodes: 0,
        broken: 0,
        recent: Default::default(),
    };
    let mut next = 0;
    while next < plan.len() {
        let from = next;
        next = c.episode(&plan, from, say)?;
        // Every episode has room for a strike (see `episode`); one that
        // made none would repeat for ever.
        anyhow::ensure!(next > from, "episode {} made no strike", c.episodes);
    }
    Ok(Outcome::Ran(Box::new(c.report(&classes))))
}

impl Campaign<'_> {
    fn pace(&self) -> Duration {
        Duration::from_micros(self.o.pace_us)
    }

    fn window(&self, class: FaultClass) -> Duration {
        let w = Duration::from_millis(self.o.window_ms);
        if class.internal() {
            w.max(SELFTEST_REACH)
        } else {
            w
        }
    }

    /// The longest a strike can take, from its draw to the end of its pause.
    fn strike_max(&self) -> Duration {
        let window = FaultClass::ALL.map(|c| self.window(c)).into_iter().max().unwrap_or(STALL);
        window.max(STALL) + RESUME + HOOK_TIMEOUT + Duration::from_micros(*HANG_US.end() + PAUSE_US.end)
    }

    /// Fresh engines and applications, the stream, and strikes from
    /// `plan[from..]` until the plan is done, the stream is broken, or its
    /// room runs short: the index of the next strike.
    fn episode(&mut self, plan: &[FaultClass], from: usize, say: &dyn Fn(&str)) -> anyhow::Result<usize> {
        self.episodes += 1;
        let e = self.episodes;
        let port = PORT + (e % 1000) as u16;
        say(&format!("episode {e}: starting two tether engine processes"));
        let hang = self.o.hang_after_us.to_string();
        let drop = format!("drop:p={}", self.o.drop);
        let seed = self.o.seed.wrapping_add(e as u64).to_string();
        let mut extra = vec!["--hang-after-us", hang.as_str()];
        if self.o.drop > 0.0 {
            extra.extend(["--fault", drop.as_str(), "--seed", seed.as_str()]);
        }
        if self.hooks.is_some() {
            extra.push("--fault-hook");
        }
        let mut engines = Vec::with_capacity(2);
        for s in 0..2 {
            let name = format!("campaign-{e}-{}", if s == 0 { 'a' } else { 'b' });
            let binds = self.ns.binds(s, port);
            engines.push(EngineProcess::start_in(Some(self.ns.name(s)), &name, &binds, &extra)?);
        }
        let engines: [EngineProcess; 2] =
            engines.try_into().map_err(|_| anyhow::anyhow!("two engines were started"))?;
        let a = engines[0].attach(A)?;
        let b = engines[1].attach(B)?;
        a.add_peer_rails(B, &engines[1].rails)?;
        b.add_peer_rails(A, &engines[0].rails)?;
        let pace = self.pace();
        let room = EPISODE.max(self.strike_max() * 2).as_nanos() / pace.as_nanos().max(1) + 1;
        let spec = Spec { from: A, to: B, size: self.o.size, pace, room: room as usize, patience: DRAIN };
        let clients = [&a, &b];
        let (next, ended) =
            verified_stream::run(&spec, &a, &b, |p| self.strikes(p, &engines, clients, plan, from, say));
        let next = next?;
        let ended = ended?;
        self.totals += ended.totals(&a);
        self.events(clients)?;
        // What the supervisors reported after the last strike was nobody's.
        for (s, e) in engines.iter().enumerate() {
            while let Some((when, l)) = e.next_line(Duration::from_millis(10)) {
                self.line(s, when, &l, None);
            }
        }
        Ok(next)
    }

    /// The strikes of one episode (see `episode`).
    fn strikes(
        &mut self,
        p: &Progress,
        engines: &[EngineProcess; 2],
        clients: [&Client; 2],
        plan: &[FaultClass],
        from: usize,
        say: &dyn Fn(&str),
    ) -> anyhow::Result<usize> {
        self.idle(engines, WARMUP);
        let began = Instant::now();
        let need = (self.strike_max().as_nanos() / self.pace().as_nanos().max(1)) as usize + 1;
        let mut i = from;
        while i < plan.len() {
            if p.room_left() < need {
                break;
            }
            let class = plan[i];
            let draw = Draw {
                side: self.rng.gen_range(0..2),
                pause: Duration::from_micros(self.rng.gen_range(PAUSE_US)),
                hang: Duration::from_micros(self.rng.gen_range(HANG_US)),
                seed: self.rng.gen(),
            };
            say(&format!(
                "strike {}/{}: {} on the {}'s engine",
                i + 1,
                plan.len(),
                class.name(),
                SIDES[draw.side]
            ));
            let through = self.strike(p, engines, clients, class, &draw)?;
            i += 1;
            let n = self.records.len();
            match through {
                Through::Broken => {
                    self.broken += 1;
                    let what = format!("episode {} broke after strike {n}", self.episodes);
                    self.account(clients, &what, &format!("broken-episode-{}.log", self.episodes), say);
                    break;
                }
                Through::Stalled => {
                    let what = format!("strike {n} stalled the stream");
                    self.account(clients, &what, &format!("stall-{n}.log"), say);
                }
                Through::Delivering => {}
            }
        }
        self.watched += began.elapsed() * 2;
        Ok(i)
    }

    /// Strike once, observe until the next strike is due, and record it:
    /// how the stream came through it.
    fn strike(
        &mut self,
        p: &Progress,
        engines: &[EngineProcess; 2],
        clients: [&Client; 2],
        class: FaultClass,
        d: &Draw,
    ) -> anyhow::Result<Through> {
        let victim = &engines[d.side];
        let before = p.tally();
        let failed_before = self.failed;
        let pid = victim.engine_pid();
        let at = Instant::now();
        let t = p.stamp_of(at);
        let queue_ms = p.sojourn_at(t).map(|q| ms(Duration::from_nanos(q)));
        let (hit, hook) = match class {
            FaultClass::Kill => match victim.signal_engine(libc::SIGKILL) {
                Ok(_) => (Hit::Struck, String::new()),
                Err(e) => (Hit::Missed, e.to_string()),
            },
            FaultClass::Hang => match victim.signal_engine(libc::SIGSTOP) {
                Ok(_) => {
                    std::thread::sleep(d.hang);
                    // If the supervisor fenced it meanwhile, there is
                    // nothing left to continue, and that is fine.
                    // SAFETY: a signal to the engine process this command started.
                    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
                    (Hit::Struck, format!("stopped {:.1} ms", d.hang.as_secs_f64() * 1e3))
                }
                Err(e) => (Hit::Missed, e.to_string()),
            },
            _ => {
                let Some((hooks, _)) = &self.hooks else {
                    anyhow::bail!("internal fault {} without the fault hook", class.name());
                };
                let reply = hooks[d.side].strike(victim.dir(), class.name(), d.seed, HOOK_TIMEOUT);
                let hit = match reply {
                    Reply::Flipped(_) => Hit::Struck,
                    Reply::Nothing(_) => Hit::NoState,
                    // A live engine answers at its next turn: one silent
                    // for a second was already stopped, dead or being
                    // replaced, and what follows is not this strike's doing.
                    Reply::Silent | Reply::Unreachable(_) | Reply::Unexpected(_) => Hit::Missed,
                };
                (hit, reply.describe())
            }
        };
        if hit == Hit::Struck {
            self.struck.insert(pid);
        }

        // The observation: until the strike is reported, its engine
        // replaced and the stream delivering again; or the window has
        // passed with the stream delivering; or the stall bound has passed.
        let mut w = Watch { side: d.side, pid, at, detection: None, replaced: false };
        let window = self.window(class);
        let mut delivered = None;
        loop {
            delivered = delivered.or_else(|| p.submitted_after(t).and_then(|i| p.delivered_stamp(i)));
            let elapsed = at.elapsed();
            let back = delivered.is_some();
            if (w.detection.is_some() && w.replaced && back)
                || (hit != Hit::Struck && back)
                || (elapsed >= window && back)
                || elapsed >= window.max(STALL)
            {
                break;
            }
            self.look(victim, &mut w, LOOK);
        }
        // A stall: wait for the stream to resume, or give the episode up.
        let until = Instant::now() + RESUME;
        while delivered.is_none() && Instant::now() < until {
            self.look(victim, &mut w, LOOK);
            delivered = p.submitted_after(t).and_then(|i| p.delivered_stamp(i));
        }
        let broken = delivered.is_none();
        // The pause before the next strike is still this one's to explain.
        let next = Instant::now() + d.pause;
        while let Some(left) = next.checked_duration_since(Instant::now()) {
            self.look(victim, &mut w, left.min(Duration::from_millis(10)));
        }
        let other = 1 - d.side;
        while let Some((when, l)) = engines[other].next_line(Duration::ZERO) {
            self.line(other, when, &l, None);
        }
        self.events(clients)?;

        let after = p.tally();
        let recovery_ms = delivered.map(|d| ms(Duration::from_nanos(d.saturating_sub(t))));
        let effect = Effect {
            stalled: recovery_ms.is_none_or(|r| r > ms(STALL)),
            lost: after.lost - before.lost,
            duplicated: after.duplicated - before.duplicated,
            corrupted: after.corrupted - before.corrupted,
            failed: self.failed - failed_before,
        };
        let detection = w.detection.map(|(d, _)| d);
        let verdict = verdict(hit, detection, &effect);
        let observed = at.elapsed();
        if hit == Hit::Struck {
            self.observed += observed;
        }
        self.records.push(StrikeRecord {
            n: self.records.len() + 1,
            class,
            side: SIDES[d.side],
            episode: self.episodes,
            at_ms: ms(at.duration_since(self.start)),
            engine: pid,
            detection,
            detect_ms: w.detection.map(|(_, ms)| ms),
            recovery_ms,
            queue_ms,
            added_ms: recovery_ms.zip(queue_ms).map(|(r, q)| r - q),
            observed_ms: ms(observed),
            verdict,
            effect: effect.describe(),
            hook,
        });
        Ok(match (broken, effect.stalled) {
            (true, _) => Through::Broken,
            (false, true) => Through::Stalled,
            (false, false) => Through::Delivering,
        })
    }

    /// Read the victim's next timeline line (waiting up to `wait`) into the
    /// strike's observation.
    fn look(&mut self, victim: &EngineProcess, w: &mut Watch, wait: Duration) {
        if let Some((when, text)) = victim.next_line(wait) {
            self.line(w.side, when, &text, Some(w));
        }
    }

    /// A timeline line of side `s`'s supervisor, which arrived `when`; `w`
    /// if it is the struck engine's, during its strike's observation.
    fn line(&mut self, s: usize, when: Instant, text: &str, w: Option<&mut Watch>) {
        let recent = &mut self.recent[s];
        if recent.len() == RECENT_LINES {
            recent.pop_front();
        }
        recent.push_back(format!("{:>10.3} ms {text}", ms(when.saturating_duration_since(self.start))));
        let failure = Detection::of(text);
        let line = Line::parse(text);
        if let Some(w) = w.filter(|w| Line::engine(text) == Some(w.pid) || line_replaces(&line, w.pid)) {
            if let Some(d) = failure.filter(|_| w.detection.is_none()) {
                w.detection = Some((d, ms(when.saturating_duration_since(w.at))));
            }
            w.replaced |= line_replaces(&line, w.pid);
        }
        if failure.is_some() {
            // "   507.993 ms engine 18964 died: ..." without the supervisor's clock.
            self.last_failure[s] = text.split_once(" ms ").map_or(text, |(_, rest)| rest).to_string();
        }
        // A replacement of an engine no strike reached was nobody's doing.
        if let Line::Replaced { old, .. } = line {
            if !self.struck.contains(&old) {
                self.unprovoked.push(Incident {
                    at_ms: ms(when.saturating_duration_since(self.start)),
                    side: SIDES[s],
                    what: std::mem::take(&mut self.last_failure[s]),
                });
            }
        }
    }

    /// A stall (a second or more before a message submitted after the
    /// strike was delivered) is rare: three in 50,000 strikes, each a
    /// receiver's hung engine whose fence took most of the second (the
    /// kernel finishing the killed process; docs/ENGINE.md, "Stalls of a
    /// second"); and once the stream never resumed, and the episode
    /// broke. What each application's endpoint and each supervisor said,
    /// into `--out` as `file` (or on stderr), for whoever looks into it.
    fn account(&mut self, clients: [&Client; 2], what: &str, file: &str, say: &dyn Fn(&str)) {
        let mut text = format!("{what}\n");
        if let Some(r) = self.records.last() {
            text.push_str(&format!("{r:?}\n"));
        }
        for (s, c) in clients.iter().enumerate() {
            text.push_str(&format!(
                "\n{} application: engine pid {}, recoveries {}, unsettled {}\n  {:?}\n  {:?}\n",
                SIDES[s],
                c.engine_pid(),
                c.recoveries(),
                c.unsettled(),
                c.stats(),
                c.engine_counters()
            ));
        }
        for (s, lines) in self.recent.iter().enumerate() {
            text.push_str(&format!("\n{}'s supervisor, its last {} lines:\n", SIDES[s], lines.len()));
            for l in lines {
                text.push_str(l);
                text.push('\n');
            }
        }
        let written = self.o.out.as_ref().map(|dir| {
            let path = dir.join(file);
            std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, &text)).map(|()| path)
        });
        match written {
            Some(Ok(path)) => say(&format!("{what}: its account is in {}", path.display())),
            _ => eprintln!("tether campaign --engine: {text}"),
        }
    }

    /// Read both engines' lines for `d`, with no strike to explain them.
    fn idle(&mut self, engines: &[EngineProcess; 2], d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            for (s, e) in engines.iter().enumerate() {
                while let Some((when, l)) = e.next_line(Duration::from_millis(5)) {
                    self.line(s, when, &l, None);
                }
            }
        }
    }

    /// Count the applications' events: recoveries and failed messages.
    fn events(&mut self, clients: [&Client; 2]) -> anyhow::Result<()> {
        for (s, c) in clients.into_iter().enumerate() {
            let n = verified_stream::drain_events(c)?;
            self.recovered[s] += n.recovered;
            self.failed += n.failed;
        }
        Ok(())
    }

    fn report(self, classes: &[FaultClass]) -> EngineCampaignReport {
        let rows = classes
            .iter()
            .map(|&c| {
                let of: Vec<&StrikeRecord> = self.records.iter().filter(|r| r.class == c).collect();
                ClassRow::of(c.name(), &of)
            })
            .collect();
        let all = ClassRow::of("all", &self.records.iter().collect::<Vec<_>>());
        let t = self.totals;
        let unwatched = self.watched.saturating_sub(self.observed).as_secs_f64();
        let coincidences_expected = if unwatched > 0.0 {
            self.unprovoked.len() as f64 / unwatched * self.observed.as_secs_f64()
        } else {
            0.0
        };
        EngineCampaignReport {
            seed: self.o.seed,
            rails: self.ns.rails(),
            size: self.o.size,
            pace_us: self.o.pace_us,
            hang_after_us: self.o.hang_after_us,
            window_ms: self.o.window_ms,
            drop: self.o.drop,
            strikes_per_class: self.o.strikes,
            classes: rows,
            all,
            totals: t,
            reported_failed: self.failed,
            recovered_events_sender: self.recovered[0],
            recovered_events_receiver: self.recovered[1],
            unprovoked_replacements: self.unprovoked.len(),
            unprovoked: self.unprovoked,
            coincidences_expected,
            episodes: self.episodes,
            broken_episodes: self.broken,
            seconds: self.start.elapsed().as_secs_f64(),
            strikes: self.records,
        }
    }
}

/// Write `engine-campaign.csv` (a row per strike) and `engine-recovery.png`
/// (the empirical distribution of recovery times, a line per detector:
/// the counterpart of Zhou et al. [FTGM] Fig. 10) into `dir`.
pub fn write_out(dir: &Path, r: &EngineCampaignReport) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = vec![plot::write_csv(dir, "engine-campaign.csv", &r.strikes)?];
    let series: Vec<Series> = Detection::ALL
        .iter()
        .filter_map(|&d| {
            let mut ms: Vec<f64> =
                r.strikes.iter().filter(|s| s.detection == Some(d)).filter_map(|s| s.recovery_ms).collect();
            ms.sort_by(f64::total_cmp);
            let n = ms.len() as f64;
            (!ms.is_empty()).then(|| Series {
                label: format!("detected by {} (n = {})", d.name(), ms.len()),
                points: ms.iter().enumerate().map(|(i, &x)| (x, (i + 1) as f64 / n)).collect(),
            })
        })
        .collect();
    if series.is_empty() {
        eprintln!("no strike was detected: no recovery-time distribution to plot");
        return Ok(written);
    }
    let path = dir.join("engine-recovery.png");
    let title = format!("Recovery after engine faults ({} strikes, seed {})", r.strikes.len(), r.seed);
    let chart = Chart {
        title: &title,
        x_label: "strike to first new message delivered (ms)",
        y_label: "fraction of detected strikes",
        log_x: false,
        series: &series,
    };
    plot::line_png(&path, &chart, 900, 600)?;
    written.push(path);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_lines_name_their_detector() {
        let of = Detection::of;
        assert_eq!(of("   507.783 ms engine 18958 died: killed by signal 9"), Some(Detection::Crash));
        assert_eq!(of("   7.7 ms engine 18958 died: exited with status 1"), Some(Detection::Crash));
        assert_eq!(
            of("   7.7 ms engine 18958 died: failed its self-test (exit status 3)"),
            Some(Detection::SelfTest)
        );
        assert_eq!(
            of("   716.542 ms engine 18964 hung: heartbeat still for 5.021 ms"),
            Some(Detection::Watchdog)
        );
        assert_eq!(of("   716.843 ms engine 18964 fenced (killed and reaped)"), None);
        assert_eq!(of("   716.980 ms engine 18969 replaced 18964, 0.119 ms after"), None);
    }

    #[test]
    fn verdicts_put_detection_first_then_what_the_application_saw() {
        let none = Effect::default();
        let stall = Effect { stalled: true, ..Effect::default() };
        let lost = Effect { lost: 2, ..Effect::default() };
        assert_eq!(verdict(Hit::Struck, None, &none), Verdict::NoEffect);
        assert_eq!(verdict(Hit::Struck, None, &stall), Verdict::Undetected);
        assert_eq!(verdict(Hit::Struck, None, &lost), Verdict::Undetected);
        assert_eq!(verdict(Hit::Struck, Some(Detection::Watchdog), &stall), Verdict::Watchdog);
        assert_eq!(verdict(Hit::Struck, Some(Detection::SelfTest), &none), Verdict::SelfTest);
        assert_eq!(verdict(Hit::NoState, Some(Detection::Crash), &lost), Verdict::NoState);
        assert_eq!(verdict(Hit::Missed, None, &none), Verdict::NotStruck);
        assert_eq!(lost.describe(), "lost 2");
        assert_eq!(
            Effect { stalled: true, failed: 3, ..lost }.describe(),
            "stall, lost 2, reported failed 3"
        );
        assert_eq!(none.describe(), "-");
    }

    fn record(verdict: Verdict, recovery_ms: Option<f64>) -> StrikeRecord {
        StrikeRecord {
            n: 1,
            class: FaultClass::Kill,
            side: "sender",
            episode: 1,
            at_ms: 0.0,
            engine: 1,
            detection: None,
            detect_ms: recovery_ms.map(|r| r / 2.0),
            recovery_ms,
            queue_ms: recovery_ms.map(|r| r / 4.0),
            added_ms: recovery_ms.map(|r| r * 0.75),
            observed_ms: 100.0,
            verdict,
            effect: "-".into(),
            hook: String::new(),
        }
    }

    #[test]
    fn coverage_is_detected_over_detected_and_undetected_with_effect() {
        let rs = [
            record(Verdict::Crash, Some(2.0)),
            record(Verdict::Watchdog, Some(8.0)),
            record(Verdict::Crash, Some(4.0)),
            record(Verdict::Undetected, None),
            record(Verdict::NoEffect, Some(0.3)),
            record(Verdict::NotStruck, None),
        ];
        let row = ClassRow::of("kill", &rs.iter().collect::<Vec<_>>());
        assert_eq!((row.injected, row.not_struck, row.crash, row.watchdog, row.undetected), (5, 1, 2, 1, 1));
        assert_eq!(row.coverage_pct, Some(75.0));
        let rec = row.recovery_ms.unwrap();
        assert_eq!((rec.n, rec.median, rec.max), (3, 4.0, 8.0), "over the detected strikes only");
        let quiet = ClassRow::of("hang", &[&record(Verdict::NoEffect, Some(0.3))]);
        assert_eq!(quiet.coverage_pct, None, "nothing to detect: no coverage figure");
    }
}
