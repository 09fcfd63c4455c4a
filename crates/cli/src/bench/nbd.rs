//! `--nbd`: the same cell measured through the real path. The stack is built on the
//! scratch members as in-process, closed, then served by `cairn serve` (this binary) on a
//! unix socket in the scratch directory, with its control socket beside it, and fio's nbd
//! engine (libnbd) drives it: the server, the protocol and the stack are measured
//! together. Every figure of such a run says "nbd+fio".

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::cell::{self, Scratch};
use super::measure::{CellResult, Latency, SweepPoint};
use super::{CellSpec, Plan, Progress};
use crate::error::{CliError, Result};

/// fio, or a clear error saying how to get it.
pub fn check_fio() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("fio"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CliError::new(
                "--nbd measures through fio's nbd engine, and fio is not installed (apt-get \
                 install fio); without --nbd the measurements run in-process",
            )
        })
}

/// The served stack: `cairn serve` as a child, killed and waited for on drop.
struct Server {
    child: Child,
    socket: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM first: the server closes the array cleanly.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child's pid; no memory is touched.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// CPU seconds (user + system) the server has used so far, from /proc/PID/stat;
    /// 0 when it cannot be read.
    fn cpu(&self) -> f64 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())) else {
            return 0.0;
        };
        // The fields after the command name (which may hold spaces) in parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            return 0.0;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        let ticks: f64 = [11, 12]
            .iter()
            .filter_map(|&i| f.get(i)?.parse::<u64>().ok())
            .map(|t| t as f64)
            .sum();
        // SAFETY: sysconf has no memory effects.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if hz > 0 {
            ticks / hz as f64
        } else {
            0.0
        }
    }
}

fn serve(spec: &CellSpec, dir: &Path, members: &[PathBuf], key: Option<&Path>) -> Result<Server> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::new(format!("cannot find the cairn binary to serve with: {e}")))?;
    let socket = dir.join("nbd.sock");
    let control = dir.join("control.sock");
    let list: Vec<String> = members.iter().map(|p| p.display().to_string()).collect();
    let log = dir.join("serve.log");
    let log_file = std::fs::File::create(&log)
        .map_err(|e| CliError::new(format!("cannot write {}: {e}", log.display())))?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve")
        .arg("--md")
        .arg(format!("{}:bench", list.join(",")))
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .arg("--control")
        .arg(&control)
        .arg("--stripe-cache-size")
        .arg(spec.stripe_cache.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file);
    if let Some(k) = key {
        cmd.arg("--luks").arg("--key-file").arg(k);
    }
    let child = cmd
        .spawn()
        .map_err(|e| CliError::new(format!("cannot start cairn serve: {e}")))?;
    let mut s = Server { child, socket };
    let t = Instant::now();
    while !s.socket.exists() {
        if let Ok(Some(st)) = s.child.try_wait() {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(CliError::new(format!(
                "cairn serve for {} stopped at start ({st}): {}",
                spec.label(),
                said.trim()
            )));
        }
        if t.elapsed() > Duration::from_secs(30) {
            return Err(CliError::new("cairn serve did not open its socket in 30 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(s)
}

/// One fio job against the export; its JSON "jobs[0]" object.
fn fio(s: &Server, rw: &str, bs: u64, depth: u32, fsync: bool, runtime: Duration) -> Result<Value> {
    let uri = format!("nbd+unix:///bench?socket={}", s.socket.display());
    let mut cmd = Command::new("fio");
    cmd.arg("--name=bench")
        .arg("--ioengine=nbd")
        .arg(format!("--uri={uri}"))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .arg(format!("--iodepth={depth}"))
        .arg("--time_based")
        .arg(format!("--runtime={}ms", runtime.as_millis().max(10)))
        .arg("--output-format=json")
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    if fsync {
        cmd.arg("--fsync=1");
    }
    let out = cmd
        .output()
        .map_err(|e| CliError::new(format!("cannot run fio: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print notes before its JSON.
    let json = text.find('{').map_or("", |i| &text[i..]);
    let v: Value = serde_json::from_str(json).map_err(|_| {
        CliError::new(format!(
            "fio --ioengine=nbd failed ({}) for {rw} bs={bs}",
            out.status
        ))
    })?;
    v.pointer("/jobs/0")
        .cloned()
        .ok_or_else(|| CliError::new("fio printed no job results"))
}

fn num(v: &Value, ptr: &str) -> f64 {
    v.pointer(ptr).and_then(Value::as_f64).unwrap_or(0.0)
}

/// fio's bandwidth of `dir` ("read"/"write") in MB/s.
fn mbps(job: &Value, dir: &str) -> f64 {
    num(job, &format!("/{dir}/bw_bytes")) / 1e6
}

/// Measures one cell through cairn serve and fio.
pub fn run_cell(
    plan: &Plan,
    spec: &CellSpec,
    scratch: &Scratch,
    progress: &mut Progress,
) -> Result<CellResult> {
    let dir = scratch.dir().to_path_buf();
    let key = (spec.cipher != "none").then(|| dir.join("bench.key"));
    let stack = cell::build(plan, spec, scratch, key.as_deref())?;
    let (full_stripe, payload_offset) = (stack.full_stripe, stack.payload_offset);
    let block = u64::from(stack.top.geometry().logical_block_size).max(512);
    stack.close();
    let members = scratch.member_paths(spec.members);
    let s = serve(spec, &dir, &members, key.as_deref())?;
    let rt = plan.runtime;
    let seq = (1u64 << 20).max(full_stripe);
    progress.step("sequential write (fio)");
    let c0 = s.cpu();
    let w = fio(&s, "write", seq, 1, false, rt)?;
    let wcpu = s.cpu() - c0;
    progress.step("sequential read (fio)");
    let c0 = s.cpu();
    let r = fio(&s, "read", seq, 1, false, rt)?;
    let rcpu = s.cpu() - c0;
    let mut sweep = Vec::new();
    for req in plan.sweep_sizes(full_stripe, block) {
        progress.step(&format!("sweep {} (fio)", super::short_size(req)));
        let j = fio(&s, "write", req, 1, false, rt / 2)?;
        sweep.push(SweepPoint {
            request: req,
            write_mbps: mbps(&j, "write"),
            member_ops_per_mib: None,
        });
    }
    progress.step("QD1 write+flush (fio)");
    let sync = fio(&s, "randwrite", 4096, 1, true, rt)?;
    let pct = |p: &str| num(&sync, &format!("/write/clat_ns/percentile/{p}")) / 1000.0;
    let lat = Latency {
        p50: pct("50.000000"),
        p90: pct("90.000000"),
        p99: pct("99.000000"),
        p999: pct("99.900000"),
        max: num(&sync, "/write/clat_ns/max") / 1000.0,
    };
    progress.step("4K random read QD1 (fio)");
    let rr1 = fio(&s, "randread", 4096, 1, false, rt)?;
    progress.step("4K random write QD1 (fio)");
    let rw1 = fio(&s, "randwrite", 4096, 1, false, rt)?;
    progress.step("4K random QD32 (fio)");
    let rr32 = fio(&s, "randread", 4096, 32, false, rt)?;
    let rw32 = fio(&s, "randwrite", 4096, 32, false, rt)?;
    drop(s);
    if let Some(k) = &key {
        let _ = std::fs::remove_file(k);
    }
    // The server's CPU (the stack and the protocol), not fio's: per GB fio moved. A
    // floor of a microsecond per GB keeps a run shorter than the clock tick positive.
    let cpu_gb = |job: &Value, dir: &str, cpu: f64| {
        let gb = num(job, &format!("/{dir}/io_bytes")) / 1e9;
        if gb > 0.0 {
            (cpu / gb).max(1e-6)
        } else {
            1e-6
        }
    };
    Ok(CellResult {
        cell: spec.label(),
        spec: spec.clone(),
        mode: "nbd+fio".into(),
        full_stripe,
        payload_offset,
        seq_write_mbps: mbps(&w, "write"),
        seq_read_mbps: mbps(&r, "read"),
        randread_qd1_iops: num(&rr1, "/read/iops"),
        randwrite_qd1_iops: num(&rw1, "/write/iops"),
        randread_qd32_iops: num(&rr32, "/read/iops"),
        randwrite_qd32_iops: num(&rw32, "/write/iops"),
        sync_write_iops: num(&sync, "/write/iops"),
        sync_write_lat_us: lat,
        cpu_s_per_gb_write: cpu_gb(&w, "write", wcpu),
        cpu_s_per_gb_read: cpu_gb(&r, "read", rcpu),
        sweep,
    })
}
