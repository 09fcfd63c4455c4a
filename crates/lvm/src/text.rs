//! The "LVM2 001" text format (ondisk-formats.md §4.3) as a generic ordered tree.
//!
//! ```text
//!   text ──parse──> Section { entries: [Entry { key, node: Value | Section, blank }] }
//!                      │  (keys cairn does not know stay in place, in order)
//!   vg.rs model <──────┘──> Section ──print──> text lvm reads back
//! ```
//!
//! Grammar: `key = value`, `name { ... }`, values are integers, `"strings"` (with `\"`
//! and `\\` escapes), or arrays `[v, v, ...]` of those; `#` starts a comment to the end of
//! the line. The parser records blank lines before entries and multi-line arrays so the
//! printer reproduces lvm's layout. Nesting is bounded ([`MAX_DEPTH`]) and nothing is
//! allocated from a length field.

use std::fmt::Write as _;

use cairn_block::{Error, ErrorKind, Result};

/// Deepest section nesting accepted (lvm's metadata uses 4).
pub const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Int(i64),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    /// A list of strings (`status = ["READ", "WRITE"]`).
    pub fn strings(list: &[&str]) -> Value {
        Value::Array(list.iter().map(|s| Value::Str((*s).to_string())).collect())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Value(Value),
    Section(Section),
}

#[derive(Debug, Clone, Eq)]
pub struct Entry {
    pub key: String,
    pub node: Node,
    /// A blank line precedes this entry.
    pub blank: bool,
    /// An array printed one pair per line (lvm's `stripes = [ ... ]`).
    pub multiline: bool,
    /// The line it was parsed from (0 when built in memory).
    pub line: usize,
}

/// Equal when the text they print is equal: the source line does not count.
impl PartialEq for Entry {
    fn eq(&self, o: &Entry) -> bool {
        self.key == o.key
            && self.node == o.node
            && self.blank == o.blank
            && self.multiline == o.multiline
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Section {
    pub entries: Vec<Entry>,
    /// A blank line precedes the closing brace.
    pub trailing_blank: bool,
}

impl Section {
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.entries.iter().find(|e| e.key == key).map(|e| &e.node)
    }
    pub fn entry(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == key)
    }
    pub fn value(&self, key: &str) -> Option<&Value> {
        match self.get(key) {
            Some(Node::Value(v)) => Some(v),
            _ => None,
        }
    }
    pub fn section(&self, key: &str) -> Option<&Section> {
        match self.get(key) {
            Some(Node::Section(s)) => Some(s),
            _ => None,
        }
    }
    /// Sets `key`: replaces the value in place if present (keeping its layout), else
    /// appends it with `blank` before it.
    pub fn set(&mut self, key: &str, node: Node, blank: bool) {
        let multiline = matches!(&node, Node::Value(Value::Array(_)))
            && matches!(key, "stripes" | "raids" | "mirrors" | "raid0_lvs");
        if let Some(e) = self.entries.iter_mut().find(|e| e.key == key) {
            e.node = node;
            return;
        }
        self.entries.push(Entry {
            key: key.to_string(),
            node,
            blank,
            multiline,
            line: 0,
        });
    }
    pub fn set_value(&mut self, key: &str, v: Value, blank: bool) {
        self.set(key, Node::Value(v), blank);
    }
    pub fn remove(&mut self, key: &str) {
        self.entries.retain(|e| e.key != key);
    }
}

/// A parse error at a line: "line 12: expected '=' after 'seqno'".
fn err_at(line: usize, msg: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Corrupt, format!("line {line}: {msg}"))
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    line: usize,
    /// Newlines seen by the last `skip_ws` (2+ means a blank line).
    newlines: usize,
}

fn is_key_byte(c: u8) -> bool {
    !c.is_ascii_whitespace() && !b"={}[]\",#".contains(&c) && c != 0
}

impl<'a> Parser<'a> {
    fn skip_ws(&mut self) {
        self.newlines = 0;
        while let Some(&c) = self.s.get(self.pos) {
            match c {
                b'\n' => {
                    self.line += 1;
                    self.newlines += 1;
                    self.pos += 1;
                }
                b'#' => {
                    while self.s.get(self.pos).is_some_and(|&c| c != b'\n') {
                        self.pos += 1;
                    }
                }
                c if c.is_ascii_whitespace() => self.pos += 1,
                _ => break,
            }
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn describe(&self) -> String {
        match self.peek() {
            None => "the end of the text".into(),
            Some(0) => "a NUL byte".into(),
            Some(c) if c.is_ascii_graphic() => format!("'{}'", char::from(c)),
            Some(c) => format!("byte {c:#04x}"),
        }
    }

    fn key(&mut self) -> Result<String> {
        let start = self.pos;
        while self.peek().is_some_and(is_key_byte) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(err_at(
                self.line,
                format!("expected a name, found {}", self.describe()),
            ));
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.pos]).into_owned())
    }

    /// Entries until `}` (nested) or the end of the text / a NUL (top level).
    fn section(&mut self, depth: usize) -> Result<Section> {
        if depth > MAX_DEPTH {
            return Err(err_at(
                self.line,
                format!("sections nested deeper than {MAX_DEPTH}"),
            ));
        }
        let mut sec = Section::default();
        loop {
            self.skip_ws();
            let blank = self.newlines >= 2;
            match self.peek() {
                None | Some(0) if depth == 0 => return Ok(sec),
                None | Some(0) => {
                    return Err(err_at(self.line, "a section is not closed (missing '}')"))
                }
                Some(b'}') if depth > 0 => {
                    sec.trailing_blank = blank;
                    self.pos += 1;
                    return Ok(sec);
                }
                Some(b'}') => return Err(err_at(self.line, "unexpected '}'")),
                _ => {}
            }
            let line = self.line;
            let key = self.key()?;
            self.skip_ws();
            let (node, multiline) = match self.peek() {
                Some(b'{') => {
                    self.pos += 1;
                    (Node::Section(self.section(depth + 1)?), false)
                }
                Some(b'=') => {
                    self.pos += 1;
                    self.skip_ws();
                    let start_line = self.line;
                    let v = self.value(true)?;
                    (Node::Value(v), self.line != start_line)
                }
                _ => {
                    return Err(err_at(
                        self.line,
                        format!("expected '=' after '{key}', found {}", self.describe()),
                    ))
                }
            };
            sec.entries.push(Entry {
                key,
                node,
                blank,
                multiline,
                line,
            });
        }
    }

    fn value(&mut self, allow_array: bool) -> Result<Value> {
        match self.peek() {
            Some(b'"') => self.string().map(Value::Str),
            Some(b'[') if allow_array => {
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    self.skip_ws();
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                        return Ok(Value::Array(items));
                    }
                    if !items.is_empty() {
                        if self.peek() != Some(b',') {
                            return Err(err_at(
                                self.line,
                                format!(
                                    "expected ',' or ']' in an array, found {}",
                                    self.describe()
                                ),
                            ));
                        }
                        self.pos += 1;
                        self.skip_ws();
                    }
                    items.push(self.value(false)?);
                }
            }
            Some(c) if c == b'-' || c.is_ascii_digit() => self.int(),
            _ => Err(err_at(
                self.line,
                format!("expected a value, found {}", self.describe()),
            )),
        }
    }

    fn int(&mut self) -> Result<Value> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let t = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
        if self.peek() == Some(b'.') {
            return Err(err_at(
                self.line,
                format!("unsupported number {t}...: not an integer"),
            ));
        }
        t.parse::<i64>()
            .map(Value::Int)
            .map_err(|_| err_at(self.line, format!("invalid integer {t:?}")))
    }

    fn string(&mut self) -> Result<String> {
        let line = self.line;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None | Some(0) => {
                    return Err(err_at(line, "a string is not closed (missing '\"')"))
                }
                Some(b'"') => {
                    self.pos += 1;
                    break;
                }
                Some(b'\\') => {
                    self.pos += 1;
                    match self.peek() {
                        None | Some(0) => continue,
                        Some(c) => {
                            if c == b'\n' {
                                self.line += 1;
                            }
                            out.push(c);
                            self.pos += 1;
                        }
                    }
                }
                Some(c) => {
                    if c == b'\n' {
                        self.line += 1;
                    }
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
        String::from_utf8(out).map_err(|_| err_at(line, "a string is not valid UTF-8"))
    }
}

/// Parses a whole metadata text (everything up to the first NUL).
pub fn parse(text: &[u8]) -> Result<Section> {
    let mut p = Parser {
        s: text,
        pos: 0,
        line: 1,
        newlines: 0,
    };
    p.section(0)
}

fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            o.push('\\');
        }
        o.push(c);
    }
    o.push('"');
    o
}

fn print_value(out: &mut String, v: &Value, multiline: bool) {
    match v {
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Str(s) => out.push_str(&escape(s)),
        Value::Array(items) if multiline && !items.is_empty() => {
            out.push_str("[\n");
            for (i, pair) in items.chunks(2).enumerate() {
                if i > 0 {
                    out.push_str(",\n");
                }
                for (j, it) in pair.iter().enumerate() {
                    if j > 0 {
                        out.push_str(", ");
                    }
                    print_value(out, it, false);
                }
            }
            out.push_str("\n]");
        }
        Value::Array(items) => {
            out.push('[');
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                print_value(out, it, false);
            }
            out.push(']');
        }
    }
}

/// Prints a section's entries the way lvm writes them on disk: no indentation, blank
/// lines where recorded.
pub fn print_entries(out: &mut String, sec: &Section) {
    for e in &sec.entries {
        if e.blank {
            out.push('\n');
        }
        out.push_str(&e.key);
        match &e.node {
            Node::Value(v) => {
                out.push_str(" = ");
                print_value(out, v, e.multiline);
                out.push('\n');
            }
            Node::Section(s) => {
                out.push_str(" {\n");
                print_entries(out, s);
                if s.trailing_blank {
                    out.push('\n');
                }
                out.push_str("}\n");
            }
        }
    }
}

/// Prints a tree back to text (no trailer handling, no NUL).
pub fn print(sec: &Section) -> String {
    let mut out = String::new();
    print_entries(&mut out, sec);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_errors() {
        let t =
            parse(b"a = 1\nb = \"x\\\"y\\\\z\"\n# c\nc = [\"p\", -3]\ns {\nd = []\n}\n").unwrap();
        assert_eq!(t.value("a"), Some(&Value::Int(1)));
        assert_eq!(t.value("b").unwrap().as_str(), Some("x\"y\\z"));
        assert_eq!(
            t.value("c"),
            Some(&Value::Array(vec![Value::Str("p".into()), Value::Int(-3)]))
        );
        assert_eq!(
            t.section("s").unwrap().value("d"),
            Some(&Value::Array(vec![]))
        );
        let again = parse(print(&t).as_bytes()).unwrap();
        assert_eq!(again.value("b"), t.value("b"));

        let e = parse(b"vg {\nid = \"x\"\nseqno 3\n}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3: expected '=' after 'seqno'"), "{e}");
        assert!(parse(b"vg {\n")
            .unwrap_err()
            .to_string()
            .contains("not closed"));
        assert!(parse(b"a = \"x").is_err());
        assert!(parse(b"a = 99999999999999999999").is_err());
        assert!(parse(b"a = [[1]]").is_err());
        assert!(parse(b"}").is_err());
        assert!(parse(b"a = 1.5").is_err());
        let deep = "a {".repeat(10_000);
        assert!(parse(deep.as_bytes())
            .unwrap_err()
            .to_string()
            .contains("nested"));
        // Text after a NUL is not metadata.
        assert_eq!(parse(b"a = 1\n\0garbage {").unwrap().entries.len(), 1);
    }
}
