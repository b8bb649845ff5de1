//! tether for Python (PyO3; docs/PYTHON.md): `import tether` gives
//! endpoints, messages, events, calls with Python handlers, and the fault
//! injector, over the Rust runtime.
//!
//! What the binding keeps to:
//!
//! - **The GIL is released while waiting**: `recv`, `next_event`, `wait`,
//!   `flush`, `serve`, `request` and a `send` that waits for room run
//!   their waits without it, so other Python threads run meanwhile.
//! - **No copy where the buffer allows**: `send` takes any buffer (bytes,
//!   bytearray, memoryview, numpy arrays) and copies it once, into the
//!   send log, as the Rust API does; a received `Message` exposes its
//!   bytes through the buffer protocol (`memoryview(msg)`, `msg.data`)
//!   without a copy.
//! - **Typed errors**: each class of the runtime's error is an exception
//!   class under `tether.Error` (`TimedOut`, `WouldBlock`, `UnknownPeer`...).

use std::ffi::c_int;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use runtime::faults::FaultPlan;
use runtime::rpc::{AckStatus, Executed, OperationStatus};
use runtime::{Bytes, ClusterKey, Config, Error, Event, FailReason, MessageId, MessageState, SendError};

create_exception!(tether, TetherError, PyException, "Everything tether raises.");
create_exception!(tether, TimedOut, TetherError, "The timeout passed first.");
create_exception!(tether, WouldBlock, TetherError, "The send buffer is full (pass a timeout to wait for room).");
create_exception!(tether, UnknownPeer, TetherError, "No peer with that node id was given or taken in.");
create_exception!(tether, MessageTooLarge, TetherError, "The message exceeds the endpoint's largest.");
create_exception!(tether, Closed, TetherError, "The endpoint is closed.");
create_exception!(tether, ConfigError, TetherError, "The configuration, rails, peers or fault rules are invalid.");
create_exception!(tether, TransportError, TetherError, "The transport refused (bind, send).");
create_exception!(tether, EngineError, TetherError, "The engine could not be attached to, or is gone.");
create_exception!(tether, CallError, TetherError, "A call could not be made, or its log refused a record.");
create_exception!(tether, Lingered, TetherError, "close waited its bound and messages were still unsettled.");

fn err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::TimedOut => TimedOut::new_err(msg),
        Error::Closed => Closed::new_err(msg),
        Error::Send(SendError::WouldBlock) => WouldBlock::new_err(msg),
        Error::Send(SendError::UnknownPeer(_)) => UnknownPeer::new_err(msg),
        Error::Send(SendError::MessageTooLarge { .. }) => MessageTooLarge::new_err(msg),
        Error::Send(_) | Error::Config(_) | Error::Path(_) | Error::FaultPlan(_) => ConfigError::new_err(msg),
        Error::Rails { .. } | Error::PeerRails { .. } | Error::PeerTwice { .. } => ConfigError::new_err(msg),
        Error::Transport(_) => TransportError::new_err(msg),
        Error::Engine(_) | Error::EngineOwns { .. } => EngineError::new_err(msg),
        Error::Call(_) | Error::CallLog(_) => CallError::new_err(msg),
        Error::Lingered { .. } => Lingered::new_err(msg),
        _ => TetherError::new_err(msg),
    }
}

fn timeout(t: Option<f64>) -> PyResult<Option<Duration>> {
    t.map(|s| Duration::try_from_secs_f64(s).map_err(|_| PyValueError::new_err(format!("timeout {s}: seconds, >= 0"))))
        .transpose()
}

fn addr(s: &str) -> PyResult<std::net::SocketAddr> {
    s.parse().map_err(|_| PyValueError::new_err(format!("`{s}` is not an address like 127.0.0.1:7000")))
}

fn state_name(s: MessageState) -> &'static str {
    match s {
        MessageState::Pending => "pending",
        MessageState::Delivered => "delivered",
        MessageState::Failed(FailReason::PeerUnreachable) => "failed: peer unreachable",
        MessageState::Failed(FailReason::PeerRestarted) => "failed: peer restarted",
        MessageState::Failed(_) => "failed",
        _ => "unknown",
    }
}

/// One node's endpoint: send to and receive from its peers.
///
/// `Endpoint(node, bind="127.0.0.1:0", peers={2: "10.0.0.2:7000"},
/// key_file=None, accept=None, accept_unkeyed=False, faults=None, seed=1,
/// engine=None)`: `bind` is an address or a list (one rail each);
/// `accept=N` takes in up to N peers not given (with a key, any that
/// proves it; without one only with `accept_unkeyed=True`); `faults` is a
/// list of rules (`"drop:p=0.01"`, docs/FAULTS.md) drawn from `seed`;
/// `engine` attaches to `tether engine --dir DIR` instead.
#[pyclass(frozen, module = "tether")]
struct Endpoint {
    ep: RwLock<Option<Arc<runtime::Endpoint>>>,
}

impl Endpoint {
    fn get(&self) -> PyResult<Arc<runtime::Endpoint>> {
        self.ep.read().unwrap_or_else(|e| e.into_inner()).clone().ok_or_else(|| Closed::new_err("endpoint closed"))
    }
}

#[pymethods]
impl Endpoint {
    #[new]
    #[pyo3(signature = (node, bind=None, peers=None, key_file=None, accept=None, accept_unkeyed=false, faults=None, seed=1, engine=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        node: u32,
        bind: Option<&Bound<'_, PyAny>>,
        peers: Option<&Bound<'_, PyDict>>,
        key_file: Option<std::path::PathBuf>,
        accept: Option<usize>,
        accept_unkeyed: bool,
        faults: Option<Vec<String>>,
        seed: u64,
        engine: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let mut b = runtime::Endpoint::builder(node);
        match (&engine, bind) {
            (Some(dir), _) => b = b.engine(dir),
            (None, None) => b = b.bind(addr("127.0.0.1:0")?),
            (None, Some(x)) => {
                let binds: Vec<String> = match x.extract::<String>() {
                    Ok(one) => vec![one],
                    Err(_) => x.extract()?,
                };
                for a in binds {
                    b = b.bind(addr(&a)?);
                }
            }
        }
        if let Some(p) = peers {
            for (k, v) in p.iter() {
                b = b.peer(k.extract()?, addr(&v.extract::<String>()?)?);
            }
        }
        if let Some(path) = key_file {
            let material = std::fs::read(&path)
                .map_err(|e| ConfigError::new_err(format!("key file {}: {e}", path.display())))?;
            let key = ClusterKey::from_material(&material).map_err(|e| err(Error::Config(e)))?;
            b = b.key(key);
        }
        match (accept, accept_unkeyed) {
            (Some(n), true) => b = b.accept_unkeyed(n),
            (Some(n), false) => b = b.accept(n),
            (None, true) => b = b.accept_unkeyed(Config::default().accept_peers),
            (None, false) => {}
        }
        if let Some(rules) = faults {
            b = b.faults(FaultPlan::parse_rules(seed, &rules).map_err(|e| err(Error::FaultPlan(e)))?);
        }
        let ep = py.allow_threads(|| b.build()).map_err(err)?;
        Ok(Endpoint { ep: RwLock::new(Some(Arc::new(ep))) })
    }

    /// This endpoint's node id.
    #[getter]
    fn node(&self) -> PyResult<u32> {
        Ok(self.get()?.node())
    }

    /// Rail 0's address, "IP:port" (None attached to an engine).
    #[getter]
    fn local_addr(&self) -> PyResult<Option<String>> {
        Ok(self.get()?.local_addr().map(|a| a.to_string()))
    }

    /// Know node `node` at `addr` (rail 0).
    fn add_peer(&self, node: u32, addr_: &str) -> PyResult<()> {
        self.get()?.add_peer(node, addr(addr_)?).map_err(err)
    }

    /// Queue `data` (any buffer) for `peer`; copied once, into the send
    /// log. Without `timeout` it never waits (`WouldBlock` when the send
    /// buffer is full); with one it waits up to that many seconds for
    /// room, without the GIL. Returns the message's `Sent`.
    #[pyo3(signature = (peer, data, timeout=None))]
    fn send(&self, py: Python<'_>, peer: u32, data: PyBuffer<u8>, timeout: Option<f64>) -> PyResult<Sent> {
        let ep = self.get()?;
        let wait = self::timeout(timeout)?;
        let sent = {
            // SAFETY: a C-contiguous buffer of `len_bytes` bytes, held (and
            // the GIL with it) for the length of this borrow: no Python
            // code runs that could change or free it.
            let bytes = contiguous(&data)?;
            let msg = unsafe { std::slice::from_raw_parts(bytes.0, bytes.1) };
            match (ep.send(peer, msg), wait) {
                (Err(Error::Send(SendError::WouldBlock)), Some(w)) => {
                    // Waiting for room without the GIL: the bytes are
                    // copied first, as the buffer may change meanwhile.
                    let owned = Bytes::copy_from_slice(msg);
                    py.allow_threads(|| ep.send_bytes_blocking(peer, owned, Some(w)))
                }
                (other, _) => other,
            }
        }
        .map_err(err)?;
        Ok(Sent { id: sent.id(), handle: sent })
    }

    /// The next delivered message, waiting up to `timeout` seconds
    /// (None: as long as it takes) without the GIL.
    #[pyo3(signature = (timeout=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Message> {
        let ep = self.get()?;
        let t = self::timeout(timeout)?;
        // Already waiting: taken without giving up the GIL.
        let d = match ep.try_recv() {
            Some(d) => d,
            None => py.allow_threads(|| ep.recv(t)).map_err(err)?,
        };
        Ok(Message { sender: d.from, data: d.message })
    }

    /// The next event, waiting up to `timeout` seconds without the GIL.
    #[pyo3(signature = (timeout=None))]
    fn next_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyEvent> {
        let ep = self.get()?;
        let t = self::timeout(timeout)?;
        let e = py.allow_threads(|| ep.next_event(t)).map_err(err)?;
        Ok(PyEvent::of(&e))
    }

    /// The next event if one is waiting, else None.
    fn poll_event(&self) -> PyResult<Option<PyEvent>> {
        Ok(self.get()?.poll_event().map(|e| PyEvent::of(&e)))
    }

    /// Wait up to `timeout` seconds until everything sent is delivered or failed.
    #[pyo3(signature = (timeout=None))]
    fn flush(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let ep = self.get()?;
        let t = self::timeout(timeout)?;
        py.allow_threads(|| ep.flush(t)).map_err(err)
    }

    /// The protocol's counters, by name.
    fn stats(&self) -> PyResult<std::collections::BTreeMap<&'static str, u64>> {
        Ok(self.get()?.stats().fields().into_iter().collect())
    }

    /// What the fault plan injected, by kind ("drop", "duplicate"...).
    fn fault_counters(&self) -> PyResult<std::collections::BTreeMap<&'static str, u64>> {
        let c = self.get()?.fault_counters();
        Ok(runtime::faults::FaultKind::ALL.iter().map(|&k| (k.name(), c.of(k))).collect())
    }

    /// Switch the fault plan off (False) or back on.
    fn set_faults_enabled(&self, on: bool) -> PyResult<()> {
        self.get()?.set_faults_enabled(on);
        Ok(())
    }

    /// Serve `handler` under `id`: `handler(sender, args) -> bytes` runs in
    /// `serve`, on the thread that serves, with the GIL. An exception it
    /// raises is printed and its reply is empty.
    fn register_handler(&self, id: u32, handler: PyObject) -> PyResult<()> {
        let run = move |r: &runtime::rpc::Request<'_>| -> Vec<u8> {
            Python::with_gil(|py| {
                let args = PyBytes::new(py, r.args);
                match handler.call1(py, (r.from, args)).and_then(|out| reply_bytes(py, out)) {
                    Ok(reply) => reply,
                    Err(e) => {
                        e.print(py);
                        Vec::new()
                    }
                }
            })
        };
        self.get()?.register_handler(id, run).map_err(err)
    }

    /// Run one handler for a request that came in, waiting up to `timeout`
    /// seconds for one (without the GIL), and send its reply.
    #[pyo3(signature = (timeout=None))]
    fn serve(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let ep = self.get()?;
        let t = self::timeout(timeout)?;
        py.allow_threads(|| ep.serve(t)).map_err(err)
    }

    /// Call `handler` on `peer` with `args` (any buffer) and wait up to
    /// `timeout` seconds, without the GIL, for its `CallOutcome`.
    #[pyo3(signature = (peer, handler, args, timeout=None))]
    fn request(
        &self,
        py: Python<'_>,
        peer: u32,
        handler: u32,
        args: PyBuffer<u8>,
        timeout: Option<f64>,
    ) -> PyResult<CallOutcome> {
        let ep = self.get()?;
        let t = self::timeout(timeout)?;
        let call = {
            let bytes = contiguous(&args)?;
            // SAFETY: as in `send`: held with the GIL for this borrow.
            let a = unsafe { std::slice::from_raw_parts(bytes.0, bytes.1) };
            ep.request(peer, handler, a).map_err(err)?
        };
        let o = py.allow_threads(|| call.wait(t)).map_err(err)?;
        Ok(CallOutcome {
            reply: o.reply.clone(),
            acked: o.state.ack == AckStatus::Acked,
            processed: o.state.op == OperationStatus::Processed,
            executed: match o.executed() {
                Executed::Yes => Some(true),
                Executed::No => Some(false),
                _ => None,
            },
        })
    }

    /// Settle what was sent, up to `linger` seconds, and stop.
    #[pyo3(signature = (linger=1.0))]
    fn close(&self, py: Python<'_>, linger: f64) -> PyResult<()> {
        let linger = self::timeout(Some(linger))?.unwrap_or_default();
        let Some(arc) = self.ep.write().unwrap_or_else(|e| e.into_inner()).take() else { return Ok(()) };
        // Another thread's call may still hold it a moment.
        let mut arc = arc;
        let ep = loop {
            match Arc::try_unwrap(arc) {
                Ok(ep) => break ep,
                Err(back) => {
                    arc = back;
                    py.allow_threads(|| std::thread::sleep(Duration::from_millis(1)));
                }
            }
        };
        py.allow_threads(|| ep.close(linger)).map_err(err)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py, 1.0)
    }
}

/// A contiguous buffer's start and length.
fn contiguous(b: &PyBuffer<u8>) -> PyResult<(*const u8, usize)> {
    if !b.is_c_contiguous() {
        return Err(PyValueError::new_err("the buffer must be contiguous"));
    }
    Ok((b.buf_ptr() as *const u8, b.len_bytes()))
}

/// A handler's return value as bytes (None: empty).
fn reply_bytes(py: Python<'_>, out: PyObject) -> PyResult<Vec<u8>> {
    if out.is_none(py) {
        return Ok(Vec::new());
    }
    let buf: PyBuffer<u8> = out.extract(py)?;
    buf.to_vec(py)
}

/// A sent message: its id, where it stands, and a wait for its fate.
#[pyclass(frozen, module = "tether")]
struct Sent {
    id: Option<MessageId>,
    handle: runtime::SendHandle,
}

#[pymethods]
impl Sent {
    /// The message's sequence number in its stream to the peer.
    #[getter]
    fn seq(&self) -> Option<u64> {
        self.id.map(|i| i.seq)
    }

    /// "pending", "delivered", or "failed: ..." now.
    fn state(&self) -> &'static str {
        state_name(self.handle.state())
    }

    /// Wait up to `timeout` seconds (without the GIL) until it is
    /// delivered or failed; its state.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<&'static str> {
        let t = self::timeout(timeout)?;
        py.allow_threads(|| self.handle.wait(t)).map(state_name).map_err(err)
    }
}

/// A delivered message: `sender`, and its bytes through the buffer
/// protocol without a copy (`memoryview(msg)`, `msg.data`; `bytes(msg)`
/// copies).
#[pyclass(frozen, module = "tether")]
struct Message {
    #[pyo3(get)]
    sender: u32,
    data: Bytes,
}

#[pymethods]
impl Message {
    /// The bytes, as a read-only memoryview over the message (no copy).
    #[getter]
    fn data<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let view = pyo3::types::PyMemoryView::from(slf.as_any())?;
        Ok(view.into_any())
    }

    fn __len__(&self) -> usize {
        self.data.len()
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }

    fn __repr__(&self) -> String {
        format!("Message(sender={}, {} bytes)", self.sender, self.data.len())
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if flags & pyo3::ffi::PyBUF_WRITABLE != 0 {
            return Err(pyo3::exceptions::PyBufferError::new_err("a message is read-only"));
        }
        let data = &slf.get().data;
        // SAFETY: `view` is the interpreter's; the bytes live as long as
        // the message, which the view holds a reference to (its `obj`).
        let r = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_ptr() as *mut std::ffi::c_void,
                data.len() as pyo3::ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if r == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

/// An event: `kind` ("peer_unreachable", "peer_restarted",
/// "peer_reachable", "peer_accepted", "refused", "engine_recovered",
/// "other"), the `peer` it concerns, and for failures the messages
/// `first` to `end` (exclusive) that failed, those below `in_doubt_end`
/// perhaps delivered.
#[pyclass(frozen, module = "tether", name = "Event")]
struct PyEvent {
    #[pyo3(get)]
    kind: &'static str,
    #[pyo3(get)]
    peer: u32,
    #[pyo3(get)]
    first: u64,
    #[pyo3(get)]
    end: u64,
    #[pyo3(get)]
    in_doubt_end: u64,
    /// The event in full, as the Rust API prints it.
    #[pyo3(get)]
    detail: String,
}

impl PyEvent {
    fn of(e: &Event) -> Self {
        let mut ev = PyEvent { kind: "other", peer: 0, first: 0, end: 0, in_doubt_end: 0, detail: format!("{e:?}") };
        let mut failed = |kind, f: &runtime::FailedMessages| {
            (ev.kind, ev.peer, ev.first, ev.end, ev.in_doubt_end) = (kind, f.peer, f.first, f.end, f.in_doubt_end);
        };
        match e {
            Event::PeerUnreachable { failed: f } => failed("peer_unreachable", f),
            Event::PeerRestarted { failed: f, .. } => failed("peer_restarted", f),
            Event::PeerReachable { peer } => (ev.kind, ev.peer) = ("peer_reachable", *peer),
            Event::PeerAccepted { peer, .. } => (ev.kind, ev.peer) = ("peer_accepted", *peer),
            Event::Refused { .. } => ev.kind = "refused",
            Event::EngineRecovered { .. } => ev.kind = "engine_recovered",
            _ => {}
        }
        ev
    }
}

#[pymethods]
impl PyEvent {
    fn __repr__(&self) -> String {
        format!("Event(kind={:?}, peer={}, first={}, end={})", self.kind, self.peer, self.first, self.end)
    }
}

/// What a call came to: the `reply` (bytes, or None), whether the server
/// `acked` it, whether it was `processed` (the handler ran and replied),
/// and `executed`: True, False, or None when unknown (the server died
/// while running it).
#[pyclass(frozen, module = "tether")]
struct CallOutcome {
    reply: Option<Bytes>,
    #[pyo3(get)]
    acked: bool,
    #[pyo3(get)]
    processed: bool,
    #[pyo3(get)]
    executed: Option<bool>,
}

#[pymethods]
impl CallOutcome {
    #[getter]
    fn reply<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.reply.as_ref().map(|r| PyBytes::new(py, r))
    }
}

/// The same 1 KiB stream as `bench.py` runs through the package, through
/// the Rust API in this process: messages a second (the yardstick).
#[pyfunction]
fn _rust_stream(py: Python<'_>, count: u64, size: usize) -> PyResult<f64> {
    py.allow_threads(|| {
        let any = || "127.0.0.1:0".parse().expect("an address");
        let a = runtime::Endpoint::builder(1).bind(any()).build()?;
        let b = runtime::Endpoint::builder(2).bind(any()).build()?;
        a.add_peer(2, b.local_addr().expect("bound"))?;
        b.add_peer(1, a.local_addr().expect("bound"))?;
        let msg = vec![7u8; size];
        let start = std::time::Instant::now();
        std::thread::scope(|s| -> Result<(), Error> {
            let rx = s.spawn(|| -> Result<(), Error> {
                for _ in 0..count {
                    b.recv(Some(Duration::from_secs(10)))?;
                }
                Ok(())
            });
            for _ in 0..count {
                a.send_blocking(2, &msg, Some(Duration::from_secs(10)))?;
            }
            rx.join().expect("the receiving thread")
        })?;
        Ok(count as f64 / start.elapsed().as_secs_f64())
    })
    .map_err(err)
}

#[pymodule]
fn tether(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Endpoint>()?;
    m.add_class::<Sent>()?;
    m.add_class::<Message>()?;
    m.add_class::<PyEvent>()?;
    m.add_class::<CallOutcome>()?;
    m.add_function(wrap_pyfunction!(_rust_stream, m)?)?;
    let py = m.py();
    m.add("Error", py.get_type::<TetherError>())?;
    for (name, ty) in [
        ("TimedOut", py.get_type::<TimedOut>()),
        ("WouldBlock", py.get_type::<WouldBlock>()),
        ("UnknownPeer", py.get_type::<UnknownPeer>()),
        ("MessageTooLarge", py.get_type::<MessageTooLarge>()),
        ("Closed", py.get_type::<Closed>()),
        ("ConfigError", py.get_type::<ConfigError>()),
        ("TransportError", py.get_type::<TransportError>()),
        ("EngineError", py.get_type::<EngineError>()),
        ("CallError", py.get_type::<CallError>()),
        ("Lingered", py.get_type::<Lingered>()),
    ] {
        m.add(name, ty)?;
    }
    Ok(())
}
