//! Load from other processes, for `tether bench contention --external`:
//! what a cluster node runs beside its communication, which hurt a
//! spinning-then-sleeping transport far more than busy loops do (an 8 B
//! round trip 10.6x the limit's beside a parallel build and processes that
//! block and wake, against 1.9x beside two busy loops).
//!
//! Each kind is real processes, none of them tether's:
//!
//! - `build`: a parallel build, one compiler loop per core: `cc -O2` of a
//!   generated C file of a few hundred functions, again and again (each a
//!   new process: fork, exec, file I/O, about a second of CPU);
//! - `wake`: processes that block and wake, one shell loop per core
//!   running `sleep 0.0005` (a process that sleeps half a millisecond,
//!   made and reaped 1,000 times a second);
//! - `pipe`: producers and consumers through pipes (`yes | cat`, one pair
//!   per core), each blocking on the other thousands of times a second;
//! - `spin`: one busy process per core (`sh -c 'while :; do :; done'`), the
//!   load `bench contention` always had, as processes.
//!
//! Every process is registered with `scratch` when started and reaped on
//! drop, so an interrupted bench leaves none behind, and dies with the
//! thread that started it, so one killed outright leaves none either; the
//! compiler's files live in a scratch directory of the run.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::scratch::{self, Base, Scratch};

/// A kind of external load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A parallel build: `cc -O2` loops, one per core.
    Build,
    /// Processes that sleep half a millisecond and wake, one loop per core.
    Wake,
    /// `yes | cat` pairs: processes blocking on each other through a pipe.
    Pipe,
    /// Busy processes, one per core.
    Spin,
}

/// Functions in the generated C file: about a second of `cc -O2` here
/// (3,000 took 12 s).
const FUNCTIONS: usize = 300;

/// The processes of a load, stopped and reaped on drop.
pub struct ExternalLoad {
    children: Arc<Mutex<Vec<Child>>>,
    stop: Arc<AtomicBool>,
    builders: Vec<std::thread::JoinHandle<()>>,
    _dir: Option<Scratch>,
}

impl ExternalLoad {
    /// Start `kinds` with `per_kind` processes (or loops) of each.
    pub fn start(kinds: &[Kind], per_kind: usize) -> anyhow::Result<Self> {
        let mut load = ExternalLoad {
            children: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(AtomicBool::new(false)),
            builders: Vec::new(),
            _dir: None,
        };
        for &kind in kinds {
            match kind {
                Kind::Build => load.start_builds(per_kind)?,
                Kind::Wake => {
                    for _ in 0..per_kind {
                        let mut sh = Command::new("sh");
                        load.spawn(sh.args(["-c", "while :; do sleep 0.0005; done"]).stdin(Stdio::null()))?;
                    }
                }
                Kind::Pipe => {
                    for _ in 0..per_kind {
                        let mut yes = Command::new("yes");
                        yes.stdin(Stdio::null()).stdout(Stdio::piped());
                        let mut producer = spawned(&mut yes)?;
                        let out = producer.stdout.take().expect("piped");
                        load.adopt(producer);
                        load.spawn(Command::new("cat").stdin(out).stdout(Stdio::null()))?;
                    }
                }
                Kind::Spin => {
                    for _ in 0..per_kind {
                        let mut sh = Command::new("sh");
                        load.spawn(sh.args(["-c", "while :; do :; done"]).stdin(Stdio::null()))?;
                    }
                }
            }
        }
        Ok(load)
    }

    /// `n` compiler loops over one generated source file.
    fn start_builds(&mut self, n: usize) -> anyhow::Result<()> {
        let dir = Scratch::new(Base::Tmp, "external-load")?;
        let source = dir.path().join("load.c");
        std::fs::write(&source, generated_source())?;
        // A compiler that works, first: a missing one is an error now, not
        // a load that silently is not there.
        let probe = dir.path().join("probe.c");
        std::fs::write(&probe, "int probe(int x) { return x + 1; }\n")?;
        let status = Command::new("cc")
            .args(["-O2", "-c", "-o"])
            .arg(dir.path().join("probe.o"))
            .arg(&probe)
            .stderr(Stdio::null())
            .status()
            .map_err(|e| anyhow::anyhow!("--external build needs a C compiler (`cc`): {e}"))?;
        anyhow::ensure!(status.success(), "--external build: `cc -O2` failed on a one-line C file");
        for i in 0..n {
            let (stop, children) = (self.stop.clone(), self.children.clone());
            let (source, object) = (source.clone(), dir.path().join(format!("load{i}.o")));
            self.builders.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut cc = Command::new("cc");
                    cc.args(["-O2", "-pipe", "-c", "-o"]).arg(&object).arg(&source).stdin(Stdio::null());
                    let Ok(child) = spawned(&mut cc) else { return };
                    let pid = child.id();
                    children.lock().unwrap_or_else(|p| p.into_inner()).push(child);
                    // Reaped by whoever finds it done: this loop, or drop.
                    loop {
                        std::thread::sleep(Duration::from_millis(5));
                        let mut all = children.lock().unwrap_or_else(|p| p.into_inner());
                        let Some(at) = all.iter().position(|c| c.id() == pid) else { break };
                        if !matches!(all[at].try_wait(), Ok(None)) {
                            // Reaped by `try_wait`; `wait` returns its status.
                            let _ = all.swap_remove(at).wait();
                            scratch::child_gone(pid);
                            break;
                        }
                    }
                }
            }));
        }
        self._dir = Some(dir);
        Ok(())
    }

    fn spawn(&mut self, cmd: &mut Command) -> anyhow::Result<()> {
        let child = spawned(cmd)?;
        self.adopt(child);
        Ok(())
    }

    fn adopt(&mut self, child: Child) {
        self.children.lock().unwrap_or_else(|p| p.into_inner()).push(child);
    }
}

/// Start `cmd` with nothing on the terminal (its input is the caller's
/// to set), registered with `scratch`, and killed by the kernel if the
/// thread that started it dies (`PR_SET_PDEATHSIG`): a bench killed
/// outright runs no destructor, and a `yes | cat` pair would spin on.
fn spawned(cmd: &mut Command) -> anyhow::Result<Child> {
    use std::os::unix::process::CommandExt;
    let program = cmd.get_program().to_string_lossy().into_owned();
    // SAFETY: prctl is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("external load: cannot start `{program}`: {e}"))?;
    scratch::child_started(child.id());
    Ok(child)
}

impl Drop for ExternalLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = std::mem::take(&mut *self.children.lock().unwrap_or_else(|p| p.into_inner()));
        for c in &mut all {
            let _ = c.kill();
        }
        for mut c in all {
            let _ = c.wait();
            scratch::child_gone(c.id());
        }
        for b in self.builders.drain(..) {
            let _ = b.join();
        }
        // A compile the loops started while the list was being emptied.
        for mut c in std::mem::take(&mut *self.children.lock().unwrap_or_else(|p| p.into_inner())) {
            let _ = c.kill();
            let _ = c.wait();
            scratch::child_gone(c.id());
        }
    }
}

/// A C file that keeps `cc -O2` busy: functions with loops and arithmetic
/// to optimise, none of them trivial enough to fold away.
fn generated_source() -> String {
    let mut s = String::from("#include <stdint.h>\n");
    for i in 0..FUNCTIONS {
        s.push_str(&format!(
            "uint64_t f{i}(uint64_t x, const uint32_t *v, int n) {{\n\
             \tuint64_t h = x ^ {i}u;\n\
             \tfor (int j = 0; j < n; j++) {{ h = (h * 1099511628211u) ^ v[j]; if (h & {m}) h += j * {i}u; }}\n\
             \treturn h + (x << ({i} % 17));\n}}\n",
            m = (i % 61) + 1
        ));
    }
    s
}
