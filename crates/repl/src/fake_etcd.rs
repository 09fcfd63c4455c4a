//! A stand-in for etcd's v3 JSON gateway, for the quorum tests of node.rs: the calls
//! cairn_cluster::Etcd makes (lease grant, keepalive, revoke; txn with CREATE and LEASE
//! compares; range, put, deleterange) on a map in memory, one thread per connection.
//! What a real etcd cannot be made to do on cue, a test can do here: end a lease at once
//! (its TTL ran out, or another node revoked it), or leave every keepalive unanswered
//! (an election that outlasts the lease's margin) and then answer again.
//! crates/cluster/tests/etcd.rs checks the same calls against a real etcd.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use serde_json::{json, Value};

/// A key's value, its lease (0: none) and create revision. Keys and values stay as the
/// client sent them (base64): nothing here needs their bytes.
#[derive(Clone)]
struct Kv {
    value: String,
    lease: i64,
    create: i64,
}

#[derive(Default)]
struct State {
    kv: BTreeMap<String, Kv>,
    /// Live leases and their TTLs.
    leases: BTreeMap<i64, i64>,
    revision: i64,
    next_lease: i64,
}

pub struct FakeEtcd {
    pub url: String,
    st: Arc<Mutex<State>>,
    stall: Arc<AtomicBool>,
}

fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().expect("an integer string"),
        Value::Number(n) => n.as_i64().expect("an integer"),
        _ => 0,
    }
}

impl FakeEtcd {
    pub fn start() -> FakeEtcd {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", l.local_addr().expect("address"));
        let st = Arc::new(Mutex::new(State {
            revision: 1,
            next_lease: 0x7000,
            ..State::default()
        }));
        let stall = Arc::new(AtomicBool::new(false));
        let (s, t) = (st.clone(), stall.clone());
        // Lives as long as the test process: a test's etcd is never stopped.
        thread::spawn(move || {
            for c in l.incoming().flatten() {
                let (s, t) = (s.clone(), t.clone());
                thread::spawn(move || serve(c, &s, &t));
            }
        });
        FakeEtcd { url, st, stall }
    }

    /// The lease ends now and its keys go, as when its TTL runs out in etcd.
    pub fn expire(&self, id: i64) {
        let mut s = self.st.lock().expect("state");
        s.leases.remove(&id);
        s.kv.retain(|_, kv| kv.lease != id);
    }

    /// Keepalives get no answer (the client times out) until called with `false`.
    pub fn stall_keepalives(&self, on: bool) {
        self.stall.store(on, Ordering::SeqCst);
    }
}

fn kv_json(key: &str, kv: &Kv) -> Value {
    json!({"key": key, "value": kv.value, "lease": kv.lease.to_string(),
           "create_revision": kv.create.to_string(), "mod_revision": kv.create.to_string()})
}

fn range(s: &State, key: &str) -> Value {
    let kvs: Vec<Value> =
        s.kv.get(key)
            .map(|kv| kv_json(key, kv))
            .into_iter()
            .collect();
    json!({"kvs": kvs, "count": kvs.len().to_string()})
}

fn apply(s: &mut State, op: &Value) -> Value {
    if let Some(p) = op.get("request_put") {
        let key = p["key"].as_str().expect("key").to_string();
        s.revision += 1;
        let create = s.kv.get(&key).map_or(s.revision, |kv| kv.create);
        let value = p["value"].as_str().unwrap_or("").to_string();
        let lease = int(&p["lease"]);
        s.kv.insert(
            key,
            Kv {
                value,
                lease,
                create,
            },
        );
        json!({"response_put": {}})
    } else if let Some(d) = op.get("request_delete_range") {
        s.revision += 1;
        s.kv.remove(d["key"].as_str().expect("key"));
        json!({"response_delete_range": {}})
    } else if let Some(r) = op.get("request_range") {
        json!({"response_range": range(s, r["key"].as_str().expect("key"))})
    } else {
        panic!("fake etcd: unknown txn operation {op}")
    }
}

fn answer(path: &str, body: &Value, st: &Mutex<State>) -> Value {
    let mut s = st.lock().expect("state");
    let header = json!({"revision": s.revision.to_string()});
    match path {
        "/v3/lease/grant" => {
            s.next_lease += 1;
            let (id, ttl) = (s.next_lease, int(&body["TTL"]));
            s.leases.insert(id, ttl);
            json!({"header": header, "ID": id.to_string(), "TTL": ttl.to_string()})
        }
        "/v3/lease/keepalive" => {
            let id = int(&body["ID"]);
            let ttl = s.leases.get(&id).copied().unwrap_or(0);
            json!({"result": {"header": header, "ID": id.to_string(), "TTL": ttl.to_string()}})
        }
        "/v3/lease/revoke" => {
            let id = int(&body["ID"]);
            s.leases.remove(&id);
            s.kv.retain(|_, kv| kv.lease != id);
            json!({"header": header})
        }
        "/v3/kv/txn" => {
            let ok = body["compare"]
                .as_array()
                .expect("compare")
                .iter()
                .all(|c| {
                    let kv = s.kv.get(c["key"].as_str().expect("key"));
                    assert_eq!(c["result"], "EQUAL", "fake etcd: only EQUAL compares");
                    match c["target"].as_str() {
                        Some("CREATE") => {
                            kv.map_or(0, |kv| kv.create) == int(&c["create_revision"])
                        }
                        Some("LEASE") => kv.map_or(0, |kv| kv.lease) == int(&c["lease"]),
                        t => panic!("fake etcd: compare target {t:?}"),
                    }
                });
            let ops = body[if ok { "success" } else { "failure" }]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let responses: Vec<Value> = ops.iter().map(|op| apply(&mut s, op)).collect();
            json!({"header": {"revision": s.revision.to_string()}, "succeeded": ok, "responses": responses})
        }
        "/v3/kv/range" => {
            let mut r = range(&s, body["key"].as_str().expect("key"));
            r["header"] = header;
            r
        }
        "/v3/kv/put" => {
            apply(&mut s, &json!({"request_put": body}));
            json!({"header": header})
        }
        "/v3/kv/deleterange" => {
            apply(&mut s, &json!({"request_delete_range": body}));
            json!({"header": header})
        }
        p => panic!("fake etcd: {p} is not served"),
    }
}

fn serve(mut c: TcpStream, st: &Mutex<State>, stall: &AtomicBool) {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    let (head_end, len) = loop {
        let Ok(n) = c.read(&mut buf) else { return };
        if n == 0 {
            return;
        }
        req.extend_from_slice(&buf[..n]);
        if let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&req[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().expect("content length"));
            break (end + 4, len);
        }
    };
    while req.len() < head_end + len {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&req[..head_end]).to_string();
    let path = head.split(' ').nth(1).unwrap_or("").to_string();
    let body: Value = serde_json::from_slice(&req[head_end..head_end + len]).expect("JSON");
    if path == "/v3/lease/keepalive" && stall.load(Ordering::SeqCst) {
        while stall.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(20));
        }
        return; // never answered: the client gave up long ago
    }
    let out = answer(&path, &body, st).to_string();
    let _ = write!(
        c,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{out}",
        out.len()
    );
}
