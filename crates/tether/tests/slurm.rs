//! Start-up under a real Slurm (docs/CLUSTER.md, "Start-up"): a
//! one-machine Slurm (munged, slurmctld, slurmd from Debian's `slurm-wlm`,
//! installed by `scripts/setup`) is started with its own configuration and
//! ports, and `srun -n 4` starts this very test binary four times, each
//! running `slurm_task`. Each task learns its rank, the job's size and
//! every rank's address from Slurm's environment alone
//! (`tether::launch::Launch::from_slurm`), joins the cluster (ranks 0-2
//! run the manager replicas) and a group, multicasts, and prints what it
//! delivered. Every task must have delivered every task's messages, in
//! one order (the same digest).
//!
//! Skips, saying so, where it cannot run Slurm: not root, or the daemons
//! not installed.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tether::cluster::{ClusterConfig, GroupOutput};
use tether::launch::Launch;

const TASKS: u32 = 4;
const EACH: u64 = 200;
const GROUP: u32 = 5;

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A one-machine Slurm of this test's own: stopped when dropped.
struct Slurm {
    dir: PathBuf,
    conf: PathBuf,
    daemons: Vec<Child>,
}

impl Slurm {
    fn start() -> Option<Slurm> {
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } != 0 {
            eprintln!("SKIPPED: the Slurm test needs root (slurmd runs tasks as any user)");
            return None;
        }
        for cmd in ["slurmctld", "slurmd", "srun", "munged", "sinfo"] {
            if !have(cmd) {
                eprintln!("SKIPPED: no {cmd} (scripts/setup installs slurm-wlm and munge where apt can)");
                return None;
            }
        }
        let host = String::from_utf8(Command::new("hostname").output().ok()?.stdout).ok()?.trim().to_string();
        let dir = std::env::temp_dir().join(format!("tether-slurm-{}", std::process::id()));
        for sub in ["state", "spool", "log"] {
            std::fs::create_dir_all(dir.join(sub)).ok()?;
        }
        let port = 20_000 + (std::process::id() % 20_000) as u16;
        let d = dir.display();
        let conf = dir.join("slurm.conf");
        std::fs::write(
            &conf,
            format!(
                "ClusterName=tether\nSlurmctldHost={host}\nSlurmctldPort={port}\nSlurmdPort={}\n\
                 AuthType=auth/munge\nStateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
                 SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
                 SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd.log\n\
                 ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSwitchType=switch/none\n\
                 MpiDefault=none\nSchedulerType=sched/builtin\nSelectType=select/cons_tres\n\
                 SelectTypeParameters=CR_CPU\nReturnToService=2\nSlurmUser=root\nSlurmdUser=root\n\
                 JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
                 NodeName={host} CPUs=2 State=UNKNOWN\n\
                 PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n",
                port + 1
            ),
        )
        .ok()?;
        // munged: the system's if it runs, else started here (it stays: it
        // is a machine's service, and others may use it).
        if !Path::new("/run/munge/munge.socket.2").exists() {
            std::fs::create_dir_all("/run/munge").ok()?;
            let _ = Command::new("chown").args(["munge:munge", "/run/munge"]).status();
            let started = Command::new("munged").arg("--force").status().is_ok_and(|s| s.success())
                || Command::new("runuser")
                    .args(["-u", "munge", "--", "munged", "--force"])
                    .status()
                    .is_ok_and(|s| s.success());
            if !started {
                eprintln!("SKIPPED: munged would not start");
                return None;
            }
        }
        let mut daemons = Vec::new();
        for daemon in ["slurmctld", "slurmd"] {
            let child = Command::new(daemon)
                .arg("-D")
                .arg("-f")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            match child {
                Ok(c) => daemons.push(c),
                Err(e) => {
                    eprintln!("SKIPPED: {daemon} would not start: {e}");
                    return None;
                }
            }
        }
        let slurm = Slurm { dir, conf, daemons };
        // Up when the node is idle.
        let start = Instant::now();
        loop {
            let out = Command::new("sinfo")
                .args(["-h", "-o", "%t"])
                .env("SLURM_CONF", &slurm.conf)
                .output()
                .ok()?;
            if String::from_utf8_lossy(&out.stdout).trim() == "idle" {
                return Some(slurm);
            }
            if start.elapsed() > Duration::from_secs(30) {
                // The machine's Slurm, not tether, failed here.
                let log = std::fs::read_to_string(slurm.dir.join("log/slurmd.log")).unwrap_or_default();
                eprintln!("SKIPPED: this machine's Slurm did not come up in 30 s; slurmd's log:\n{log}");
                return None;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn ranks_started_by_srun_form_a_cluster_and_deliver_one_order() {
    if std::env::var_os("SLURM_PROCID").is_some() {
        return; // a task of the job below: `slurm_task` is its work
    }
    let Some(slurm) = Slurm::start() else { return };
    let exe = std::env::current_exe().unwrap();
    let base = 30_000 + (std::process::id() % 20_000) as u16;
    let out = Command::new("timeout")
        .arg("120")
        .arg("srun")
        .args(["-n", &TASKS.to_string(), "--overcommit", "-t", "2"])
        .arg(&exe)
        .args(["--exact", "slurm_task", "--ignored", "--nocapture", "--test-threads=1"])
        .env("SLURM_CONF", &slurm.conf)
        .env("TETHER_TEST_BASE_PORT", base.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "srun failed: {}\n{stdout}\n{stderr}", out.status);
    // The test harness prints its own words before the task's line.
    let reports: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.rfind("task ").map(|at| &l[at..]))
        .filter(|l| l.contains("digest"))
        .collect();
    assert_eq!(reports.len(), TASKS as usize, "every task reports:\n{stdout}\n{stderr}");
    let digests: Vec<&str> = reports.iter().map(|l| l.rsplit(' ').next().unwrap()).collect();
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "one order everywhere: {reports:?}");
    let want = format!("delivered {}", u64::from(TASKS) * EACH);
    assert!(reports.iter().all(|l| l.contains(&want)), "{reports:?}");
    println!("{}", reports.join("\n"));
}

/// One task of the job: everything from Slurm's environment.
#[test]
#[ignore = "run by srun from ranks_started_by_srun_form_a_cluster_and_deliver_one_order"]
fn slurm_task() {
    let base: u16 = std::env::var("TETHER_TEST_BASE_PORT").unwrap().parse().unwrap();
    let job = Launch::from_slurm(base).unwrap();
    let replicas: Vec<u32> = (1..=job.size().min(3)).collect();
    let ep = job.builder().cluster(ClusterConfig::new(&replicas, Duration::from_millis(50))).build().unwrap();
    ep.join_group(GROUP).unwrap();
    let all: Vec<u32> = (1..=job.size()).collect();
    let start = Instant::now();
    while ep.group_view(GROUP).is_none_or(|(_, m)| m != all) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "rank {}: group {:?}",
            job.rank,
            ep.group_view(GROUP)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for i in 0..EACH {
        ep.multicast(GROUP, format!("{}:{i}", job.rank).as_bytes(), Some(Duration::from_secs(10))).unwrap();
    }
    // FNV-1a over (sender, number) of every delivery in order.
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    let mut delivered = 0u64;
    while delivered < u64::from(job.size()) * EACH {
        assert!(start.elapsed() < Duration::from_secs(90), "rank {}: {delivered} delivered", job.rank);
        if let Ok(GroupOutput::Delivered(m)) = ep.next_group_output(Some(Duration::from_secs(1))) {
            delivered += 1;
            for b in m.from.to_le_bytes().into_iter().chain(m.n.to_le_bytes()) {
                digest = (digest ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    println!("task {} of {}: delivered {delivered}, digest {digest:016x}", job.rank, job.size());
    // Stay until the others have theirs: a member leaving early would
    // change the group under them.
    std::thread::sleep(Duration::from_secs(1));
    let _ = ep.close(Duration::from_secs(1));
}
