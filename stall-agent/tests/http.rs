//! The daemon's HTTP server under abuse, in this process and without root:
//! the real server (`daemon::http::serve`) on a free loopback port, a web
//! config loaded from a file with a test CA's certificate (made here with
//! openssl), and real clients over TCP and TLS from threads. Each test
//! measures what a client sees: how long a scrape and a probe take while
//! others guess passwords or hold thousands of sockets, how long a refusal
//! takes, when a silent connection is closed.
//!
//! The tests take turns (one lock): they measure times and hold most of
//! the process's file descriptors. Run them with `--release`, as CI does:
//! bcrypt at cost 10 is what the daemon meets in practice.
use std::{
    io::{self, BufRead, BufReader, Read, Seek, Write},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream},
    os::fd::AsRawFd,
    path::PathBuf,
    process::{Child, ChildStdout, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc, Mutex, MutexGuard,
    },
    thread,
    time::{Duration, Instant},
};

use base64::Engine;
use stall_agent::daemon::{
    http::{self, CaptureRefused, CaptureRequest, ConnectionLimits, HttpOptions, Shared},
    web_config::WebConfig,
};
use tokio_rustls::rustls::{
    self,
    pki_types::{pem::PemObject, CertificateDer, ServerName},
    ClientConfig, ClientConnection, RootCertStore, StreamOwned,
};

/// bcrypt's cost in the test's password file: the documented one where
/// times are measured (release), less where every hash is slow (debug).
const COST: u32 = if cfg!(debug_assertions) { 6 } else { 10 };
const USER: &str = "prometheus";
const PASSWORD: &str = "s3cret";
/// How long a test client waits for an answer before it gives up.
const PATIENCE: Duration = Duration::from_secs(5);

fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// A directory of the test's own, removed after it.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("stall-http-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A test CA (`ca.crt`) and a certificate for 127.0.0.1 signed by it
/// (`server.crt`, `server.key`), in `dir`.
fn make_certificates(dir: &Scratch) {
    // openssl's own configuration, so that no system one is needed.
    let config = dir.path("openssl.cnf");
    std::fs::write(
        &config,
        "[req]\ndistinguished_name = dn\nx509_extensions = ca\n[dn]\n[ca]\nbasicConstraints = critical,CA:TRUE\nkeyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n",
    )
    .unwrap();
    std::fs::write(dir.path("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .env("OPENSSL_CONF", &config)
            .current_dir(&dir.0)
            .output()
            .expect("openssl (the tests make their certificates with it)");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    run(&[
        &["req", "-x509"][..],
        &key,
        &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=stall test CA"],
    ]
    .concat());
    run(&[
        &["req", "-new"][..],
        &key,
        &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=stall test"],
    ]
    .concat());
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
}

/// What a test server is made of.
#[derive(Clone, Copy)]
struct Setup {
    tls: bool,
    password: bool,
    expose_details: bool,
    limits: ConnectionLimits,
    /// A port of its own for `/healthz` (as deployed).
    health: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            tls: true,
            password: true,
            expose_details: false,
            limits: ConnectionLimits::default(),
            health: true,
        }
    }
}

/// The daemon's HTTP server, and what a client needs to reach it.
struct Server {
    dial: Dial,
    /// The health port, plain HTTP.
    health: Option<Dial>,
    captures: mpsc::Receiver<CaptureRequest>,
    _shared: Arc<Shared>,
    _dir: Scratch,
}

/// What a client needs to reach the server.
#[derive(Clone)]
struct Dial {
    addr: SocketAddr,
    tls: Option<Arc<ClientConfig>>,
}

fn start(name: &str, setup: Setup) -> Server {
    let dir = Scratch::new(name);
    let mut yaml = String::new();
    let mut tls = None;
    if setup.tls {
        make_certificates(&dir);
        yaml += "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n";
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(dir.path("ca.crt")).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls = Some(Arc::new(config));
    }
    if setup.password {
        let hash = bcrypt::hash(PASSWORD, COST).unwrap();
        yaml += &format!("basic_auth_users:\n  {USER}: '{hash}'\n");
    }
    let web = (setup.tls || setup.password).then(|| {
        std::fs::write(dir.path("web.yml"), &yaml).unwrap();
        WebConfig::load(&dir.path("web.yml")).unwrap()
    });
    let (shared, captures) = http::serve(
        "127.0.0.1:0".parse().unwrap(),
        HttpOptions {
            web,
            expose_details: setup.expose_details,
            fresh: Duration::from_secs(600),
            node: "node-a".into(),
            limits: setup.limits,
            health: setup.health.then(|| "127.0.0.1:0".parse().unwrap()),
        },
    )
    .unwrap();
    let health = shared.health_addr().map(|addr| Dial { addr, tls: None });
    Server { dial: Dial { addr: shared.local_addr(), tls }, health, captures, _shared: shared, _dir: dir }
}

fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// An HTTP/1.1 client on one keep-alive connection.
struct Client(BufReader<Stream>);

/// A TCP connection to `addr` from `from` (any loopback address: each is
/// a client of its own to the server).
fn tcp(addr: SocketAddr, from: Ipv4Addr) -> io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.bind(&SocketAddrV4::new(from, 0).into())?;
    socket.connect_timeout(&addr.into(), PATIENCE)?;
    let stream = TcpStream::from(socket);
    stream.set_read_timeout(Some(PATIENCE))?;
    stream.set_write_timeout(Some(PATIENCE))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

impl Dial {
    /// A client from 127.0.0.1, over TLS where the server speaks it, with
    /// the handshake done.
    fn client(&self) -> io::Result<Client> {
        self.client_from(Ipv4Addr::LOCALHOST)
    }

    fn client_from(&self, from: Ipv4Addr) -> io::Result<Client> {
        let tcp = tcp(self.addr, from)?;
        let stream = match &self.tls {
            None => Stream::Plain(tcp),
            Some(config) => {
                let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
                let conn = ClientConnection::new(config.clone(), name).map_err(io::Error::other)?;
                let mut tls = StreamOwned::new(conn, tcp);
                while tls.conn.is_handshaking() {
                    tls.conn.complete_io(&mut tls.sock)?;
                }
                Stream::Tls(Box::new(tls))
            }
        };
        Ok(Client(BufReader::new(stream)))
    }
}

impl Client {
    /// `method path` with `authorization`: (status, body).
    fn request(
        &mut self,
        method: &str,
        path: &str,
        authorization: Option<&str>,
    ) -> io::Result<(u16, String)> {
        let auth = authorization.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
        let head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Length: 0\r\n\r\n");
        let stream = self.0.get_mut();
        stream.write_all(head.as_bytes())?;
        stream.flush()?;
        let mut line = String::new();
        if self.0.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or(io::ErrorKind::InvalidData)?;
        let mut length = None;
        loop {
            line.clear();
            if self.0.read_line(&mut line)? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse::<usize>().ok();
                }
            }
        }
        let mut body = vec![0; length.ok_or(io::ErrorKind::InvalidData)?];
        self.0.read_exact(&mut body)?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    fn get(&mut self, path: &str, authorization: Option<&str>) -> io::Result<(u16, String)> {
        self.request("GET", path, authorization)
    }

    /// Waits for the server to close the connection: how long it took, or
    /// `None` when it was still open after `within`.
    fn closed_within(&mut self, within: Duration) -> Option<Duration> {
        let start = Instant::now();
        let set = |s: &Stream, t| match s {
            Stream::Plain(s) => s.set_read_timeout(Some(t)),
            Stream::Tls(s) => s.sock.set_read_timeout(Some(t)),
        };
        set(self.0.get_ref(), within).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match self.0.read(&mut buf) {
                Ok(0) => return Some(start.elapsed()),
                Ok(_) => continue,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    return None
                }
                // A reset is a close too.
                Err(_) => return Some(start.elapsed()),
            }
        }
    }
}

/// The `q` quantile of `times` (ms), nearest rank.
fn quantile(times: &[f64], q: f64) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Times `f` in ms; a failure counts as never answering.
fn timed(f: impl FnOnce() -> io::Result<(u16, String)>, want: u16) -> f64 {
    let start = Instant::now();
    match f() {
        Ok((status, _)) if status == want => ms(start.elapsed()),
        _ => f64::INFINITY,
    }
}

/// 32 clients, each from an address of its own (127.0.`net`.10 on), that
/// guess passwords over TLS as fast as they are answered, until stopped.
struct Guessers {
    stop: Arc<AtomicBool>,
    guesses: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Guessers {
    fn start(dial: &Dial, net: u8) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let guesses = Arc::new(AtomicU64::new(0));
        let threads = (0..32u8)
            .map(|i| {
                let (dial, stop, guesses) = (dial.clone(), stop.clone(), guesses.clone());
                thread::spawn(move || {
                    let from = Ipv4Addr::new(127, 0, net, 10 + i);
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(mut c) = dial.client_from(from) else { continue };
                        while !stop.load(Ordering::Relaxed) {
                            n += 1;
                            if c.get("/metrics", Some(&basic(USER, &format!("guess{n}")))).is_err() {
                                break;
                            }
                            guesses.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        Self { stop, guesses, threads }
    }

    /// Stops them: how many guesses were answered.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        self.guesses.load(Ordering::Relaxed)
    }
}

/// A probe as a kubelet makes it: a connection of its own, one request
/// (ms; a failure counts as never answering).
fn kubelet_probe(health: &Dial) -> f64 {
    timed(|| health.client()?.get("/healthz", None), 200)
}

/// Probes the health port as a kubelet does, every 10 ms from a thread of
/// its own, until `stop`: the times (ms).
fn probing(health: Dial, stop: Arc<AtomicBool>) -> thread::JoinHandle<Vec<f64>> {
    thread::spawn(move || {
        let mut times = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            times.push(kubelet_probe(&health));
            thread::sleep(Duration::from_millis(10));
        }
        times
    })
}

/// 32 clients, each from an address of its own (so that slowing each one
/// down after its failures cannot be all that keeps the server up), guess
/// passwords over TLS as fast as they are answered, for 8 s, while
/// Prometheus scrapes `/metrics` with its password (already checked once,
/// as after its first scrape) and a probe asks `/healthz` on the same
/// connection, every 20 ms, and a kubelet probes the health port every
/// 10 ms, each probe on a connection of its own: hundreds of samples each.
/// The scrape's p99 must stay under 100 ms and the probes' under 50 ms.
#[test]
fn password_guessers_do_not_slow_scrapes_or_probes() {
    let _turn = serial();
    let server = start("guessers", Setup::default());
    let auth = basic(USER, PASSWORD);
    let mut scraper = server.dial.client().unwrap();
    assert_eq!(scraper.get("/metrics", Some(&auth)).unwrap().0, 200);
    let mut probe = server.dial.client().unwrap();

    let guessers = Guessers::start(&server.dial, 2);
    // Let the guesses queue up.
    thread::sleep(Duration::from_millis(300));
    let stop = Arc::new(AtomicBool::new(false));
    let kubelet = probing(server.health.clone().expect("a health port"), stop.clone());
    let (mut scrapes, mut probes) = (Vec::new(), Vec::new());
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        scrapes.push(timed(|| scraper.get("/metrics", Some(&auth)), 200));
        probes.push(timed(|| probe.get("/healthz", None), 200));
        if scrapes.last().is_some_and(|t| t.is_infinite()) {
            scraper = server.dial.client().unwrap();
        }
        if probes.last().is_some_and(|t| t.is_infinite()) {
            probe = server.dial.client().unwrap();
        }
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let kubelet = kubelet.join().unwrap();
    let guesses = guessers.stop();
    let p99 = |t: &[f64]| quantile(t, 0.99);
    eprintln!(
        "32 guessers ({guesses} guesses answered): {} scrapes, p50 {:.1} ms, p99 {:.1} ms; {} probes on the same port, \
         p50 {:.1} ms, p99 {:.1} ms; {} kubelet probes of the health port, p50 {:.1} ms, p99 {:.1} ms",
        scrapes.len(),
        quantile(&scrapes, 0.5),
        p99(&scrapes),
        probes.len(),
        quantile(&probes, 0.5),
        p99(&probes),
        kubelet.len(),
        quantile(&kubelet, 0.5),
        p99(&kubelet),
    );
    assert!(scrapes.len() >= 200, "only {} scrapes in 8 s", scrapes.len());
    assert!(kubelet.len() >= 300, "only {} kubelet probes in 8 s", kubelet.len());
    assert!(p99(&scrapes) < 100.0, "a scrape's p99 is {:.1} ms while passwords are guessed", p99(&scrapes));
    assert!(p99(&probes) < 50.0, "/healthz's p99 is {:.1} ms while passwords are guessed", p99(&probes));
    assert!(
        p99(&kubelet) < 50.0,
        "the health port's p99 is {:.1} ms while passwords are guessed",
        p99(&kubelet)
    );
}

/// A client that guesses wrong waits longer before each next check: 0.1 s
/// after its first failure, doubling; another client is not slowed by it.
#[test]
fn failed_passwords_slow_their_client_down() {
    let _turn = serial();
    let server = start("slowed", Setup::default());
    let guesser = Ipv4Addr::new(127, 0, 5, 1);
    let mut client = server.dial.client_from(guesser).unwrap();
    let times: Vec<f64> = (0..4)
        .map(|i| timed(|| client.get("/metrics", Some(&basic(USER, &format!("guess{i}")))), 401))
        .collect();
    let mut other = server.dial.client_from(Ipv4Addr::new(127, 0, 5, 2)).unwrap();
    let elsewhere = timed(|| other.get("/metrics", Some(&basic(USER, "guess"))), 401);
    eprintln!(
        "4 wrong passwords in a row refused after {times:.0?} ms; another client's after {elsewhere:.0} ms"
    );
    let check = times[0];
    for (i, t) in times.iter().enumerate().skip(1) {
        let wait = 100.0 * f64::from(1 << (i - 1));
        assert!(
            *t >= wait + check * 0.5,
            "wrong password {} refused after {t:.0} ms, not {wait} ms + a check",
            i + 1
        );
    }
    // Its own check, and no wait.
    assert!(elsewhere < check + 50.0, "another client waited {elsewhere:.0} ms");
}

/// Set in a holder's environment: `ADDR FROM COUNT`, what it connects to,
/// from where, and how many times.
const HOLDER_ENV: &str = "STALL_HTTP_TEST_HOLDER";

/// Not a test of its own: the flood test runs this binary again as holders
/// of its silent connections, each a process with a file limit of its own,
/// so that the flood's client sockets count against theirs and the server
/// has the test process's limit to itself. A holder opens its connections
/// one after another and says `HOLDER held N [why it stopped]`; asked
/// `check` on stdin, it says `HOLDER open N out_of_order M`: how many of
/// its connections the server has not closed, and how many it closed while
/// an older one stayed open; at the end of its stdin it exits.
#[test]
#[ignore = "a helper the flood test runs in processes of its own"]
fn holder_of_silent_connections() {
    let Ok(spec) = std::env::var(HOLDER_ENV) else { return };
    let mut words = spec.split(' ');
    let addr: SocketAddr = words.next().unwrap().parse().unwrap();
    let from: Ipv4Addr = words.next().unwrap().parse().unwrap();
    let count: usize = words.next().unwrap().parse().unwrap();
    raise_file_limit();
    let mut held = Vec::with_capacity(count);
    let mut failure = String::new();
    while held.len() < count {
        match tcp(addr, from) {
            Ok(s) => held.push(s),
            Err(e) => {
                failure = e.to_string();
                break;
            }
        }
    }
    println!("HOLDER held {} {failure}", held.len());
    for line in io::stdin().lines() {
        if line.as_deref().ok() != Some("check") {
            continue;
        }
        let closed: Vec<bool> = held.iter().map(closed_by_peer).collect();
        let open = closed.iter().filter(|c| !**c).count();
        let first_open = closed.iter().position(|c| !*c).unwrap_or(closed.len());
        let out_of_order = closed[first_open..].iter().filter(|c| **c).count();
        println!("HOLDER open {open} out_of_order {out_of_order}");
    }
}

/// Whether the server closed (or reset) a connection that never sent a
/// byte: it has nothing else to say on one.
fn closed_by_peer(s: &TcpStream) -> bool {
    let mut fd = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN | libc::POLLRDHUP, revents: 0 };
    unsafe { libc::poll(&mut fd, 1, 0) == 1 }
}

/// A holder process; killed if the test ends before it does.
struct Holder {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Holder {
    fn spawn(addr: SocketAddr, from: Ipv4Addr, count: usize) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "holder_of_silent_connections",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(HOLDER_ENV, format!("{addr} {from} {count}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Holder { child, out }
    }

    /// Its next `HOLDER` line's words after the prefix.
    fn says(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.out.read_line(&mut line).unwrap() > 0, "a holder ended unasked");
            // libtest's "test ... " may precede it on the line.
            if let Some((_, rest)) = line.split_once("HOLDER ") {
                return rest.trim_end().to_string();
            }
        }
    }

    /// (connections held, why it stopped short).
    fn held(&mut self) -> (usize, String) {
        let said = self.says();
        let rest = said.strip_prefix("held ").unwrap();
        let (n, why) = rest.split_once(' ').unwrap_or((rest, ""));
        (n.parse().unwrap(), why.to_string())
    }

    /// (connections still open, closed while an older one stayed open).
    fn check(&mut self) -> (usize, usize) {
        writeln!(self.child.stdin.as_mut().unwrap(), "check").unwrap();
        let said = self.says();
        let n: Vec<usize> = said.split(' ').filter_map(|w| w.parse().ok()).collect();
        (n[0], n[1])
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Raises this process's file limit to its hard limit; the new limit.
fn raise_file_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    limit.rlim_cur = limit.rlim_max;
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    limit.rlim_cur
}

/// A file of /proc, opened once and read again from its start: a server
/// without a cap leaves this process no descriptor to open it with then.
struct ProcFile(std::fs::File);

impl ProcFile {
    fn open(path: &str) -> Self {
        ProcFile(std::fs::File::open(path).unwrap())
    }

    fn text(&mut self) -> String {
        let mut text = String::new();
        self.0.seek(io::SeekFrom::Start(0)).unwrap();
        self.0.read_to_string(&mut text).unwrap();
        text
    }
}

/// The loopback TCP sockets at local `port` in /proc/net/tcp: (listening
/// sockets' accept queues, connections a process holds). An orphan (the
/// server closed it, its FIN not yet answered) has no inode.
fn sockets_at(tcp: &mut ProcFile, port: u16) -> (u64, usize) {
    let local = format!("0100007F:{port:04X}");
    let (mut queued, mut held) = (0, 0);
    for line in tcp.text().lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&local.as_str()) {
            continue;
        }
        if fields.get(3) == Some(&"0A") {
            // tx_queue:rx_queue, where rx is the accept queue.
            queued += fields
                .get(4)
                .and_then(|q| q.split_once(':'))
                .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok())
                .unwrap_or(0);
        } else if fields.get(9).is_some_and(|inode| *inode != "0") {
            held += 1;
        }
    }
    (queued, held)
}

fn resident_bytes(statm: &mut ProcFile) -> u64 {
    let pages: u64 = statm.text().split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// How many connections the flood opens.
const FLOOD: usize = 25_000;

/// 25,000 connections opened to the TLS port and left silent (never a
/// handshake) while 32 clients guess passwords, held while 200 scrapes
/// (each on a connection of its own, as a scrape's kept-alive one may have
/// been closed to make room), 200 probes of the same port and 200 of the
/// health port (each on a connection of its own, as a kubelet's) are
/// timed: the scrape's p99 must stay under 100 ms and the probes' under
/// 50 ms, the server must
/// hold no more than its 512 connections, having closed the oldest ones
/// and kept the youngest, and its memory must come back once the flood is
/// gone.
///
/// The flood's sockets are held by processes of their own (this binary run
/// again, [`holder_of_silent_connections`]), each under its own file
/// limit: the server, in this process, never needs 25,000 descriptors,
/// and one that took every connection it was given would run out of them
/// here rather than hold 25,000.
/// Timed requests of each kind under the flood.
const SAMPLES: usize = 200;

#[test]
fn a_flood_of_silent_connections_leaves_scrapes_and_probes_answering() {
    let _turn = serial();
    let limit = raise_file_limit() as usize;
    // Four holders at least, from four addresses; more where a hard limit
    // leaves each fewer (with room for their own files).
    let per_holder = FLOOD.div_ceil(4).min(limit.saturating_sub(64));
    assert!(per_holder >= 500, "a hard file limit of {limit} leaves a holder too few connections");
    let holders_n = FLOOD.div_ceil(per_holder);
    assert!(holders_n <= 200, "{holders_n} holders");
    let server = start("flood", Setup::default());
    let port = server.dial.addr.port();
    let (mut tcp, mut statm) = (ProcFile::open("/proc/net/tcp"), ProcFile::open("/proc/self/statm"));
    let auth = basic(USER, PASSWORD);
    assert_eq!(server.dial.client().unwrap().get("/metrics", Some(&auth)).unwrap().0, 200);
    let rss_before = resident_bytes(&mut statm);
    let guessers = Guessers::start(&server.dial, 6);
    // Let the guesses queue up.
    thread::sleep(Duration::from_millis(300));

    let opening = Instant::now();
    let mut holders: Vec<Holder> = (0..holders_n)
        .map(|i| {
            let count = per_holder.min(FLOOD - i * per_holder);
            Holder::spawn(server.dial.addr, Ipv4Addr::new(127, 0, 3, 1 + i as u8), count)
        })
        .collect();
    let held: Vec<(usize, String)> = holders.iter_mut().map(Holder::held).collect();
    let opening = opening.elapsed();
    let opened: usize = held.iter().map(|h| h.0).sum();
    let failures: Vec<&str> = held.iter().map(|h| h.1.as_str()).filter(|w| !w.is_empty()).collect();
    // Held means accepted too: wait (2 s at most) for the server to take
    // the kernel's queue of the flood's last connections. A scrape that
    // came in meanwhile would wait behind them (tens of ms at 4096).
    let draining = Instant::now();
    while sockets_at(&mut tcp, port).0 > 0 && draining.elapsed().as_secs() < 2 {
        thread::sleep(Duration::from_millis(5));
    }
    let draining = draining.elapsed();

    let health = server.health.clone().expect("a health port");
    let (mut scrapes, mut probes, mut kubelet) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..SAMPLES {
        scrapes.push(timed(|| server.dial.client()?.get("/metrics", Some(&auth)), 200));
        probes.push(timed(|| server.dial.client()?.get("/healthz", None), 200));
        kubelet.push(kubelet_probe(&health));
        // A server that answers nothing would make this test as long as
        // its clients' patience, 100 times over.
        if scrapes.iter().chain(&probes).chain(&kubelet).filter(|t| t.is_infinite()).count() >= 3 {
            break;
        }
    }
    // What the server holds, and what the holders see of it, at one time.
    let server_held = sockets_at(&mut tcp, port).1;
    let checked: Vec<(usize, usize)> = holders.iter_mut().map(Holder::check).collect();
    let still_open: usize = checked.iter().map(|c| c.0).sum();
    let out_of_order: usize = checked.iter().map(|c| c.1).sum();
    let rss_held = resident_bytes(&mut statm);
    let guesses = guessers.stop();
    drop(holders);
    // The server sees the clients' ends close.
    thread::sleep(Duration::from_millis(500));
    let rss_after = resident_bytes(&mut statm);
    let (scrape_p99, probe_p99) = (quantile(&scrapes, 0.99), quantile(&probes, 0.99));
    let kubelet_p99 = quantile(&kubelet, 0.99);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "{opened} of {FLOOD} silent connections opened by {holders_n} holders in {:.1} s{}, accepted {:.0} ms later, \
         32 guessers ({guesses} guesses answered): the server held {server_held} connections, {still_open} of the flood's open \
         ({out_of_order} closed before an older one); scrape p50 {:.1} ms, p99 {scrape_p99:.1} ms; probe p50 {:.1} ms, \
         p99 {probe_p99:.1} ms; health port p50 {:.1} ms, p99 {kubelet_p99:.1} ms; resident {:.0} MiB before, {:.0} held, \
         {:.0} after",
        opening.as_secs_f64(),
        failures.first().map(|f| format!(" (stopped: {f})")).unwrap_or_default(),
        ms(draining),
        quantile(&scrapes, 0.5),
        quantile(&probes, 0.5),
        quantile(&kubelet, 0.5),
        mib(rss_before),
        mib(rss_held),
        mib(rss_after),
    );
    assert_eq!(opened, FLOOD, "the flood could not be opened: {failures:?}");
    assert!(server_held <= 512, "the server held {server_held} connections");
    assert!(still_open <= 512, "{still_open} of the flood's connections are open");
    // The guessers' connections are in the 512 too, and the timed ones
    // each pushed out one more of the flood's.
    assert!(
        still_open >= 256,
        "only {still_open} of the flood's connections are open: the youngest were closed"
    );
    assert_eq!(out_of_order, 0, "connections were closed while older ones stayed open");
    assert_eq!(scrapes.len(), SAMPLES, "scrapes failed while the flood was held: {scrapes:?}");
    assert!(scrape_p99 < 100.0, "a scrape's p99 is {scrape_p99:.1} ms while {opened} connections are held");
    assert!(probe_p99 < 50.0, "/healthz's p99 is {probe_p99:.1} ms while {opened} connections are held");
    assert!(
        kubelet_p99 < 50.0,
        "the health port's p99 is {kubelet_p99:.1} ms while {opened} connections are held"
    );
    assert!(
        rss_after.saturating_sub(rss_before) < 32 << 20,
        "resident memory grew {:.0} MiB and stayed",
        mib(rss_after.saturating_sub(rss_before))
    );
}

/// An unknown user and a known one with a wrong password, 20 of each,
/// alternately and each from an address of its own (no failure of its
/// own behind it), over TLS: the medians of the times to the 401 must be
/// within 10 % of each other, so the time does not tell which users exist.
#[test]
fn unknown_users_are_refused_as_slowly_as_wrong_passwords() {
    let _turn = serial();
    let server = start("users", Setup::default());
    let (mut unknown, mut wrong) = (Vec::new(), Vec::new());
    for i in 0..40u8 {
        let mut client = server.dial.client_from(Ipv4Addr::new(127, 0, 4, 10 + i)).unwrap();
        let (user, times) = if i % 2 == 0 { ("nobody", &mut unknown) } else { (USER, &mut wrong) };
        times.push(timed(|| client.get("/metrics", Some(&basic(user, "wrong"))), 401));
    }
    let (unknown_median, wrong_median) = (quantile(&unknown, 0.5), quantile(&wrong, 0.5));
    let gap = (unknown_median - wrong_median).abs() / unknown_median.max(wrong_median);
    eprintln!(
        "refused in a median of {unknown_median:.2} ms (unknown user), {wrong_median:.2} ms (wrong password): {:.1} % apart",
        gap * 100.0
    );
    assert!(gap <= 0.10, "unknown user {unknown_median:.2} ms, wrong password {wrong_median:.2} ms");
}

/// With a 0.5 s header timeout and a 1.5 s idle timeout: a connection
/// that sends nothing, one that sends a request's head a byte at a time,
/// and one that finished its TLS handshake and says nothing are closed
/// after about 0.5 s; plain and TLS connections idle after a request are
/// closed after about 1.5 s, not before.
#[test]
fn silent_slow_and_idle_connections_are_closed_in_time() {
    let _turn = serial();
    let limits = ConnectionLimits {
        header_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_millis(1500),
        ..ConnectionLimits::default()
    };
    let plain_server =
        start("timeouts-plain", Setup { tls: false, password: false, limits, ..Setup::default() });
    let tls_server = start("timeouts-tls", Setup { limits, ..Setup::default() });
    let (plain, tls) = (&plain_server.dial, &tls_server.dial);
    let within = Duration::from_secs(4);
    let header = (0.35, 1.2);
    let idle = (1.3, 2.5);
    type Case = (&'static str, (f64, f64), Box<dyn FnOnce() -> Option<Duration> + Send>);
    let cases: Vec<Case> = vec![
        ("plain, silent", header, {
            let s = plain.clone();
            Box::new(move || s.client().unwrap().closed_within(within))
        }),
        ("plain, a byte every 100 ms", header, {
            let s = plain.clone();
            Box::new(move || {
                let mut stream = tcp(s.addr, Ipv4Addr::LOCALHOST).unwrap();
                let start = Instant::now();
                stream.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
                for b in b"X-Slow: abcdefghijklmnopqrstuvwxyz0123456789".iter().cycle() {
                    thread::sleep(Duration::from_millis(100));
                    if stream.write_all(&[*b]).is_err() || start.elapsed() > within {
                        break;
                    }
                }
                let mut buf = [0u8; 64];
                stream.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) if start.elapsed() <= within => Some(start.elapsed()),
                    _ => None,
                }
            })
        }),
        ("TLS, silent after the handshake", header, {
            let s = tls.clone();
            Box::new(move || s.client().unwrap().closed_within(within))
        }),
        ("plain, idle after a request", idle, {
            let s = plain.clone();
            Box::new(move || {
                let mut c = s.client().unwrap();
                assert_eq!(c.get("/healthz", None).unwrap().0, 200);
                c.closed_within(within)
            })
        }),
        ("TLS, idle after a request", idle, {
            let s = tls.clone();
            Box::new(move || {
                let mut c = s.client().unwrap();
                assert_eq!(c.get("/healthz", None).unwrap().0, 200);
                c.closed_within(within)
            })
        }),
    ];
    let results: Vec<_> = cases
        .into_iter()
        .map(|(name, bounds, case)| (name, bounds, thread::spawn(case)))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|(name, bounds, t)| (name, bounds, t.join().unwrap()))
        .collect();
    for (name, _, closed) in &results {
        eprintln!(
            "{name}: {}",
            closed
                .map_or("still open after 4 s".into(), |d| format!("closed after {:.2} s", d.as_secs_f64()))
        );
    }
    for (name, (low, high), closed) in results {
        let s = closed.map(|d| d.as_secs_f64());
        assert!(
            s.is_some_and(|s| (low..=high).contains(&s)),
            "{name}: closed after {s:?} s, not in {low}–{high} s"
        );
    }
}

/// With room for 4 connections: a fifth one closes the one idle the
/// longest and is served; when all 4 are mid-request (captures the main
/// loop has not answered), a fifth is closed at once, unanswered.
#[test]
fn past_the_cap_the_idlest_connection_makes_room() {
    let _turn = serial();
    let limits = ConnectionLimits { max_connections: 4, ..ConnectionLimits::default() };
    let server =
        start("cap", Setup { tls: false, password: false, expose_details: true, limits, health: false });
    let mut idle: Vec<Client> = (0..4)
        .map(|_| {
            let mut c = server.dial.client().unwrap();
            assert_eq!(c.get("/healthz", None).unwrap().0, 200);
            thread::sleep(Duration::from_millis(20));
            c
        })
        .collect();
    let mut fifth = server.dial.client().unwrap();
    assert_eq!(fifth.get("/healthz", None).unwrap().0, 200);
    assert!(idle[0].closed_within(Duration::from_secs(1)).is_some(), "the idlest connection is still open");
    for c in &mut idle[1..] {
        assert_eq!(c.get("/healthz", None).unwrap().0, 200, "a younger connection was closed");
    }
    drop((idle, fifth));
    thread::sleep(Duration::from_millis(100));

    let busy: Vec<_> = (0..4)
        .map(|_| {
            let mut c = server.dial.client().unwrap();
            thread::spawn(move || c.request("POST", "/jobs/abc/capture?seconds=1", None))
        })
        .collect();
    let asked: Vec<CaptureRequest> =
        (0..4).map(|_| server.captures.recv_timeout(Duration::from_secs(2)).unwrap()).collect();
    let mut refused = server.dial.client().unwrap();
    let answer = refused.get("/healthz", None);
    assert!(answer.is_err(), "a connection past the cap was served while all were busy: {answer:?}");
    for a in asked {
        let _ = a.reply.send(Err(CaptureRefused::Busy));
    }
    for b in busy {
        assert_eq!(b.join().unwrap().unwrap().0, 409);
    }
    assert_eq!(server.dial.client().unwrap().get("/healthz", None).unwrap().0, 200);
}

/// A capture whose job ends before the window is over answers 410 Gone
/// with a one-line reason (it was a 500, as if the daemon had failed).
#[test]
fn a_capture_whose_job_ended_is_gone() {
    let _turn = serial();
    let server =
        start("gone", Setup { tls: false, password: false, expose_details: true, ..Setup::default() });
    let mut client = server.dial.client().unwrap();
    let answer = thread::spawn(move || client.request("POST", "/jobs/abc/capture?seconds=1", None));
    let asked = server.captures.recv_timeout(Duration::from_secs(2)).unwrap();
    assert_eq!(asked.id, "abc");
    asked.reply.send(Err(CaptureRefused::JobEnded)).unwrap();
    let (status, body) = answer.join().unwrap().unwrap();
    assert_eq!(status, 410, "{body}");
    assert_eq!(body.lines().count(), 1, "{body:?}");
    assert!(body.contains("ended during the capture"), "{body}");
}

/// Plain HTTP to the TLS port is answered with a fatal TLS alert (record
/// type 21, level 2), then the connection is closed: not silence, and not
/// HTTP (curl says "Received HTTP/0.9 when not allowed").
#[test]
fn plain_http_to_the_tls_port_gets_a_tls_alert() {
    let _turn = serial();
    let server = start("alert", Setup::default());
    let mut stream = tcp(server.dial.addr, Ipv4Addr::LOCALHOST).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    assert!(answer.len() == 7 && answer[0] == 21 && answer[5] == 2, "{answer:?}");
}
