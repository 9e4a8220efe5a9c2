//! What a job's processes name — file paths, command lines, other
//! programs' and threads' names, peers' addresses, environment values — is
//! a detail: the operator's own terminal (`stall run`, `stall attach`)
//! shows it, the daemon's endpoints and log show it only with
//! `--expose-details` (docs/DAEMON.md lists each). Redaction is by
//! construction, not field by field:
//! - a name is held as a [`Detail`], which never prints bare: formatted
//!   into words (`format!`, `Display`) or serialized, it is a marked span
//!   (its kind and value between two private-use characters), so every
//!   sentence built from it carries the mark;
//! - words a person reads ([`Text`]: a verdict's summary and evidence, what
//!   a wait is on) keep their marks until an output resolves them;
//! - every output resolves every string once, at the end: [`reveal`] (the
//!   value, without marks) for the operator's terminal and files,
//!   [`redact`] (`[path]`, `[command]`, …) for whoever reached the daemon
//!   without details. A marked span nothing resolved stays redacted.
use std::fmt;

use serde::{Serialize, Serializer};
use serde_json::Value;

/// Opens a marked span; the next character is its kind.
const OPEN: char = '\u{E000}';
/// Closes a marked span.
const CLOSE: char = '\u{E001}';

/// Kinds of detail, as the mark's kind character.
pub mod kind {
    /// A file's path.
    pub const PATH: char = 'p';
    /// A command line.
    pub const COMMAND: char = 'c';
    /// A process's or thread's name (`comm`: a process title can carry
    /// arguments, a thread's name says what the code does).
    pub const NAME: char = 'n';
    /// A peer's address.
    pub const PEER: char = 'a';
    /// A value from a process's environment (a run's id, a rendezvous).
    pub const VALUE: char = 'v';
}

/// What a redacted span of kind `k` reads as.
fn placeholder(k: char) -> &'static str {
    match k {
        kind::PATH => "[path]",
        kind::COMMAND => "[command]",
        kind::NAME => "[name]",
        kind::PEER => "[peer]",
        _ => "[detail]",
    }
}

/// A name of kind `K` (see [`kind`]) that a job's process gave.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Detail<const K: char>(String);

pub type PathName = Detail<{ kind::PATH }>;
pub type Command = Detail<{ kind::COMMAND }>;
pub type Name = Detail<{ kind::NAME }>;
pub type Peer = Detail<{ kind::PEER }>;
pub type EnvValue = Detail<{ kind::VALUE }>;

impl<const K: char> Detail<K> {
    pub fn new(value: impl Into<String>) -> Self {
        let mut value: String = value.into();
        // A mark inside a value would end or forge a span.
        value.retain(|c| c != OPEN && c != CLOSE);
        Self(value)
    }

    /// The value itself, for the logic that reads it (never for output).
    pub fn value(&self) -> &str {
        &self.0
    }
}

impl<const K: char> From<&str> for Detail<K> {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl<const K: char> From<String> for Detail<K> {
    fn from(s: String) -> Self {
        Self::new(s)
    }
}

/// Marked: whatever is built from it carries the mark.
impl<const K: char> fmt::Display for Detail<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{OPEN}{K}{}{CLOSE}", self.0)
    }
}

impl<const K: char> fmt::Debug for Detail<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl<const K: char> Serialize for Detail<K> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Words a person reads, their details marked until an output resolves
/// them. Compared and searched as the operator's terminal shows them.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Text(String);

impl Text {
    pub fn new(marked: impl Into<String>) -> Self {
        Self(marked.into())
    }

    /// As the operator's terminal shows it.
    pub fn shown(&self) -> String {
        reveal(&self.0)
    }

    /// With its marks, to build more words from.
    pub fn marked(&self) -> &str {
        &self.0
    }

    pub fn contains(&self, pat: &str) -> bool {
        self.shown().contains(pat)
    }

    pub fn starts_with(&self, pat: &str) -> bool {
        self.shown().starts_with(pat)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn push_str(&mut self, s: &str) {
        self.0.push_str(s);
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

/// Marked: words built from words keep their marks.
impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.shown(), f)
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.shown() == *other
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.shown() == other
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// `s` with each marked span replaced by what `span(kind, value)` gives.
fn resolve(s: &str, span: impl Fn(char, &str) -> String) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(OPEN) {
        out.push_str(&rest[..at]);
        let after = &rest[at + OPEN.len_utf8()..];
        let mut chars = after.chars();
        let k = chars.next().unwrap_or('?');
        let body = chars.as_str();
        let (value, next) = match body.find(CLOSE) {
            Some(end) => (&body[..end], &body[end + CLOSE.len_utf8()..]),
            // Cut short (a line cut at a width): the rest is the value.
            None => (body, ""),
        };
        out.push_str(&span(k, value));
        rest = next;
    }
    out.push_str(rest);
    out.retain(|c| c != CLOSE);
    out
}

/// As the operator sees it: every detail's value, no marks.
pub fn reveal(s: &str) -> String {
    resolve(s, |_, v| v.to_string())
}

/// As the daemon shows it without details: every detail a placeholder.
pub fn redact(s: &str) -> String {
    resolve(s, |k, _| placeholder(k).to_string())
}

/// Whether `s` holds a marked span.
pub fn is_marked(s: &str) -> bool {
    s.contains(OPEN)
}

/// Every string of a document (its keys too) resolved by `how`.
pub fn resolve_json(v: &mut Value, how: fn(&str) -> String) {
    match v {
        Value::String(s) if is_marked(s) => *s = how(s),
        Value::Array(a) => a.iter_mut().for_each(|x| resolve_json(x, how)),
        Value::Object(m) => {
            if m.keys().any(|k| is_marked(k)) {
                let entries: Vec<(String, Value)> = std::mem::take(m).into_iter().collect();
                m.extend(entries.into_iter().map(|(k, v)| (how(&k), v)));
            }
            m.values_mut().for_each(|x| resolve_json(x, how));
        }
        _ => {}
    }
}

/// The JSON of `value` as the operator sees it (details shown, no marks).
pub fn revealed_json(value: &impl Serialize) -> serde_json::Result<Value> {
    let mut v = serde_json::to_value(value)?;
    resolve_json(&mut v, reveal);
    Ok(v)
}

/// A writer that passes what it is given on with every mark taken out
/// (details shown): the operator's JSON Lines, streamed as serialized (a
/// summary of thousands of processes is never held whole).
pub struct Revealing<W> {
    inner: W,
    /// Bytes of a mark seen so far (a mark can straddle two writes).
    pending: Vec<u8>,
}

impl<W: std::io::Write> Revealing<W> {
    pub fn new(inner: W) -> Self {
        Self { inner, pending: Vec::new() }
    }

    /// Ends the stream: a mark cut short at its end is passed on as it is
    /// (there is none in what serde writes).
    pub fn finish(mut self) -> std::io::Result<()> {
        let pending = std::mem::take(&mut self.pending);
        self.inner.write_all(&pending)
    }
}

/// The marks' UTF-8: OPEN is EE 80 80 (then the kind's ASCII character),
/// CLOSE is EE 80 81.
const MARK_LEAD: [u8; 2] = [0xEE, 0x80];

impl<W: std::io::Write> std::io::Write for Revealing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut out = Vec::with_capacity(buf.len());
        let mut bytes = std::mem::take(&mut self.pending);
        bytes.extend_from_slice(buf);
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] != MARK_LEAD[0] {
                out.push(bytes[i]);
                i += 1;
                continue;
            }
            // A mark needs up to 4 bytes: wait for them.
            let rest = &bytes[i..];
            if rest.len() < 3 || (rest[..3] == [0xEE, 0x80, 0x80] && rest.len() < 4) {
                if rest.len() >= 2 && rest[1] != MARK_LEAD[1] {
                    out.push(bytes[i]);
                    i += 1;
                    continue;
                }
                self.pending = rest.to_vec();
                break;
            }
            match rest[..3] {
                [0xEE, 0x80, 0x80] => i += 4,
                [0xEE, 0x80, 0x81] => i += 3,
                _ => {
                    out.push(bytes[i]);
                    i += 1;
                }
            }
        }
        self.inner.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let pending = std::mem::take(&mut self.pending);
        self.inner.write_all(&pending)?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_built_from_details_carry_them_to_the_end() {
        let path = PathName::from("/data/secret_shard.pt");
        let who = Name::from("decoder --key=hunter2");
        let line = Text::new(format!("read {path} at 5 MB/s, woken by pid 7 ({who})"));
        // Built again into more words: still marked.
        let more = format!("{line}; again");
        assert_eq!(
            reveal(&more),
            "read /data/secret_shard.pt at 5 MB/s, woken by pid 7 (decoder --key=hunter2); again"
        );
        assert_eq!(redact(&more), "read [path] at 5 MB/s, woken by pid 7 ([name]); again");
        assert!(
            line.contains("secret_shard")
                && line == "read /data/secret_shard.pt at 5 MB/s, woken by pid 7 (decoder --key=hunter2)"
        );
        assert!(!redact(&more).contains("secret") && !redact(&more).contains("hunter2"));
    }

    #[test]
    fn a_field_naming_a_jobs_object_is_never_serialized_bare() {
        // A new field of any output struct that holds a name as a detail:
        // serialized, only an output that opts in shows its value.
        #[derive(Serialize)]
        struct NewOutput {
            bytes: u64,
            path: PathName,
            peer: Option<Peer>,
            run: EnvValue,
            says: Text,
        }
        let out = NewOutput {
            bytes: 5,
            path: "/data/MARK-a".into(),
            peer: Some("10.9.8.7:443".into()),
            run: "run-MARK-b".into(),
            says: Text::new(format!("the socket to {}", Peer::from("10.9.8.7:443"))),
        };
        let mut daemon = serde_json::to_value(&out).unwrap();
        resolve_json(&mut daemon, redact);
        let text = daemon.to_string();
        assert!(!text.contains("MARK") && !text.contains("10.9.8.7"), "{text}");
        assert_eq!(daemon["path"], "[path]");
        assert_eq!(daemon["says"], "the socket to [peer]");
        assert_eq!(daemon["bytes"], 5);
        let shown = revealed_json(&out).unwrap();
        assert_eq!(
            (shown["path"].as_str(), shown["run"].as_str()),
            (Some("/data/MARK-a"), Some("run-MARK-b"))
        );
        assert!(!shown.to_string().contains(OPEN));
    }

    #[test]
    fn marks_in_values_cannot_forge_or_end_a_span() {
        let sly = PathName::from(format!("/a{CLOSE} shown {OPEN}p/b"));
        let line = format!("x {sly} y");
        assert_eq!(redact(&line), "x [path] y");
        assert_eq!(reveal(&line), "x /a shown p/b y");
        // A span cut short (a line cut at a width) is still redacted.
        let cut: String = format!("read {}", PathName::from("/data/shard")).chars().take(9).collect();
        assert_eq!(redact(&cut), "read [path]");
    }

    #[test]
    fn a_revealing_writer_takes_marks_out_wherever_writes_cut_them() {
        use std::io::Write;
        let line = format!(
            "{{\"path\":\"{}\",\"says\":\"é {} ü\"}}\n",
            PathName::from("/d/ä"),
            Peer::from("1.2.3.4:5")
        );
        let bytes = line.as_bytes();
        for cut in 0..bytes.len() {
            let mut w = Revealing::new(Vec::new());
            w.write_all(&bytes[..cut]).unwrap();
            w.write_all(&bytes[cut..]).unwrap();
            w.flush().unwrap();
            assert_eq!(String::from_utf8(w.inner).unwrap(), reveal(&line), "cut at {cut}");
        }
    }

    #[test]
    fn keys_are_resolved_too() {
        let mut v = serde_json::json!({ PathName::from("/data/x").to_string(): 3 });
        resolve_json(&mut v, redact);
        assert_eq!(v, serde_json::json!({"[path]": 3}));
    }
}
