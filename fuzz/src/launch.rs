//! Fuzz start-up's parsers (`tether::launch`, docs/CLUSTER.md "Start-up"):
//! a hostfile's text, and Slurm's variables (the tasks per node, the rank,
//! the size, the distribution) over a fixed hostlist (the hostlist syntax
//! is the `hostlist` crate's). No panic; what parses places every rank
//! once, on a port at or above the base, this process's rank among them.

use tether::launch::Layout;

/// One fuzz input: fields split at NUL bytes.
pub fn run(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    let mut fields = text.split('\0');
    let hostfile = fields.next().unwrap_or("");
    let base = 9000;
    let rank = input.first().map_or(0, |&b| u32::from(b % 8));
    if let Ok(l) = Layout::from_hostfile_text(hostfile, rank, base) {
        assert!((l.rank as usize) < l.hosts.len());
    }
    let per = fields.next().unwrap_or("").to_string();
    let procid = fields.next().unwrap_or("").to_string();
    let ntasks = fields.next().unwrap_or("").to_string();
    let dist = fields.next().map(str::to_string);
    let var = |k: &str| -> Option<String> {
        match k {
            "SLURM_PROCID" => Some(procid.clone()),
            "SLURM_NTASKS" => Some(ntasks.clone()),
            "SLURM_STEP_NODELIST" => Some("n[1-4]".to_string()),
            "SLURM_STEP_TASKS_PER_NODE" => Some(per.clone()),
            "SLURM_DISTRIBUTION" => dist.clone(),
            _ => None,
        }
    };
    if let Ok(l) = Layout::from_slurm_vars(var, base) {
        assert!((l.rank as usize) < l.hosts.len());
        assert_eq!(ntasks.trim().parse::<usize>(), Ok(l.hosts.len()), "every task placed");
        assert!(l.hosts.iter().all(|(h, p)| h.starts_with('n') && *p >= base));
        let mut seen = l.hosts.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), l.hosts.len(), "no two ranks at one address");
    }
}
