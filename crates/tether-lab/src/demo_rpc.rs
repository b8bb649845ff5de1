//! `tether demo --rpc`: a small bank where at-most-once matters (issue
//! 15). Accounts live on several server processes (`tether bank-server`,
//! found by name in a directory of names); a client moves money between
//! two accounts of one server as calls, through links that drop,
//! duplicate, corrupt, reorder and delay, while the servers are killed
//! with SIGKILL at random moments and restarted on their call logs. Then
//! it checks, from what the servers wrote: no transfer ran twice, no money
//! was created or destroyed, no account went below zero, and every call's
//! final state told the truth (a transfer reported as run ran, one
//! reported as not run did not).
//!
//! A server's accounts are its effects file: each applied transfer is one
//! 24-byte record (transfer id, from, to, amount) appended with a single
//! `write`, which a kill cannot split; the balances are the initial ones
//! plus every record. A handler either appends its record or refuses for
//! want of funds; the call layer's log says whether it ran.

// The demo paces its kills by the wall clock.
#![allow(clippy::disallowed_methods)]

use std::collections::VecDeque;
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use tether::names::{FileNames, Names};
use tether::rpc::{CallLogOptions, CallOptions, Executed, RpcConfig, SyncPolicy};
use tether::{Endpoint, Error, Options};

use crate::args;
use crate::scratch::{self, Base, Scratch};

const CLIENT: u32 = 1;
const TRANSFER: u32 = 1;
const INITIAL: i64 = 1_000;
const RECORD: usize = 24;
const WAIT: Option<Duration> = Some(Duration::from_secs(60));

/// `tether bank-server` (started by the demo, not by hand).
#[derive(Debug, Clone, clap::Args)]
pub struct BankServerOpts {
    /// The demo's directory: names, logs, effects.
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long)]
    pub node: u32,
    #[arg(long)]
    pub bind: SocketAddr,
    #[arg(long, default_value_t = 8, value_parser = args::int_in::<usize>(2, 1024, "accounts", ""))]
    pub accounts: usize,
}

fn rpc() -> RpcConfig {
    RpcConfig {
        credit: 16,
        retries: 40,
        ack_timeout: Duration::from_millis(30),
        reply_timeout: Duration::from_millis(60),
        max_retry_interval: Duration::from_millis(250),
        ..RpcConfig::default()
    }
}

fn name(node: u32) -> String {
    format!("bank-{node}")
}

fn effects_path(dir: &Path, node: u32) -> PathBuf {
    dir.join(format!("effects-{node}"))
}

/// A transfer's arguments and its effect record: id, from, to, amount.
fn encode(id: u64, from: u32, to: u32, amount: u64) -> [u8; RECORD] {
    let mut b = [0u8; RECORD];
    b[0..8].copy_from_slice(&id.to_le_bytes());
    b[8..12].copy_from_slice(&from.to_le_bytes());
    b[12..16].copy_from_slice(&to.to_le_bytes());
    b[16..24].copy_from_slice(&amount.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<(u64, usize, usize, i64)> {
    let b: &[u8; RECORD] = b.try_into().ok()?;
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes")) as usize;
    let amount = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
    Some((u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")), u32_at(8), u32_at(12), amount as i64))
}

/// The balances an effects file says, and every transfer id in it.
fn replay_effects(bytes: &[u8], accounts: usize) -> anyhow::Result<(Vec<i64>, Vec<u64>)> {
    let mut balances = vec![INITIAL; accounts];
    let mut ids = Vec::new();
    // A record cut short by a kill never took effect.
    for r in bytes.chunks_exact(RECORD) {
        let (id, from, to, amount) = decode(r).expect("a whole record");
        anyhow::ensure!(from < accounts && to < accounts, "an effect names an account that does not exist");
        balances[from] -= amount;
        balances[to] += amount;
        ids.push(id);
    }
    Ok((balances, ids))
}

/// The server: its accounts from its effects file, a transfer handler,
/// registered by name, serving until killed.
pub fn serve(o: &BankServerOpts) -> anyhow::Result<()> {
    let path = effects_path(&o.dir, o.node);
    let (balances, _) = replay_effects(&std::fs::read(&path).unwrap_or_default(), o.accounts)?;
    let effects = std::fs::OpenOptions::new().append(true).create(true).open(&path)?;
    let log = CallLogOptions {
        path: o.dir.join(format!("calls-{}.log", o.node)),
        capacity: 8 << 20,
        sync: SyncPolicy::None,
    };
    let options = Options { calls: rpc(), call_log: Some(log), linger: Duration::ZERO, ..Options::default() };
    let ep = Endpoint::udp(o.node, o.bind, &[], options)?;
    // The demo's store: a server started as an interrupted demo cleans up
    // must not make it again (`FileNames::new` would) and leave it behind.
    let names = FileNames::existing(o.dir.join("names"))?;
    tether::names::connect(&names, &ep, &name(CLIENT))?;
    let balances = Mutex::new(balances);
    ep.register_handler(TRANSFER, move |r| {
        let Some((_, from, to, amount)) = decode(r.args) else { return vec![2] };
        let mut b = balances.lock().unwrap_or_else(|e| e.into_inner());
        if from >= b.len() || to >= b.len() || b[from] < amount {
            return vec![0];
        }
        // The effect: one write, which a kill cannot split.
        if (&effects).write_all(r.args).is_err() {
            return vec![2];
        }
        b[from] -= amount;
        b[to] += amount;
        vec![1]
    })?;
    tether::names::register(&names, &name(o.node), &ep)?;
    loop {
        match ep.serve(Some(Duration::from_millis(100))) {
            Ok(()) | Err(Error::TimedOut) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// What the demo did and found.
#[derive(Debug, Serialize)]
pub struct BankReport {
    pub servers: u32,
    pub accounts: usize,
    pub transfers: u64,
    pub kills: u32,
    /// Final states: ran and moved money, ran and refused (no funds),
    /// did not run, unknown (the server died while it ran).
    pub applied: u64,
    pub refused_funds: u64,
    pub not_run: u64,
    pub unknown: u64,
    /// Transfers whose effect is there more than once.
    pub ran_twice: u64,
    /// Calls whose final state says something the effects contradict.
    pub false_states: u64,
    pub money_before: i64,
    pub money_after: i64,
    pub negative_accounts: u64,
    pub faults_injected: u64,
    pub retransmissions: u64,
    pub seconds: f64,
    pub ok: bool,
}

struct Servers {
    dir: PathBuf,
    addrs: Vec<SocketAddr>,
    children: Vec<Option<Child>>,
    accounts: usize,
}

impl Servers {
    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let child = scratch::owned_by_this_run(&mut Command::new(std::env::current_exe()?))
            .arg("bank-server")
            .arg("--dir")
            .arg(&self.dir)
            .args(["--node", &(i as u32 + 2).to_string(), "--bind", &self.addrs[i].to_string()])
            .args(["--accounts", &self.accounts.to_string()])
            .stdout(Stdio::null())
            .spawn()?;
        scratch::child_started(child.id());
        self.children[i] = Some(child);
        Ok(())
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
            scratch::child_gone(c.id());
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}

/// Run the bank: `servers` processes of `accounts` each, `transfers`
/// calls, `kills` kills at random.
pub fn run(
    servers: u32,
    accounts: usize,
    transfers: u64,
    kills: u32,
    seed: u64,
    faults: tether::faults::FaultPlan,
) -> anyhow::Result<BankReport> {
    let start = Instant::now();
    // The servers' call logs, effects and names: this run's scratch.
    let scratch = Scratch::new(Base::Tmp, "bank")?;
    let dir = scratch.path().to_owned();
    let names = FileNames::new(dir.join("names"))?;
    let options = Options { calls: rpc(), faults, ..Options::default() };
    let client = Endpoint::udp(CLIENT, "127.0.0.1:0".parse()?, &[], options)?;
    tether::names::register(&names, &name(CLIENT), &client)?;
    // One port for each server's every life.
    let addrs = (0..servers)
        .map(|_| Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?))
        .collect::<anyhow::Result<Vec<SocketAddr>>>()?;
    let mut farm =
        Servers { dir: dir.clone(), addrs, children: (0..servers).map(|_| None).collect(), accounts };
    for i in 0..servers as usize {
        farm.spawn(i)?;
    }
    // Each server up: its name registered.
    for i in 0..servers {
        let t = Instant::now();
        while names.resolve(&name(i + 2))?.is_none() {
            anyhow::ensure!(t.elapsed() < Duration::from_secs(20), "bank server {} never came up", i + 2);
            std::thread::sleep(Duration::from_millis(5));
        }
        tether::names::connect(&names, &client, &name(i + 2))?;
    }
    let done = AtomicBool::new(false);
    let killed = AtomicU32::new(0);
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let mut kill_rng = Pcg64Mcg::seed_from_u64(seed ^ 0xB4A4);
    let calls = std::thread::scope(|s| -> anyhow::Result<Vec<_>> {
        let killer = s.spawn(|| -> anyhow::Result<()> {
            while killed.load(Ordering::SeqCst) < kills && !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(kill_rng.gen_range(5..40)));
                let i = kill_rng.gen_range(0..servers as usize);
                farm.kill(i);
                farm.spawn(i)?;
                killed.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        });
        let wait = CallOptions { credit_wait: WAIT, ..CallOptions::default() };
        let mut open = VecDeque::new();
        let mut ended = Vec::new();
        let mut id = 0u64;
        // Transfers until there are enough and the kills are done.
        while id < transfers || (killed.load(Ordering::SeqCst) < kills && !killer.is_finished()) {
            let server = rng.gen_range(2..servers + 2);
            let from = rng.gen_range(0..accounts as u32);
            let to = (from + rng.gen_range(1..accounts as u32)) % accounts as u32;
            let args = encode(id, from, to, rng.gen_range(1..300));
            open.push_back((server, args, client.request_with(server, TRANSFER, &args, &wait)?));
            id += 1;
            if open.len() >= 32 {
                let (server, args, call) = open.pop_front().expect("in flight");
                ended.push((server, args, call.wait(WAIT)?));
            }
        }
        for (server, args, call) in open {
            ended.push((server, args, call.wait(WAIT)?));
        }
        done.store(true, Ordering::SeqCst);
        killer.join().map_err(|_| anyhow::anyhow!("the killer thread panicked"))??;
        Ok(ended)
    })?;
    drop(farm);
    // What the servers wrote, against what the calls said.
    let mut report = BankReport {
        servers,
        accounts,
        transfers: calls.len() as u64,
        kills: killed.load(Ordering::SeqCst),
        applied: 0,
        refused_funds: 0,
        not_run: 0,
        unknown: 0,
        ran_twice: 0,
        false_states: 0,
        money_before: INITIAL * accounts as i64 * servers as i64,
        money_after: 0,
        negative_accounts: 0,
        faults_injected: client.fault_counters().total(),
        retransmissions: client.call_stats().map_or(0, |s| s.caller.retransmissions),
        seconds: 0.0,
        ok: false,
    };
    let mut applied = vec![0u32; calls.len()];
    for node in 2..servers + 2 {
        let (balances, ids) =
            replay_effects(&std::fs::read(effects_path(&dir, node)).unwrap_or_default(), accounts)?;
        report.money_after += balances.iter().sum::<i64>();
        report.negative_accounts += balances.iter().filter(|&&b| b < 0).count() as u64;
        for id in ids {
            applied[id as usize] += 1;
        }
    }
    report.ran_twice = applied.iter().filter(|&&n| n > 1).count() as u64;
    for (_, args, out) in &calls {
        let (id, ..) = decode(args).expect("our own arguments");
        let took = applied[id as usize] >= 1;
        let truthful = match (out.executed(), out.reply.as_deref()) {
            (Executed::Yes, Some([1])) => {
                report.applied += 1;
                took
            }
            (Executed::Yes, Some([0])) => {
                report.refused_funds += 1;
                !took
            }
            (Executed::Yes, _) => false,
            (Executed::No, _) => {
                report.not_run += 1;
                !took
            }
            (Executed::Unknown, _) => {
                report.unknown += 1;
                true
            }
        };
        report.false_states += u64::from(!truthful);
    }
    report.seconds = start.elapsed().as_secs_f64();
    report.ok = report.ran_twice == 0
        && report.false_states == 0
        && report.money_after == report.money_before
        && report.negative_accounts == 0
        && report.kills >= kills;
    drop(scratch);
    Ok(report)
}

/// The report as a few lines.
pub fn print(r: &BankReport) {
    println!(
        "bank: {} servers x {} accounts, {} transfers as calls, {} server kills (SIGKILL, restarted on their logs), {} faults injected, {} call retransmissions, {:.2} s",
        r.servers, r.accounts, r.transfers, r.kills, r.faults_injected, r.retransmissions, r.seconds
    );
    println!(
        "outcomes: {} moved money, {} refused for want of funds, {} did not run, {} unknown (the server died while the handler ran)",
        r.applied, r.refused_funds, r.not_run, r.unknown
    );
    println!(
        "checks: {} transfers ran twice, {} final states false, money {} before and {} after, {} accounts below zero: {}",
        r.ran_twice,
        r.false_states,
        r.money_before,
        r.money_after,
        r.negative_accounts,
        if r.ok { "ok" } else { "FAILED" }
    );
}
