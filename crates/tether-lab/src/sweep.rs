//! `tether bench sweep`: the parameter study of Tang and Bilas [TB]
//! sections 5-6 (Table 1, Figures 5-9) run on tether over real UDP, with
//! the fault injector as the error source.
//!
//! The paper varied its one retransmission timer (10 us to 1 s), its NIC
//! send-queue size (2 to 128 buffers of about 4 KB) and the error rate
//! (none, 1e-5 to 1e-2: a packet dropped on the sending NIC), and found
//! that 1 ms timers are robust across error rates, that queues above 8 are
//! enough, and that only rates above 1e-3 hurt. Here:
//!
//! - **timer**: tether's adaptive timer pinned (its floor, start and
//!   ceiling all one value), at a window of 32 segments: Figures 5 and 6;
//! - **window**: segments in flight per peer, the send-queue size, at a
//!   1 ms timer: Figures 7 and 8;
//! - **error rate**: each datagram dropped as it is sent with that
//!   probability, on both endpoints (`drop:p=R,side=send`);
//! - **repair**: tether's selective repair and go-back-N, which is how the
//!   paper's protocol repaired (it had no selective retransmission);
//! - datagrams of 4096 bytes by default, the paper's buffer size, so a
//!   window counts what the paper's queue counted;
//! - Figure 9: the application kernels of `app_kernels` (all-to-all,
//!   nearest neighbour) under the paper's four settings (timer 100 us or
//!   1 ms, queue 2 or 32), their run time against the error rate.
//!
//! Every stream is checked (each message once, in order, intact) and every
//! kernel block; a run that is not fails the command.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::app_kernels::{self, Kernel};
use crate::args;
use crate::net::{Mode, NetOpts};
use crate::plot::{self, Chart, Series};
use crate::stream;
use crate::summary::Summary;

#[derive(Debug, Clone, clap::Args)]
pub struct SweepOpts {
    /// Retransmission timers, a fixed timer each (Figures 5-6), comma-separated.
    #[arg(long, value_delimiter = ',', default_values = ["100us", "1ms", "10ms", "100ms", "1s"],
          value_parser = args::duration_in(Duration::from_micros(100), Duration::from_secs(10), "the coalescing delay is 25 us"))]
    pub timers: Vec<Duration>,
    /// Send windows in segments, the paper's send-queue sizes (Figures 7-8).
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 8, 32, 128], allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 65_536, "segments", ""))]
    pub windows: Vec<usize>,
    /// Error rates: the probability that a datagram is dropped as it is sent.
    #[arg(long, value_delimiter = ',', default_values_t = [0.0, 1e-4, 1e-3, 1e-2], allow_negative_numbers = true,
          value_parser = args::probability)]
    pub rates: Vec<f64>,
    /// Message sizes of the streams, in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [4096usize, 65536], allow_negative_numbers = true,
          value_parser = args::size(8))]
    pub sizes: Vec<usize>,
    /// Repair: selective (tether's) and go-back-n (the paper's protocol's).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Selective, Mode::GoBackN])]
    pub modes: Vec<Mode>,
    /// Bytes each stream carries.
    #[arg(long, default_value_t = 16 << 20, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(1 << 16, 1 << 34, "bytes", ""))]
    pub bytes: u64,
    /// Largest datagram, header included (the paper's buffers held about 4 KB).
    #[arg(long, default_value_t = 4096, value_parser = args::mtu)]
    pub mtu: usize,
    /// Rounds of each application kernel (0: no kernels).
    #[arg(long, default_value_t = 200, allow_negative_numbers = true,
          value_parser = args::int_in::<u64>(0, 1_000_000, "rounds", ""))]
    pub rounds: u64,
    /// Runs of each setting: the median is the figure, min and max beside it.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(1, 100, "runs", ""))]
    pub runs: usize,
    /// Nodes of the application kernels, a thread each.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true,
          value_parser = args::int_in::<usize>(3, 64, "nodes", ""))]
    pub nodes: usize,
    /// A grid of minutes instead: timers 100us,1ms,100ms, windows 2,8,32,
    /// rates 0,0.001,0.01, 64 KiB messages, 16 MiB a stream, 200 rounds.
    #[arg(long, conflicts_with_all = ["timers", "windows", "rates", "sizes", "bytes", "rounds"])]
    pub quick: bool,
    /// Seed of the fault injectors.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = args::seed)]
    pub seed: u64,
    /// Write sweep.csv, kernels.csv and the figures' PNGs into this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

impl SweepOpts {
    /// The grid, `--quick`'s if asked for.
    fn grid(&self) -> SweepOpts {
        if !self.quick {
            return self.clone();
        }
        SweepOpts {
            timers: [100, 1_000, 100_000].map(Duration::from_micros).to_vec(),
            windows: vec![2, 8, 32],
            rates: vec![0.0, 1e-3, 1e-2],
            sizes: vec![65_536],
            bytes: 16 << 20,
            rounds: 200,
            ..self.clone()
        }
    }
}

/// The window the timer sweep runs at, and the timer the window sweep
/// runs at: the paper's best pair.
const FIG5_WINDOW: usize = 32;
const FIG7_TIMER: Duration = Duration::from_millis(1);

/// One stream of the grid.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub mode: &'static str,
    pub size: usize,
    pub timer_us: u64,
    pub window: usize,
    pub rate: f64,
    /// The median of the runs, and their least and most.
    pub mb_s: f64,
    pub mb_s_min: f64,
    pub mb_s_max: f64,
    /// The median against the same settings' without errors.
    pub relative: f64,
    pub retransmits: u64,
    pub dropped: u64,
}

/// One kernel run.
#[derive(Debug, Clone, Serialize)]
pub struct KernelPoint {
    pub kernel: &'static str,
    /// The paper's label: `r100us-q2` is a 100 us timer and a queue of 2.
    pub setting: String,
    pub rate: f64,
    /// The median of the runs, and their least and most.
    pub seconds: f64,
    pub seconds_min: f64,
    pub seconds_max: f64,
    /// The median against the same setting's without errors.
    pub relative: f64,
    pub retransmits: u64,
    pub dropped: u64,
}

/// A finding of the paper and what this run says of it.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub paper: &'static str,
    pub tether: String,
}

#[derive(Debug, Serialize)]
pub struct Sweep {
    pub mtu: usize,
    pub bytes: u64,
    pub points: Vec<Point>,
    pub kernels: Vec<KernelPoint>,
    pub findings: Vec<Finding>,
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Selective => "selective",
        Mode::GoBackN => "go-back-n",
    }
}

/// Run the grid over loopback, `net` otherwise as `tether stream` has it
/// by default; `tell` says what runs now.
pub fn run(o: &SweepOpts, net: NetOpts, tell: &dyn Fn(&str)) -> anyhow::Result<Sweep> {
    let g = o.grid();
    let mut points: Vec<Point> = Vec::new();
    // The settings of Figures 5-6 (timers at the paper's window) and 7-8
    // (windows at its timer), each once.
    let mut settings: Vec<(Duration, usize)> = g.timers.iter().map(|&t| (t, FIG5_WINDOW)).collect();
    for &w in &g.windows {
        if !settings.contains(&(FIG7_TIMER, w)) {
            settings.push((FIG7_TIMER, w));
        }
    }
    for &mode in &g.modes {
        for &size in &g.sizes {
            for &(timer, window) in &settings {
                for &rate in &g.rates {
                    tell(&format!(
                        "{} {size} B, timer {}, window {window}, rate {rate}",
                        mode_name(mode),
                        tether_fault::format_duration(timer)
                    ));
                    let faults =
                        if rate > 0.0 { vec![format!("drop:p={rate},side=send")] } else { Vec::new() };
                    let o = NetOpts {
                        size,
                        mode,
                        window,
                        mtu: g.mtu,
                        rto_fixed: Some(timer),
                        faults,
                        loss: 0.0,
                        seed: g.seed,
                        ..net.clone()
                    };
                    let count = (g.bytes / size as u64).max(1);
                    let (mut mb_s, mut retransmits, mut dropped) = (Vec::new(), 0, 0);
                    for run in 0..g.runs {
                        // Each run its own drops.
                        let o = NetOpts { seed: g.seed + run as u64, ..o.clone() };
                        let r = stream::reliable_loopback(&o, count).map_err(|e| {
                            anyhow::anyhow!(
                                "{} {size} B, timer {}, window {window}, rate {rate}, run {run}: {e}",
                                mode_name(mode),
                                tether_fault::format_duration(timer)
                            )
                        })?;
                        anyhow::ensure!(
                            r.delivered == r.messages && r.corrupted == 0 && r.out_of_order == 0,
                            "{} {size} B, timer {timer:?}, window {window}, rate {rate}: {} of {} delivered, {} corrupted, {} out of order",
                            mode_name(mode),
                            r.delivered,
                            r.messages,
                            r.corrupted,
                            r.out_of_order
                        );
                        mb_s.push(r.goodput_mb_s);
                        retransmits += r.retransmits;
                        dropped += r.injected.dropped;
                    }
                    let m = Summary::of(&mb_s).expect("at least one run");
                    points.push(Point {
                        mode: mode_name(mode),
                        size,
                        timer_us: timer.as_micros() as u64,
                        window,
                        rate,
                        mb_s: m.median,
                        mb_s_min: m.min,
                        mb_s_max: m.max,
                        // Set below, once the row's error-free point is in.
                        relative: f64::NAN,
                        retransmits,
                        dropped,
                    });
                }
            }
        }
    }
    against_error_free(&mut points);
    let kernels = if g.rounds > 0 { run_kernels(&g, &net, tell)? } else { Vec::new() };
    let findings = findings(&g, &points);
    Ok(Sweep { mtu: g.mtu, bytes: g.bytes, points, kernels, findings })
}

/// Figure 9: each kernel under the paper's four settings and each rate,
/// with tether's selective repair.
fn run_kernels(g: &SweepOpts, net: &NetOpts, tell: &dyn Fn(&str)) -> anyhow::Result<Vec<KernelPoint>> {
    let mut out = Vec::new();
    let settings = [(100, 2), (100, 32), (1_000, 2), (1_000, 32)];
    for kernel in Kernel::ALL {
        let (block, compute) = match kernel {
            Kernel::AllToAll => (16 << 10, Duration::ZERO),
            Kernel::Neighbour => (4 << 10, Duration::from_micros(200)),
        };
        let spec = app_kernels::Spec { kernel, nodes: g.nodes, rounds: g.rounds, block, compute };
        for (timer_us, window) in settings {
            let setting =
                format!("r{}-q{window}", tether_fault::format_duration(Duration::from_micros(timer_us)));
            let o = NetOpts {
                window,
                mtu: g.mtu,
                mode: Mode::Selective,
                rto_fixed: Some(Duration::from_micros(timer_us)),
                ..net.clone()
            };
            let config = o.config();
            for &rate in &g.rates {
                tell(&format!("{} {setting}, rate {rate}", kernel.name()));
                let rule = (rate > 0.0).then(|| format!("drop:p={rate},side=send"));
                let (mut seconds, mut retransmits, mut dropped) = (Vec::new(), 0, 0);
                for run in 0..g.runs {
                    let r = app_kernels::run(&spec, &config, rule.as_deref(), g.seed + 1000 * run as u64)
                        .map_err(|e| {
                            anyhow::anyhow!("{} {setting}, rate {rate}, run {run}: {e}", kernel.name())
                        })?;
                    seconds.push(r.seconds);
                    retransmits += r.retransmits;
                    dropped += r.dropped;
                }
                let t = Summary::of(&seconds).expect("at least one run");
                out.push(KernelPoint {
                    kernel: kernel.name(),
                    setting: setting.clone(),
                    rate,
                    seconds: t.median,
                    seconds_min: t.min,
                    seconds_max: t.max,
                    relative: f64::NAN,
                    retransmits,
                    dropped,
                });
            }
        }
    }
    against_error_free(&mut out);
    Ok(out)
}

/// A figure of the grid, in a row of settings swept over the error rates.
trait Cell {
    fn same_row(&self, other: &Self) -> bool;
    fn rate(&self) -> f64;
    fn value(&self) -> f64;
    fn relative_mut(&mut self) -> &mut f64;
}

impl Cell for Point {
    fn same_row(&self, o: &Self) -> bool {
        (self.mode, self.size, self.timer_us, self.window) == (o.mode, o.size, o.timer_us, o.window)
    }
    fn rate(&self) -> f64 {
        self.rate
    }
    fn value(&self) -> f64 {
        self.mb_s
    }
    fn relative_mut(&mut self) -> &mut f64 {
        &mut self.relative
    }
}

impl Cell for KernelPoint {
    fn same_row(&self, o: &Self) -> bool {
        (self.kernel, &self.setting) == (o.kernel, &o.setting)
    }
    fn rate(&self) -> f64 {
        self.rate
    }
    fn value(&self) -> f64 {
        self.seconds
    }
    fn relative_mut(&mut self) -> &mut f64 {
        &mut self.relative
    }
}

/// Each figure against its row's error-free one, wherever 0 is in
/// `--rates` (none there: not a number).
fn against_error_free<T: Cell>(cells: &mut [T]) {
    let free: Vec<Option<f64>> = cells
        .iter()
        .map(|c| cells.iter().find(|b| b.rate() == 0.0 && b.same_row(c)).map(Cell::value))
        .collect();
    for (c, free) in cells.iter_mut().zip(free) {
        let v = c.value();
        *c.relative_mut() = free.map_or(f64::NAN, |f| v / f);
    }
}

/// The paper's three findings, each read off this run's grid for each
/// repair mode (at the largest message size).
fn findings(g: &SweepOpts, points: &[Point]) -> Vec<Finding> {
    let Some(&size) = g.sizes.iter().max() else { return Vec::new() };
    let mut out = Vec::new();
    let fig7_timer = FIG7_TIMER.as_micros() as u64;
    let show = |v: f64| if v.is_finite() { format!("{v:.2}") } else { "-".into() };
    for &mode in &g.modes {
        let m = mode_name(mode);
        let at = |timer_us: u64, window: usize, rate: f64| {
            points.iter().find(|p| {
                p.mode == m
                    && p.size == size
                    && p.timer_us == timer_us
                    && p.window == window
                    && p.rate == rate
            })
        };
        // Timers: the worst relative bandwidth over the error rates, each timer.
        let timers: Vec<String> = g
            .timers
            .iter()
            .map(|t| {
                let t = t.as_micros() as u64;
                let worst = g
                    .rates
                    .iter()
                    .filter_map(|&r| at(t, FIG5_WINDOW, r))
                    .map(|p| p.relative)
                    .fold(f64::INFINITY, f64::min);
                format!("{}: {}", tether_fault::format_duration(Duration::from_micros(t)), show(worst))
            })
            .collect();
        out.push(Finding {
            paper: "1 ms timers are robust across error rates (within 10% of error-free at 1e-4, 4 KB and up); 100 us costs 18%, 1 s 72%",
            tether: format!("{m}, {size} B, window {FIG5_WINDOW}: worst bandwidth over the rates against error-free, by timer: {}", timers.join(", ")),
        });
        // Windows: the smallest within 10% of the best, error-free and at each rate.
        let windows: Vec<String> = g
            .rates
            .iter()
            .map(|&r| {
                let mut row: Vec<(usize, f64)> =
                    g.windows.iter().filter_map(|&w| at(fig7_timer, w, r).map(|p| (w, p.mb_s))).collect();
                row.sort_by_key(|&(w, _)| w);
                let best = row.iter().map(|&(_, v)| v).fold(0.0, f64::max);
                let enough = row.iter().find(|&&(_, v)| v >= 0.9 * best).map(|&(w, _)| w.to_string());
                format!("rate {r}: {}", enough.unwrap_or_else(|| "-".into()))
            })
            .collect();
        out.push(Finding {
            paper: "send queues above 8 reach close to the best bandwidth (at 1e-2, large queues lose 30% without selective retransmission)",
            tether: format!("{m}, {size} B, timer 1ms: the smallest window within 10% of the best: {}", windows.join(", ")),
        });
        // Rates: the first at which the 1 ms / 32 setting falls below 0.9.
        let hurt = g
            .rates
            .iter()
            .filter(|&&r| r > 0.0)
            .find(|&&r| at(fig7_timer, FIG5_WINDOW, r).is_some_and(|p| p.relative < 0.9));
        out.push(Finding {
            paper: "error rates up to 1e-4 change little; above 1e-3 performance degrades by more than 20%",
            tether: format!(
                "{m}, {size} B, timer 1ms, window {FIG5_WINDOW}: {}",
                match hurt {
                    Some(r) => format!("first below 0.9x error-free at rate {r}"),
                    None => "within 0.9x of error-free at every rate swept".into(),
                }
            ),
        });
    }
    out
}

/// The tables: per mode and size, bandwidth by timer and by window against
/// the error rates; then the kernels; then the findings.
pub fn print(s: &Sweep, g: &SweepOpts) {
    let g = g.grid();
    let fig7_timer = FIG7_TIMER.as_micros() as u64;
    println!(
        "tether bench sweep (Tang and Bilas [TB] Figures 5-9): streams over loopback, {} B a stream, datagrams of {} B, each datagram dropped as it is sent with the rate's probability; MB/s, median of {} runs (x error-free)",
        s.bytes, s.mtu, g.runs
    );
    let rates: Vec<String> = g.rates.iter().map(|r| format!("rate {r}")).collect();
    for &mode in &g.modes {
        for &size in &g.sizes {
            let m = mode_name(mode);
            let cell = |t: u64, w: usize, r: f64| {
                s.points
                    .iter()
                    .find(|p| {
                        p.mode == m && p.size == size && p.timer_us == t && p.window == w && p.rate == r
                    })
                    .map_or("-".into(), |p| format!("{:.0} ({:.2})", p.mb_s, p.relative))
            };
            println!("\n{m}, {size} B messages, window {FIG5_WINDOW} (Figures 5-6):");
            println!("{:>8}  {}", "timer", rates.iter().map(|r| format!("{r:>16}")).collect::<String>());
            for t in &g.timers {
                let us = t.as_micros() as u64;
                let row: String =
                    g.rates.iter().map(|&r| format!("{:>16}", cell(us, FIG5_WINDOW, r))).collect();
                println!("{:>8}  {row}", tether_fault::format_duration(*t));
            }
            println!("{m}, {size} B messages, timer 1ms (Figures 7-8):");
            println!("{:>8}  {}", "window", rates.iter().map(|r| format!("{r:>16}")).collect::<String>());
            for &w in &g.windows {
                let row: String =
                    g.rates.iter().map(|&r| format!("{:>16}", cell(fig7_timer, w, r))).collect();
                println!("{w:>8}  {row}");
            }
        }
    }
    if !s.kernels.is_empty() {
        println!("\napplication kernels (Figure 9), {} nodes, {} rounds, selective repair: seconds, median of {} runs (x error-free)", g.nodes, g.rounds, g.runs);
        for kernel in Kernel::ALL {
            println!("{}:", kernel.name());
            println!("{:>12}  {}", "setting", rates.iter().map(|r| format!("{r:>16}")).collect::<String>());
            let mut seen: Vec<&str> = Vec::new();
            for k in s.kernels.iter().filter(|k| k.kernel == kernel.name()) {
                if seen.contains(&k.setting.as_str()) {
                    continue;
                }
                seen.push(&k.setting);
                let row: String = g
                    .rates
                    .iter()
                    .map(|&r| {
                        let p = s
                            .kernels
                            .iter()
                            .find(|p| p.kernel == k.kernel && p.setting == k.setting && p.rate == r);
                        format!(
                            "{:>16}",
                            p.map_or("-".into(), |p| format!("{:.3} ({:.2})", p.seconds, p.relative))
                        )
                    })
                    .collect();
                println!("{:>12}  {row}", k.setting);
            }
        }
    }
    println!("\nthe paper's findings, and this run's:");
    for f in &s.findings {
        println!("- [TB] {}\n  tether: {}", f.paper, f.tether);
    }
}

/// sweep.csv, kernels.csv and a PNG per figure: bandwidth against the
/// timer and against the window, a line per error rate (one chart per mode
/// and size), and kernel run time against the error rate, a line per
/// setting. The paths written.
pub fn write(s: &Sweep, g: &SweepOpts, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let g = g.grid();
    let mut written = vec![plot::write_csv(dir, "sweep.csv", &s.points)?];
    if !s.kernels.is_empty() {
        written.push(plot::write_csv(dir, "kernels.csv", &s.kernels)?);
    }
    let fig7_timer = FIG7_TIMER.as_micros() as u64;
    for &mode in &g.modes {
        let m = mode_name(mode);
        for &size in &g.sizes {
            let of = |fixed: &dyn Fn(&Point) -> Option<f64>| -> Vec<Series> {
                g.rates
                    .iter()
                    .map(|&r| Series {
                        label: format!("error rate {r}"),
                        points: s
                            .points
                            .iter()
                            .filter(|p| p.mode == m && p.size == size && p.rate == r)
                            .filter_map(|p| fixed(p).map(|x| (x, p.mb_s)))
                            .collect(),
                    })
                    .collect()
            };
            let timer = of(&|p| (p.window == FIG5_WINDOW).then_some(p.timer_us as f64));
            let title =
                format!("Bandwidth against the retransmission timer ({m}, {size} B, window {FIG5_WINDOW})");
            let path = dir.join(format!("sweep-timer-{m}-{size}.png"));
            plot::line_png(
                &path,
                &Chart {
                    title: &title,
                    x_label: "retransmission timer (us)",
                    y_label: "MB/s",
                    log_x: true,
                    series: &timer,
                },
                900,
                600,
            )?;
            written.push(path);
            let window = of(&|p| (p.timer_us == fig7_timer).then_some(p.window as f64));
            let title = format!("Bandwidth against the send window ({m}, {size} B, timer 1 ms)");
            let path = dir.join(format!("sweep-window-{m}-{size}.png"));
            plot::line_png(
                &path,
                &Chart {
                    title: &title,
                    x_label: "send window (segments)",
                    y_label: "MB/s",
                    log_x: true,
                    series: &window,
                },
                900,
                600,
            )?;
            written.push(path);
        }
    }
    for kernel in Kernel::ALL {
        let mut series: Vec<Series> = Vec::new();
        for k in s.kernels.iter().filter(|k| k.kernel == kernel.name()) {
            match series.iter_mut().find(|x| x.label == k.setting) {
                Some(x) => x.points.push((k.rate, k.relative)),
                None => series.push(Series { label: k.setting.clone(), points: vec![(k.rate, k.relative)] }),
            }
        }
        if series.iter().all(|x| x.points.iter().all(|p| p.0 <= 0.0)) {
            continue;
        }
        let title = format!("{} run time against the error rate", kernel.name());
        let path = dir.join(format!("sweep-kernel-{}.png", kernel.name()));
        plot::line_png(
            &path,
            &Chart {
                title: &title,
                x_label: "error rate",
                y_label: "run time / error-free",
                log_x: true,
                series: &series,
            },
            900,
            600,
        )?;
        written.push(path);
    }
    Ok(written)
}
